"""What ``kairos dev`` keeps across restarts, in-process against a real database: the demo webhook URL
(token saved 0600 in the data directory), a fresh idempotency key on each ``try:`` line, only new run
lines after a restart, a failed run's reason code, and Bedrock refused at creation (422 naming
``agent.executor``) while ``KAIROS_LOCAL=1``."""

from __future__ import annotations

import json
import re
import stat
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import dict_row

from kairos import webhooks
from kairos.local import stack
from tests import factories
from tests.support.api import Api


def _start(api: Api, data_dir: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """One start's demo: (the printed webhook URL, the printed idempotency key)."""
    demo = stack.create_demo(api.url, "http://127.0.0.1:8000", data_dir)
    stack.print_demo(demo, "http://127.0.0.1:8000")
    out = capsys.readouterr().out
    url = re.search(r"webhook URL \(kept across restarts\): (\S+)", out)
    key = re.search(r"Idempotency-Key: (demo-[0-9a-f]{12})", out)
    assert url and key, out
    return url.group(1), key.group(1)


def test_the_demo_url_survives_a_restart_with_a_fresh_key(api: Api, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    first_url, first_key = _start(api, tmp_path, capsys)
    saved = tmp_path / "demo.json"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    token = first_url.rsplit("/", 1)[1]
    assert json.loads(saved.read_text())["token"] == token

    second_url, second_key = _start(api, tmp_path, capsys)
    assert second_url == first_url and second_key != first_key
    with psycopg.connect(api.url, row_factory=dict_row) as conn:
        assert webhooks.find(conn, token) is not None  # the URL still opens the demo schedule

    saved.unlink()  # without the saved token (only its hash is stored), a new one is made and saved
    third_url, _ = _start(api, tmp_path, capsys)
    assert third_url != first_url
    assert json.loads(saved.read_text())["token"] == third_url.rsplit("/", 1)[1]
    with psycopg.connect(api.url, row_factory=dict_row) as conn:
        assert webhooks.find(conn, token) is None


def test_after_a_restart_only_new_runs_are_shown_and_failures_say_why(api: Api,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    sched = factories.schedule(api.url)
    old = factories.run(api.url, schedule_row=sched, state="succeeded")
    seen = stack.runs_now(api.url)
    assert seen[str(old["id"])] == "succeeded"
    watch = stack.watch_step(api.url, seen)

    watch()
    assert capsys.readouterr().out == ""  # the previous session's runs are not printed again

    failed = factories.run(api.url, schedule_row=sched, state="failed", fire_at=datetime(2026, 1, 2, tzinfo=UTC),
                           diagnosis=json.dumps({"reason_code": "peer_timeout", "summary": "x"}))
    watch()
    (line,) = capsys.readouterr().out.splitlines()
    assert str(failed["id"]) in line and line.endswith("failed  (peer_timeout)")


def test_bedrock_is_a_422_naming_agent_executor_locally(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    agent = {"executor": "bedrock", "model": "anthropic.claude-3-haiku-20240307-v1:0"}
    monkeypatch.setenv("KAIROS_LOCAL", "1")
    answer = api.alice.post("/v1/conversations", {"agent": agent, "title": "t"})
    assert answer.status == 422, answer.text
    assert [(f["field"], f["rule"]) for f in answer.error["fields"]] == [("agent.executor", "not_available_locally")]
    conversation = api.conversation()
    answer = api.alice.post("/v1/schedules", {"conversation_id": conversation["id"], "prompt": "p",
                                              "cron": "0 7 * * *", "agent": agent})
    assert answer.status == 422, answer.text
    assert "agent.executor" in [f["field"] for f in answer.error["fields"]]
