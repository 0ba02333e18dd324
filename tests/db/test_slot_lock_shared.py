"""One owner's run ends share its slot lock (migrations 0036, 0042; 0039 had made it exclusive between
them), against real PostgreSQL: ends with nothing of the owner waiting do not wait for each other; a
release (exclusive) waits for an end in progress and then hands its slot out; two ends that find runs
waiting hand out one slot each.

Waits are observed, not timed: a statement either finishes or shows up in ``pg_stat_activity`` waiting
on a lock, whichever comes first (a deadline only bounds a hang)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from kairos import budgets
from tests import factories

_DEADLINE_SECONDS = 60.0


def _connect(url: str) -> psycopg.Connection[dict[str, Any]]:
    return psycopg.connect(url, row_factory=dict_row, autocommit=True)


def _end(conn: psycopg.Connection[dict[str, Any]], run_id: uuid.UUID) -> None:
    """Ends a run holding a slot (its statement's trigger gives the slot up), in ``conn``'s transaction."""
    conn.execute("UPDATE runs SET state = 'cancelled', lease_token = NULL, lease_expires_at = NULL, "
                 "finished_at = now() WHERE id = %s", (run_id,))


def _holders(url: str, owner: str, n: int) -> list[uuid.UUID]:
    """``n`` running runs of ``owner``, each holding one of its slots (released, then claimed)."""
    sched = factories.schedule(url, owner=owner)
    return [factories.run(url, schedule_row=sched, source="manual", state="running", slot_limit=n,
                          admitted_at=datetime.now(UTC))["id"] for _ in range(n)]


def _waiting(url: str, owner: str, n: int, slots: int) -> list[uuid.UUID]:
    sched = factories.schedule(url, owner=owner)
    return [factories.run(url, schedule_row=sched, source="manual", slot_limit=slots)["id"] for _ in range(n)]


class _Call:
    """A call on its own thread and connection; ``settle`` says whether it finished or waits on a lock."""

    def __init__(self, url: str, work: Callable[[psycopg.Connection[dict[str, Any]]], Any]) -> None:
        self.conn = _connect(url)
        self.pid = self.conn.info.backend_pid
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()

        def run() -> None:
            try:
                self.result = work(self.conn)
            except BaseException as error:
                self.error = error
            finally:
                self.done.set()

        self.thread = threading.Thread(target=run)
        self.thread.start()

    def settle(self, url: str) -> str:
        """'done' once the call returned, 'waiting' once its backend waits on a lock."""
        deadline = time.monotonic() + _DEADLINE_SECONDS
        with _connect(url) as watcher:
            while time.monotonic() < deadline:
                if self.done.wait(0.01):
                    return "done"
                row = watcher.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                                      (self.pid,)).fetchone()
                if row is not None and row["wait_event_type"] == "Lock":
                    return "waiting"
        raise AssertionError("the call neither finished nor waited on a lock")

    def join(self) -> Any:
        assert self.done.wait(_DEADLINE_SECONDS)
        self.thread.join()
        self.conn.close()
        if self.error is not None:
            raise self.error
        return self.result


def test_ends_of_one_owner_with_nothing_waiting_do_not_wait_for_each_other(db_url: str) -> None:
    """One end's transaction open (its slot lock held): another end of the same owner finishes at once.
    With the lock exclusive (before 0036, and 0039 to 0042) it waited for the first one's commit."""
    first, second = _holders(db_url, "alice", 2)
    with _connect(db_url) as conn:
        with conn.transaction():
            _end(conn, first)

            def end_second(c: psycopg.Connection[dict[str, Any]]) -> None:
                with c.transaction():
                    _end(c, second)

            call = _Call(db_url, end_second)
            assert call.settle(db_url) == "done"
            call.join()
    with _connect(db_url) as conn:
        assert conn.execute("SELECT count(*) AS n FROM runs WHERE id = ANY(%s) AND state = 'cancelled' "
                            "AND admitted_at IS NULL", ([first, second],)).fetchone() == {"n": 2}


def test_a_release_waits_for_an_end_in_progress_and_hands_its_slot_out(db_url: str) -> None:
    """An end in progress found nothing waiting; a run is recorded meanwhile (committed) and its intake
    releases: the release waits for the end's commit, then counts that slot free and admits the run —
    it is never left waiting beside the slot (as it would be if the end took no lock)."""
    (holder,) = _holders(db_url, "alice", 1)
    with _connect(db_url) as conn:
        with conn.transaction():
            _end(conn, holder)
            (waiting,) = _waiting(db_url, "alice", 1, slots=1)

            def intake(c: psycopg.Connection[dict[str, Any]]) -> list[uuid.UUID]:
                with c.transaction():
                    return budgets.release(c, ["alice"])

            call = _Call(db_url, intake)
            assert call.settle(db_url) == "waiting"
        assert call.join() == [waiting]
    with _connect(db_url) as conn:
        assert conn.execute("SELECT admitted_at IS NOT NULL AS admitted FROM runs WHERE id = %s",
                            (waiting,)).fetchone() == {"admitted": True}


def test_two_ends_that_find_runs_waiting_hand_out_one_slot_each(db_url: str) -> None:
    """Two slots held, two runs waiting: the ends of both holders, one in progress while the other runs,
    release one waiting run each (the second end counts after the first committed)."""
    first, second = _holders(db_url, "alice", 2)
    older, newer = _waiting(db_url, "alice", 2, slots=2)
    with _connect(db_url) as conn:
        with conn.transaction():
            _end(conn, first)

            def end_second(c: psycopg.Connection[dict[str, Any]]) -> None:
                with c.transaction():
                    _end(c, second)

            call = _Call(db_url, end_second)
            assert call.settle(db_url) == "waiting"
        call.join()
    with _connect(db_url) as conn:
        rows = conn.execute("SELECT id, released_by FROM runs WHERE id = ANY(%s)", ([older, newer],)).fetchall()
    assert {r["id"]: r["released_by"] for r in rows} == {older: first, newer: second}
