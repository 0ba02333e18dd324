"""RunFunction with the owner's running slots full (``KAIROS_OWNER_CONCURRENCY``): the record is
acknowledged, the run stays queued and its id goes back on the queue with an SQS delay (moto), never a
redelivery loop; once a slot is free the delayed message runs it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from kairos import db as kairos_db
from kairos import runtime
from kairos.local.stack import load_function
from psycopg.rows import dict_row

from tests import factories
from tests.support.aws import LambdaContext, SqsQueue, run_body, sqs_event

app = load_function("run")


class RecordingSqs:
    """moto's client, with every ``send_message`` call's arguments kept."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.sent: list[dict[str, Any]] = []

    def send_message(self, **kwargs: Any) -> Any:
        self.sent.append(kwargs)
        return self.client.send_message(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


@pytest.fixture
def recorded(db_url: str, sqs_queue: SqsQueue, monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordingSqs]:
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("RUN_QUEUE_URL", sqs_queue.url)
    monkeypatch.setenv("KAIROS_OWNER_CONCURRENCY", "1")
    runtime.reset()
    recording = RecordingSqs(sqs_queue.client)
    monkeypatch.setattr(runtime, "sqs", lambda: recording)
    try:
        yield recording
    finally:
        runtime.database().close()
        kairos_db._databases.pop(db_url, None)
        runtime.reset()


def _run(url: str, run_id: Any) -> dict[str, Any]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        row = conn.execute("SELECT state, attempt, handoff_count, unclaimed_handoffs FROM runs WHERE id = %s",
                           (run_id,)).fetchone()
        events = conn.execute("SELECT type FROM run_events WHERE run_id = %s ORDER BY seq", (run_id,)).fetchall()
    assert row is not None
    return {**row, "events": [e["type"] for e in events]}


def test_a_run_over_the_owners_slots_is_re_sent_with_a_delay_and_acknowledged(
        db_url: str, sqs_queue: SqsQueue, recorded: RecordingSqs, lambda_context: LambdaContext) -> None:
    sched = factories.schedule(db_url)
    holder = factories.run(db_url, schedule_row=sched, source="manual", state="running")
    waiting = factories.run(db_url, schedule_row=sched, source="manual")

    response = app.handler(sqs_event(run_body(waiting["id"])), lambda_context)

    assert response == {"batchItemFailures": []}  # acknowledged: no redelivery loop
    assert [(m["MessageBody"], 30 <= m["DelaySeconds"] <= 60) for m in recorded.sent] == [
        (run_body(waiting["id"]), True)]
    attributes = sqs_queue.client.get_queue_attributes(
        QueueUrl=sqs_queue.url, AttributeNames=["ApproximateNumberOfMessagesDelayed"])["Attributes"]
    assert attributes["ApproximateNumberOfMessagesDelayed"] == "1"
    assert _run(db_url, waiting["id"]) == {"state": "queued", "attempt": 0, "handoff_count": 1,
                                           "unclaimed_handoffs": 1, "events": ["run.deferred"]}

    # The holder ends; the delayed message (delivered here by hand) now runs the waiting run.
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE runs SET state = 'succeeded', lease_token = NULL, lease_expires_at = NULL, "
                     "finished_at = now(), output = '{}' WHERE id = %s", (holder["id"],))
    assert app.handler(sqs_event(run_body(waiting["id"])), lambda_context) == {"batchItemFailures": []}
    assert _run(db_url, waiting["id"])["state"] == "succeeded"
    assert len(recorded.sent) == 1
