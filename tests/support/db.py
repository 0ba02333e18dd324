"""Waiting on the database's own state, never on a timer."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import psycopg


def wait_until_blocked(db_url: str, pid: int, done: threading.Event) -> bool:
    """True once backend ``pid`` waits on a lock; False if its thread finished without waiting.

    This waits for a condition (polling pg_stat_activity, returning early when the thread ends), it
    does not sleep for timing.
    """
    with psycopg.connect(db_url, autocommit=True) as watcher:
        deadline = datetime.now(UTC) + timedelta(seconds=20)
        while datetime.now(UTC) < deadline:
            row = watcher.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
            if row is not None and row[0] == "Lock":
                return True
            if done.wait(0.005):
                return False
    raise AssertionError("the second writer neither blocked nor finished")
