"""The README's walkthrough, taken from the README itself and run with bash, curl and jq against
`kairos dev` started as a newcomer starts it: the README cannot drift from what the stack answers."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.output import start_dev, stop_dev, wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def walkthrough() -> str:
    """The ```sh block that follows the ``<!-- walkthrough -->`` marker in README.md."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- walkthrough -->\n```sh\n(.*?)\n```", text, re.S)
    assert match, "README.md has no walkthrough block"
    return match.group(1)


@pytest.mark.skipif(not (shutil.which("curl") and shutil.which("jq")), reason="the walkthrough uses curl and jq")
def test_the_readme_walkthrough_runs_against_kairos_dev(tmp_path: Path) -> None:
    proc, lines, log = start_dev(tmp_path, drop=("KAIROS_DEV_TOKENS",))
    try:
        base = wait_for(lines, r"^api\s+(http://\S+)", log).group(1).rstrip("/")
        wait_for(lines, r"^running ", log)
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", walkthrough()], capture_output=True, text=True,
                              env={**os.environ, "KAIROS": base}, timeout=120, cwd=tmp_path)
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{''.join(log)}"
        out = done.stdout.splitlines()
        # 2. three fires at 07:00 Berlin time, each with its offset (+01:00 in winter, +02:00 in summer)
        fires = [json.loads(line) for line in out[:3]]
        assert len(fires) == 3 and all(f[0].endswith("T07:00:00") and f[1] in ("+01:00", "+02:00") for f in fires)
        # 4. the run's trace, in order, and its output
        events = out[3:-1]
        assert events[0] == "run.queued" and events[-1] == "run.succeeded" and "output.published" in events
        assert out[-1] == "available"
    finally:
        stop_dev(proc)
