"""The pool hands out working connections: a connection killed while idle is replaced, not used, and its
idle siblings with it; errors of a database out of reach are told from faults of the request.
(A whole server restarted or stopped: tests/db/test_db_restart.py.)"""

from __future__ import annotations

import time
from contextlib import ExitStack

import psycopg
from psycopg_pool import PoolTimeout

from kairos import db
from kairos.db import Database


def test_a_connection_killed_while_idle_is_replaced(db_url: str, monkeypatch) -> None:
    database = Database(db_url, max_size=1)
    try:
        with database.transaction() as conn:
            first_pid = conn.info.backend_pid
        # Given the server ended that backend while it sat in the pool (a failover, a thawed Lambda)
        with psycopg.connect(db_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (first_pid,))
        monkeypatch.setattr(db, "CHECK_AFTER_IDLE_SECONDS", 0.0)
        # When the next transaction starts, then it runs on a fresh backend instead of failing
        with database.transaction() as conn:
            assert conn.execute("SELECT 1 AS one").fetchone() == {"one": 1}
            assert conn.info.backend_pid != first_pid
    finally:
        database.close()


def test_a_recently_returned_connection_is_reused_without_a_check(db_url: str) -> None:
    database = Database(db_url, max_size=1)
    try:
        with database.transaction() as conn:
            pid = conn.info.backend_pid
        with database.transaction() as conn:
            assert conn.info.backend_pid == pid
    finally:
        database.close()


def test_atomic_gives_an_autocommit_connection_one_transaction_and_joins_a_callers(db_url: str) -> None:
    """``db.atomic`` is the one helper the library's lock-then-write blocks use (conversations, schedules)."""
    database = Database(db_url, max_size=1)
    try:
        with database.connection() as conn:
            # Given autocommit, the block runs in a transaction of its own: a failure undoes it all
            conn.execute("CREATE TEMP TABLE atomic_probe (n integer)")
            try:
                with db.atomic(conn):
                    conn.execute("INSERT INTO atomic_probe VALUES (1)")
                    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
                    raise RuntimeError("undo")
            except RuntimeError:
                pass
            assert conn.execute("SELECT count(*) AS n FROM atomic_probe").fetchone() == {"n": 0}
        with database.transaction() as conn:
            # Given the caller's transaction, the block joins it: the caller's rollback undoes the block
            conn.execute("CREATE TEMP TABLE atomic_joined (n integer)")
            with db.atomic(conn):
                conn.execute("INSERT INTO atomic_joined VALUES (1)")
            assert conn.execute("SELECT count(*) AS n FROM atomic_joined").fetchone() == {"n": 1}
            conn.rollback()
            assert conn.execute("SELECT count(*) AS n FROM pg_tables WHERE tablename = 'atomic_joined'"
                                ).fetchone() == {"n": 0}
    finally:
        database.close()


def test_a_connection_the_server_ended_a_moment_ago_is_not_handed_out(db_url: str, monkeypatch) -> None:
    # However recently it was returned (a restart or failover takes no time at all to end a session)
    monkeypatch.setattr(db, "CHECK_AFTER_IDLE_SECONDS", 3600.0)
    database = Database(db_url, max_size=1)
    try:
        with database.transaction() as conn:
            first_pid = conn.info.backend_pid
        with psycopg.connect(db_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s, 10000)", (first_pid,))
        with database.transaction() as conn:
            assert conn.execute("SELECT 1 AS one").fetchone() == {"one": 1}
            assert conn.info.backend_pid != first_pid
    finally:
        database.close()


def test_one_dead_pooled_connection_has_its_idle_siblings_replaced_at_once(db_url: str, monkeypatch) -> None:
    """Four idle connections ended together (a failover): the first checkout that finds one dead drains the
    rest, so no caller meets them one at a time, each with the pool's back-off pause after a failed check."""
    monkeypatch.setattr(db, "CHECK_AFTER_IDLE_SECONDS", 3600.0)
    database = Database(db_url, max_size=4)
    try:
        with ExitStack() as stack:
            pids = [stack.enter_context(database.transaction()).info.backend_pid for _ in range(4)]
        with psycopg.connect(db_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid, 10000) FROM unnest(%s::int[]) AS pid", (pids,))
        started = time.monotonic()
        for _ in range(4):
            with database.transaction() as conn:
                assert conn.execute("SELECT 1 AS one").fetchone() == {"one": 1}
                assert conn.info.backend_pid not in pids
        assert time.monotonic() - started < db.CONNECTION_WAIT_SECONDS
    finally:
        database.close()


def test_a_database_out_of_reach_is_told_from_a_fault_of_the_request() -> None:
    lost = psycopg.OperationalError("consuming input failed: server closed the connection unexpectedly")
    for error in (lost, psycopg.errors.AdminShutdown(), psycopg.errors.CannotConnectNow(),
                  psycopg.errors.ConnectionFailure(), psycopg.errors.TooManyConnections()):
        assert db.unavailable(error) and db.lost(error), error
    assert db.unavailable(PoolTimeout()) and not db.lost(PoolTimeout()), "the pool's wait ran out: not tried again"
    for error in (psycopg.errors.QueryCanceled(), psycopg.errors.UniqueViolation(), psycopg.errors.DeadlockDetected(),
                  psycopg.errors.LockNotAvailable(), ValueError("no")):
        assert not db.unavailable(error) and not db.lost(error), error
