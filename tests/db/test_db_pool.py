"""The pool hands out working connections: a connection killed while idle is replaced, not used."""

from __future__ import annotations

import psycopg
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
