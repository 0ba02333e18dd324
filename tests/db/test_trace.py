"""The run trace: gap-free seq under concurrent writers, database time, paging, progress folding."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from kairos import trace
from kairos.db import Database
from kairos.execution.execute import process
from kairos.runs import moves
from kairos.states import EventType
from tests import factories

WAIT = 30


def _claimed(db: Database, db_url: str) -> dict[str, Any]:
    run = factories.run(db_url)
    with db.transaction() as conn:
        row = moves.claim(conn, run["id"])
    assert row is not None
    return row


def test_concurrent_writers_get_gap_free_sequence_numbers(db: Database, db_url: str) -> None:
    run = _claimed(db, db_url)
    barrier = threading.Barrier(4)

    def write(n: int) -> None:
        barrier.wait(WAIT)
        for _ in range(n):
            with db.transaction() as conn:
                assert trace.append(conn, run["id"], EventType.STEP_PROGRESS, fence=1, step="model") is not None

    threads = [threading.Thread(target=write, args=(10,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)

    with psycopg.connect(db_url, row_factory=dict_row, autocommit=True) as conn:
        seqs = [r["seq"] for r in conn.execute("SELECT seq FROM run_events WHERE run_id = %s ORDER BY seq",
                                                (run["id"],))]
        last = conn.execute("SELECT last_seq FROM runs WHERE id = %s", (run["id"],)).fetchone()
    assert seqs == list(range(1, 43))  # run.claimed and step.started, written by the claim, then 40 appends
    assert last == {"last_seq": 42}


def test_events_carry_database_time_unless_a_test_injects_it(db: Database, db_url: str) -> None:
    run = _claimed(db, db_url)
    injected = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)
    with db.transaction() as conn:
        trace.append(conn, run["id"], EventType.STEP_STARTED, fence=1, step="model", now=injected)
        trace.append(conn, run["id"], EventType.STEP_FINISHED, fence=1, step="model")
        db_now = conn.execute("SELECT now() AS now").fetchone()
        events, _ = trace.page(conn, run["id"])
    assert db_now is not None
    assert [e["type"] for e in events] == ["run.claimed", "step.started", "step.started", "step.finished"]
    assert events[2]["at"] == "2031-05-06T07:08:09Z"
    assert events[3]["at"] == trace.rfc3339(db_now["now"])  # one transaction: the same now()


def test_event_data_refuses_content_keys(db: Database, db_url: str) -> None:
    run = _claimed(db, db_url)
    with db.transaction() as conn:
        for key in ("prompt", "completion", "payload", "secret"):
            with pytest.raises(ValueError):
                trace.append(conn, run["id"], EventType.STEP_FINISHED, fence=1, data={"x": {key: "v"}})


def test_pages_follow_the_cursor_and_the_limit_is_capped(db: Database, db_url: str) -> None:
    run = _claimed(db, db_url)
    with db.transaction() as conn:
        for _ in range(248):  # after the claim's run.claimed and step.started (seqs 1, 2)
            trace.append(conn, run["id"], EventType.STEP_FINISHED, fence=1, step="s")

    with db.transaction() as conn:
        first, after_first = trace.page(conn, run["id"], after=0, limit=1000)
        second, after_second = trace.page(conn, run["id"], after=after_first, limit=1000)
        empty, after_empty = trace.page(conn, run["id"], after=after_second, limit=10)
        small, _ = trace.page(conn, run["id"], after=5, limit=3)
    assert len(first) == trace.MAX_PAGE and after_first == 200
    assert [e["seq"] for e in second] == list(range(201, 251)) and after_second == 250
    assert empty == [] and after_empty == 250
    assert [e["seq"] for e in small] == [6, 7, 8]
    assert set(first[0]) == {"seq", "type", "at", "attempt", "step", "data"}


def test_progress_folds_into_its_own_step_and_attempt(db: Database, db_url: str) -> None:
    run = _claimed(db, db_url)
    started_1 = 2  # the claim wrote run.claimed and the model step's step.started
    with db.transaction() as conn:
        for _ in range(3):
            trace.append(conn, run["id"], EventType.STEP_PROGRESS, fence=1, step="model")
        trace.append(conn, run["id"], EventType.STEP_FINISHED, fence=1, step="model")
    # A second attempt (fence 2) of the same step has progress of its own.
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE runs SET fence = 2 WHERE id = %s", (run["id"],))
    with db.transaction() as conn:
        started_2 = trace.append(conn, run["id"], EventType.STEP_STARTED, fence=2, step="model")
        trace.append(conn, run["id"], EventType.STEP_PROGRESS, fence=2, step="model")

    with db.transaction() as conn:
        events, next_after = trace.page(conn, run["id"], after=0, limit=50)
    assert [(e["type"], e.get("progress_count")) for e in events] == [
        ("run.claimed", None), ("step.started", 3), ("step.finished", None), ("step.started", 1)]
    assert events[1]["seq"] == started_1 and events[3]["seq"] == started_2
    assert next_after == started_2


def test_a_full_run_reads_back_as_a_page(db: Database, db_url: str) -> None:
    run = factories.run(db_url)
    from kairos.settings import Settings

    assert process(db, run["id"], settings=Settings()).result == "succeeded"
    with db.transaction() as conn:
        events, next_after = trace.page(conn, run["id"], after=0, limit=2)
        rest, _ = trace.page(conn, run["id"], after=next_after, limit=50)
    types = [e["type"] for e in events + rest]
    assert types[0] == "run.claimed" and types[-1] == "run.succeeded"
    assert [e["seq"] for e in events + rest] == list(range(1, len(types) + 1))
