"""The run path's single-column checks are domains (migration 0049): every bad value the table CHECKs
refused is still refused with SQLSTATE 23514, on INSERT and on UPDATE; the columns keep their base types
(as information_schema and the client see them); and widening a closed list still works."""

from __future__ import annotations

import uuid
from datetime import date
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from kairos import migrations
from tests import factories

# (table, column, base type as information_schema names it, a value its former CHECK refused)
BAD: list[tuple[str, str, str, Any]] = [
    ("runs", "owner", "text", ""),
    ("runs", "source", "text", "bogus"),
    ("runs", "mode", "text", "bogus"),
    ("runs", "state", "text", "bogus"),
    ("runs", "attempt", "integer", -1),
    ("runs", "max_attempts", "integer", 0),
    ("runs", "restarts", "integer", -1),
    ("runs", "fence", "bigint", -1),
    ("runs", "last_seq", "integer", -1),
    ("runs", "runtime_limit_seconds", "integer", 0),
    ("runs", "unclaimed_handoffs", "integer", -1),
    ("runs", "flow_window", "text", "bogus"),
    ("runs", "deliveries", "integer", 0),
    ("runs", "max_steps", "integer", 0),
    ("runs", "schedule_revision", "integer", 0),
    ("runs", "agent_digest", "text", "A" * 64),
    ("runs", "slot_limit", "integer", 0),
    ("runs", "concurrency_limit", "integer", 0),
    ("effects", "kind", "text", "bogus"),
    ("effects", "state", "text", "bogus"),
    ("effects", "charge_tokens", "bigint", -1),
    ("effects", "charge_cost_usd", "numeric", Decimal("-0.01")),
    ("effects", "charge_stripe", "smallint", 8),
    ("effects", "charge_stripe", "smallint", -1),
    ("run_event_batches", "attempt", "integer", -1),
    ("run_event_batches", "events", "jsonb", Jsonb([{"type": "run.bogus"}])),
    ("run_event_batches", "events", "jsonb", Jsonb([{"step": "no type"}])),
    ("run_event_batches", "events", "jsonb", Jsonb([])),
    ("run_event_batches", "events", "jsonb", Jsonb({"type": "run.queued"})),
    ("usage_ledger_stripes", "owner", "text", ""),
    ("usage_ledger_stripes", "reserved_tokens", "bigint", -1),
    ("usage_ledger_stripes", "reserved_cost_usd", "numeric", Decimal("-1")),
    ("usage_ledger_stripes", "input_tokens", "bigint", -1),
    ("usage_ledger_stripes", "output_tokens", "bigint", -1),
    ("usage_ledger_stripes", "cost_usd", "numeric", Decimal("-1")),
    ("usage_ledger_stripes", "calls", "integer", -1),
    ("usage_ledger_stripes", "runs", "integer", -1),
    ("usage_ledger_stripes", "stripe", "smallint", 8),
    ("run_steps", "kind", "text", "bogus"),
    ("run_steps", "state", "text", "bogus"),
    ("run_steps", "n", "integer", 0),
    ("occurrences", "source", "text", "bogus"),
    ("occurrences", "decision", "text", "bogus"),
    ("occurrences", "fold", "smallint", 2),
    ("occurrences", "covers_count", "integer", 0),
    ("occurrences", "key_generation", "integer", -1),
    ("conversation_entries", "role", "text", "bogus"),
    ("conversation_entries", "seq", "integer", 0),
    ("conversations", "owner", "text", ""),
    ("conversations", "fork_seq", "integer", -1),
]
# The tables whose rows may be updated (the others refuse any UPDATE by trigger).
MUTABLE = {"runs", "effects", "usage_ledger_stripes", "run_steps", "conversations"}
KEYS = {"runs": ("id",), "effects": ("id",), "run_event_batches": ("run_id", "last_seq"),
        "usage_ledger_stripes": ("owner", "day", "stripe"), "run_steps": ("run_id", "n"), "occurrences": ("id",),
        "conversation_entries": ("conversation_id", "seq"), "conversations": ("id",)}


def _one_row_each(url: str) -> dict[str, dict[str, Any]]:
    """A valid row of each table (the key columns of it): a queued run with its occurrence and thread,
    and an entry, an effect with its charge, a trace batch, a step and a ledger stripe of it."""
    run = factories.run(url, state="queued")
    effect_id = uuid.uuid4()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("""INSERT INTO conversation_entries (conversation_id, seq, role, content)
                        VALUES (%s, 1, 'user', 'hi')""", (run["source_conversation_id"],))
        conn.execute("""INSERT INTO effects (id, run_id, fence, attempt, step, kind, target, request_digest,
                                             charge_day, charge_tokens, charge_cost_usd, charge_stripe)
                        VALUES (%s, %s, 1, 1, 'step-1', 'model_call', 'm', 'd', current_date, 10, 0.5, 3)""",
                     (effect_id, run["id"]))
        conn.execute("""INSERT INTO run_event_batches (run_id, last_seq, at, attempt, fence, events)
                        VALUES (%s, 1, now(), 0, 0, '[{"type": "run.queued"}]')""", (run["id"],))
        conn.execute("""INSERT INTO run_steps (run_id, n, kind, name, record, attempt, fence, state, finished_at)
                        VALUES (%s, 1, 'model', 'm', '{}', 1, 1, 'succeeded', now())""", (run["id"],))
        conn.execute("INSERT INTO usage_ledger_stripes (owner, day, stripe) VALUES (%s, %s, 2)",
                     (run["owner"], date(2026, 1, 1)))
    return {"runs": {"id": run["id"]}, "effects": {"id": effect_id},
            "run_event_batches": {"run_id": run["id"], "last_seq": 1},
            "usage_ledger_stripes": {"owner": run["owner"], "day": date(2026, 1, 1), "stripe": 2},
            "run_steps": {"run_id": run["id"], "n": 1}, "occurrences": {"id": run["occurrence_id"]},
            "conversation_entries": {"conversation_id": run["source_conversation_id"], "seq": 1},
            "conversations": {"id": run["source_conversation_id"]}}


def _where(key: dict[str, Any]) -> sql.Composed:
    return sql.SQL(" AND ").join(sql.SQL("{} = {}").format(sql.Identifier(k), sql.Placeholder(k)) for k in key)


def _copy(conn: psycopg.Connection[Any], table: str, key: dict[str, Any], changes: dict[str, Any]) -> None:
    """INSERT a copy of the row at ``key`` with ``changes`` (every other value as read)."""
    cur = conn.cursor(row_factory=dict_row)
    row = cur.execute(sql.SQL("SELECT * FROM {} WHERE {}").format(sql.Identifier(table), _where(key)), key).fetchone()
    assert row is not None
    values = {k: Jsonb(v) if isinstance(v, dict | list) else v for k, v in row.items()}
    values.update(changes)
    conn.execute(sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
        sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, values)),
        sql.SQL(", ").join(map(sql.Placeholder, values))), values)


@pytest.mark.parametrize(("table", "column", "base", "bad"), BAD, ids=[f"{t}.{c}={b!r}" for t, c, _, b in BAD])
def test_each_former_single_column_check_still_refuses_its_bad_value(db_url: str, table: str, column: str,
                                                                     base: str, bad: Any) -> None:
    rows = _one_row_each(db_url)
    key = rows[table]
    with psycopg.connect(db_url, autocommit=True) as conn:
        # The column keeps its base type, as information_schema and the client see it.
        data_type = conn.execute("""SELECT data_type FROM information_schema.columns
                                     WHERE table_schema = 'public' AND table_name = %s AND column_name = %s""",
                                 (table, column)).fetchone()
        assert data_type == (base,)
        good = conn.execute(sql.SQL("SELECT {} FROM {} WHERE {}").format(
            sql.Identifier(column), sql.Identifier(table), _where(key)), key).fetchone()
        assert good is not None
        # INSERT: a copy of a valid row with the bad value is refused by the check; with the row's own
        # value the same copy passes every check and only meets the row's key.
        with pytest.raises(psycopg.errors.CheckViolation):
            _copy(conn, table, key, {column: bad})
        with pytest.raises(psycopg.errors.UniqueViolation):
            _copy(conn, table, key, {column: Jsonb(good[0]) if isinstance(good[0], dict | list) else good[0]})
        # UPDATE of that one column: refused, and the row is unchanged.
        if table in MUTABLE:
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute(sql.SQL("UPDATE {} SET {} = %(bad)s WHERE {}").format(
                    sql.Identifier(table), sql.Identifier(column), _where(key)), {**key, "bad": bad})
        after = conn.execute(sql.SQL("SELECT {} FROM {} WHERE {}").format(
            sql.Identifier(column), sql.Identifier(table), _where(key)), key).fetchone()
    assert after == good


def test_domain_columns_read_back_as_their_base_types(db_url: str) -> None:
    rows = _one_row_each(db_url)
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        run = conn.execute("SELECT state, attempt, fence, slot_limit, owner FROM runs WHERE id = %s",
                           (rows["runs"]["id"],)).fetchone()
        effect = conn.execute("SELECT charge_tokens, charge_cost_usd, charge_stripe FROM effects WHERE id = %s",
                              (rows["effects"]["id"],)).fetchone()
        batch = conn.execute("SELECT events FROM run_event_batches WHERE run_id = %s", (rows["runs"]["id"],)).fetchone()
    assert run == {"state": "queued", "attempt": 0, "fence": 0, "slot_limit": 4, "owner": "alice"}
    assert effect == {"charge_tokens": 10, "charge_cost_usd": Decimal("0.5"), "charge_stripe": 3}
    assert batch == {"events": [{"type": "run.queued"}]}


def test_the_checks_that_relate_two_columns_stay_table_checks(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        names = {r[0] for r in conn.execute(
            """SELECT conname FROM pg_constraint WHERE contype = 'c' AND conrelid = ANY (ARRAY['runs', 'effects',
                   'run_event_batches', 'run_steps', 'occurrences', 'conversations']::regclass[])""")}
    assert names == {
        "runs_concurrency_check", "runs_failed_has_diagnosis", "runs_finished_iff_terminal", "runs_lease_iff_running",
        "runs_pruned_after_finish", "runs_resumed_from_is_retry", "runs_schedule_iff_not_chat",
        "runs_settled_after_finish", "runs_succeeded_has_output", "runs_test_iff_source", "runs_window_shape",
        "effects_charge_whole", "effects_settled_iff_final", "run_event_batches_seq_check",
        "run_steps_finished_when_ended", "run_steps_succeeded_has_record", "occurrences_coalesced_shape",
        "occurrences_keyed", "occurrences_schedule_iff_not_chat", "conversations_fork_point"}


def test_widening_a_closed_list_widens_the_domain_of_every_column_that_has_it(db_url: str) -> None:
    rows = _one_row_each(db_url)
    with psycopg.connect(db_url, autocommit=True) as conn:
        # A later migration's call, as 0024 made it: runs.source's list is its domain's, shared with
        # occurrences.source, so both take the value; the values already allowed stay.
        conn.execute("SELECT kairos_widen_check('runs', 'source', ARRAY['replay'])")
        conn.execute("SELECT kairos_widen_domain('kairos_run_state', ARRAY['parked', 'queued'])")
        conn.execute("UPDATE runs SET state = 'parked' WHERE id = %s", (rows["runs"]["id"],))
        conn.execute("UPDATE runs SET state = 'queued' WHERE id = %s", (rows["runs"]["id"],))
        _copy(conn, "occurrences", rows["occurrences"], {"id": uuid.uuid4(), "source": "replay"})
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("UPDATE runs SET state = 'bogus' WHERE id = %s", (rows["runs"]["id"],))
        lists = dict(conn.execute(
            """SELECT t.typname, pg_get_constraintdef(c.oid) FROM pg_constraint c JOIN pg_type t ON t.oid = c.contypid
                WHERE t.typname IN ('kairos_run_source', 'kairos_run_state')""").fetchall())
        # A table's own IN-list check (not a domain's) widens as before.
        conn.execute("SELECT kairos_widen_check('approvals', 'state', ARRAY['withdrawn'])")
        approvals = conn.execute("""SELECT pg_get_constraintdef(oid) FROM pg_constraint
                                     WHERE conname = 'approvals_state_check'""").fetchone()
    assert "'replay'::text" in lists["kairos_run_source"] and "'webhook'::text" in lists["kairos_run_source"]
    assert lists["kairos_run_state"].count("'queued'::text") == 1 and "'parked'::text" in lists["kairos_run_state"]
    assert approvals is not None and "'withdrawn'::text" in approvals[0]


def test_a_run_written_with_a_bad_value_by_a_statement_that_assigns_it_is_refused_however_it_is_assigned(
        db_url: str) -> None:
    """Domain checks run where a value is assigned: a computed value, a default and a parameter."""
    rows = _one_row_each(db_url)
    run_id = rows["runs"]["id"]
    with psycopg.connect(db_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("UPDATE runs SET attempt = attempt - 1 WHERE id = %s", (run_id,))  # 0 - 1
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("UPDATE runs SET (fence, last_seq) = (SELECT -5, 1) WHERE id = %s", (run_id,))
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("UPDATE usage_ledger_stripes SET calls = calls + %s WHERE stripe = 2", (-1,))
        assert conn.execute("SELECT attempt, fence FROM runs WHERE id = %s", (run_id,)).fetchone() == (0, 0)


_FILES = "SELECT relname, relfilenode FROM pg_class WHERE relname = ANY (%s) ORDER BY relname"


def test_the_migration_keeps_each_table_in_place_and_its_statistics(empty_db_url: str) -> None:
    """The domains migration over a database with rows and statistics: no table is rewritten (each keeps
    its file), the rows are read back as they were, and the changed columns have statistics again."""
    every = migrations.discover()
    domains = next(m for m in every if m.name == "run_path_domains")
    migrations.apply(empty_db_url, [m for m in every if m.version < domains.version])
    run = factories.run(empty_db_url, state="running")
    tables = ["runs", "effects", "run_event_batches", "usage_ledger_stripes", "run_steps", "occurrences",
              "conversation_entries", "conversations"]
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute("ANALYZE")
        files = conn.execute(_FILES, (tables,)).fetchall()
    assert migrations.apply(empty_db_url, every) == [m for m in every if m.version >= domains.version]
    with psycopg.connect(empty_db_url) as conn:
        assert conn.execute(_FILES, (tables,)).fetchall() == files
        again = conn.execute("SELECT state, fence, attempt, owner FROM runs WHERE id = %s", (run["id"],)).fetchone()
        stats = conn.execute("""SELECT count(*) FROM pg_stats WHERE tablename = 'runs'
                                   AND attname IN ('state', 'owner', 'fence')""").fetchone()
    assert again == (run["state"], run["fence"], run["attempt"], run["owner"])
    assert stats == (3,)
