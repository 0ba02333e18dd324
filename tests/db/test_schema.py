"""The schema's check constraints hold the state invariants, and match kairos.states."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg import sql

from kairos import states
from tests import factories


def _check_values(url: str, table: str, column: str) -> set[str]:
    """The literal values a check constraint allows for ``column`` (``column IN ('a', 'b')``): its
    domain's check when the column has a domain, else the column's own ``<table>_<column>_check`` when
    there is one (migrations that widen a list keep that name), else the first IN-list check on it."""
    with psycopg.connect(url) as conn:
        # A column of a domain (0049): the domain's check holds the list.
        domain = [
            r[0]
            for r in conn.execute(
                """SELECT pg_get_constraintdef(c.oid) FROM pg_attribute a
                     JOIN pg_type d ON d.oid = a.atttypid AND d.typtype = 'd'
                     JOIN pg_constraint c ON c.contypid = d.oid AND c.contype = 'c'
                    WHERE a.attrelid = %s::regclass AND a.attname = %s""",
                (table, column),
            )
        ]
        defs = domain or [
            r[0]
            for r in conn.execute(
                """SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c
                   JOIN pg_class t ON t.oid = c.conrelid WHERE t.relname = %s AND c.contype = 'c'
                   ORDER BY c.conname <> %s, c.conname""",
                (table, f"{table}_{column}_check"),
            )
        ]
    name = "VALUE" if domain else column
    for d in defs:
        if re.search(rf"\(?{name}\)? = ANY", d) and "ARRAY" in d and "state <> " not in d:
            found = set(re.findall(r"'([a-z_.]+)'::text", d))
            if found:
                return found
        if column == "events" and "jsonb_path_query_array" in d:
            found = set(re.findall(r'"([a-z_.]+)"', d.split("<@", 1)[1]))
            if found:
                return found
    if table == "run_events":  # a view since 0034: its batches' check holds the list as a JSON array
        return _check_values(url, "run_event_batches", "events")
    raise AssertionError(f"no IN-list check on {table}.{column}: {defs}")


@pytest.mark.parametrize(
    ("table", "column", "enum"),
    [
        ("schedules", "status", states.ScheduleStatus),
        ("schedules", "kind", states.ScheduleKind),
        ("schedules", "mode", states.Mode),
        ("schedules", "overlap", states.Overlap),
        ("schedules", "dst_gap", states.DstGap),
        ("schedules", "dst_fold", states.DstFold),
        ("occurrences", "decision", states.Decision),
        ("occurrences", "source", states.Source),
        ("runs", "state", states.RunState),
        ("run_events", "type", states.EventType),
        ("effects", "state", states.EffectState),
        ("input_requests", "state", states.InputRequestState),
        ("approvals", "state", states.ApprovalState),
        ("notify_deliveries", "state", states.NotifyDeliveryState),
        ("corpus_runs", "phase", states.CorpusPhase),
        ("corpus_partitions", "state", states.CorpusPartitionState),
        ("run_steps", "state", states.StepState),
    ],
)
def test_check_constraints_match_the_enums(db_url: str, table: str, column: str, enum: type) -> None:
    assert _check_values(db_url, table, column) == {e.value for e in enum}


def test_running_requires_lease_and_only_running_has_one(db_url: str) -> None:
    run = factories.run(db_url, state="queued")
    with psycopg.connect(db_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("UPDATE runs SET state = 'running' WHERE id = %s", (run["id"],))
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(
                "UPDATE runs SET lease_token = %s, lease_expires_at = now() WHERE id = %s",
                (uuid.uuid4(), run["id"]),
            )


def test_finished_at_set_exactly_when_terminal(db_url: str) -> None:
    run = factories.run(db_url, state="queued")
    done = factories.run(db_url, state="cancelled")
    with psycopg.connect(db_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("UPDATE runs SET finished_at = now() WHERE id = %s", (run["id"],))
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("UPDATE runs SET finished_at = NULL WHERE id = %s", (done["id"],))


def test_occurrences_and_run_events_refuse_updates(db_url: str) -> None:
    run = factories.run(db_url, state="queued")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO run_events (run_id, seq, type, attempt) VALUES (%s, 1, 'run.queued', 0)", (run["id"],)
        )
        with pytest.raises(psycopg.errors.RestrictViolation):
            conn.execute("UPDATE occurrences SET decision = 'expired' WHERE id = %s", (run["occurrence_id"],))
        with pytest.raises(psycopg.errors.RestrictViolation):
            conn.execute("UPDATE run_events SET type = 'run.failed' WHERE run_id = %s", (run["id"],))


def test_duplicate_timed_occurrence_is_refused(db_url: str) -> None:
    sched = factories.schedule(db_url)
    fire_at = datetime(2026, 1, 1, 7, tzinfo=UTC)
    factories.run(db_url, schedule_row=sched, fire_at=fire_at)
    with pytest.raises(psycopg.errors.UniqueViolation):
        factories.run(db_url, schedule_row=sched, fire_at=fire_at)


def test_webhook_tokens_are_unique_and_only_webhook_schedules_take_a_token_entry(db_url: str) -> None:
    """Migration 0018: the token indexes are partial. Two schedules still cannot share a token (current
    or previous), NULL tokens still never collide, and a thousand cron schedules (whose cursor the tick
    moves every fire) leave both indexes at a metapage and one leaf: no NULL entry per row version."""
    first, second = (factories.schedule(db_url, kind="webhook") for _ in range(2))
    with pytest.raises(psycopg.errors.UniqueViolation):
        factories.schedule(db_url, kind="webhook", token_hash=first["token_hash"])
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE schedules SET previous_token_hash = 'p' || token_hash WHERE id = %s", (first["id"],))
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("UPDATE schedules SET previous_token_hash = 'p' || %s WHERE id = %s",
                         (first["token_hash"], second["id"]))
        conn.execute("""INSERT INTO schedules (id, owner, conversation_id, prompt, kind, cron, status, next_fire_at)
                        SELECT gen_random_uuid(), 'alice', %s, 'p', 'cron', '* * * * *', 'active', now()
                          FROM generate_series(1, 1000)""", (first["conversation_id"],))
        conn.execute("UPDATE schedules SET next_fire_at = next_fire_at + interval '1 minute' WHERE kind = 'cron'")
        sizes = conn.execute("SELECT pg_relation_size('schedules_token_hash_key'),"
                             " pg_relation_size('schedules_previous_token_hash_key')").fetchone()
    assert sizes == (2 * 8192, 2 * 8192)


def _skipped_occurrence(conn: psycopg.Connection[Any], schedule_id: uuid.UUID) -> uuid.UUID:
    """An occurrence with no run (a skipped fire): the kind a pruner could remove outright."""
    occurrence_id = uuid.uuid4()
    fire_at = datetime(2026, 1, 1, 7, tzinfo=UTC)
    conn.execute(
        """INSERT INTO occurrences (id, schedule_id, source, fire_at, local_time, utc_offset, fold, timezone,
               tzdata_version, schedule_revision, decision)
           VALUES (%s, %s, 'scheduled', %s, %s, interval '0', 0, 'UTC', 'test', 1, 'skipped_late')""",
        (occurrence_id, schedule_id, fire_at, fire_at.replace(tzinfo=None)),
    )
    return occurrence_id


@pytest.mark.parametrize("statement", ["DELETE FROM {table}", "DELETE FROM {table} WHERE false",
                                       "TRUNCATE {table} CASCADE"])
@pytest.mark.parametrize("table", ["occurrences", "run_events"])
def test_occurrences_and_run_events_refuse_delete_and_truncate(db_url: str, table: str, statement: str) -> None:
    # Given a run with its occurrence and one event, and a skipped occurrence with no run
    run = factories.run(db_url, state="queued")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO run_events (run_id, seq, type, attempt) VALUES (%s, 1, 'run.queued', 0)",
                     (run["id"],))
        _skipped_occurrence(conn, run["schedule_id"])
        # When anyone but the pruner deletes or truncates, Then it is refused and nothing is gone
        # (run_events is a view of run_event_batches since 0034: TRUNCATE names the table it stores in)
        target = "run_event_batches" if table == "run_events" and statement.startswith("TRUNCATE") else table
        with pytest.raises(psycopg.errors.RestrictViolation, match="append-only"):
            conn.execute(sql.SQL(statement).format(table=sql.Identifier(target)))
        counts = conn.execute("SELECT (SELECT count(*) FROM occurrences) AS o, (SELECT count(*) FROM run_events) AS e"
                              ).fetchone()
    assert counts == (2, 1)


def test_the_pruner_may_delete_in_its_own_transaction_only(db_url: str) -> None:
    run = factories.run(db_url, state="succeeded")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO run_events (run_id, seq, type, attempt) VALUES (%s, 1, 'run.queued', 0), "
                     "(%s, 2, 'run.succeeded', 1)", (run["id"], run["id"]))
        skipped = _skipped_occurrence(conn, run["schedule_id"])
        # The pruner: the escape hatch and its deletes in one transaction.
        with conn.transaction():
            conn.execute("SELECT kairos_allow_pruning()")
            deleted = conn.execute("DELETE FROM run_events WHERE run_id = %s AND seq = 1", (run["id"],)).rowcount
            gone = conn.execute("DELETE FROM occurrences WHERE id = %s", (skipped,)).rowcount
            # Pruning removes rows; it never rewrites them.
            with pytest.raises(psycopg.errors.RestrictViolation), conn.transaction():
                conn.execute("UPDATE run_events SET type = 'run.failed' WHERE run_id = %s", (run["id"],))
        assert (deleted, gone) == (1, 1)
        # The permission ended with that transaction: the same connection is refused again.
        with pytest.raises(psycopg.errors.RestrictViolation):
            conn.execute("DELETE FROM run_events WHERE run_id = %s", (run["id"],))
        # And a rolled-back pruner leaves nothing behind either.
        with pytest.raises(RuntimeError), conn.transaction():
            conn.execute("SELECT kairos_allow_pruning()")
            raise RuntimeError("pruner failed")
        with pytest.raises(psycopg.errors.RestrictViolation):
            conn.execute("DELETE FROM run_events WHERE run_id = %s", (run["id"],))
        assert conn.execute("SELECT count(*) FROM run_events WHERE run_id = %s", (run["id"],)).fetchone() == (1,)


@pytest.mark.parametrize("loosened", [
    "catch_up = true", "overlap = 'allow'", "mode = 'fork'", "ends_at = NULL", "max_occurrences = NULL",
    "max_occurrences = 501", "kind = 'once', cron = NULL, starts_at = now() + interval '1 day'", "goal = NULL",
])
def test_the_schema_refuses_a_loop_that_would_loosen_its_policies(db_url: str, loosened: str) -> None:
    loop = factories.loop(db_url)
    with psycopg.connect(db_url, autocommit=True) as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(f"UPDATE schedules SET {loosened} WHERE id = %s", (loop["id"],))  # type: ignore[arg-type]


def test_only_a_loop_has_a_goal_or_a_draft(db_url: str) -> None:
    plain = factories.schedule(db_url)
    with psycopg.connect(db_url, autocommit=True) as conn:
        for change in ("status = 'draft'", "goal = '{}'::jsonb"):
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute(f"UPDATE schedules SET {change} WHERE id = %s", (plain["id"],))  # type: ignore[arg-type]
