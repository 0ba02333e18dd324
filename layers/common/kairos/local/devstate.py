"""What ``kairos dev`` keeps in its data directory between starts, and what it hands to the CLI.

* ``env``: ``DATABASE_URL``, ``RUN_QUEUE_URL`` and the endpoint and dummy credentials of moto's SQS,
  as ``NAME=value`` lines, written when the stack is up and removed when it stops. The ``kairos``
  command reads it by itself when run from the checkout (``kairos.cli``), so ``kairos status`` works
  in another terminal with nothing exported.
* ``demo.json``: the demo webhook schedule's id and token, so a restart prints the same webhook URL
  instead of rotating the token (only its hash is in the database).
* ``aws.json`` and ``aws-s3/``: the secrets, queued messages and S3 objects moto holds, saved on every
  change (``kairos.local.awsstate``).
* ``pgdata``: the embedded PostgreSQL's data (``kairos.local.postgres``).

``reset`` (``kairos dev --reset``) forgets all of it before the stack starts: it stops the embedded
server a crashed stack left running and deletes ``pgdata``, ``aws.json``, ``aws-s3``, ``demo.json`` and ``env``, and
nothing else in the directory (which may be one the user named). It refuses (``postgres.InUse``) while
a running stack holds the database; a ``DATABASE_URL`` database is the user's and is left alone.

Guarantees: both files are created with mode 0600 (and an existing one is put back to 0600 before it
is written), and the token is never logged: it appears only in the URL lines the demo prints.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ENV_FILE = "env"
DEMO_FILE = "demo.json"
AWS_FILE = "aws.json"  # kairos.local.awsstate.STATE_FILE
AWS_BLOBS = "aws-s3"  # the bodies of the S3 objects aws.json names
PGDATA = "pgdata"


def write_private(path: Path, text: str) -> None:
    """Writes ``text`` to ``path`` readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # O_CREAT's mode applies to a new file only
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)


def write_env(data_dir: Path, values: Mapping[str, str]) -> Path:
    path = data_dir / ENV_FILE
    lines = ["# Written by `kairos dev` while it runs (removed when it stops); the kairos CLI reads it."]
    lines += [f"{name}={value}" for name, value in values.items()]
    write_private(path, "\n".join(lines) + "\n")
    return path


def remove_env(data_dir: Path) -> None:
    (data_dir / ENV_FILE).unlink(missing_ok=True)


def load_demo(data_dir: Path) -> dict[str, Any]:
    """The saved demo state, or ``{}`` when there is none or it cannot be read."""
    try:
        saved = json.loads((data_dir / DEMO_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def save_demo(data_dir: Path, *, schedule_id: str, token: str) -> None:
    write_private(data_dir / DEMO_FILE, json.dumps({"schedule_id": schedule_id, "token": token}) + "\n")


def reset(data_dir: Path, *, external_database: bool) -> list[str]:
    """Forgets what the stack keeps in ``data_dir`` (see the module's docstring); a line per thing done."""
    from kairos.local import postgres

    done = []
    pgdata = data_dir / PGDATA
    if external_database:
        done.append("DATABASE_URL is yours: its data is kept")
    elif pgdata.exists():
        postgres.remove(pgdata)
        done.append(f"embedded database deleted ({pgdata})")
    if (data_dir / AWS_BLOBS).is_dir():
        shutil.rmtree(data_dir / AWS_BLOBS)
        done.append(f"S3 objects deleted ({data_dir / AWS_BLOBS})")
    for name, what in ((AWS_FILE, "secrets, queued messages and S3 objects"), (DEMO_FILE, "demo webhook token"),
                       (ENV_FILE, "CLI environment")):
        if (data_dir / name).exists():
            (data_dir / name).unlink()
            done.append(f"{what} deleted ({data_dir / name})")
    return done or ["nothing to forget"]


def merge_dev_tokens(existing: str | None, token: str, principal: str) -> str:
    """``KAIROS_DEV_TOKENS`` with the demo's ``token=principal`` added to the user's own pairs."""
    pairs = [p.strip() for p in (existing or "").split(",") if p.strip()]
    if not any(p.partition("=")[0].strip() == token for p in pairs):
        pairs.append(f"{token}={principal}")
    return ",".join(pairs)
