"""Retry from the last step (``POST /v1/runs/{id}/retry {"from": "last_step"}``) on real PostgreSQL, through
the API handler and the worker, with a real local model server and a real local HTTP target: the new run
takes over the old run's completed steps — the model server's request log shows none of them asked
again, the target gets no call twice — and re-runs the step that failed; a run with an ambiguous step
answers 409 ``ambiguous_effect`` naming it."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from kairos.db import Database
from kairos.execution.execute import process
from tests import factories
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


def poster(api: Api, fake: FakeOpenAI) -> dict[str, Any]:
    conversation = api.alice.post("/v1/conversations", {"agent": {**openai_agent(fake), "tools": ["http"],
                                                                  "approval": "never"}})
    assert conversation.status == 201, conversation.text
    created = api.alice.post("/v1/schedules", {"conversation_id": conversation.json["conversation"]["id"],
                                               "prompt": "post both orders", "cron": "0 * * * *", "mode": "append"})
    assert created.status == 201, created.text
    return dict(created.json["schedule"])


def failed_at_step_five(api: Api, db: Database, fake: FakeOpenAI, target: Peer, *, test: bool = False) -> str:
    """A run whose tool loop posted twice (steps 1-4: model, http_post, model, http_post) and whose
    fifth step, the model's next turn, answered something unreadable: the run failed there."""
    fake.script = [tool_call("post-1", "http_post", {"url": target.url("/orders"), "body": {"order": 1}}),
                   tool_call("post-2", "http_post", {"url": target.url("/orders"), "body": {"order": 2}}),
                   {"raw": b"this is not a chat completion"}]
    schedule = poster(api, fake)
    started = api.alice.post(f"/v1/schedules/{schedule['id']}/{'test' if test else 'trigger'}")
    assert started.status == 202, started.text
    run_id = started.json["run_id"]
    assert [m["run_id"] for m in api.messages()] == [run_id]
    outcome = process(db, uuid.UUID(run_id), settings=OPENAI_SETTINGS)
    assert outcome.result == "failed", outcome
    assert len(fake.requests) == 3
    return str(run_id)


def test_a_run_that_failed_at_step_five_is_retried_from_its_last_step(
        api: Api, db: Database, fake_openai: FakeOpenAI, target: Peer) -> None:
    old = failed_at_step_five(api, db, fake_openai, target)
    assert len(target.received) == 2
    # From the start it cannot be retried: it made external changes
    plain = api.alice.post(f"/v1/runs/{old}/retry")
    assert plain.status == 409 and plain.json["error"]["code"] == "not_retryable", plain.text

    # When it is retried from its last step
    fake_openai.script = [{"content": "Both orders are in."}]
    retried = api.alice.post(f"/v1/runs/{old}/retry", {"from": "last_step"})

    assert retried.status == 202, retried.text
    new = retried.json["run_id"]
    assert [m["run_id"] for m in api.messages()] == [new]
    assert api.alice.post(f"/v1/runs/{old}/retry", {"from": "last_step"}).json["run_id"] == new  # idempotent
    outcome = process(db, uuid.UUID(new), settings=OPENAI_SETTINGS)

    # Then steps 1-4 were never sent again: one more model request (step 5), carrying the four folded
    # steps, and no second post to the target
    assert outcome.result == "succeeded", outcome
    assert len(fake_openai.requests) == 4
    assert len(target.received) == 2
    last = fake_openai.bodies()[-1]["messages"]
    assert [m["role"] for m in last[-4:]] == ["assistant", "tool", "assistant", "tool"]
    assert [m["tool_call_id"] for m in last if m["role"] == "tool"] == ["post-1", "post-2"]
    assert json.loads(last[-1]["content"])["status"] == 200
    run = api.alice.get(f"/v1/runs/{new}").json["run"]
    assert (run["retry_of"], run["resumed_from"], run["source"]) == (old, 4, "manual")
    assert api.alice.get(f"/v1/runs/{old}").json["run"]["resumed_from"] is None
    # the new run's effects are its own call only: the folded steps cost nothing again
    effects = rows(api.url, "SELECT kind FROM effects WHERE run_id = %s", new)
    assert [e["kind"] for e in effects] == ["model_call"]
    # its log: steps 1-4 taken over (attempt 0, never made by it), step 5 made again by its first attempt
    steps = rows(api.url, "SELECT n, kind, state, attempt FROM run_steps WHERE run_id = %s ORDER BY n", new)
    assert [(s["n"], s["kind"], s["state"], s["attempt"]) for s in steps] == [
        (1, "model", "succeeded", 0), (2, "tool", "succeeded", 0), (3, "model", "succeeded", 0),
        (4, "tool", "succeeded", 0), (5, "model", "succeeded", 1)]
    listed = api.alice.get(f"/v1/runs/{new}/steps")
    assert listed.status == 200, listed.text
    assert [s["n"] if "n" in s else s["step"] for s in listed.json["steps"]] == [1, 2, 3, 4, 5]
    old_steps = rows(api.url, "SELECT n, state FROM run_steps WHERE run_id = %s ORDER BY n", old)
    assert old_steps[-1] == {"n": 5, "state": "failed"}


def test_a_test_run_retries_from_its_last_step_as_a_test_run(
        api: Api, db: Database, fake_openai: FakeOpenAI, target: Peer) -> None:
    old = failed_at_step_five(api, db, fake_openai, target, test=True)
    assert target.received == []  # a test run sends nothing

    retried = api.alice.post(f"/v1/runs/{old}/retry", {"from": "last_step"})

    assert retried.status == 202, retried.text
    assert process(db, uuid.UUID(retried.json["run_id"]), settings=OPENAI_SETTINGS).result == "succeeded"
    run = api.alice.get(f"/v1/runs/{retried.json['run_id']}").json["run"]
    assert (run["source"], run["test"], run["resumed_from"]) == ("test", True, 4)
    assert len(fake_openai.requests) == 4 and target.received == []


def test_a_run_with_an_ambiguous_step_answers_409_naming_it(api: Api) -> None:
    schedule = factories.schedule(api.url, owner="alice", cron="0 7 * * *")
    failed = factories.run(api.url, schedule_row=schedule, state="failed")
    with psycopg.connect(api.url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO effects (id, run_id, fence, attempt, step, kind, mutation, target, request_digest, state,"
            " settled_at) VALUES (%s, %s, 1, 1, 'tool:2', 'http_call', true, 'https://t.example/', 'd',"
            " 'ambiguous', %s)", (uuid.uuid4(), failed["id"], datetime.now(UTC)))

    answer = api.alice.post(f"/v1/runs/{failed['id']}/retry", {"from": "last_step"})

    assert answer.status == 409, answer.text
    assert answer.json["error"]["code"] == "ambiguous_effect"
    assert "tool:2" in answer.json["error"]["message"]
    assert answer.json["error"]["fields"][0]["field"] == "step"
    assert rows(api.url, "SELECT 1 FROM runs WHERE retry_of = %s", failed["id"]) == []


def test_a_retry_body_other_than_last_step_is_422(api: Api) -> None:
    schedule = factories.schedule(api.url, owner="alice", cron="0 7 * * *")
    failed = factories.run(api.url, schedule_row=schedule, state="failed")
    answer = api.alice.post(f"/v1/runs/{failed['id']}/retry", {"from": "step_3"})
    assert answer.status == 422, answer.text
    assert api.alice.post(f"/v1/runs/{failed['id']}/retry", {"from": "last_step"}).status == 202


def test_the_cli_retries_from_the_last_step(
        api: Api, db: Database, fake_openai: FakeOpenAI, target: Peer, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from kairos import cli

    monkeypatch.setenv("RUN_QUEUE_URL", api.queue_url)
    old = failed_at_step_five(api, db, fake_openai, target)

    code = cli.main(["runs", "retry", old, "--from-last-step", "--json"])

    out = capsys.readouterr()
    assert code == 0, out.err
    new = json.loads(out.out)["run_id"]
    assert rows(api.url, "SELECT retry_of, resumed_from FROM runs WHERE id = %s", new) == [
        {"retry_of": uuid.UUID(old), "resumed_from": 4}]
