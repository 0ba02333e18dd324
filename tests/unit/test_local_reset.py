"""``kairos dev --reset`` (``devstate.reset``): forgets exactly what the stack keeps, and never the
database of a stack still running; a crashed stack's handle on the embedded database is dropped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kairos.local import devstate, postgres


def _kept(data_dir: Path) -> None:
    (data_dir / "pgdata").mkdir(parents=True)
    (data_dir / "pgdata" / "PG_VERSION").write_text("16\n")
    for name in (devstate.AWS_FILE, devstate.DEMO_FILE, devstate.ENV_FILE, "notes.txt"):
        (data_dir / name).write_text("x")


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(done.stdout)


def test_reset_forgets_what_the_stack_keeps_and_nothing_else(tmp_path: Path) -> None:
    _kept(tmp_path)
    (tmp_path / "pgdata" / postgres.HANDLES).write_text(json.dumps([_dead_pid()]))  # a crashed stack's
    done = devstate.reset(tmp_path, external_database=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    assert done[0].startswith("embedded database deleted") and len(done) == 4
    assert devstate.reset(tmp_path, external_database=False) == ["nothing to forget"]


def test_reset_refuses_while_a_running_stack_holds_the_database(tmp_path: Path) -> None:
    _kept(tmp_path)
    (tmp_path / "pgdata" / postgres.HANDLES).write_text(json.dumps([os.getppid()]))  # alive: our parent
    with pytest.raises(postgres.InUse) as refused:
        devstate.reset(tmp_path, external_database=False)
    assert refused.value.pid == os.getppid()
    assert (tmp_path / "pgdata" / "PG_VERSION").exists() and (tmp_path / devstate.AWS_FILE).exists()


def test_a_database_url_is_left_alone(tmp_path: Path) -> None:
    _kept(tmp_path)
    done = devstate.reset(tmp_path, external_database=True)
    assert done[0] == "DATABASE_URL is yours: its data is kept"
    assert (tmp_path / "pgdata" / "PG_VERSION").exists() and not (tmp_path / devstate.AWS_FILE).exists()


def test_a_dead_process_is_dropped_from_the_handles(tmp_path: Path) -> None:
    dead = _dead_pid()
    (tmp_path / postgres.HANDLES).write_text(json.dumps([dead, os.getppid()]))
    assert postgres.prune_handles(tmp_path) == [os.getppid()]
    assert json.loads((tmp_path / postgres.HANDLES).read_text()) == [os.getppid()]
