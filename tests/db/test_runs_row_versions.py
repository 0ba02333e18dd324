"""One row version of a run per worker transaction.

A transaction that updates a run row a second time makes PostgreSQL re-check all four foreign keys
of the row (the old version was written by the same transaction), key-share-locking the run's
occurrence, schedule and conversations — rows every run of a schedule shares. The worker therefore
folds each state change and its trace events into one statement (``kairos.trace.change``) and the
claim writes ``run.claimed`` and ``step.started`` itself. A trigger counts the updates of each run
row per transaction; without the folding these tests fail.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row

from kairos import handoff
from kairos.db import Database
from kairos.db import q as db_query
from kairos.execution.execute import process
from kairos.executors.base import ExecutorError
from kairos.runs import moves
from kairos.settings import Settings
from kairos.tick import Repair, Tick
from tests import factories
from tests.support.executors import ScriptedExecutor, raising

SETTINGS = Settings()


def _count_updates(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("""
            CREATE TABLE run_updates (xid xid8 NOT NULL, run_id uuid NOT NULL, state text NOT NULL);
            CREATE FUNCTION log_run_update() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO run_updates VALUES (pg_current_xact_id(), NEW.id, NEW.state);
                RETURN NULL;
            END $$;
            CREATE TRIGGER log_run_update AFTER UPDATE ON runs FOR EACH ROW EXECUTE FUNCTION log_run_update();
        """)


def _updates_per_transaction(url: str, run_id: Any) -> list[int]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        rows = conn.execute("""SELECT count(*) AS n FROM run_updates WHERE run_id = %s
                               GROUP BY xid ORDER BY min(xid::text::numeric)""", (run_id,)).fetchall()
    return [int(r["n"]) for r in rows]


def test_a_successful_append_run_writes_its_row_once_per_transaction(db: Database, db_url: str) -> None:
    _count_updates(db_url)
    run = factories.run(db_url, mode="append")
    outcome = process(db, run["id"], settings=SETTINGS, executor_factory=ScriptedExecutor().factory,
                           heartbeat_interval=3600)
    assert outcome.result == "succeeded"
    # claim (+ run.claimed, step.started), reserve (+ effect.reserved), publish (settle, answer,
    # output.published, step.finished, run.succeeded): three transactions, one row version each.
    assert _updates_per_transaction(db_url, run["id"]) == [1, 1, 1]


def test_failure_and_retry_endings_write_the_row_once(db: Database, db_url: str) -> None:
    _count_updates(db_url)
    retried = factories.run(db_url, mode="append")
    failing = ScriptedExecutor(on_send=raising(ExecutorError("connect_failed", "refused", retry_safe=True)))
    assert process(db, retried["id"], settings=SETTINGS, executor_factory=failing.factory,
                        heartbeat_interval=3600).result == "retry"
    failed = factories.run(db_url, mode="append")
    broken = ScriptedExecutor(on_send=raising(ExecutorError("reply_too_large", "too long")))
    assert process(db, failed["id"], settings=SETTINGS, executor_factory=broken.factory,
                        heartbeat_interval=3600).result == "failed"
    assert _updates_per_transaction(db_url, retried["id"]) == [1, 1, 1]
    assert _updates_per_transaction(db_url, failed["id"]) == [1, 1, 1]


def test_a_fork_run_records_its_new_conversation_in_the_claim_transaction(db: Database, db_url: str) -> None:
    _count_updates(db_url)
    run = factories.run(db_url, mode="fork")
    assert process(db, run["id"], settings=SETTINGS, executor_factory=ScriptedExecutor().factory,
                        heartbeat_interval=3600).result == "succeeded"
    # The claim statement creates the fork itself (issue 14: runs_claim's thread_id), so its id is no
    # second write of the claim transaction any more; every transaction stays at one.
    assert _updates_per_transaction(db_url, run["id"]) == [1, 1, 1]


def test_a_heartbeat_updates_the_run_in_place(db: Database, db_url: str) -> None:
    """HOT: the heartbeat's columns are in no index, and the table leaves room on each page."""
    run = factories.run(db_url, mode="append")
    with db.transaction() as conn:
        claimed = moves.claim(conn, run["id"])
    assert claimed is not None
    with psycopg.connect(db_url, autocommit=False) as conn:
        conn.execute(db_query("runs_heartbeat"), {"run_id": run["id"], "fence": claimed["fence"],
                                                   "lease_seconds": moves.LEASE_SECONDS, "now": None})
        counts = conn.execute("""SELECT pg_stat_get_xact_tuples_updated('runs'::regclass),
                                        pg_stat_get_xact_tuples_hot_updated('runs'::regclass)""").fetchone()
    assert counts == (1, 1)


class _RefusingSqs:
    """An SQS client that accepts nothing: the tick commits its runs and leaves every one unstamped."""

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        return {"Successful": [], "Failed": [{"Id": e["Id"], "Code": "ServiceUnavailable", "SenderFault": False}
                                             for e in Entries]}


def test_the_handoff_stamp_updates_a_fired_batch_of_runs_in_place(db: Database, db_url: str) -> None:
    """runs_handoff_idx names no column the stamp writes, and the pages the tick's insert fills keep
    room for a run on them to be updated in place (migration 0019); since runs wait for a slot (0030)
    the release takes that room first, so the stamp is one update a run, not always a HOT one."""
    due = datetime(2026, 3, 2, 7, 0, tzinfo=UTC)
    # Sixty owners, so each run gets one of its owner's slots and is sent (the sends fail: unstamped).
    schedules = [factories.schedule(db_url, owner=f"owner-{i}", cron="* * * * *", next_fire_at=due)
                 for i in range(60)]
    report = Tick(db, _RefusingSqs(), "https://sqs.invalid/q", metrics=None).run(now=due + timedelta(seconds=30))
    assert (report.dispatched, report.handoff_failures) == (60, 60)
    with psycopg.connect(db_url, autocommit=False, row_factory=dict_row) as conn:
        ids = [r["id"] for r in conn.execute("SELECT id FROM runs WHERE schedule_id = ANY(%s) AND handoff_at IS NULL",
                                             ([s["id"] for s in schedules],))]
        assert len(ids) == 60
        assert handoff.stamp(conn, ids) == 60
        counts = conn.execute("""SELECT pg_stat_get_xact_tuples_updated('runs'::regclass) AS updated,
                                        pg_stat_get_xact_tuples_hot_updated('runs'::regclass) AS hot""").fetchone()
    # Each run was first given its owner's slot (admitted_at, migration 0030: a new row version and
    # index entries, in the room fillfactor kept on its page), so its stamp finds that room taken:
    # the stamp writes each row once, but no longer always in place.
    assert counts is not None and counts["updated"] == 60


def test_a_rescue_writes_the_row_once(db: Database, db_url: str) -> None:
    """The tick's rescue moves a run and appends its event in one statement (``kairos.runs.rescue``);
    before, it updated the row and then bumped ``last_seq`` again for the event's append."""
    _count_updates(db_url)
    requeued = factories.run(db_url, state="running", schedule_row=factories.schedule(db_url, catch_up=True),
                             fire_at=datetime(2026, 1, 1, tzinfo=UTC))
    abandoned = factories.run(db_url, state="running", schedule_row=factories.schedule(db_url, catch_up=False),
                              fire_at=datetime(2026, 1, 1, 0, 1, tzinfo=UTC))
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    # An SQS that accepts nothing: the rescue's handoff stamp writes nothing, the move alone is counted.
    report = Repair(db, _RefusingSqs(), "https://sqs.invalid/q").rescue_once(now=row[0] + timedelta(minutes=3))
    assert (report.requeued, report.abandoned) == (1, 1)
    assert _updates_per_transaction(db_url, requeued["id"]) == [1]
    assert _updates_per_transaction(db_url, abandoned["id"]) == [1]
