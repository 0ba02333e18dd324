"""The settle step: ended runs are accounted to their schedule once, in finished order; 3 failures pause."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row

from kairos.db import Database
from kairos.tick import Settle
from tests import factories
from tests.support.aws import SqsQueue

T = datetime(2026, 3, 2, 7, 0, tzinfo=UTC)


def settle(db: Database, queue: SqsQueue) -> Settle:
    return Settle(db, queue.client, queue.url)


def one(url: str, query: str, *args: Any) -> dict[str, Any]:
    with psycopg.connect(url, row_factory=dict_row) as conn:
        row = conn.execute(query, args).fetchone()
    assert row is not None
    return row


def ended(url: str, sched: dict[str, Any], state: str, minute: int) -> dict[str, Any]:
    """A run of ``sched`` that ended in ``state`` at T + ``minute`` minutes."""
    return factories.run(url, schedule_row=sched, state=state, fire_at=T + timedelta(minutes=minute),
                         finished_at=T + timedelta(minutes=minute, seconds=30))


def failures(url: str, sched: dict[str, Any]) -> int:
    row = one(url, "SELECT consecutive_failures FROM schedules WHERE id = %s", sched["id"])
    return int(row["consecutive_failures"])


def test_failed_adds_one_succeeded_resets_other_ends_change_nothing(db: Database, db_url: str,
                                                                    sqs_queue: SqsQueue) -> None:
    sched = factories.schedule(db_url)
    ended(db_url, sched, "failed", 0)
    ended(db_url, sched, "cancelled", 1)
    ended(db_url, sched, "abandoned", 2)
    report = settle(db, sqs_queue).run_once(now=T + timedelta(hours=1))
    assert report.settled == 3 and failures(db_url, sched) == 1

    ended(db_url, sched, "succeeded", 3)
    settle(db, sqs_queue).run_once(now=T + timedelta(hours=1))
    assert failures(db_url, sched) == 0


def test_runs_are_counted_in_the_order_they_finished(db: Database, db_url: str, sqs_queue: SqsQueue) -> None:
    sched = factories.schedule(db_url)
    # Inserted out of order; finished: failed, failed, succeeded, failed -> 1 in a row.
    ended(db_url, sched, "failed", 9)
    ended(db_url, sched, "succeeded", 5)
    ended(db_url, sched, "failed", 1)
    ended(db_url, sched, "failed", 2)
    settle(db, sqs_queue).run_once()
    assert failures(db_url, sched) == 1


def test_each_run_is_settled_once(db: Database, db_url: str, sqs_queue: SqsQueue) -> None:
    sched = factories.schedule(db_url)
    run = ended(db_url, sched, "failed", 0)
    s = settle(db, sqs_queue)
    assert s.run_once().settled == 1
    assert s.run_once().settled == 0
    assert failures(db_url, sched) == 1
    assert one(db_url, "SELECT settled_at FROM runs WHERE id = %s", run["id"])["settled_at"] is not None


def test_unfinished_runs_are_not_settled(db: Database, db_url: str, sqs_queue: SqsQueue) -> None:
    sched = factories.schedule(db_url)
    factories.run(db_url, schedule_row=sched, state="running", fire_at=T)
    factories.run(db_url, schedule_row=sched, state="queued", fire_at=T + timedelta(minutes=1))
    assert settle(db, sqs_queue).run_once().settled == 0


def test_three_failures_in_a_row_pause_the_schedule_with_one_note(db: Database, db_url: str,
                                                                  sqs_queue: SqsQueue) -> None:
    sched = factories.schedule(db_url)
    s = settle(db, sqs_queue)
    ended(db_url, sched, "failed", 0)
    ended(db_url, sched, "failed", 1)
    assert s.run_once().paused == 0
    assert one(db_url, "SELECT status FROM schedules WHERE id = %s", sched["id"])["status"] == "active"

    ended(db_url, sched, "failed", 2)
    assert s.run_once().paused == 1
    after = one(db_url, "SELECT * FROM schedules WHERE id = %s", sched["id"])
    assert after["status"] == "paused" and after["revision"] == sched["revision"] + 1
    # The newest note; each failed run also left its own run_ended note (the default notify).
    note = one(db_url, "SELECT * FROM inbox_notes WHERE conversation_id = %s ORDER BY id DESC LIMIT 1",
               sched["conversation_id"])
    assert note["kind"] == "schedule_paused" and note["box"] == "notes"
    assert note["body"] == {"schedule_id": str(sched["id"]), "reason": "3 consecutive failures", "failures": 3}

    ended(db_url, sched, "failed", 3)  # a run that was still going when the schedule paused
    assert s.run_once().paused == 0 and failures(db_url, sched) == 4
    count = one(db_url, "SELECT count(*) AS n FROM inbox_notes WHERE conversation_id = %s AND kind = 'schedule_paused'",
                sched["conversation_id"])
    assert count["n"] == 1


def test_a_success_between_failures_prevents_the_pause(db: Database, db_url: str, sqs_queue: SqsQueue) -> None:
    sched = factories.schedule(db_url)
    for minute, state in enumerate(["failed", "failed", "succeeded", "failed", "failed"]):
        ended(db_url, sched, state, minute)
    report = settle(db, sqs_queue).run_once()
    assert report.paused == 0 and failures(db_url, sched) == 2


def test_concurrent_settlers_count_every_run_exactly_once(db: Database, db_url: str, sqs_queue: SqsQueue) -> None:
    """Eight settlers at once over two schedules: the counts equal the runs, never more."""
    scheds = [factories.schedule(db_url), factories.schedule(db_url)]
    for sched in scheds:
        for minute in range(12):
            ended(db_url, sched, "failed", minute)
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []
    settled: list[int] = []

    def worker() -> None:
        try:
            barrier.wait()
            for _ in range(3):
                settled.append(settle(db, sqs_queue).run_once().settled)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sum(settled) == 24
    assert [failures(db_url, s) for s in scheds] == [12, 12]
    notes = one(db_url, "SELECT count(*) AS n FROM inbox_notes WHERE kind = 'schedule_paused'")
    assert notes["n"] == 2
