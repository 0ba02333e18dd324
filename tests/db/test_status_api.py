"""``GET /v1/status``, the console's operator status, on real PostgreSQL and moto's SQS.

Given schedules and runs of two owners, the caller sees only their own due backlog (active schedules
whose next fire has passed; paused ones do not count), the fire lag of the oldest one, and their runs
in flight; the dead-letter depth is the deployment's (RUN_DLQ_URL), and null when it is not set or SQS
does not answer — the status still answers. No principal: 401 before any database work.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from kairos import runtime
from tests import factories
from tests.support.api import Api


def test_the_status_counts_only_the_callers_due_schedules_and_runs(api: Api) -> None:
    now = datetime.now(UTC)
    oldest = factories.schedule(api.url, owner="alice", next_fire_at=now - timedelta(minutes=10))
    factories.schedule(api.url, owner="alice", next_fire_at=now - timedelta(minutes=1))
    factories.schedule(api.url, owner="alice", next_fire_at=now + timedelta(hours=1))  # not due
    factories.schedule(api.url, owner="alice", status="paused", next_fire_at=now - timedelta(hours=2))
    factories.schedule(api.url, owner="bob", next_fire_at=now - timedelta(days=1))
    factories.run(api.url, schedule_row=oldest, state="queued")
    factories.run(api.url, schedule_row=oldest, state="running", fire_at=now - timedelta(minutes=30))
    factories.run(api.url, schedule_row=oldest, state="succeeded", fire_at=now - timedelta(minutes=40))

    answer = api.alice.get("/v1/status")

    assert answer.status == 200, answer.text
    status = answer.json["status"]
    assert status["due_backlog"] == 2
    assert 9 * 60 <= status["fire_lag_seconds"] < 11 * 60
    assert (status["queued"], status["running"], status["awaiting_approval"]) == (1, 1, 0)
    assert status["dlq_depth"] is None  # RUN_DLQ_URL is not set
    bob = api.bob.get("/v1/status").json["status"]
    assert (bob["due_backlog"], bob["queued"], bob["running"]) == (1, 0, 0) and bob["fire_lag_seconds"] > 86000


def test_nothing_due_is_no_lag(api: Api) -> None:
    status = api.alice.get("/v1/status").json["status"]
    assert (status["due_backlog"], status["fire_lag_seconds"], status["oldest_due_at"]) == (0, 0, None)


def test_the_dlq_depth_is_read_from_the_dead_letter_queue(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    dlq = api.sqs.create_queue(QueueName="runs-dlq")["QueueUrl"]
    for n in range(3):
        api.sqs.send_message(QueueUrl=dlq, MessageBody=f'{{"run_id": "{n}"}}')
    monkeypatch.setenv("RUN_DLQ_URL", dlq)
    runtime.reset()
    assert api.alice.get("/v1/status").json["status"]["dlq_depth"] == 3


def test_an_unreadable_dlq_leaves_the_depth_unknown_and_the_status_answers(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUN_DLQ_URL", "https://sqs.us-east-1.amazonaws.com/123456789012/no-such-queue")
    runtime.reset()
    answer = api.alice.get("/v1/status")
    assert answer.status == 200 and answer.json["status"]["dlq_depth"] is None


def test_the_status_needs_a_principal(api: Api) -> None:
    assert api.anonymous.get("/v1/status").status == 401
