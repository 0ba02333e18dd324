"""Retention (``kairos.tick.prune``; docs/architecture.md "Runs, traces and guarantees") against real
PostgreSQL.

Runs are executed by the real worker (a scripted executor), so their threads are the fork and fresh
conversations the claim creates; time moves by setting ``finished_at`` back, as black-box tests move it.
What must hold: every run's state and whole trace are untouched, only old ended runs lose their own
thread's entries and their payload, the user's conversations are never touched, the output answers
``unavailable`` (``pruned``) while the run still says ``succeeded``, and only the pruner may delete.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from kairos import conversations, instants, runs
from kairos.db import Database
from kairos.execution.execute import process
from kairos.settings import Settings
from kairos.tick import Tick
from kairos.tick.prune import Prune
from tests import factories
from tests.support.api import Api
from tests.support.aws import SqsQueue
from tests.support.executors import ScriptedExecutor
from tests.support.logs import powertools_output

SETTINGS = Settings()
LATER = datetime.now(UTC) + timedelta(days=1)  # schedules here are never due: the tick must not fire them
_fires = iter(range(10_000))


def _rows(url: str, query: str, *params: Any) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()  # type: ignore[arg-type]


def _schedule(url: str, conversation_id: uuid.UUID, mode: str = "fork") -> dict[str, Any]:
    return factories.schedule(url, conversation_id=conversation_id, mode=mode, next_fire_at=LATER)


def _ran(database: Database, url: str, schedule: dict[str, Any], **columns: Any) -> dict[str, Any]:
    """A run executed by the worker (its claim makes the fork or fresh thread and writes into it)."""
    fire_at = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=next(_fires))
    run = factories.run(url, schedule_row=schedule, fire_at=fire_at, **columns)
    outcome = process(database, run["id"], settings=SETTINGS, executor_factory=ScriptedExecutor().factory)
    assert outcome.result == "succeeded"
    return _rows(url, "SELECT * FROM runs WHERE id = %s", run["id"])[0]


def _settle_all(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE runs SET settled_at = now() WHERE finished_at IS NOT NULL AND settled_at IS NULL")


def _history(url: str) -> dict[str, list[dict[str, Any]]]:
    """Everything retention must leave as it was: each run but its payload and stamp, each occurrence,
    each trace event, each conversation row."""
    return {
        "runs": _rows(url, "SELECT to_jsonb(r) - ARRAY['payload', 'pruned_at'] AS r FROM runs r ORDER BY id"),
        "occurrences": _rows(url, "SELECT to_jsonb(o) AS o FROM occurrences o ORDER BY id"),
        "run_events": _rows(url, "SELECT to_jsonb(e) AS e FROM run_events e ORDER BY run_id, seq"),
        "conversations": _rows(url, "SELECT to_jsonb(c) AS c FROM conversations c ORDER BY id"),
    }


def _entries(url: str, conversation_id: uuid.UUID) -> list[tuple[int, str, str]]:
    return [(r["seq"], r["role"], r["content"]) for r in _rows(
        url, "SELECT seq, role, content FROM conversation_entries WHERE conversation_id = %s ORDER BY seq",
        conversation_id)]


def _run(url: str, run_id: uuid.UUID) -> dict[str, Any]:
    return _rows(url, "SELECT * FROM runs WHERE id = %s", run_id)[0]


# --- what is forgotten, and what stays ----------------------------------------------------------------


def test_pruning_forgets_old_ended_runs_threads_and_payloads_and_leaves_every_state_and_trace(
        db: Database, db_url: str) -> None:
    # Given the user's own conversation, and fork, fresh and append schedules on it
    root = factories.conversation(db_url, entries=[("user", "my notes"), ("assistant", "my answer")])
    fork = _schedule(db_url, root["id"])
    fresh = _schedule(db_url, root["id"], mode="fresh")
    append = _schedule(db_url, root["id"], mode="append")
    # runs that ended 31 days ago (a fork webhook run with its payload, a fresh run, an append run with a
    # payload, a failed run with a payload), one that ended 31 days ago but was never settled, one that
    # ended today, and runs that have not ended
    old_fork = _ran(db, db_url, fork, source="webhook", payload={"order": 42})
    old_fresh = _ran(db, db_url, fresh)
    old_append = _ran(db, db_url, append, source="webhook", payload={"order": 7})
    old_failed = factories.run(db_url, schedule_row=fork, state="failed", source="webhook", payload={"order": 1})
    unsettled = factories.run(db_url, schedule_row=fork, state="cancelled", source="webhook", payload={"o": 2})
    recent = _ran(db, db_url, fork, source="webhook", payload={"order": 43})
    running = factories.run(db_url, schedule_row=fork, state="running", source="webhook", payload={"o": 3})
    queued = factories.run(db_url, schedule_row=fork, state="queued", source="webhook", payload={"o": 4})
    _settle_all(db_url)
    factories.ended_ago(db_url, old_fork["id"], old_fresh["id"], old_append["id"], old_failed["id"])
    factories.ended_ago(db_url, unsettled["id"], settled=False)
    threads = {name: row["conversation_id"] for name, row in
               (("fork", old_fork), ("fresh", old_fresh), ("recent", recent))}
    thread_entries = {name: _entries(db_url, cid) for name, cid in threads.items()}
    assert all(len(e) == 2 for e in thread_entries.values()), "each run wrote its prompt and its answer"
    root_entries = _entries(db_url, root["id"])
    assert len(root_entries) == 4, "the append run wrote into the user's conversation"
    before = _history(db_url)

    # When the pruner passes with the default retention (30 days)
    report = Prune(db).run_once()

    # Then the four old ended, settled runs are stamped; two threads (fork and fresh) lost their entries
    assert (report.runs, report.threads, report.entries, report.payloads, report.full) == (4, 2, 4, 3, False)
    stamped = {r["id"] for r in _rows(db_url, "SELECT id FROM runs WHERE pruned_at IS NOT NULL")}
    assert stamped == {old_fork["id"], old_fresh["id"], old_append["id"], old_failed["id"]}
    assert _entries(db_url, threads["fork"]) == [] and _entries(db_url, threads["fresh"]) == []
    # and nothing else is gone: the recent thread, the user's conversation (with the append run's entries)
    assert _entries(db_url, threads["recent"]) == thread_entries["recent"]
    assert _entries(db_url, root["id"]) == root_entries
    payloads = {r["id"]: r["payload"] for r in _rows(db_url, "SELECT id, payload FROM runs")}
    assert payloads == {old_fork["id"]: None, old_fresh["id"]: None, old_append["id"]: None,
                        old_failed["id"]: None, unsettled["id"]: {"o": 2}, recent["id"]: {"order": 43},
                        running["id"]: {"o": 3}, queued["id"]: {"o": 4}}
    # and every run's state, output reference, usage, times, occurrence and whole trace are as they were
    assert _history(db_url) == before
    assert _run(db_url, old_fork["id"])["state"] == "succeeded"
    # A second pass finds nothing more to forget.
    assert Prune(db).run_once() == type(report)()


def test_retention_is_counted_from_the_end_of_a_run_in_whole_days(db: Database, db_url: str) -> None:
    root = factories.conversation(db_url)
    fork = _schedule(db_url, root["id"])
    ended = _ran(db, db_url, fork)
    _settle_all(db_url)
    factories.ended_ago(db_url, ended["id"], days=10)

    assert Prune(db, retention_days=11).run_once().runs == 0
    assert Prune(db, retention_days=10).run_once().runs == 1
    assert _entries(db_url, ended["conversation_id"]) == []


def test_the_output_of_a_pruned_succeeded_run_is_unavailable_and_the_run_still_succeeded(api: Api) -> None:
    # Given a succeeded fork run whose answer is readable
    database = Database(api.url)
    try:
        root = factories.conversation(api.url)
        done = _ran(database, api.url, _schedule(api.url, root["id"]))
        _settle_all(api.url)
        path = f"/v1/runs/{done['id']}"
        assert api.alice.get(path + "/output").json["output"]["state"] == "available"
        factories.ended_ago(api.url, done["id"])

        # When retention passes
        assert Prune(database).run_once().entries == 2
        with database.transaction() as conn:
            projection = runs.output(conn, done["id"], owner="alice")
    finally:
        database.close()

    # Then the output says the source was pruned, and when; the run still says succeeded with its reference
    stamp = _run(api.url, done["id"])["pruned_at"]
    made_by = {k: projection.pop(k) for k in ("schedule_revision", "agent_digest")}  # what produced it, kept
    assert made_by == {"schedule_revision": _run(api.url, done["id"])["schedule_revision"],
                       "agent_digest": _run(api.url, done["id"])["agent_digest"]}
    assert projection == {"state": "unavailable", "reason": "pruned",
                          "pruned_at": instants.rfc3339(stamp)}
    assert api.alice.get(path + "/output").json == {"output": {**projection, **made_by}}
    run = api.alice.get(path).json["run"]
    assert run["state"] == "succeeded" and run["output"] == done["output"]
    assert api.alice.get(path + "/events").json["events"], "the trace stays readable"
    assert api.bob.get(path + "/output").status == 404


def test_a_thread_someone_built_on_is_kept_whole_while_the_run_is_still_stamped(db: Database, db_url: str) -> None:
    # Given three old fork runs whose threads someone continued: an entry the user appended, a schedule
    # created on the thread, a fork of the thread
    root = factories.conversation(db_url)
    fork = _schedule(db_url, root["id"])
    appended, scheduled, forked = (_ran(db, db_url, fork, payload={"n": n}) for n in range(3))
    with db.transaction() as conn:
        conversations.append(conn, appended["conversation_id"], role="user", content="and then?")
        conversations.fork(conn, forked["conversation_id"])
    factories.schedule(db_url, conversation_id=scheduled["conversation_id"], next_fire_at=LATER)
    _settle_all(db_url)
    factories.ended_ago(db_url, appended["id"], scheduled["id"], forked["id"])
    kept = {r["id"]: _entries(db_url, r["conversation_id"]) for r in (appended, scheduled, forked)}

    # When retention passes
    report = Prune(db).run_once()

    # Then no entry is deleted, the payloads are cleared, and each answer is still available
    assert (report.runs, report.threads, report.entries, report.payloads) == (3, 0, 0, 3)
    for run in (appended, scheduled, forked):
        assert _entries(db_url, run["conversation_id"]) == kept[run["id"]]
        with db.transaction() as conn:
            assert runs.output(conn, run["id"], owner="alice")["state"] == "available"
    assert all(r["payload"] is None and r["pruned_at"] for r in _rows(db_url, "SELECT * FROM runs"))


def test_a_thread_a_writer_holds_is_left_for_a_later_pass(db: Database, db_url: str) -> None:
    # Given two old fork runs, and a writer holding one run's thread (as a schedule create or an append does)
    root = factories.conversation(db_url)
    fork = _schedule(db_url, root["id"])
    held_run, free_run = _ran(db, db_url, fork), _ran(db, db_url, fork)
    _settle_all(db_url)
    factories.ended_ago(db_url, held_run["id"], free_run["id"])
    with psycopg.connect(db_url) as writer:
        writer.execute("SELECT id FROM conversations WHERE id = %s FOR NO KEY UPDATE",
                       (held_run["conversation_id"],))

        # When the pruner passes, it neither waits nor touches the held thread or its run
        report = Prune(db).run_once()
        assert (report.runs, report.threads, report.full) == (1, 1, False)
        assert len(_entries(db_url, held_run["conversation_id"])) == 2
        assert _run(db_url, held_run["id"])["pruned_at"] is None
        writer.rollback()

    # Then once the writer is done, the next pass forgets it
    again = Prune(db).run_once()
    assert (again.runs, again.threads, again.entries) == (1, 1, 2)
    assert _entries(db_url, held_run["conversation_id"]) == []


def test_pruning_works_in_bounded_batches_and_a_second_pass_continues(db: Database, db_url: str) -> None:
    root = factories.conversation(db_url)
    fork = _schedule(db_url, root["id"])
    old = [_ran(db, db_url, fork) for _ in range(5)]
    _settle_all(db_url)
    factories.ended_ago(db_url, *(r["id"] for r in old))
    prune = Prune(db, batch=2)

    passes = [prune.run_once() for _ in range(4)]

    assert [(p.runs, p.entries, p.full) for p in passes] == [(2, 4, True), (2, 4, True), (1, 2, False),
                                                             (0, 0, False)]
    assert _rows(db_url, "SELECT count(*) AS n FROM conversation_entries")[0]["n"] == 0
    # Oldest end first: the first batch held the two runs that ended first.
    first = sorted(old, key=lambda r: r["finished_at"])[:2]
    stamps = {r["id"]: r["pruned_at"] for r in _rows(db_url, "SELECT id, pruned_at FROM runs")}
    assert max(stamps[r["id"]] for r in first) <= min(v for k, v in stamps.items() if k not in {r["id"] for r in first})


def test_the_tick_prunes_with_its_retention_and_reports_and_logs_the_counts(
        db: Database, db_url: str, sqs_queue: SqsQueue) -> None:
    root = factories.conversation(db_url)
    ended = _ran(db, db_url, _schedule(db_url, root["id"]), source="webhook", payload={"k": "v"})
    factories.ended_ago(db_url, ended["id"], days=45)

    kept = Tick(db, sqs_queue.client, sqs_queue.url, metrics=None, retention_days=60).run()
    assert (kept.runs_pruned, kept.entries_pruned) == (0, 0)
    with powertools_output() as out:
        report = Tick(db, sqs_queue.client, sqs_queue.url, metrics=None, retention_days=30).run()

    assert (report.runs_pruned, report.threads_pruned, report.entries_pruned, report.payloads_pruned) == (1, 1, 2, 1)
    logged = [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]
    pruned = [entry for entry in logged if entry.get("action") == "runs_pruned"]
    assert [(e["runs"], e["threads"], e["entries"], e["payloads"], e["retention_days"]) for e in pruned] == [
        (1, 1, 2, 1, 30)]
    finished = [entry for entry in logged if entry.get("action") == "tick_finished"]
    assert finished and finished[0]["runs_pruned"] == 1


# --- only the pruner deletes ---------------------------------------------------------------------------


@pytest.fixture
def recorded(db: Database, db_url: str) -> Iterator[dict[str, Any]]:
    """An ended run with its occurrence, trace events and thread entries."""
    root = factories.conversation(db_url, entries=[("user", "mine")])
    yield _ran(db, db_url, _schedule(db_url, root["id"]))


@pytest.mark.parametrize("statement", ["DELETE FROM {table}", "DELETE FROM {table} WHERE false",
                                       "TRUNCATE {table} CASCADE", "UPDATE {table} SET {column} = {column}"])
@pytest.mark.parametrize(("table", "column"), [("conversation_entries", "content"), ("run_events", "type"),
                                               ("occurrences", "decision")])
def test_records_refuse_a_plain_delete_or_update(db_url: str, recorded: dict[str, Any], table: str, column: str,
                                                 statement: str) -> None:
    before = _history(db_url)
    entries = _rows(db_url, "SELECT * FROM conversation_entries ORDER BY conversation_id, seq")
    if table == "run_events" and statement.startswith("TRUNCATE"):
        table = "run_event_batches"  # run_events is a view of its batches (migration 0034): a view has no TRUNCATE
    with psycopg.connect(db_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.RestrictViolation, match=rf"{table} rows are (append-only|immutable)"):
            conn.execute(sql.SQL(statement).format(table=sql.Identifier(table), column=sql.Identifier(column)))
    assert _history(db_url) == before
    assert _rows(db_url, "SELECT * FROM conversation_entries ORDER BY conversation_id, seq") == entries


def test_the_pruners_transaction_may_delete_entries_but_never_rewrite_them(db_url: str,
                                                                          recorded: dict[str, Any]) -> None:
    thread = recorded["conversation_id"]
    with psycopg.connect(db_url, autocommit=True) as conn:
        with conn.transaction():
            conn.execute("SELECT kairos_allow_pruning()")
            with pytest.raises(psycopg.errors.RestrictViolation, match="immutable"), conn.transaction():
                conn.execute("UPDATE conversation_entries SET content = 'rewritten' WHERE conversation_id = %s",
                             (thread,))
            gone = conn.execute("DELETE FROM conversation_entries WHERE conversation_id = %s", (thread,)).rowcount
        assert gone == 2
        # The permission ended with that transaction.
        with pytest.raises(psycopg.errors.RestrictViolation, match="append-only"):
            conn.execute("DELETE FROM conversation_entries")
    assert len(_rows(db_url, "SELECT * FROM conversation_entries")) == 1, "the user's entry stays"
