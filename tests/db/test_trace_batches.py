"""The trace stored densely (migration 0034): a writing statement's events are one run_event_batches row,
and the run_events view answers them one row per event, gap-free, with the table's columns; the view
refuses UPDATE and DELETE (the pruner's delete takes one event out of its batch)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from kairos import trace
from kairos.db import Database
from kairos.runs import moves
from kairos.states import EventType
from tests import factories


def _batches(db_url: str, run_id: Any) -> list[tuple[int, list[str]]]:
    with psycopg.connect(db_url) as conn:
        rows = conn.execute("SELECT last_seq, events FROM run_event_batches WHERE run_id = %s ORDER BY last_seq",
                            (run_id,)).fetchall()
    return [(int(r[0]), [e["type"] for e in r[1]]) for r in rows]


def _events(db_url: str, run_id: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(db_url) as conn:
        return conn.execute("SELECT seq, type, attempt, fence, step FROM run_events WHERE run_id = %s ORDER BY seq",
                            (run_id,)).fetchall()


def test_a_statement_writes_one_batch_and_the_view_answers_one_row_per_event(db: Database, db_url: str) -> None:
    # Given a claimed run (the claim: run.claimed and step.started, one statement)
    run = factories.run(db_url)
    with db.transaction() as conn:
        claimed = moves.claim(conn, run["id"])
        assert claimed is not None
        fence = int(claimed["fence"])
        # When one event is appended and a state change writes three more
        assert trace.append(conn, run["id"], EventType.STEP_PROGRESS, fence=fence, step="model") is not None
        assert moves.succeed(conn, run["id"], fence, output={"conversation_id": "c", "entry_seq": 1, "attempt": 1},
                             events=[trace.Event(EventType.STEP_FINISHED, "model", {"outcome": "succeeded"}),
                                     trace.Event(EventType.OUTPUT_PUBLISHED)])
    # Then each statement stored one batch, ending at the run's last_seq then
    batches = _batches(db_url, run["id"])
    assert [len(types) for _, types in batches] == [2, 1, 3]
    assert [last for last, _ in batches] == [2, 3, 6]
    # And the view answers one row per event, seqs 1..n without a gap, in the order written
    events = _events(db_url, run["id"])
    assert [e[0] for e in events] == [1, 2, 3, 4, 5, 6]
    assert [e[1] for e in events] == ["run.claimed", "step.started", "step.progress", "step.finished",
                                      "output.published", "run.succeeded"]
    assert {(e[2], e[3]) for e in events} == {(1, fence)}
    with psycopg.connect(db_url) as conn:
        columns = conn.execute("""SELECT column_name, data_type FROM information_schema.columns
                                   WHERE table_name = 'run_events' ORDER BY ordinal_position""").fetchall()
        last_seq = conn.execute("SELECT last_seq FROM runs WHERE id = %s", (run["id"],)).fetchone()
    assert columns == [("run_id", "uuid"), ("seq", "integer"), ("type", "text"), ("at", "timestamp with time zone"),
                       ("attempt", "integer"), ("fence", "bigint"), ("step", "text"), ("data", "jsonb")]
    assert last_seq == (6,)
    # And a page reads them back (progress folded into its step)
    with db.connection() as conn:
        page, cursor = trace.page(conn, run["id"], after=1, limit=2)
    assert [(e["seq"], e["type"]) for e in page] == [(2, "step.started"), (4, "step.finished")]
    assert page[0]["progress_count"] == 1 and cursor == 4


@pytest.mark.parametrize("statement", ["UPDATE run_events SET type = 'run.failed' WHERE run_id = %s",
                                       "UPDATE run_event_batches SET attempt = 2 WHERE run_id = %s",
                                       "DELETE FROM run_events WHERE run_id = %s",
                                       "DELETE FROM run_events WHERE run_id = %s AND false",
                                       "DELETE FROM run_event_batches WHERE run_id = %s"])
def test_the_view_and_its_batches_refuse_update_and_delete(db: Database, db_url: str, statement: str) -> None:
    run = factories.run(db_url)
    with db.transaction() as conn:
        assert moves.claim(conn, run["id"]) is not None
    with psycopg.connect(db_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.RestrictViolation):
            conn.execute(statement, (run["id"],))  # type: ignore[arg-type]
    assert len(_events(db_url, run["id"])) == 2


def test_direct_inserts_keep_seq_unique_and_the_pruner_deletes_one_event_of_a_batch(db: Database, db_url: str) -> None:
    run = factories.run(db_url)
    with db.transaction() as conn:
        assert moves.claim(conn, run["id"]) is not None  # seqs 1 and 2, one batch
    with psycopg.connect(db_url, autocommit=True) as conn:
        # A seq inside an existing batch is refused, as the primary key refused it
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("INSERT INTO run_events (run_id, seq, type, attempt) VALUES (%s, 1, 'run.queued', 0)",
                         (run["id"],))
        # An unknown type is refused by the batches' check
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("INSERT INTO run_events (run_id, seq, type, attempt) VALUES (%s, 3, 'run.bogus', 0)",
                         (run["id"],))
        seq = conn.execute("INSERT INTO run_events (run_id, seq, type, attempt) VALUES (%s, 3, 'run.queued', 0) "
                           "RETURNING seq", (run["id"],)).fetchone()
        assert seq == (3,)
        with conn.transaction():
            conn.execute("SELECT kairos_allow_pruning()")
            deleted = conn.execute("DELETE FROM run_events WHERE run_id = %s AND seq = 1", (run["id"],)).rowcount
    assert deleted == 1
    assert [e[:2] for e in _events(db_url, run["id"])] == [(2, "step.started"), (3, "run.queued")]
    assert _batches(db_url, run["id"]) == [(2, ["step.started"]), (3, ["run.queued"])]


@pytest.mark.parametrize("statement", ["DELETE FROM runs WHERE id = %(run)s",
                                       "DELETE FROM runs WHERE false",
                                       "TRUNCATE runs CASCADE",
                                       "DELETE FROM conversations WHERE id = %(conversation)s",
                                       "TRUNCATE conversations CASCADE"])
def test_runs_and_conversations_are_never_deleted(db: Database, db_url: str, statement: str) -> None:
    # The trace batches, effects and entries that name a run or a conversation carry no foreign key
    # (migration 0040: the inserting statements select their parent themselves): their parents refuse
    # to go instead.
    conversation = factories.conversation(db_url, entries=[("user", "hello")])
    run = factories.run(db_url, schedule_row=factories.schedule(db_url, conversation_id=conversation["id"]))
    with db.transaction() as conn:
        assert moves.claim(conn, run["id"]) is not None
    with psycopg.connect(db_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.RestrictViolation, match="never deleted"):
            conn.execute(statement, {"run": run["id"], "conversation": conversation["id"]})  # type: ignore[arg-type]
        assert conn.execute("SELECT count(*) FROM runs WHERE id = %s", (run["id"],)).fetchone() == (1,)
    assert len(_events(db_url, run["id"])) == 2


def test_an_event_inserted_through_the_view_for_an_unknown_run_is_refused(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.ForeignKeyViolation, match="run_events_run_id_fkey"):
            conn.execute("""INSERT INTO run_events (run_id, seq, type, at, attempt, fence, data)
                            VALUES (gen_random_uuid(), 1, 'run.queued', now(), 0, 0, '{}')""")
