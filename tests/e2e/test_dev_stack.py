"""`kairos dev` end to end: a subprocess from a clean directory, driven over real HTTP.

Given the local stack started as a newcomer would start it (embedded PostgreSQL in a fresh
directory, moto's SQS, the API server, fast ticks), when a webhook is posted to the printed URL,
then the run succeeds through the real tick/worker loops, its trace reads back through the API, and
Ctrl-C (SIGINT) stops everything, leaving no process behind.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.support.output import http_json, start_dev, wait_for

pytestmark = pytest.mark.slow

DEV_TOKEN = "dev-token-alice"


def test_kairos_dev_runs_a_webhook_end_to_end_and_stops_cleanly(tmp_path: Path) -> None:
    proc, lines, log = start_dev(tmp_path)
    try:
        hook_url = wait_for(lines, r"webhook URL \(kept across restarts\): (\S+)", log).group(1)
        wait_for(lines, r"^running ", log)
        base = hook_url.split("/v1/hooks/")[0]

        status, accepted = http_json("POST", hook_url, {"hello": "world"}, {"Idempotency-Key": "e2e-1"})
        assert status == 202, accepted
        run_id = accepted["run_id"]

        auth = {"Authorization": f"Bearer {DEV_TOKEN}"}
        deadline = time.monotonic() + 120
        state = None
        while time.monotonic() < deadline:
            status, body = http_json("GET", f"{base}/v1/runs/{run_id}", headers=auth)
            assert status == 200, body
            state = body["run"]["state"]
            if state in ("succeeded", "failed", "cancelled", "abandoned"):
                break
            time.sleep(0.2)  # polling a state with a deadline, not timing an outcome
        assert state == "succeeded", "".join(log)

        status, page = http_json("GET", f"{base}/v1/runs/{run_id}/events?after=0", headers=auth)
        assert status == 200
        types = [e["type"] for e in page["events"]]
        assert types[0] == "run.queued" and types[-1] == "run.succeeded", types
        assert "run.claimed" in types and "output.published" in types

        status, output = http_json("GET", f"{base}/v1/runs/{run_id}/output", headers=auth)
        assert status == 200 and output["output"]["state"] == "available"
    finally:
        children = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0, "".join(log)
    _, alive = psutil.wait_procs(children, timeout=30)
    assert alive == [], f"left behind: {[p.pid for p in alive]}"
    # The embedded postmaster daemonizes (it is no child of ours): find it by its data directory.
    stray = [p.pid for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert stray == [], f"processes still using {tmp_path}: {stray}"
    assert "postgres   stopped" in "".join(log)
