"""docs/try.md, taken from the page itself: every ```sh block run in order, in one bash, with curl and jq
against `kairos dev` started as a newcomer starts it, its agents talking to the stack's demo model — tools
with an approval, a goal loop's question, a corpus run, a backfill and a retry. Also the banner's own
demo conversation and its curl line."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from kairos.local.demo_model import DemoModel
from tests.support.output import start_dev, stop_dev, wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MARK = "=== block "


def blocks() -> list[str]:
    """Every ```sh block of docs/try.md, in order."""
    found = re.findall(r"^```sh\n(.*?)\n```", (ROOT / "docs" / "try.md").read_text(encoding="utf-8"), re.S | re.M)
    assert len(found) == 6, "docs/try.md: the settings and five steps"
    return found


def script() -> str:
    """The blocks as one bash script, each announced by a marker line so its output can be told apart."""
    return "\n".join(f"echo '{MARK}{n}'\n{block}" for n, block in enumerate(blocks()))


def outputs(stdout: str) -> list[list[str]]:
    parts = re.split(rf"^{MARK}\d+\n", stdout, flags=re.M)
    return [p.splitlines() for p in parts[1:]]


@pytest.mark.skipif(not (shutil.which("curl") and shutil.which("jq")), reason="the page uses curl and jq")
def test_every_block_of_try_md_runs_against_kairos_dev_and_its_demo_model() -> None:
    # Not under pytest's 0700 temporary root: the embedded PostgreSQL runs as its own user, which must
    # reach its data directory.
    tmp_path = Path(tempfile.mkdtemp(prefix="kairos-try-"))
    tmp_path.chmod(0o755)
    proc, lines, log = start_dev(tmp_path, drop=("KAIROS_DEV_TOKENS", "KAIROS_EGRESS_ALLOW"))
    try:
        base = wait_for(lines, r"^api\s+(http://\S+)", log).group(1).rstrip("/")
        demo = wait_for(lines, r"^demo model (http://\S+)/v1 ", log).group(1)
        banner_conversation = wait_for(lines, r"^conversation (\S+) uses it", log).group(1)
        try_line = wait_for(lines, r"^try:  (curl .*/messages .*)$", log).group(1)
        wait_for(lines, r"^running ", log)

        # The banner's conversation answers its own curl line, through the demo model.
        posted = subprocess.run(shlex.split(try_line), capture_output=True, text=True, timeout=60, check=True)
        run_id = json.loads(posted.stdout)["run_id"]
        assert _settled(base, run_id)["state"] == "succeeded"
        entries = _get(base, f"/v1/conversations/{banner_conversation}")["conversation"]["entries"]
        assert entries[-1]["content"] == "demo: Hello, demo model"

        started = time.monotonic()
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", script()], capture_output=True, text=True,
                              env={**os.environ, "KAIROS": base, "DEMO": demo}, timeout=600, cwd=tmp_path)
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{''.join(log)}"
        settings, tools, loop, corpus, backfill, retry = outputs(done.stdout)
        assert time.monotonic() - started < 300  # every step well inside five minutes, all of them together too

        assert settings == ["demo: Hello there"]
        assert tools[0].startswith('{"tool":"http_post"') and tools[1] == "approved"
        assert tools[2].startswith('demo: http_post answered {"status": 200')
        assert [json.loads(line) for line in tools[3:]] == [{"path": "/sink/team", "body": {"text": "deploy done"}}]
        assert loop == ["Which environment first?", "The owner answered: staging", "active", "cancelled"]
        partitions, covered, key = json.loads(corpus[0])
        assert (partitions, covered) == (2, 3) and key.endswith("/records.jsonl")
        assert [json.loads(line) for line in corpus[1:]] == [
            ["items/0", "Alpha launch moved to March."], ["items/1", "Beta needs two more reviewers."],
            ["items/2", "Gamma shipped."]]
        assert backfill[0] == "paused" and json.loads(backfill[2]) == ["backfill", "succeeded"]
        attempts, reason, actions = json.loads(retry[0])
        assert (attempts, reason) == (3, "peer_error") and "retry_run" in actions
        assert json.loads(retry[1]) == ["run.queued", True]  # the retry names the run it retries
        assert retry[2].startswith("demo: Write the nightly report for ")

        # What the page says of the egress check: runs reach the demo model's address and port, not the
        # rest of loopback (here the local API itself); an approved call there is a tool error.
        content = "demo: call http_post " + json.dumps({"url": f"{base}/v1/schedules", "body": {}})
        run_id = _post(base, f"/v1/conversations/{banner_conversation}/messages", {"content": content})["run_id"]
        assert _settled(base, run_id)["state"] == "awaiting_approval"
        (approval,) = [a for a in _get(base, "/v1/approvals?state=pending")["approvals"] if a["run_id"] == run_id]
        _post(base, f"/v1/approvals/{approval['id']}/approve", None)
        assert _settled(base, run_id)["state"] == "succeeded"
        text = _get(base, f"/v1/runs/{run_id}/output")["output"]["text"]
        assert text.startswith('demo: http_post answered {"error": {"code": "egress_refused"'), text

        # Kairos counted, call for call, what the demo model answered: across an approval park, a
        # question park, tool loops, a corpus run, a backfill and a failed run with its retry.
        # (Less the settings block's own call straight to the model, which no run made.)
        answered = json.loads(subprocess.run(["curl", "-fsS", f"{demo}/usage"], capture_output=True, text=True,
                                             timeout=60, check=True).stdout)
        direct = DemoModel().answer({"model": "kairos-demo", "stream": True,
                                     "messages": [{"role": "user", "content": "Hello there"}]}).body["usage"]
        days = _get(base, "/v1/usage")["days"]
        counted = {k: sum(d[k] for d in days) for k in ("input_tokens", "output_tokens")}
        assert counted == {"input_tokens": answered["prompt_tokens"] - direct["prompt_tokens"],
                           "output_tokens": answered["completion_tokens"] - direct["completion_tokens"]}
    finally:
        stop_dev(proc)
        shutil.rmtree(tmp_path, ignore_errors=True)


def _get(base: str, path: str) -> dict[str, Any]:
    done = subprocess.run(["curl", "-fsS", f"{base}{path}", "-H", "Authorization: Bearer dev-token-alice"],
                          capture_output=True, text=True, timeout=60, check=True)
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def _post(base: str, path: str, body: Any) -> dict[str, Any]:
    data = [] if body is None else ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    done = subprocess.run(["curl", "-fsS", "-X", "POST", f"{base}{path}", "-H", "Authorization: Bearer dev-token-alice",
                           *data], capture_output=True, text=True, timeout=60, check=True)
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def _settled(base: str, run_id: str, timeout: float = 120) -> dict[str, Any]:
    """The run once it is no longer queued or running (a deadline, not a fixed wait)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = _get(base, f"/v1/runs/{run_id}")["run"]
        assert isinstance(run, dict)
        if run["state"] not in ("queued", "running"):
            return run
        time.sleep(0.5)
    raise AssertionError(f"run {run_id} did not settle in {timeout} s")


def test_the_demo_conversation_and_its_answers_survive_a_restart() -> None:
    """On the same ports (as `./scripts/dev` always starts: 8000 and 8001), a restart prints the same demo
    conversation, its transcript kept, and it answers again through the restarted demo model."""
    tmp_path = Path(tempfile.mkdtemp(prefix="kairos-try-"))
    tmp_path.chmod(0o755)
    with socket.socket() as one, socket.socket() as two:
        one.bind(("127.0.0.1", 0))
        two.bind(("127.0.0.1", 0))
        ports = ("--port", str(one.getsockname()[1]), "--demo-port", str(two.getsockname()[1]))
    seen: list[str] = []
    try:
        for attempt in range(2):
            proc, lines, log = start_dev(tmp_path, drop=("KAIROS_DEV_TOKENS", "KAIROS_EGRESS_ALLOW"), args=ports)
            try:
                base = wait_for(lines, r"^api\s+(http://\S+)", log).group(1).rstrip("/")
                seen.append(wait_for(lines, r"^conversation (\S+) uses it", log).group(1))
                wait_for(lines, r"^running ", log)
                content = f"Hello again ({attempt})"
                run_id = _post(base, f"/v1/conversations/{seen[-1]}/messages", {"content": content})["run_id"]
                assert _settled(base, run_id)["state"] == "succeeded"
                entries = _get(base, f"/v1/conversations/{seen[-1]}")["conversation"]["entries"]
                assert [e["content"] for e in entries] == [
                    c for n in range(attempt + 1) for c in (f"Hello again ({n})", f"demo: Hello again ({n})")]
            finally:
                stop_dev(proc)
        assert seen[0] == seen[1]
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)
