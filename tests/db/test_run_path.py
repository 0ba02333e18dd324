"""What one echo run costs the database, counted on the wire: round trips, statements, commits.

The run path's budget (issue 14) is held here: a change that adds a round trip or a commit to a
plain run fails a test, and must say why in the number it changes. Round trips and statements are
counted by a proxy in front of the server (``tests.support.wire``); commits as the distinct
transactions (``xmin``) that wrote the run's rows. Also: a crash between the combined statements
leaves a consistent row (kairos.probes, as the crash tests of test_runs_fencing.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from kairos import db as kairos_db
from kairos.db import Database
from kairos.execution.execute import process
from kairos.probes import Probes
from kairos.settings import Settings
from tests import factories
from tests.support.wire import WireCounter, wire_counter

SETTINGS = Settings()

# One echo run in fork mode, first attempt, from the claim to the terminal state, on a warm pool.
# Before issue 14: 22 round trips, 22 statements (BEGIN and COMMIT included), 3 commits — the claim
# transaction alone was 11 statements (slot lock, claim, a savepoint around the fork and the run's
# conversation update, the conversation lock and the prompt entry, the window), each its own trip.
# Now: the claim writes the thread and the prompt entry itself and reads the model's input window from
# the new thread in the same statement (runs_claim's window_budget; a second statement of its trip
# before), and takes the slot lock itself, only for a run nobody released: one statement, one trip,
# committed by the pipeline's Sync (kairos.db.Database.trip); the effect with its budget charge is one
# statement in autocommit (effects_reserve_charged): one trip, its own commit; the answer was two trips of five
# statements — [BEGIN, run and conversation lock, answer] [settle, terminal update, COMMIT] — and is
# one of two, an implicit transaction too: [run and conversation lock, runs_publish (the answer entry,
# the settlement, the terminal update and its events in one statement)].
ROUND_TRIPS = 3
STATEMENTS = 4
COMMITS = 3  # the claim; the effect reserved before the call; the answer with the terminal state
# Without pipeline mode every statement is its own trip, and the answer spells out BEGIN and COMMIT (the
# fork claim, one statement, commits on its own).
STATEMENTS_WITHOUT_PIPELINE = STATEMENTS + 2


@pytest.fixture
def counter(db_url: str) -> Iterator[WireCounter]:
    with wire_counter(db_url) as wire:
        yield wire


@pytest.fixture
def db(counter: WireCounter, monkeypatch: pytest.MonkeyPatch) -> Iterator[Database]:
    # The pool's liveness check sends a statement of its own when a connection sat idle past
    # CHECK_AFTER_IDLE_SECONDS, which a loaded machine can reach between two steps of a test: the counter
    # would see that trip as the run's. These tests count the run's trips; test_db_restart.py holds the check.
    monkeypatch.setattr(kairos_db, "_check_connection", lambda conn: None)
    database = Database(counter.url, max_size=4)
    try:
        yield database
    finally:
        database.close()


def _warm(db: Database, url: str) -> None:
    """A warm container: its pool's connection is open and has prepared the hot statements (one run)."""
    assert process(db, fork_run(url)["id"], settings=SETTINGS).result == "succeeded"


def fork_run(url: str) -> dict[str, Any]:
    conversation = factories.conversation(url, entries=[("user", "hello"), ("assistant", "echo: hello")])
    schedule = factories.schedule(url, conversation_id=conversation["id"], mode="fork")
    return factories.run(url, schedule_row=schedule)


def commits_of(url: str, run_id: uuid.UUID) -> int:
    """The transactions that wrote the run: every one of them traces (a state change and its events
    are one statement, kairos.trace), so they are the distinct ``xmin`` of the run's event batches; the run's
    other rows must have been written by those same transactions."""
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        row = conn.execute(
            """SELECT (SELECT array_agg(DISTINCT xmin::text) FROM run_event_batches WHERE run_id = %(r)s) AS traced,
                      (SELECT array_agg(DISTINCT x) FROM (
                           SELECT xmin::text AS x FROM runs WHERE id = %(r)s
                           UNION ALL SELECT xmin::text FROM conversation_entries WHERE run_id = %(r)s
                           UNION ALL SELECT xmin::text FROM conversations WHERE origin_run_id = %(r)s
                           UNION ALL SELECT xmin::text FROM effects WHERE run_id = %(r)s) AS w) AS rows
            """, {"r": run_id}).fetchone()
    assert row is not None
    assert set(row["rows"]) <= set(row["traced"]), row
    return len(row["traced"])


def test_an_echo_run_costs_its_counted_round_trips_statements_and_commits(
        db: Database, db_url: str, counter: WireCounter) -> None:
    run = fork_run(db_url)
    _warm(db, db_url)
    counter.reset()

    outcome = process(db, run["id"], settings=SETTINGS)

    assert outcome.result == "succeeded"
    print(f"round trips {counter.round_trips}, statements {counter.statements}, "
          f"commits {commits_of(db_url, run['id'])}")
    for text in counter.texts:
        print("  ", " ".join(text.split())[:110])
    assert (counter.round_trips, counter.statements, commits_of(db_url, run["id"])) == (
        ROUND_TRIPS, STATEMENTS, COMMITS)


def test_the_counter_sees_a_round_trip_per_statement_outside_a_pipeline(db: Database, counter: WireCounter) -> None:
    with db.connection() as conn:
        conn.execute("SELECT 1")
    counter.reset()
    with db.transaction() as conn:
        conn.execute("SELECT 1")
        conn.execute("SELECT 2")
    assert (counter.round_trips, counter.statements) == (4, 4)  # BEGIN, two selects, COMMIT
    counter.reset()
    with db.explicit() as conn, db.batch(conn):  # spelled out and pipelined: one trip
        kairos_db.begin(conn)
        conn.execute("SELECT 1")
        conn.execute("SELECT 2")
        kairos_db.commit(conn)
    assert (counter.round_trips, counter.statements) == (1, 4)


def test_a_trip_is_one_transaction_in_one_round_trip_without_begin_or_commit(
        db: Database, counter: WireCounter) -> None:
    with db.connection() as conn:
        conn.execute("CREATE TABLE trip_probe (n integer PRIMARY KEY)")
    counter.reset()
    with db.explicit() as conn:
        with db.trip(conn):
            first = conn.execute("INSERT INTO trip_probe VALUES (1) RETURNING txid_current() AS xid")
            second = conn.execute("INSERT INTO trip_probe VALUES (2) RETURNING txid_current() AS xid")
        assert conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE  # committed by the Sync
        assert first.fetchone() == second.fetchone()  # one transaction
    assert (counter.round_trips, counter.statements) == (1, 2)
    # A statement that fails takes the trip's earlier statements with it: the implicit transaction aborts.
    with pytest.raises(psycopg.errors.UniqueViolation), db.explicit() as conn, db.trip(conn):
        conn.execute("INSERT INTO trip_probe VALUES (3)")
        conn.execute("INSERT INTO trip_probe VALUES (1)")
    with db.connection() as conn:
        assert conn.execute("SELECT array_agg(n ORDER BY n) AS n FROM trip_probe").fetchone() == {"n": [1, 2]}


class Crash(BaseException):
    """The end of the invocation (a killed process): nothing in the worker catches it."""


def _crash(**_: Any) -> None:
    raise Crash()


def _state(url: str, run_id: uuid.UUID) -> dict[str, Any]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        row = conn.execute(
            """SELECT r.state, r.fence, r.conversation_id, r.output, r.last_seq,
                      (SELECT max(seq) FROM run_events e WHERE e.run_id = r.id) AS max_seq,
                      (SELECT count(*) FROM run_events e WHERE e.run_id = r.id) AS events,
                      (SELECT array_agg(role::text ORDER BY seq) FROM conversation_entries e
                        WHERE e.run_id = r.id) AS roles,
                      (SELECT c.parent_id FROM conversations c WHERE c.origin_run_id = r.id) AS thread_parent,
                      (SELECT array_agg(state::text) FROM effects f WHERE f.run_id = r.id) AS effects,
                      (SELECT count(*) FROM usage_reservations u WHERE u.run_id = r.id) AS reservations
                 FROM runs r WHERE r.id = %s""", (run_id,)).fetchone()
    assert row is not None
    return row


def test_a_crash_after_the_claim_leaves_the_thread_and_prompt_committed_with_it(db: Database, db_url: str) -> None:
    run = fork_run(db_url)
    with pytest.raises(Crash):
        process(db, run["id"], settings=SETTINGS, probes=Probes().on("after_claim", _crash))
    row = _state(db_url, run["id"])
    assert (row["state"], row["fence"], row["roles"]) == ("running", 1, ["user"])
    assert row["thread_parent"] == run["source_conversation_id"] and row["conversation_id"] is not None
    assert row["last_seq"] == row["max_seq"] == row["events"] == 2  # run.claimed, step.started: no gap
    assert row["effects"] is None and row["reservations"] == 0


def test_a_crash_after_the_reservation_leaves_the_effect_and_its_charge_committed_together(
        db: Database, db_url: str) -> None:
    run = fork_run(db_url)
    with pytest.raises(Crash):
        process(db, run["id"], settings=SETTINGS, probes=Probes().on("after_reserve", _crash))
    row = _state(db_url, run["id"])
    assert (row["state"], row["effects"], row["reservations"], row["roles"]) == ("running", ["reserved"], 1, ["user"])
    assert row["last_seq"] == row["max_seq"] == row["events"] == 3


def test_a_crash_between_the_answer_batch_and_the_terminal_update_writes_none_of_them(
        db: Database, db_url: str) -> None:
    """A crash as the answer is about to be published (before its trip, which writes the answer entry,
    the settlement and the terminal update in one statement) writes none of them: no answer, the effect
    still reserved."""
    run = fork_run(db_url)
    with pytest.raises(Crash):
        process(db, run["id"], settings=SETTINGS, probes=Probes().on("before_finish", _crash))
    row = _state(db_url, run["id"])
    assert (row["state"], row["output"], row["roles"], row["effects"]) == ("running", None, ["user"], ["reserved"])
    assert row["last_seq"] == row["max_seq"] == row["events"] == 3
    with db.connection() as conn:  # the pooled connection came back usable, with no transaction open
        assert conn.execute("SELECT 1 AS one").fetchone() == {"one": 1}
        assert conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_without_pipeline_mode_the_same_run_costs_a_round_trip_per_statement(db_url: str,
                                                                            counter: WireCounter) -> None:
    database = Database(counter.url, max_size=4, pipeline=False)
    try:
        _warm(database, db_url)
        run = fork_run(db_url)
        counter.reset()
        assert process(database, run["id"], settings=SETTINGS).result == "succeeded"
        assert (counter.round_trips, counter.statements, commits_of(db_url, run["id"])) == (
            STATEMENTS_WITHOUT_PIPELINE, STATEMENTS_WITHOUT_PIPELINE, COMMITS)
    finally:
        database.close()
