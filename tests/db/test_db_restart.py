"""A database restart and outage, through the public handlers (issue 37, item 14).

What RDS Proxy and an Aurora failover need of the API, the tick and the pool, rehearsed on a PostgreSQL
of this module's own (an embedded server: ``pg_ctl restart -m immediate`` and ``pg_ctl stop`` on it
never touch the session's shared server), with the handlers' per-process pool
(``kairos.runtime.database``) holding four idle connections when the server goes:

* right after an immediate restart the API's first GET and first POST, the next tick and the next
  run worker invocation succeed: a connection the restart ended is never handed out; a run whose
  model call spans the restart finishes in the same attempt;
* a connection that fails in use (a network that says nothing until the connection is used) is
  discarded: a GET is tried once more on a fresh one, a write answers 503 with ``Retry-After``;
* while the server is down a webhook delivery answers 503 with ``Retry-After`` within 10 s (API
  Gateway gives up at 29 s), and once it is back the next delivery is accepted at once (no
  reconnection back-off left to wait out).

Every pooled connection counts as "returned a moment ago" here (``CHECK_AFTER_IDLE_SECONDS``), however
long the restart takes on a loaded machine: the case where the pool used to skip its check.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from kairos import db, migrations, runtime
from kairos.execution.execute import process
from kairos.executors.base import PreparedCall, Reply
from kairos.local.postgres import LocalPostgres
from kairos.local.stack import load_function
from tests.support.api import Api, count, hook, rows
from tests.support.aws import LambdaContext, run_body, scheduled_event, sqs_event
from tests.support.executors import ScriptedExecutor

tick_app = load_function("tick")
run_app = load_function("run")
TEMPLATE = "kairos_restart_template"
POOL_SIZE = 4  # runtime.database()'s pool: db.shared's default max_size
_names = itertools.count()


@pytest.fixture(scope="module")
def server() -> Iterator[LocalPostgres]:
    """This module's own PostgreSQL, with a migrated template database."""
    pg = LocalPostgres()
    try:
        with psycopg.connect(pg.url(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE)))
        migrations.apply(pg.url(TEMPLATE))
        yield pg
    finally:
        pg.stop()


@pytest.fixture
def db_url(server: LocalPostgres) -> Iterator[str]:
    """A fresh database on this module's server (replaces the session's ``db_url`` for the ``api`` fixture)."""
    name = f"kairos_restart_{next(_names)}"
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(TEMPLATE)))
    try:
        yield server.url(name)
    finally:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(autouse=True)
def _connections_count_as_just_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(db, "CHECK_AFTER_IDLE_SECONDS", 3600.0)


def fill_pool() -> None:
    """The handlers' pool holds ``POOL_SIZE`` idle connections, each just used (as after some traffic)."""
    database = runtime.database()
    with ExitStack() as stack:
        for _ in range(POOL_SIZE):
            stack.enter_context(database.transaction()).execute("SELECT 1")


def tick() -> dict[str, Any]:
    report: dict[str, Any] = tick_app.handler(scheduled_event("2026-03-02T07:00:00Z"), LambdaContext())
    return report


def due_schedule(api: Api) -> str:
    """An hourly schedule whose next fire is a minute ago (database clock): the next tick fires it."""
    conversation = api.conversation()
    anchor = datetime.now().astimezone() - timedelta(days=1)
    answer = api.alice.post("/v1/schedules", {"conversation_id": conversation["id"], "prompt": "brief me",
                                              "kind": "interval", "interval_seconds": 3600,
                                              "starts_at": anchor.isoformat()})
    assert answer.status == 201, answer.text
    schedule_id = str(answer.json["schedule"]["id"])
    rows(api.url, "UPDATE schedules SET next_fire_at = now() - interval '1 minute' WHERE id = %(id)s RETURNING id",
         {"id": schedule_id})
    return schedule_id


def new_conversation(api: Api) -> Any:
    return api.alice.post("/v1/conversations", {"agent": {"executor": "echo", "model": "echo"}, "title": "after"})


def test_the_first_get_and_post_right_after_an_immediate_restart_answer_correctly(
        api: Api, server: LocalPostgres) -> None:
    conversation = api.conversation()
    fill_pool()
    server.restart(mode="immediate")

    first = api.alice.get(f"/v1/conversations/{conversation['id']}")
    assert first.status == 200, first.text
    assert first.json["conversation"]["id"] == conversation["id"]
    then = new_conversation(api)
    assert then.status == 201, then.text

    fill_pool()
    server.restart(mode="immediate")

    first_write = new_conversation(api)
    assert first_write.status == 201, first_write.text
    listed = api.alice.get("/v1/conversations")
    assert listed.status == 200, listed.text
    made = {conversation["id"], then.json["conversation"]["id"], first_write.json["conversation"]["id"]}
    assert {c["id"] for c in listed.json["conversations"]} == made


def test_the_tick_succeeds_on_its_first_invocation_after_an_immediate_restart(api: Api, server: LocalPostgres) -> None:
    schedule_id = due_schedule(api)
    fill_pool()

    server.restart(mode="immediate")

    report = tick()
    assert report["dispatched"] == 1, report
    [sent] = api.messages()
    [run] = rows(api.url, "SELECT id, schedule_id, state FROM runs")
    assert (sent["run_id"], str(run["schedule_id"]), run["state"]) == (str(run["id"]), schedule_id, "queued")


def test_the_run_worker_succeeds_on_its_first_invocation_after_an_immediate_restart(
        api: Api, server: LocalPostgres) -> None:
    due_schedule(api)
    assert tick()["dispatched"] == 1
    [message] = api.messages()
    fill_pool()

    server.restart(mode="immediate")

    response = run_app.handler(sqs_event(run_body(uuid.UUID(message["run_id"]))), LambdaContext())
    assert response["batchItemFailures"] == [], response
    [run] = rows(api.url, "SELECT state, attempt FROM runs WHERE id = %(id)s", {"id": message["run_id"]})
    assert (run["state"], run["attempt"]) == ("succeeded", 1)


def test_a_run_whose_model_call_spans_an_immediate_restart_succeeds_with_one_call_and_a_whole_trace(
        api: Api, server: LocalPostgres) -> None:
    """The restart happens while the worker waits on the model (no connection held): its next transaction
    gets a live connection, so the run finishes in this attempt — the model is not called again by a
    rescue — and its trace has no gap."""
    due_schedule(api)
    assert tick()["dispatched"] == 1
    [message] = api.messages()
    run_id = uuid.UUID(message["run_id"])
    fill_pool()

    def restart_during_the_call(prepared: PreparedCall, timeout: float) -> Reply:
        server.restart(mode="immediate")
        return Reply(content="the answer", usage={"prompt_tokens": 3, "completion_tokens": 5})

    model = ScriptedExecutor(on_send=restart_during_the_call)
    outcome = process(runtime.database(), run_id, settings=runtime.settings(), executor_factory=model.factory)

    assert (outcome.result, outcome.state) == ("succeeded", "succeeded"), outcome
    assert len(model.requests) == 1
    events = rows(api.url, "SELECT seq, type, attempt FROM run_events WHERE run_id = %(id)s ORDER BY seq",
                  {"id": run_id})
    assert [e["seq"] for e in events] == list(range(events[0]["seq"], events[0]["seq"] + len(events)))
    assert {e["attempt"] for e in events if e["type"] != "run.queued"} == {1}
    assert events[-1]["type"] == "run.succeeded"


def test_a_connection_that_fails_in_use_is_discarded_a_get_is_tried_again_and_a_write_answers_503(
        api: Api, server: LocalPostgres, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a network that shows nothing on an idle connection the server has lost (no goodbye reaches
    # the client before it sends), so the connections are handed out and fail when used
    monkeypatch.setattr(db, "_has_input", lambda conn: False, raising=False)
    # ... and the pool's check finds nothing either: with the pool larger than what fill_pool fills, a
    # connection it never handed out would be checked, found dead and replaced by a fresh one, and the
    # write would then succeed (a race on which connection comes first, lost under load).
    monkeypatch.setattr(db, "_check_connection", lambda conn: None)
    conversation = api.conversation()
    fill_pool()
    server.restart(mode="immediate")

    read = api.alice.get(f"/v1/conversations/{conversation['id']}")
    assert read.status == 200, read.text
    assert read.json["conversation"]["id"] == conversation["id"]

    fill_pool()
    server.restart(mode="immediate")

    print("STATS", runtime.database()._pool.get_stats())
    write = new_conversation(api)
    print("STATS2", runtime.database()._pool.get_stats())
    assert write.status == 503, write.text
    assert write.error["code"] == "service_unavailable"
    assert write.headers.get("Retry-After") == "5"
    assert count(api, "conversations") == 1, "the refused write changed nothing"
    again = new_conversation(api)
    assert again.status == 201, again.text  # the failed connection and its idle siblings were discarded
    assert count(api, "conversations") == 2


@pytest.mark.slow
def test_deliveries_while_the_database_is_down_answer_503_in_time_and_the_next_one_is_accepted_at_once(
        api: Api, server: LocalPostgres) -> None:
    _, token = api.webhook_schedule()
    assert hook(api, token, {"n": 0}, headers={"idempotency-key": "before"}).status == 202
    fill_pool()

    server.halt(mode="immediate")
    try:
        during = []
        for n in (1, 2):
            if n == 2:  # a container that starts during the outage: no pooled connection, no server
                db.close_shared()
            started = time.monotonic()
            answer = hook(api, token, {"n": n}, headers={"idempotency-key": f"during-{n}"})
            during.append((answer, time.monotonic() - started))
    finally:
        server.start()

    took = [round(t, 1) for _, t in during]
    assert max(took) < 10, f"answered after {took} s (API Gateway gives up at 29 s)"
    for answer, _ in during:
        assert answer.status == 503, answer.text
        assert answer.error["code"] == "service_unavailable"
        assert answer.headers.get("Retry-After") == "5"

    started = time.monotonic()
    after = hook(api, token, {"n": 3}, headers={"idempotency-key": "after"})
    took_after = time.monotonic() - started
    assert after.status == 202, after.text
    # The old pool waited out its reconnect back-off (29.5 s here); 10 s leaves a loaded machine room.
    assert took_after < 10, f"the pool took {took_after:.1f} s to reconnect to a server that was back"
    keys = rows(api.url, "SELECT idempotency_key FROM occurrences ORDER BY fire_at")
    assert [k["idempotency_key"] for k in keys] == ["before", "after"], "the refused deliveries recorded nothing"
    assert uuid.UUID(after.json["run_id"])
