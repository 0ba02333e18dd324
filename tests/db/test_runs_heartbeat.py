"""The heartbeat: lease extension under the fence, cancel and lost-lease detection, throttled progress."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from kairos import db, runs, trace
from kairos.db import Database
from kairos.execution.heartbeat import Heartbeat
from kairos.probes import Probes
from kairos.runs import moves
from kairos.states import EventType
from tests import factories

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
WAIT = 30


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _claimed(db: Database, db_url: str, *, now: datetime | None = T0, **columns: Any) -> dict[str, Any]:
    run = factories.run(db_url, **columns)
    with db.transaction() as conn:
        row = moves.claim(conn, run["id"], now=now)
    assert row is not None
    return row


def _lease(db_url: str, run_id: Any) -> dict[str, Any]:
    with psycopg.connect(db_url, row_factory=dict_row, autocommit=True) as conn:
        row = conn.execute("SELECT lease_expires_at, heartbeat_at, fence, state FROM runs WHERE id = %s",
                           (run_id,)).fetchone()
    assert row is not None
    return row


def test_the_claim_takes_a_120_second_lease_and_a_beat_extends_it(db: Database, db_url: str) -> None:
    row = _claimed(db, db_url)
    assert row["lease_expires_at"] == T0 + timedelta(seconds=120)

    beat = Heartbeat(db, row["id"], row["fence"], now=T0 + timedelta(seconds=20))
    assert beat.beat_once() is True

    lease = _lease(db_url, row["id"])
    assert lease["lease_expires_at"] == T0 + timedelta(seconds=140)
    assert lease["heartbeat_at"] == T0 + timedelta(seconds=20)
    assert not beat.should_stop


def test_a_beat_reports_a_cancel_request(db: Database, db_url: str) -> None:
    row = _claimed(db, db_url)
    with db.transaction() as conn:
        runs.cancel(conn, row["id"], owner="alice")

    beat = Heartbeat(db, row["id"], row["fence"])
    assert beat.beat_once() is True  # the lease still holds: the worker ends the run itself
    assert beat.cancel_requested.is_set() and beat.should_stop


def test_a_beat_after_another_claim_reports_the_lease_lost_and_extends_nothing(db: Database, db_url: str) -> None:
    row = _claimed(db, db_url)
    with psycopg.connect(db_url, autocommit=True) as conn:  # rescued and claimed again: fence 2
        conn.execute("UPDATE runs SET state = 'queued', lease_token = NULL, lease_expires_at = NULL WHERE id = %s",
                     (row["id"],))
    with db.transaction() as conn:
        assert moves.claim(conn, row["id"], now=T0) is not None
    before = _lease(db_url, row["id"])

    beat = Heartbeat(db, row["id"], 1, now=T0 + timedelta(seconds=60))
    assert beat.beat_once() is False
    assert beat.lost.is_set()
    assert _lease(db_url, row["id"]) == before


def test_progress_is_written_at_most_once_per_10_seconds_per_step_and_folded_on_read(
        db: Database, db_url: str) -> None:
    row = _claimed(db, db_url)
    clock = FakeClock()
    beat = Heartbeat(db, row["id"], row["fence"], clock=clock)
    with db.transaction() as conn:
        started = trace.append(conn, row["id"], EventType.STEP_STARTED, fence=row["fence"], step="model")
    beat.step_started("model")
    for t in (5, 12, 15, 21, 23, 40):
        clock.t = t
        if t == 40:
            beat.step_finished()  # no progress outside a step
        assert beat.beat_once() is True

    with psycopg.connect(db_url, row_factory=dict_row, autocommit=True) as conn:
        progress = conn.execute(
            "SELECT data, step FROM run_events WHERE run_id = %s AND type = 'step.progress' ORDER BY seq",
            (row["id"],)).fetchall()
    assert progress == [{"data": {"elapsed_ms": 12000}, "step": "model"},
                        {"data": {"elapsed_ms": 23000}, "step": "model"}]
    with db.transaction() as conn:
        events, next_after = trace.page(conn, row["id"], after=0, limit=50)
    assert [e["type"] for e in events] == ["run.claimed", "step.started", "step.started"]  # progress folded
    assert events[2]["seq"] == started and events[2]["progress_count"] == 2
    assert events[2]["last_progress_at"] is not None
    assert next_after == started


def test_the_heartbeat_thread_beats_until_stopped(db: Database, db_url: str) -> None:
    row = _claimed(db, db_url, now=None)
    three = threading.Event()
    seen: list[bool] = []

    def count(alive: bool, **_: Any) -> None:
        seen.append(alive)
        if len(seen) >= 3:
            three.set()

    beat = Heartbeat(db, row["id"], row["fence"], interval=0.001, probes=Probes().on("heartbeat", count))
    beat.start()
    try:
        assert three.wait(WAIT)
    finally:
        beat.stop()
    assert all(seen)
    # The database clock moved the lease forward from the claim's.
    lease = _lease(db_url, row["id"])
    assert lease["heartbeat_at"] > row["heartbeat_at"]
    assert lease["lease_expires_at"] == lease["heartbeat_at"] + timedelta(seconds=120)


def test_the_heartbeat_thread_ends_itself_once_the_lease_is_lost(db: Database, db_url: str) -> None:
    row = _claimed(db, db_url)
    lost = threading.Event()
    probes = Probes().on("heartbeat", lambda alive, **_: None if alive else lost.set())
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE runs SET fence = fence + 1 WHERE id = %s", (row["id"],))

    beat = Heartbeat(db, row["id"], row["fence"], interval=0.001, probes=probes).start()
    assert lost.wait(WAIT)
    assert beat._thread is not None
    beat._thread.join(WAIT)
    assert not beat._thread.is_alive()
    beat.stop()


def test_a_beat_commits_without_waiting_for_the_flush_and_leaves_its_connection_durable(db_url: str) -> None:
    """The beat's transaction alone is asynchronous; the pooled connection it used is not left so."""
    row = _claimed_on(db_url)
    with psycopg.connect(db_url, autocommit=True) as conn:  # the test server runs without durability
        conn.execute(sql.SQL("ALTER DATABASE {} SET synchronous_commit = on").format(
            sql.Identifier(conn.info.dbname)))
    database = Database(db_url, max_size=1)  # one connection: the next borrower gets the beat's
    try:
        with database.connection() as conn:
            assert conn.execute("SHOW synchronous_commit").fetchone() == {"synchronous_commit": "on"}
        assert Heartbeat(database, row["id"], row["fence"]).beat_once() is True
        with database.connection() as conn:
            assert conn.execute("SHOW synchronous_commit").fetchone() == {"synchronous_commit": "on"}
            with conn.transaction():
                conn.execute(db.q("runs_heartbeat"), {"run_id": row["id"], "fence": row["fence"],
                                                      "lease_seconds": moves.LEASE_SECONDS, "now": None})
                inside = conn.execute("SHOW synchronous_commit").fetchone()
            after = conn.execute("SHOW synchronous_commit").fetchone()
    finally:
        database.close()
    assert inside == {"synchronous_commit": "off"} and after == {"synchronous_commit": "on"}


def _claimed_on(db_url: str) -> dict[str, Any]:
    run = factories.run(db_url)
    with psycopg.connect(db_url, row_factory=dict_row, autocommit=True) as conn:
        row = moves.claim(conn, run["id"])
    assert row is not None
    return row


def test_heartbeats_stopped_before_their_first_beat_do_not_pile_up_in_the_dispatcher(db: Database) -> None:
    from kairos.execution import heartbeat as module

    # Given the process's dispatcher, and a run whose heartbeat stays started throughout
    kept = Heartbeat(db, uuid.uuid4(), 1, interval=3600).start()
    before = len(module._DISPATCHER)

    # When 2,000 runs start and stop their heartbeats within the interval (most runs end that soon)
    for _ in range(2000):
        Heartbeat(db, uuid.uuid4(), 1, interval=3600).start().stop()

    # Then the heap holds at most twice what is live, not one entry per run of the last interval
    assert len(module._DISPATCHER) <= 2 * (before + 1)
    assert any(entry[2] is kept for entry in module._DISPATCHER._heap)  # the live one is still due
    kept.stop()


class _CountingCondition(threading.Condition):
    """A condition that counts its notifies (each one wakes the dispatcher's thread)."""

    notified = 0

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)


def test_runs_that_end_before_their_first_beat_do_not_wake_the_dispatcher_each(db: Database, monkeypatch: Any) -> None:
    from kairos.execution import heartbeat as module

    # Given a dispatcher of its own
    dispatcher = module._Dispatcher()
    condition = dispatcher._cond = _CountingCondition()
    monkeypatch.setattr(module, "_DISPATCHER", dispatcher)

    # ... whose thread waits for a run's first beat (the run has ended since: most do within the interval)
    first = Heartbeat(db, uuid.uuid4(), 1, interval=3600).start()
    deadline = time.monotonic() + WAIT
    while not condition._waiters and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.001)
    assert condition._waiters  # type: ignore[attr-defined]
    first.stop()

    # When 500 runs, one after another, start and stop their heartbeats within the interval
    for _ in range(500):
        Heartbeat(db, uuid.uuid4(), 1, interval=3600).start().stop()

    # Then the thread, waiting for a due time earlier than any later run's, was not woken for each (it
    # was once per run: with the stopped ones dropped, each run's heartbeat became the earliest due)
    assert condition.notified == 0


def test_a_heartbeat_due_before_the_one_the_dispatcher_waits_for_begins_on_time(db: Database, db_url: str,
                                                                                 monkeypatch: Any) -> None:
    from kairos.execution import heartbeat as module

    # Given a dispatcher of its own, waiting for a heartbeat due in an hour
    dispatcher = module._Dispatcher()
    monkeypatch.setattr(module, "_DISPATCHER", dispatcher)
    later = Heartbeat(db, uuid.uuid4(), 1, interval=3600).start()
    row = _claimed(db, db_url, now=None)
    beaten = threading.Event()

    # When a run's heartbeat due at once is added
    beat = Heartbeat(db, row["id"], row["fence"], interval=0.01,
                     probes=Probes().on("heartbeat", lambda **_: beaten.set()))
    beat.start()
    try:
        # Then the dispatcher wakes for it: it beats, not an hour later
        assert beaten.wait(WAIT)
    finally:
        beat.stop()
        later.stop()
