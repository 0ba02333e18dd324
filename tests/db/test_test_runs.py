"""Test runs (``POST /v1/schedules/{id}/test``) on real PostgreSQL, through the API handler, the worker
and the tick, with a real local model server and a real local HTTP target: real model calls, every
mutation recorded ``not_sent_test`` and answered to the model as not sent, the target receiving
nothing; a test run never counts toward failures or pause, never notifies, is never ``last_run``,
and counts toward usage."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from kairos.db import Database
from kairos.execution.execute import process
from kairos.tick import Tick
from tests.support.api import Api
from tests.support.executors import OPENAI_SETTINGS, FakeOpenAI, openai_agent, tool_call
from tests.support.peer import Peer, respond


def rows(url: str, query: str, *args: Any) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        return conn.execute(query, args).fetchall()


@pytest.fixture
def target() -> Any:
    with Peer(respond(200, '{"ok": true}')) as peer:
        yield peer


def poster(api: Api, fake: FakeOpenAI, **fields: Any) -> dict[str, Any]:
    """A schedule whose agent posts through the http tool (approval: the default, mutations)."""
    conversation = api.alice.post("/v1/conversations", {"agent": {**openai_agent(fake), "tools": ["http"]}})
    assert conversation.status == 201, conversation.text
    created = api.alice.post("/v1/schedules", {
        "conversation_id": conversation.json["conversation"]["id"], "prompt": "post the order", "cron": "0 * * * *",
        "mode": "append", **fields})
    assert created.status == 201, created.text
    return dict(created.json["schedule"])


def tick(api: Api, db: Database) -> None:
    Tick(db, api.sqs, api.queue_url, metrics=None).run(now=datetime.now(UTC) + timedelta(seconds=1))


def test_a_test_run_calls_the_model_and_sends_no_mutation(
        api: Api, db: Database, fake_openai: FakeOpenAI, target: Peer) -> None:
    # Given a schedule whose agent posts an order through the http tool
    fake_openai.script = [tool_call("post-1", "http_post", {"url": target.url("/orders"), "body": {"order": 42}}),
                          {"content": "Posted."}]
    schedule = poster(api, fake_openai)

    # When it is test-run
    answer = api.alice.post(f"/v1/schedules/{schedule['id']}/test", {"payload": {"n": 1}})

    assert answer.status == 202, answer.text
    run = answer.json["run"]
    assert (run["source"], run["test"], run["state"], run["id"]) == ("test", True, "queued", answer.json["run_id"])
    assert [m["run_id"] for m in api.messages()] == [run["id"]]
    outcome = process(db, uuid.UUID(run["id"]), settings=OPENAI_SETTINGS)

    # Then the model was called for real, the target received nothing, and no approval was asked
    assert outcome.result == "succeeded", outcome
    assert target.received == []
    assert rows(api.url, "SELECT 1 FROM approvals WHERE run_id = %s", run["id"]) == []
    _, second = fake_openai.bodies()
    tool_message = second["messages"][-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "post-1"
    assert json.loads(tool_message["content"])["status"] == "not_sent_test"
    assert "not sent (test run)" in json.loads(tool_message["content"])["message"]
    # the call is recorded with its would-be arguments, its effect not_sent_test
    [step] = rows(api.url, "SELECT record FROM run_steps WHERE run_id = %s AND kind = 'tool'", run["id"])
    assert step["record"]["state"] == "not_sent_test"
    assert step["record"]["arguments"] == {"url": target.url("/orders"), "body": {"order": 42}}
    effects = rows(api.url, "SELECT kind, state, mutation FROM effects WHERE run_id = %s ORDER BY created_at",
                   run["id"])
    assert [(e["kind"], e["state"]) for e in effects] == [
        ("model_call", "settled"), ("tool_call", "not_sent_test"), ("model_call", "settled")]
    # and the answer went to a fork, never into the schedule's own conversation
    shown = api.alice.get(f"/v1/runs/{run['id']}").json["run"]
    assert shown["mode"] == "fork" and shown["conversation_id"] != schedule["conversation_id"]
    entries = api.alice.get(f"/v1/conversations/{schedule['conversation_id']}").json["conversation"]["entries"]
    assert entries == []

    # And after the tick settled it, it is not the schedule's last run, and its usage counted
    tick(api, db)
    assert rows(api.url, "SELECT settled_at IS NOT NULL AS settled FROM runs WHERE id = %s", run["id"]) == [
        {"settled": True}]
    assert api.alice.get(f"/v1/schedules/{schedule['id']}").json["schedule"]["last_run"] is None
    assert shown["usage"]["calls"] == 2
    [day] = api.alice.get("/v1/usage").json["days"][-1:]
    assert day["calls"] == 2 and day["runs"] == 1


def test_failing_test_runs_never_pause_notify_or_count(api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    # Given a schedule that notifies its inbox of every failure
    schedule = poster(api, fake_openai, notify={"on": ["failed"]})

    # When three test runs fail in a row (the model refuses each call) and the tick settles them
    for _ in range(3):
        answer = api.alice.post(f"/v1/schedules/{schedule['id']}/test")
        assert answer.status == 202, answer.text
        fake_openai.statuses = [400]
        assert process(db, uuid.UUID(answer.json["run_id"]), settings=OPENAI_SETTINGS).result == "failed"
    tick(api, db)

    # Then the schedule stays active with no failure counted, no note, no delivery, no last run
    [row] = rows(api.url, "SELECT status, consecutive_failures FROM schedules WHERE id = %s", schedule["id"])
    assert row == {"status": "active", "consecutive_failures": 0}
    assert rows(api.url, "SELECT count(*) AS n FROM runs WHERE schedule_id = %s AND settled_at IS NOT NULL",
                schedule["id"]) == [{"n": 3}]
    notes = api.alice.get(f"/v1/conversations/{schedule['conversation_id']}/inbox").json["notes"]
    assert notes == []
    assert api.alice.get(f"/v1/schedules/{schedule['id']}").json["schedule"]["last_run"] is None


def test_a_test_run_ignores_overlap_and_a_paused_schedule_can_be_tested(
        api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    schedule = poster(api, fake_openai, overlap="skip")
    first = api.alice.post(f"/v1/schedules/{schedule['id']}/test")
    assert first.status == 202, first.text
    # a queued test run is in no one's way: a trigger still runs
    assert api.alice.post(f"/v1/schedules/{schedule['id']}/trigger").status == 202
    assert api.alice.post(f"/v1/schedules/{schedule['id']}/pause").status == 200
    paused = api.alice.post(f"/v1/schedules/{schedule['id']}/test")
    assert paused.status == 202, paused.text
    assert process(db, uuid.UUID(paused.json["run_id"]), settings=OPENAI_SETTINGS).result == "succeeded"


def test_a_test_run_refuses_a_cancelled_schedule_and_an_oversized_payload(api: Api, fake_openai: FakeOpenAI) -> None:
    schedule = poster(api, fake_openai)
    big = api.alice.post(f"/v1/schedules/{schedule['id']}/test", {"payload": {"x": "y" * 70_000}})
    assert big.status == 422, big.text
    assert big.json["error"]["fields"][0]["field"] == "payload"
    assert api.alice.post(f"/v1/schedules/{schedule['id']}/test", {"nope": 1}).status == 422
    assert api.alice.delete(f"/v1/schedules/{schedule['id']}").status == 200
    gone = api.alice.post(f"/v1/schedules/{schedule['id']}/test")
    assert gone.status == 409, gone.text
    assert api.alice.post(f"/v1/schedules/{uuid.uuid4()}/test").status == 404


def test_the_cli_test_runs_a_schedule(api: Api, fake_openai: FakeOpenAI, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from kairos import cli

    monkeypatch.setenv("RUN_QUEUE_URL", api.queue_url)
    schedule = poster(api, fake_openai)

    code = cli.main(["schedules", "test", schedule["id"], "--payload", '{"order": 7}', "--json"])

    out = capsys.readouterr()
    assert code == 0, out.err
    tested = json.loads(out.out)
    assert [m["run_id"] for m in api.messages()] == [tested["run_id"]]
    [run] = rows(api.url, "SELECT source, test, payload FROM runs WHERE id = %s", tested["run_id"])
    assert run == {"source": "test", "test": True, "payload": {"order": 7}}
    assert cli.main(["schedules", "test", schedule["id"], "--payload", "{nope"]) == 2
