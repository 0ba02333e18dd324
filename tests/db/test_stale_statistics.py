"""Hot statements under statistics taken at a quiet moment (issue 14, migrations 0017, 0020 and 0021).

Autovacuum analyzes ``runs`` after a tenth of it changed, so a burst is usually planned from
statistics taken when no run was queued or running: the planner then takes every partial index of
active runs to be empty, and a scan of a whole "empty" index costs less, to it, than a probe of the
primary key. Before 0017 a claim found its run by scanning every queued run, and "this owner's queued
runs" (the queue cap, once per owner of every fire batch) and "this owner's running runs" (the slot
count, once per claim) read every active run there was: a burst's work grew with the square of its
size.

Each test builds that state — a day of ended runs analyzed, autovacuum held off on ``runs``, then many
queued runs — and counts the rows of ``runs`` one statement reads (``pg_stat_xact_user_tables``: the
sequential and index fetches of the caller's own transaction), against the runs it has reason to read.
The claim's superseded probe read every run when ``occurrences`` had been analyzed then too (one
schedule's history, so "its newer occurrences" looked like the whole table, and "runs that started"
like none): it now reads the newer occurrences' runs one by one. Pending notify deliveries, approvals
and input requests, and active schedules found by id or webhook token, had the partial-index fault of
0017 (below, 0020). An owner the statistics never saw had all of their approvals, input requests and
schedules read to find one of them (below, the newcomer; 0021 for schedules).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from kairos import calendar, identity, occurrences
from kairos import db as db_module
from kairos.db import Database
from kairos.runs import moves
from kairos.states import Decision, Source
from tests import factories

T = datetime(2026, 3, 2, 7, 0, tzinfo=UTC)
OWNERS, QUEUED_EACH = 30, 40


@pytest.fixture
def burst(db_url: str) -> list[dict[str, Any]]:
    """OWNERS due schedules, each owner with QUEUED_EACH queued runs that the statistics never saw."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        history = factories.schedule(db_url, owner="history", status="paused")
        conn.execute("""WITH o AS (
                            INSERT INTO occurrences (id, schedule_id, source, fire_at, local_time, utc_offset,
                                                     timezone, tzdata_version, schedule_revision, decision)
                            SELECT gen_random_uuid(), %(s)s, 'scheduled', now() - make_interval(mins => i), now(),
                                   interval '0', 'UTC', 'test', 1, 'dispatched'
                              FROM generate_series(1, 300) AS i
                            RETURNING id, fire_at)
                        INSERT INTO runs (id, occurrence_id, schedule_id, owner, source, source_conversation_id,
                                          mode, prompt, agent, state, output, created_at, finished_at, settled_at)
                        SELECT gen_random_uuid(), o.id, %(s)s, 'history', 'scheduled', %(c)s, 'fork', 'p', '{}',
                               'succeeded', '{}', o.fire_at, o.fire_at, o.fire_at
                          FROM o""", {"s": history["id"], "c": history["conversation_id"]})
        for table in ("runs", "occurrences"):  # a quiet moment: nothing queued, nothing running
            conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")  # the statistics stay as taken
            conn.execute(f"VACUUM ANALYZE {table}")
    due = [factories.schedule(db_url, owner=f"owner-{n}", next_fire_at=T) for n in range(OWNERS)]
    with psycopg.connect(db_url, autocommit=True) as conn:  # each owner's queue, filled since then
        conn.execute("""WITH o AS (
                            INSERT INTO occurrences (id, schedule_id, source, fire_at, local_time, utc_offset,
                                                     timezone, tzdata_version, schedule_revision, decision)
                            SELECT gen_random_uuid(), s.id, 'scheduled', %(t)s - make_interval(hours => i), now(),
                                   interval '0', 'UTC', 'test', 1, 'dispatched'
                              FROM schedules s, generate_series(1, %(n)s) AS i
                             WHERE s.id = ANY(%(ids)s)
                            RETURNING id, schedule_id)
                        INSERT INTO runs (id, occurrence_id, schedule_id, owner, source, source_conversation_id,
                                          mode, prompt, agent, state)
                        SELECT gen_random_uuid(), o.id, s.id, s.owner, 'scheduled', s.conversation_id, 'fork', 'p',
                               '{}', 'queued'
                          FROM o JOIN schedules s ON s.id = o.schedule_id""",
                     {"t": T, "n": QUEUED_EACH, "ids": [s["id"] for s in due]})
    return due


def _reads(conn: psycopg.Connection[Any], table: str = "runs") -> int:
    """The rows of ``table`` this transaction has read so far (sequential and index fetches)."""
    row = conn.execute("SELECT seq_tup_read + coalesce(idx_tup_fetch, 0) AS n FROM pg_stat_xact_user_tables"
                       " WHERE relname = %s", (table,)).fetchone()
    assert row is not None
    return int(row["n"])


def test_a_bursts_queue_count_reads_only_its_owners_queued_runs(burst: list[dict[str, Any]], db: Database) -> None:
    """The queue cap's count, once per owner of a fire batch: each owner's own queued runs."""
    fire = calendar.describe(T, "UTC")
    batch = [occurrences.planned(occurrence_id=(o := identity.occurrence_id(s["id"], Source.SCHEDULED, fire_at=T)),
                                 schedule_id=s["id"], source=Source.SCHEDULED, fire=fire, revision=s["revision"],
                                 decision=Decision.DISPATCHED, run_id=identity.run_id(o))
             for s in burst]
    with db.transaction() as conn:
        before = _reads(conn)
        recorded = occurrences.record(conn, batch, now=T, queue_max=QUEUED_EACH + 1)
        read = _reads(conn) - before
    assert [r["decision"] for r in recorded] == ["dispatched"] * OWNERS  # each owner had room for one more
    # The owners' own queued runs and a foreign-key probe per new run (1,230 here); before 0017, every
    # queued run once per owner (36,030 here).
    assert read <= OWNERS * QUEUED_EACH + 4 * OWNERS, read


def test_a_claim_reads_its_run_and_its_owners_running_runs_only(db_url: str, burst: list[dict[str, Any]],
                                                                 db: Database) -> None:
    """A claim finds its run by the primary key and counts its owner's running runs, not every queued
    or active run."""
    queued = factories.run(db_url, schedule_row=burst[0], fire_at=T)
    with db.transaction() as conn:
        before = _reads(conn)
        claimed = moves.claim(conn, queued["id"], now=datetime.now(UTC), owner_slots=5)
        read = _reads(conn) - before
    assert claimed is not None and claimed["state"] == "running"
    # The run by its primary key and the owner's running runs (none): 3 here. Before 0017 the claim
    # found its row by scanning every queued run and counted the slots by scanning every active run
    # (2,404 here); before the probe read runs by occurrence, its superseded probe scanned every run
    # (1,505 here).
    assert read <= 10, read


# -- pending rows (migration 0020) -------------------------------------------------------------------

PENDING = 400
PENDING_TABLES = ("notify_deliveries", "approvals", "input_requests")


def _requests(conn: psycopg.Connection[Any], keys: dict[str, Any], done: bool, owner: str) -> None:
    """An approval and an input request for each run of ``keys["runs"]``, decided when ``done`` (else
    pending), owned by the SQL expression ``owner`` (over ``n``, the run's ordinal)."""
    at = datetime.now(UTC) if done else None
    conn.execute(
        f"""INSERT INTO approvals (id, run_id, owner, state, attempt, step, call_id, tool, args_digest,
                                   preview, expires_at, decided_at)
            SELECT gen_random_uuid(), r, {owner}, %(st)s, 1, 2, 'c', 'http_post', 'd', '{{}}',
                   now() + interval '1 day', %(at)s
              FROM unnest(%(runs)s::uuid[]) WITH ORDINALITY AS u(r, n)""",
        {**keys, "st": "denied" if done else "pending", "at": at})
    conn.execute(
        f"""INSERT INTO input_requests (id, owner, run_id, attempt, step, call_id, schedule_id, revision,
                                        conversation_id, question, question_digest, state, decided_at)
            SELECT gen_random_uuid(), {owner}, r, 1, 2, 'c', %(s)s, 1, %(c)s, 'Which one?', 'd', %(st)s, %(at)s
              FROM unnest(%(runs)s::uuid[]) WITH ORDINALITY AS u(r, n)""",
        {**keys, "st": "cancelled" if done else "pending", "at": at})


def _history_runs(conn: psycopg.Connection[Any], keys: dict[str, Any]) -> list[Any]:
    """``keys["n"]`` ended runs (and their occurrences) of the schedule ``keys["s"]``."""
    return [r[0] for r in conn.execute(
        """WITH o AS (
               INSERT INTO occurrences (id, schedule_id, source, fire_at, local_time, utc_offset, timezone,
                                        tzdata_version, schedule_revision, decision)
               SELECT gen_random_uuid(), %(s)s, 'scheduled', now() - make_interval(mins => i), now(),
                      interval '0', 'UTC', 'test', 1, 'dispatched'
                 FROM generate_series(1, %(n)s) AS i
               RETURNING id, fire_at)
           INSERT INTO runs (id, occurrence_id, schedule_id, owner, source, source_conversation_id, mode,
                             prompt, agent, state, output, created_at, finished_at, settled_at)
           SELECT gen_random_uuid(), o.id, %(s)s, 'history', 'scheduled', %(c)s, 'fork', 'p', '{}',
                  'succeeded', '{}', o.fire_at, o.fire_at, o.fire_at
             FROM o
           RETURNING id""", keys)]


@pytest.fixture
def pending(db_url: str) -> dict[str, Any]:
    """PENDING pending notify deliveries, approvals and input requests that the statistics never saw:
    each table analyzed holding only finished rows, autovacuum held off, then the pending rows added."""
    history = factories.schedule(db_url, owner="history", status="paused")
    keys = {"s": history["id"], "c": history["conversation_id"], "n": 2 * PENDING}
    with psycopg.connect(db_url, autocommit=True) as conn:
        run_ids = _history_runs(conn, keys)
        for state in ("finished", "pending"):  # the finished half analyzed; the pending half added after
            done = state == "finished"
            half = {**keys, "runs": run_ids[:PENDING] if done else run_ids[PENDING:]}
            conn.execute(
                """INSERT INTO notify_deliveries (run_id, schedule_id, owner, url, secret_ref, state, finished_at)
                   SELECT r, %(s)s, 'history', 'https://hooks.example.com/x', 'ref', %(st)s, %(at)s
                     FROM unnest(%(runs)s::uuid[]) AS r""",
                {**half, "st": "delivered" if done else "pending", "at": datetime.now(UTC) if done else None})
            _requests(conn, half, done, "'owner-' || n")
            if done:
                for table in PENDING_TABLES:
                    conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
                    conn.execute(f"VACUUM ANALYZE {table}")  # a quiet moment: nothing pending
        # One owner's request each (owners hold one pending row apiece, as a burst's many owners do).
        ids = {t: conn.execute(f"SELECT id, owner FROM {t} WHERE state = 'pending' LIMIT 1").fetchone()
               for t in ("approvals", "input_requests")}
    return {"schedule_id": history["id"], "run_id": run_ids[-1], "approvals": ids["approvals"],
            "input_requests": ids["input_requests"]}


@pytest.mark.parametrize(("statement", "table"), [
    ("notify_deliveries_delivered", "notify_deliveries"),
    ("notify_deliveries_retry", "notify_deliveries"),
    ("notify_deliveries_give_up", "notify_deliveries"),
    ("approvals_decide", "approvals"),
    ("input_requests_answer", "input_requests"),
])
def test_a_statement_by_id_reads_its_own_pending_row(pending: dict[str, Any], db: Database, statement: str,
                                                     table: str) -> None:
    """Marking one delivery delivered (retried, given up), deciding one approval, answering one input
    request: each reads its own row by its key, not every pending row of its table. Before 0020 each
    scanned the whole pending-rows index, which the stale statistics said was empty (PENDING rows here)."""
    now = datetime.now(UTC)
    row_id, owner = pending.get(table) or (None, None)
    params = {"run_id": pending["run_id"], "status": 500, "error": "boom", "attempts": 0, "delay_seconds": 60,
              "id": row_id, "owner": owner, "state": "approved", "answer_digest": "a", "entry_seq": 3, "now": now}
    with db.transaction() as conn:
        before = _reads(conn, table)
        changed = db_module.fetch_one(conn, statement, params)
        read = _reads(conn, table) - before
    assert changed is not None  # the statement found and moved its row
    # An approval or an input request is read to lock it, then updated: its row is fetched twice.
    assert read <= (3 if table == "notify_deliveries" else 4), read


@pytest.fixture
def newcomer(db_url: str) -> dict[str, Any]:
    """An owner the statistics never saw, with PENDING pending approvals and input requests: both tables
    analyzed holding twenty other owners' decided requests (autovacuum held off), then the newcomer's
    added, as a new tenant's first burst lands between two ANALYZEs. One request of theirs each."""
    history = factories.schedule(db_url, owner="history", status="paused")
    keys = {"s": history["id"], "c": history["conversation_id"], "n": 2 * PENDING}
    with psycopg.connect(db_url, autocommit=True) as conn:
        run_ids = _history_runs(conn, keys)
        _requests(conn, {**keys, "runs": run_ids[:PENDING]}, True, "'owner-' || (n %% 20)")
        for table in ("approvals", "input_requests"):
            conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
            conn.execute(f"VACUUM ANALYZE {table}")
        _requests(conn, {**keys, "runs": run_ids[PENDING:]}, False, "'newcomer'")
        return {t: conn.execute(f"SELECT id FROM {t} WHERE owner = 'newcomer' LIMIT 1").fetchone()[0]
                for t in ("approvals", "input_requests")}


@pytest.mark.parametrize(("statement", "table"), [
    ("approvals_get", "approvals"),
    ("approvals_decide", "approvals"),
    ("input_requests_get", "input_requests"),
    ("input_requests_answer", "input_requests"),
])
def test_a_new_owners_request_is_read_by_its_key(newcomer: dict[str, Any], db: Database, statement: str,
                                                 table: str) -> None:
    """Reading, deciding or answering one request of an owner the statistics never saw reads that row,
    not all of the owner's: with ``owner = …`` in the scan, the planner took the owner index (owner,
    state, created_at) for as selective as the key and read every one of the newcomer's requests
    (PENDING here) to find one. The statements now find the row by its key alone and check the owner
    after; another owner's request is still as absent as a missing one."""
    params = {"id": newcomer[table], "owner": "newcomer", "state": "approved", "answer_digest": "a",
              "entry_seq": 3, "now": datetime.now(UTC)}
    with db.transaction() as conn:
        assert db_module.fetch_one(conn, statement, {**params, "owner": "owner-1"}) is None
        before = _reads(conn, table)
        found = db_module.fetch_one(conn, statement, params)
        read = _reads(conn, table) - before
    assert found is not None and found["id"] == newcomer[table] and found["owner"] == "newcomer"
    assert read <= 4, read


@pytest.fixture
def new_schedules(db_url: str) -> Any:
    """An owner the statistics never saw, with PENDING schedules: ``schedules`` analyzed holding twenty
    other owners' schedules (autovacuum held off), then the newcomer's added. One of theirs."""
    for n in range(20):
        factories.schedule(db_url, owner=f"owner-{n}", status="paused")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE schedules SET (autovacuum_enabled = false)")
        conn.execute("VACUUM ANALYZE schedules")
        conversation = factories.conversation(db_url, owner="newcomer")["id"]
        conn.execute("""INSERT INTO schedules (id, owner, conversation_id, prompt, kind, cron, timezone, next_fire_at,
                                               status)
                        SELECT gen_random_uuid(), 'newcomer', %s, 'p', 'cron', '0 * * * *', 'UTC', now(), 'active'
                          FROM generate_series(1, %s)""", (conversation, PENDING))
        return conn.execute("SELECT id FROM schedules WHERE owner = 'newcomer' LIMIT 1").fetchone()[0]


@pytest.mark.parametrize("statement", ["schedules_get", "schedules_lock_owned", "schedules_pause"])
def test_a_new_owners_schedule_is_read_by_its_key(new_schedules: Any, db: Database, statement: str) -> None:
    """One schedule of an owner the statistics never saw is read alone, not with all of the owner's:
    before 0021 schedules_owner_idx (owner, created_at) was taken for as selective as the key, and every
    one of the newcomer's schedules (PENDING) was fetched to find it."""
    with db.transaction() as conn:
        assert db_module.fetch_one(conn, statement, {"schedule_id": new_schedules, "owner": "owner-1",
                                                     "reason": None, "now": None}) is None
        before = _reads(conn, "schedules")
        found = db_module.fetch_one(conn, statement, {"schedule_id": new_schedules, "owner": "newcomer",
                                                      "reason": None, "now": None})
        read = _reads(conn, "schedules") - before
    assert found is not None and found["id"] == new_schedules
    assert read <= 3, read


def _plan_served_by(db_url: str, table: str, index: str, statement: str, params: dict[str, Any]) -> str:
    """The plan of ``statement`` with ``index`` and the primary key the table's only indexes (the others
    dropped in a transaction rolled back after) and sequential scans off: ``index`` is in it when its
    predicate follows from the statement's conditions, since a partial index serves no other query.
    Which index the planner picks among several is its cost estimate's business, and PostgreSQL 18's
    skip scans changed it; whether it can use this one is the migration's."""
    with psycopg.connect(db_url) as conn:
        others = conn.execute(
            """SELECT i.indexrelid::regclass::text, c.conname
                 FROM pg_index i LEFT JOIN pg_constraint c ON c.conindid = i.indexrelid AND c.conrelid = i.indrelid
                WHERE i.indrelid = %s::regclass AND NOT i.indisprimary AND i.indexrelid::regclass::text <> %s""",
            (table, index)).fetchall()
        for name, constraint in others:
            conn.execute(f"ALTER TABLE {table} DROP CONSTRAINT {constraint}" if constraint else f"DROP INDEX {name}")
        conn.execute("SET LOCAL enable_seqscan = off")
        plan = "\n".join(str(r[0]) for r in conn.execute("EXPLAIN " + db_module.q(statement), params).fetchall())
        conn.rollback()
    return plan


@pytest.mark.parametrize(("statement", "table", "index", "params"), [
    ("notify_deliveries_claim", "notify_deliveries", "notify_deliveries_due_idx",
     {"lease_seconds": 60, "preview": 100}),
    ("approvals_lock_due_runs", "approvals", "approvals_pending_expiry_idx", {"limit": 10}),
    ("input_requests_pending_for_schedule", "input_requests", "input_requests_schedule_pending_idx", {}),
])
def test_the_pending_queries_can_still_use_their_index(db_url: str, pending: dict[str, Any], statement: str,
                                                       table: str, index: str, params: dict[str, Any]) -> None:
    """The conjunct 0020 added to each pending-rows index is one its own query implies or states."""
    plan = _plan_served_by(db_url, table, index, statement,
                           {"now": datetime.now(UTC), "schedule_id": pending["schedule_id"], **params})
    assert index in plan, plan


# -- active schedules by id or token (migration 0020) ---------------------------------------------------

ACTIVE = 400


@pytest.fixture
def active(db_url: str) -> dict[str, Any]:
    """ACTIVE active schedules (and one webhook) that the statistics never saw: ``schedules`` analyzed
    holding only paused ones, autovacuum held off, then the active ones created, as on a first deploy."""
    quiet = factories.schedule(db_url, owner="history", status="paused")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("""INSERT INTO schedules (id, owner, conversation_id, prompt, kind, cron, status, next_fire_at)
                        SELECT gen_random_uuid(), 'history', %s, 'p', 'cron', '0 7 * * *', 'paused', now()
                          FROM generate_series(1, 300)""", (quiet["conversation_id"],))
        conn.execute("ALTER TABLE schedules SET (autovacuum_enabled = false)")  # the statistics stay as taken
        conn.execute("VACUUM ANALYZE schedules")  # a quiet moment: nothing active
        conn.execute("""INSERT INTO schedules (id, owner, conversation_id, prompt, kind, cron, status, next_fire_at)
                        SELECT gen_random_uuid(), 'owner-' || i, %s, 'p', 'cron', '0 7 * * *', 'active',
                               now() + interval '1 hour'
                          FROM generate_series(1, %s) AS i""", (quiet["conversation_id"], ACTIVE))
    hook = factories.schedule(db_url, owner="hook-owner", kind="webhook", conversation_id=quiet["conversation_id"])
    timed = factories.schedule(db_url, owner="timed-owner", conversation_id=quiet["conversation_id"],
                               next_fire_at=datetime.now(UTC) + timedelta(hours=2))
    return {"hook": hook, "timed": timed}


@pytest.mark.parametrize("statement", ["schedules_pause", "schedules_pause_by_tick", "schedules_find_hook"])
def test_a_schedule_found_by_id_or_token_reads_its_own_row(active: dict[str, Any], db: Database,
                                                           statement: str) -> None:
    """Pausing one schedule (the API, the tick) and finding a webhook's schedule by its token hash read
    that schedule's row, not every active schedule: before 0020 each scanned the whole due-key index,
    which the statistics said was empty (ACTIVE entries here)."""
    target = active["hook"] if statement == "schedules_find_hook" else active["timed"]
    params = {"schedule_id": target["id"], "ids": [target["id"]], "owner": target["owner"],
              "token_hash": target["token_hash"], "reason": None, "now": datetime.now(UTC)}
    with db.transaction() as conn:
        before = _reads(conn, "schedules")
        found = db_module.fetch_all(conn, statement, params)
        read = _reads(conn, "schedules") - before
    assert [r["id"] for r in found] == [target["id"]]
    assert read <= 3, read


def test_the_due_scan_can_still_use_the_due_key_index(db_url: str, active: dict[str, Any]) -> None:
    """The conjunct 0020 added to schedules_due_key_idx is one the fire step's due scan implies."""
    plan = _plan_served_by(db_url, "schedules", "schedules_due_key_idx", "schedules_lock_due", {
        "now": datetime.now(UTC) + timedelta(hours=3), "limit": 500, "after_at": datetime(1, 1, 1, tzinfo=UTC),
        "after_id": "00000000-0000-0000-0000-000000000000", "part": 0, "parts": 1})
    assert "schedules_due_key_idx" in plan, plan


# -- a run end's look for waiting runs (migration 0044) ------------------------------------------------

HOLDING, ENDED = 300, 300


@pytest.fixture
def busy_owner(db_url: str) -> dict[str, Any]:
    """One owner with HOLDING queued runs that hold a slot each (admitted, as the tick hands them to SQS)
    and ENDED ended runs, ``runs`` analyzed in that state and never vacuumed (few of its pages
    all-visible, as while it is being written), autovacuum held off: to the planner, a quarter of the
    owner's runs wait for a slot. None does."""
    sched = factories.schedule(db_url, owner="busy")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE runs SET (autovacuum_enabled = false)")  # the statistics stay as taken
        for state, count in (("succeeded", ENDED), ("queued", HOLDING)):
            conn.execute("""WITH o AS (
                                INSERT INTO occurrences (id, schedule_id, source, fire_at, local_time, utc_offset,
                                                         timezone, tzdata_version, schedule_revision, decision)
                                SELECT gen_random_uuid(), %(s)s, 'scheduled', now() - make_interval(mins => i),
                                       now(), interval '0', 'UTC', 'test', 1, 'dispatched'
                                  FROM generate_series(1, %(n)s) AS i
                                RETURNING id, fire_at)
                            INSERT INTO runs (id, occurrence_id, schedule_id, owner, source, source_conversation_id,
                                              mode, prompt, agent, state, output, created_at, finished_at,
                                              settled_at, admitted_at)
                            SELECT gen_random_uuid(), o.id, %(s)s, 'busy', 'scheduled', %(c)s, 'fork', 'p', '{}',
                                   %(st)s, CASE WHEN %(done)s THEN '{}'::jsonb END, o.fire_at,
                                   CASE WHEN %(done)s THEN o.fire_at END, CASE WHEN %(done)s THEN o.fire_at END,
                                   CASE WHEN NOT %(done)s THEN now() END
                              FROM o""",
                         {"s": sched["id"], "c": sched["conversation_id"], "n": count, "st": state,
                          "done": state == "succeeded"})
        conn.execute("ANALYZE runs")
        holder = conn.execute("SELECT id FROM runs WHERE owner = 'busy' AND admitted_at IS NOT NULL LIMIT 1").fetchone()
    assert holder is not None
    return {"run_id": holder[0]}


def test_a_run_end_looks_for_waiting_runs_by_the_index(busy_owner: dict[str, Any], db: Database) -> None:
    """A run that gives its slot up looks for its owner's waiting runs through runs_slot_waiting_idx,
    whatever the statistics say: before 0044 the look was an EXISTS, which the planner answered with a
    sequential scan of ``runs`` (every run of every owner, HOLDING + ENDED here) at every end of a busy
    owner's run, expecting to meet a waiting run within the first rows."""
    with db.transaction() as conn:
        before = _reads(conn)
        conn.execute("UPDATE runs SET state = 'cancelled', finished_at = now() WHERE id = %s",
                     (busy_owner["run_id"],))
        read = _reads(conn) - before
        row = conn.execute("SELECT state, admitted_at FROM runs WHERE id = %s", (busy_owner["run_id"],)).fetchone()
    assert row is not None and row["state"] == "cancelled" and row["admitted_at"] is None  # its slot given up
    # The run by its primary key, and the look: no entry in the partial index (1 here; 601 before 0044).
    assert read <= 5, read


OWNERS_BUSY, HISTORY_EACH, FRESH_EACH, WAITING_AT_ANALYZE, ENDS = 100, 200, 200, 2, 8


@pytest.fixture
def long_history(db_url: str) -> list[Any]:
    """OWNERS_BUSY owners, each with HISTORY_EACH ended runs and FRESH_EACH queued runs, every one of which
    waited for a slot once (each left an entry, now dead, in runs_slot_waiting_idx: autovacuum held
    off); ``runs`` analyzed while the fresh runs held a slot but WAITING_AT_ANALYZE of each owner's; then
    those got theirs too. To the planner half of an owner's runs are queued and half have no slot, so,
    taking the two for independent, a quarter of them wait, and the waiting index, many pages for the
    few entries ANALYZE counted, looks dear: walking the owner's runs in creation order
    (runs_owner_created_idx) looks cheaper. None waits, and the history comes first in that order. The
    ids of ENDS runs of the first owner that hold a slot."""
    sched = factories.schedule(db_url, owner="busy-0")  # the owners' runs of one schedule, for brevity
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE runs SET (autovacuum_enabled = false)")
        conn.execute("""WITH o AS (
                            INSERT INTO occurrences (id, schedule_id, source, fire_at, local_time, utc_offset,
                                                     timezone, tzdata_version, schedule_revision, decision)
                            SELECT gen_random_uuid(), %(s)s, 'scheduled',
                                   %(t)s - make_interval(mins => i, secs => k / 1000.0), now(),
                                   interval '0', 'UTC', 'test', 1, 'dispatched'
                              FROM generate_series(0, %(owners)s - 1) AS k, generate_series(1, %(n)s) AS i
                            RETURNING id, fire_at)
                        INSERT INTO runs (id, occurrence_id, schedule_id, owner, source, source_conversation_id,
                                          mode, prompt, agent, state, created_at)
                        SELECT gen_random_uuid(), o.id, %(s)s,
                               'busy-' || round(extract(epoch FROM %(t)s - o.fire_at) * 1000)::bigint %% 60000,
                               'scheduled', %(c)s, 'fork', 'p', '{}', 'queued', o.fire_at
                          FROM o ORDER BY 4, o.fire_at DESC""",
                     {"s": sched["id"], "c": sched["conversation_id"], "n": HISTORY_EACH + FRESH_EACH,
                      "owners": OWNERS_BUSY, "t": T})
        conn.execute("""UPDATE runs SET state = 'succeeded', output = '{}', finished_at = created_at,
                                        settled_at = created_at
                         WHERE created_at <= %s - make_interval(mins => %s + 1)""", (T, FRESH_EACH))
        conn.execute("""UPDATE runs SET admitted_at = now()
                         WHERE state = 'queued' AND created_at <= %s - make_interval(mins => %s + 1)""",
                     (T, WAITING_AT_ANALYZE))
        conn.execute("ANALYZE runs")
        conn.execute("UPDATE runs SET admitted_at = now() WHERE state = 'queued' AND admitted_at IS NULL")
        return [r[0] for r in conn.execute("SELECT id FROM runs WHERE owner = 'busy-0' AND admitted_at IS NOT NULL"
                                           " LIMIT %s", (ENDS,))]


def test_a_run_end_does_not_walk_its_owners_history(long_history: list[Any], db_url: str, db: Database) -> None:
    """The run end's look for the owner's oldest waiting run (0044) stays on runs_slot_waiting_idx under
    statistics that make walking the owner's runs look cheap, through its custom plans and the generic
    one PL/pgSQL takes after five (each end is its own transaction on one connection, as a worker's).
    Its conditions are the index's predicate and its key, so the index answers it from its entries alone;
    a walk of runs_owner_created_idx must fetch each run to check them. The tick's fire asked the same
    in that order, with held_until besides, and was served by the walk (benchmarks, "server share")."""
    reads = []
    for run_id in long_history:
        with db.transaction() as conn:
            before = _reads(conn)
            conn.execute("UPDATE runs SET state = 'cancelled', finished_at = now(), diagnosis = '{}' WHERE id = %s",
                         (run_id,))
            reads.append(_reads(conn) - before)
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FILTER (WHERE admitted_at IS NOT NULL) AS held, "
                           "count(*) FILTER (WHERE state = 'queued' AND admitted_at IS NULL) AS waiting "
                           "FROM runs WHERE owner = 'busy-0'").fetchone()
    assert row == (FRESH_EACH - ENDS, 0)  # each end gave its slot up; none waits
    # Each end: the run by its primary key, and no entry in the partial index (1 each here). A walk of
    # the owner's runs reads its HISTORY_EACH ended runs before the first fresh one.
    assert max(reads) <= 5, reads
    # The count sees a walk: without the partial index, an end reads the owner's history.
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        conn.execute("DROP INDEX runs_slot_waiting_idx")
        before = _reads(conn)
        conn.execute("UPDATE runs SET state = 'cancelled', finished_at = now(), diagnosis = '{}' "
                     "WHERE id = (SELECT id FROM runs WHERE owner = 'busy-0' AND admitted_at IS NOT NULL LIMIT 1)")
        walked = _reads(conn) - before
        conn.rollback()
    assert walked >= HISTORY_EACH, walked
