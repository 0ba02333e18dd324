"""RunFunction end to end: SQS batch events (moto SQS for the retry handoff), real PostgreSQL, the real
handler with its decorators. One bad or failing record never takes the good ones with it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from kairos import db as kairos_db
from kairos import runtime
from kairos.db import Database, Row
from kairos.execution import sqs
from kairos.local.stack import load_function
from kairos.settings import Settings
from tests import factories
from tests.support.aws import LambdaContext, SqsQueue, run_body, sqs_event

ROOT = Path(__file__).resolve().parents[2]
REFUSED_PORT_AGENT = {"executor": "openai", "model": "m", "base_url": "http://127.0.0.1:1/v1"}


app = load_function("run")


@dataclass
class Stack:
    db_url: str
    queue_url: str
    sqs: Any


@pytest.fixture
def stack(db_url: str, sqs_queue: SqsQueue, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("KAIROS_EGRESS_ALLOW", "127.0.0.1")
    monkeypatch.setenv("RUN_QUEUE_URL", sqs_queue.url)
    runtime.reset()
    try:
        yield Stack(db_url, sqs_queue.url, sqs_queue.client)
    finally:
        runtime.database().close()
        kairos_db._databases.pop(db_url, None)
        runtime.reset()


def state(url: str, run_id: uuid.UUID) -> dict[str, Any]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        row = conn.execute("SELECT state, attempt, handoff_count FROM runs WHERE id = %s", (run_id,)).fetchone()
        terminal = conn.execute(
            "SELECT count(*) AS n FROM run_events WHERE run_id = %s AND type LIKE 'run.%%' AND type <> 'run.claimed'"
            " AND type <> 'run.queued'", (run_id,)).fetchone()
    assert row is not None and terminal is not None
    return {**row, "terminal_events": terminal["n"]}


def test_bad_records_are_acknowledged_alone_and_good_records_run(
        stack: Stack, caplog: pytest.LogCaptureFixture, lambda_context: LambdaContext) -> None:
    good_a, good_b = factories.run(stack.db_url), factories.run(stack.db_url)
    event = sqs_event(
        run_body(good_a["id"]),
        "not json at all SECRET-BODY",
        json.dumps({"run_id": "not-a-uuid"}),
        json.dumps({"run_id": str(uuid.uuid4()), "extra": "field"}),
        json.dumps([str(good_a["id"])]),
        run_body(uuid.uuid4()),  # a well-formed id no database here knows
        run_body(good_b["id"]),
    )

    response = app.handler(event, lambda_context)

    assert response == {"batchItemFailures": []}
    assert state(stack.db_url, good_a["id"])["state"] == "succeeded"
    assert state(stack.db_url, good_b["id"])["state"] == "succeeded"
    logs = [vars(record) for record in caplog.records]
    bad = [entry for entry in logs if entry.get("action") == "bad_record"]
    assert len(bad) == 4 and all(entry.get("message_id") for entry in bad)
    assert [entry for entry in logs if entry.get("action") == "run_unknown"]
    assert not any("SECRET-BODY" in json.dumps(entry, default=str) for entry in logs)


def test_five_copies_of_one_message_in_one_batch_execute_once(stack: Stack, lambda_context: LambdaContext) -> None:
    run = factories.run(stack.db_url)

    response = app.handler(sqs_event(*[run_body(run["id"])] * 5), lambda_context)

    assert response == {"batchItemFailures": []}
    assert state(stack.db_url, run["id"]) == {"state": "succeeded", "attempt": 1, "handoff_count": 0,
                                              "terminal_events": 1}


class FlakyDatabase(Database):
    """A real pool whose next transaction loses its server connection (the backend is terminated)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.break_next = True

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection[Row]]:
        with super().transaction() as conn:
            if self.break_next:
                self.break_next = False
                conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
            yield conn


def test_a_transient_database_error_fails_only_its_own_record(stack: Stack, lambda_context: LambdaContext) -> None:
    first, second = factories.run(stack.db_url), factories.run(stack.db_url)
    event = sqs_event(run_body(first["id"]), "garbage", run_body(second["id"]))
    flaky = FlakyDatabase(stack.db_url)
    by_message = {event["Records"][0]["messageId"]: first["id"], event["Records"][2]["messageId"]: second["id"]}
    try:
        # The good records execute at once: whichever borrowed first lost its connection.
        response = sqs.handle_batch(event, lambda_context, db=flaky, settings=Settings.from_env())
        [failure] = response["batchItemFailures"]
        broken = by_message[failure["itemIdentifier"]]
        [other] = [run_id for run_id in by_message.values() if run_id != broken]
        assert state(stack.db_url, broken)["state"] == "queued"  # nothing claimed: delivered again
        assert state(stack.db_url, other)["state"] == "succeeded"

        again = sqs.handle_batch(sqs_event(run_body(broken)), lambda_context, db=flaky,
                                    settings=Settings.from_env())
        assert again == {"batchItemFailures": []}
        assert state(stack.db_url, broken)["state"] == "succeeded"
    finally:
        flaky.close()


def test_a_retry_safe_failure_is_sent_again_with_a_delay(stack: Stack, lambda_context: LambdaContext) -> None:
    sched = factories.schedule(stack.db_url, agent=REFUSED_PORT_AGENT)
    run = factories.run(stack.db_url, schedule_row=sched)

    response = app.handler(sqs_event(run_body(run["id"])), lambda_context)

    assert response == {"batchItemFailures": []}
    assert state(stack.db_url, run["id"]) == {"state": "queued", "attempt": 1, "handoff_count": 1,
                                              "terminal_events": 0}
    attributes = stack.sqs.get_queue_attributes(
        QueueUrl=stack.queue_url, AttributeNames=["ApproximateNumberOfMessagesDelayed",
                                                  "ApproximateNumberOfMessages"])["Attributes"]
    assert attributes["ApproximateNumberOfMessagesDelayed"] == "1"
    assert attributes["ApproximateNumberOfMessages"] == "0"


def test_without_a_queue_a_retry_is_redelivered_by_sqs(stack: Stack, lambda_context: LambdaContext) -> None:
    sched = factories.schedule(stack.db_url, agent=REFUSED_PORT_AGENT)
    run = factories.run(stack.db_url, schedule_row=sched)
    event = sqs_event(run_body(run["id"]))
    database = Database(stack.db_url)
    try:
        response = sqs.handle_batch(event, lambda_context, db=database,
                                       settings=Settings(egress_allow=("127.0.0.1",)))
    finally:
        database.close()
    assert response == {"batchItemFailures": [{"itemIdentifier": event["Records"][0]["messageId"]}]}
    assert state(stack.db_url, run["id"])["state"] == "queued"


def test_an_invocation_short_of_time_does_not_claim(stack: Stack) -> None:
    run = factories.run(stack.db_url)
    event = sqs_event(run_body(run["id"]))

    response = app.handler(event, LambdaContext(remaining_ms=20_000))

    assert response == {"batchItemFailures": [{"itemIdentifier": event["Records"][0]["messageId"]}]}
    assert state(stack.db_url, run["id"])["attempt"] == 0


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('{"run_id": "9e7d6c5b-4a39-5281-a0b1-c2d3e4f5a603"}', uuid.UUID("9e7d6c5b-4a39-5281-a0b1-c2d3e4f5a603")),
        ('{"run_id": "9E7D6C5B-4A39-5281-A0B1-C2D3E4F5A603"}', uuid.UUID("9e7d6c5b-4a39-5281-a0b1-c2d3e4f5a603")),
        ('{"run_id": "{9e7d6c5b-4a39-5281-a0b1-c2d3e4f5a603}"}', None),
        ('{"run_id": "9e7d6c5b4a395281a0b1c2d3e4f5a603"}', None),
        ('{"run_id": 5}', None),
        ("{}", None),
        ("", None),
        ("null", None),
    ],
)
def test_only_the_exact_body_shape_names_a_run(body: str, expected: uuid.UUID | None) -> None:
    assert sqs.parse_run_id(body) == expected


@pytest.mark.parametrize(
    "event",
    [
        pytest.param({}, id="no-records"),
        pytest.param({"Records": None}, id="records-null"),
        pytest.param({"Records": []}, id="records-empty"),
        pytest.param({"Records": "not a list"}, id="records-not-a-list"),
        pytest.param({"detail-type": "Scheduled Event", "source": "aws.events"}, id="another-service"),
    ],
)
def test_an_event_without_sqs_records_is_refused_in_one_line_and_acknowledged(
        stack: Stack, event: dict[str, Any], caplog: pytest.LogCaptureFixture, lambda_context: LambdaContext) -> None:
    response = app.handler(event, lambda_context)

    assert response == {"batchItemFailures": []}
    refusals = [vars(r) for r in caplog.records if getattr(r, "action", None) == "bad_event"]
    assert len(refusals) == 1
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


def test_records_without_an_id_or_a_body_are_refused_and_the_good_ones_run(
        stack: Stack, caplog: pytest.LogCaptureFixture, lambda_context: LambdaContext) -> None:
    good = factories.run(stack.db_url)
    event = sqs_event(run_body(good["id"]))
    no_id = {k: v for k, v in event["Records"][0].items() if k != "messageId"}
    no_id["body"] = run_body(uuid.uuid4())
    no_body = {**event["Records"][0], "messageId": "m-without-body"}
    del no_body["body"]
    numeric_body = {**event["Records"][0], "messageId": "m-numeric-body", "body": 7}
    event["Records"] += [no_id, no_body, numeric_body, "not a record", None]

    response = app.handler(event, lambda_context)

    # Nothing is sent back for garbage (it names no run SQS could deliver again), the good record ran.
    assert response == {"batchItemFailures": []}
    assert state(stack.db_url, good["id"])["state"] == "succeeded"
    refusals = [vars(r) for r in caplog.records if getattr(r, "action", None) == "bad_record"]
    assert [r["index"] for r in refusals] == [1, 2, 3, 4, 5]
    assert [r["missing"] for r in refusals] == ["messageId", "body", "body", "messageId", "messageId"]
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
