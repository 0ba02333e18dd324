"""TickFunction's handler end to end: EventBridge event in, database and moto SQS, report and metrics out."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType

import boto3
import psycopg
import pytest

from kairos import runtime
from kairos.local.stack import load_function
from kairos.observability import METRIC_NAMES, metrics
from tests import factories
from tests.support.aws import LambdaContext, SqsQueue, scheduled_event

APP = Path(__file__).resolve().parents[2] / "functions" / "tick" / "app.py"


def load_app() -> ModuleType:
    return load_function("tick")


@pytest.fixture
def queue_url(db_url: str, sqs_queue: SqsQueue, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("RUN_QUEUE_URL", sqs_queue.url)
    runtime.reset()
    try:
        yield sqs_queue.url
    finally:
        runtime.reset()


def test_the_handler_fires_what_is_due_by_database_time_and_reports(db_url: str, queue_url: str,
                                                                   capsys: pytest.CaptureFixture[str],
                                                                   caplog: pytest.LogCaptureFixture,
                                                                   lambda_context: LambdaContext) -> None:
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    db_now: datetime = row[0]
    due = factories.schedule(db_url, kind="interval", interval_seconds=3600,
                             starts_at=db_now - timedelta(seconds=30), next_fire_at=db_now - timedelta(seconds=30))
    later = factories.schedule(db_url, kind="interval", interval_seconds=3600,
                               starts_at=db_now + timedelta(minutes=30), next_fire_at=db_now + timedelta(minutes=30))
    app = load_app()
    # Tests that drive Tick directly add to the process's one metric set and never flush it (a handler
    # does, every invocation): start this invocation from an empty set, as a Lambda container would.
    metrics.clear_metrics()
    # EventBridge says it is 2030: logged, never used for a decision.
    event = scheduled_event((db_now + timedelta(days=1500)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))

    report = app.handler(event, lambda_context)

    assert report["dispatched"] == 1 and report["schedules"] == 1 and report["handoff_failures"] == 0
    json.dumps(report)  # the handler's answer is plain JSON
    with psycopg.connect(db_url) as conn:
        fired = conn.execute("SELECT schedule_id, id FROM runs").fetchall()
    assert [f[0] for f in fired] == [due["id"]]
    assert later["id"] not in {f[0] for f in fired}
    got = boto3.client("sqs", region_name="us-east-1").receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)
    assert [json.loads(m["Body"]) for m in got["Messages"]] == [{"run_id": str(fired[0][1])}]

    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    emf = [line for line in lines if "_aws" in line]
    assert emf, "metrics were flushed as EMF"
    emitted = {m["Name"] for blob in emf for d in blob["_aws"]["CloudWatchMetrics"] for m in d["Metrics"]}
    assert {"FiresDispatched", "FiresSkipped", "TickDurationMs", "FireLagSeconds", "Rescues"} <= emitted
    assert emitted <= METRIC_NAMES
    assert emf[0]["FiresDispatched"] in (1.0, [1.0])
    invoked = [r for r in caplog.records if getattr(r, "action", None) == "tick_invoked"]
    assert [getattr(r, "event_time", None) for r in invoked] == [event["time"]]


def test_the_handler_stops_starting_batches_when_time_is_short(db_url: str, queue_url: str) -> None:
    factories.schedule(db_url, cron="*/5 * * * *")
    report = load_app().handler(scheduled_event("2026-03-02T07:00:00Z"), LambdaContext(remaining_ms=5_000))
    assert report["stopped_for_time"] is True and report["schedules"] == 0
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM occurrences").fetchone() == (0,)
