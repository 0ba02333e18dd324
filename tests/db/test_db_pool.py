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


def _settings(conn: psycopg.Connection) -> tuple[bool, object, object]:
    return conn.autocommit, conn.pgconn.transaction_status, conn.info.transaction_status


def test_the_autocommit_switch_is_psycopgs_setter(db_url: str) -> None:
    """``db._set_autocommit`` leaves a connection as psycopg's own setter leaves it: the value stored when
    nothing is open; a transaction open, a pipeline or a closed connection get psycopg's own answer."""
    outcomes = []
    for switch in (db._set_autocommit, lambda conn, value: setattr(conn, "autocommit", value)):
        seen: list[object] = []
        with psycopg.connect(db_url) as conn:
            for value in (True, True, False, False, True):
                switch(conn, value)
                seen.append(_settings(conn))
            switch(conn, False)
            conn.execute("SELECT 1")  # a transaction is open now: the setting is refused
            try:
                switch(conn, True)
            except psycopg.ProgrammingError as error:
                seen.append(str(error))
            seen.append(_settings(conn))
            conn.rollback()
            with conn.pipeline():
                conn.execute("SELECT 1")
                conn.commit()
                switch(conn, True)  # psycopg syncs the pipeline first
                seen.append(_settings(conn))
                conn.execute("SELECT 2")
            seen.append(_settings(conn))
        try:
            switch(conn, False)
        except psycopg.Error as error:
            seen.append((type(error), str(error)))
        seen.append(conn.autocommit)
        outcomes.append(seen)
    assert outcomes[0] == outcomes[1]
    assert "can't change 'autocommit' now" in str(outcomes[0])


def test_a_checkout_is_psycopg_pools_connection_with_its_steps(db_url: str) -> None:
    """``Database``'s checkout (psycopg_pool's ``connection()`` spelled out) commits on exit, rolls back on
    error, gives the connection back and counts it as the pool does; a connection that broke in use is
    discarded and its idle siblings drained."""
    database = Database(db_url, max_size=2)
    try:
        with psycopg.connect(db_url, autocommit=True) as admin:
            admin.execute("CREATE TABLE IF NOT EXISTS checkout_probe (n int)")
            admin.execute("TRUNCATE checkout_probe")
        with database.transaction() as conn:
            conn.execute("INSERT INTO checkout_probe VALUES (1)")
        try:
            with database.transaction() as conn:
                conn.execute("INSERT INTO checkout_probe VALUES (2)")
                raise LookupError("rolled back")
        except LookupError:
            pass
        with database.connection() as conn:
            assert conn.autocommit
            assert [r["n"] for r in conn.execute("SELECT n FROM checkout_probe").fetchall()] == [1]
        with database.explicit() as conn:
            db.begin(conn)
            conn.execute("INSERT INTO checkout_probe VALUES (3)")
            db.commit(conn)
        stats = database._pool.get_stats()
        assert stats["requests_num"] == 4 and "usage_ms" in stats
        assert database._pool.get_stats()["pool_available"] == 1  # each came back
        with database.transaction() as conn:
            assert not conn.autocommit  # handed out as the pool keeps it
            assert [r["n"] for r in conn.execute("SELECT n FROM checkout_probe ORDER BY n").fetchall()] == [1, 3]
            pid = conn.info.backend_pid
        drained = []
        database._pool.drain = lambda: drained.append(True)  # type: ignore[method-assign]
        try:
            with database.transaction() as conn:
                with psycopg.connect(db_url, autocommit=True) as admin:
                    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                conn.execute("SELECT 1")
        except psycopg.OperationalError:
            pass
        assert drained == [True]
        with database.transaction() as conn:  # psycopg_pool discarded the broken one when it came back
            assert conn.info.backend_pid != pid and conn.execute("SELECT 1 AS one").fetchone() == {"one": 1}
    finally:
        database.close()
