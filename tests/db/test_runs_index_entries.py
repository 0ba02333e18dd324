"""The runs indexes a run's updates enter, and the reads that lost an index to them (migrations 0043, 0045).

A claim and a run's end change ``state``, which most runs indexes name, so neither update is HOT: each
adds an entry to every index whose predicate the new row version satisfies. The first test evaluates
each runs index's predicate on a run's row after its claim, its end and its settlement: the indexes a
row version is in are the entries its update wrote. Before 0043 a claimed run was also in
runs_running_idx and runs_owner_active_idx, and an ended, unsettled run in runs_prunable_idx; before
0045, a claimed run was in runs_schedule_active_idx too.

The other tests hold the reads those indexes served, each against a database with history (ended runs
analyzed), counting the rows of ``runs`` the statement fetched (``pg_stat_xact_user_tables``): the
rescue's expired-lease scan, the status counts and the overlap reads find running runs among the slot
holders, not among every run, and retention reads settled runs in the order it prunes them.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from kairos import db as db_module
from kairos import operations, trace
from kairos.db import Database
from kairos.runs import moves
from kairos.states import EventType
from tests import factories
from tests.support.api import Api

T = datetime(2026, 3, 2, 7, 0, tzinfo=UTC)
HISTORY = 400
# Every run of every row touches these four, HOT updates aside.
EVERY_ROW = {"runs_pkey", "runs_occurrence_id_key", "runs_owner_created_idx", "runs_schedule_created_idx"}


def _indexes_of(conn: psycopg.Connection[Any], run_id: Any) -> set[str]:
    """The runs indexes whose predicate the run's current row satisfies (the non-partial ones too)."""
    indexes = conn.execute("""SELECT c.relname AS name, pg_get_expr(i.indpred, i.indrelid) AS predicate
                                FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
                               WHERE i.indrelid = 'runs'::regclass""").fetchall()
    found = set()
    for index in indexes:
        predicate = index["predicate"] or "true"
        row = conn.execute(f"SELECT EXISTS (SELECT 1 FROM runs WHERE id = %s AND ({predicate})) AS x",  # type: ignore[arg-type]
                           (run_id,)).fetchone()
        if row is not None and row["x"]:
            found.add(str(index["name"]))
    return found


def test_a_claim_an_end_and_a_settlement_enter_only_the_indexes_that_read_them(db: Database,
                                                                                 db_url: str) -> None:
    queued = factories.run(db_url, admitted_at=datetime.now(UTC))
    with db.transaction() as conn:
        assert _indexes_of(conn, queued["id"]) == EVERY_ROW | {
            "runs_handoff_idx", "runs_owner_active_idx", "runs_schedule_active_idx", "runs_slot_holders_idx"}
        claimed = moves.claim(conn, queued["id"])
        assert claimed is not None and claimed["state"] == "running"
        # The running run is found among its owner's slot holders, nothing else: not by id among running
        # runs (runs_running_idx, dropped), nor among its owner's or its schedule's active runs.
        assert _indexes_of(conn, queued["id"]) == EVERY_ROW | {"runs_slot_holders_idx"}
        assert moves.succeed(conn, queued["id"], int(claimed["fence"]), output={"conversation_id": "x", "entry_seq": 1},
                             events=[trace.Event(EventType.STEP_FINISHED, "model", {"outcome": "succeeded"})])
        # Ended: the settle step's, and not yet retention's (it prunes settled runs only).
        assert _indexes_of(conn, queued["id"]) == EVERY_ROW | {"runs_unsettled_idx"}
        assert db_module.fetch_all(conn, "runs_mark_settled", {"ids": [queued["id"]], "now": None})
        assert _indexes_of(conn, queued["id"]) == EVERY_ROW | {"runs_prunable_idx"}


def _reads(conn: psycopg.Connection[Any]) -> int:
    """The rows of ``runs`` this transaction has read so far (sequential and index fetches)."""
    row = conn.execute("SELECT seq_tup_read + coalesce(idx_tup_fetch, 0) AS n FROM pg_stat_xact_user_tables"
                       " WHERE relname = 'runs'").fetchone()
    assert row is not None
    return int(row["n"])


@pytest.fixture
def history(db_url: str) -> dict[str, Any]:
    """One owner's HISTORY ended runs (half settled, none pruned), analyzed, then 3 running runs (one
    whose lease expired), 2 queued and one awaiting approval."""
    schedule = factories.schedule(db_url, owner="alice")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("""WITH o AS (
                            INSERT INTO occurrences (id, schedule_id, source, fire_at, local_time, utc_offset,
                                                     timezone, tzdata_version, schedule_revision, decision)
                            SELECT gen_random_uuid(), %(s)s, 'scheduled', %(t)s - make_interval(days => 400 - i),
                                   now(), interval '0', 'UTC', 'test', 1, 'dispatched'
                              FROM generate_series(1, %(n)s) AS i
                            RETURNING id, fire_at)
                        INSERT INTO runs (id, occurrence_id, schedule_id, owner, source, source_conversation_id,
                                          mode, prompt, agent, state, output, created_at, finished_at, settled_at)
                        SELECT gen_random_uuid(), o.id, %(s)s, 'alice', 'scheduled', %(c)s, 'fork', 'p', '{}',
                               'succeeded', '{}', o.fire_at, o.fire_at,
                               CASE WHEN o.fire_at < %(t)s - interval '200 days' THEN o.fire_at END
                          FROM o""", {"s": schedule["id"], "c": schedule["conversation_id"], "t": T, "n": HISTORY})
        conn.execute("VACUUM ANALYZE runs")
    now = datetime.now(UTC)
    running = [factories.run(db_url, schedule_row=schedule, state="running", fire_at=T + timedelta(minutes=10 + i),
                             admitted_at=now) for i in range(3)]
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE runs SET lease_expires_at = %s WHERE id = %s",
                     (now - timedelta(minutes=5), running[0]["id"]))
    queued = [factories.run(db_url, schedule_row=schedule, fire_at=T + timedelta(hours=1, minutes=i))
              for i in range(2)]
    waiting = factories.run(db_url, schedule_row=schedule, state="awaiting_approval", fire_at=T + timedelta(hours=2))
    return {"schedule": schedule, "running": running, "queued": queued, "waiting": waiting, "now": now}


def test_the_rescue_reads_the_slot_holders_for_expired_leases(db: Database, history: dict[str, Any]) -> None:
    with db.transaction() as conn:
        before = _reads(conn)
        rows = db_module.fetch_all(conn, "runs_lock_expired", {"now": history["now"], "limit": 100})
        read = _reads(conn) - before
    assert [r["id"] for r in rows] == [history["running"][0]["id"]]
    assert read <= 3, read  # the slot holders (the three running runs), not the 400 ended ones


def test_the_status_counts_read_the_active_runs_only(db: Database, history: dict[str, Any]) -> None:
    with db.transaction() as conn:
        before = _reads(conn)
        owner = operations.owner_status(conn, owner="alice", dlq_depth=None, now=history["now"])
        read = _reads(conn) - before
        before = _reads(conn)
        overall = operations.status(conn, now=history["now"])
        read_overall = _reads(conn) - before
        plan = "\n".join(str(r["QUERY PLAN"]) for r in conn.execute(f"EXPLAIN {db_module.q('runs_ops_status')}",
                                                                     {"now": history["now"]}))
    assert (owner.queued, owner.running, owner.awaiting_approval, owner.awaiting_input) == (2, 3, 1, 0)
    assert owner.oldest_queued_at == min(r["created_at"] for r in history["queued"])
    assert (overall.queued, overall.running, overall.lease_expired) == (2, 3, 1)
    # The owner's counts read its queued and waiting runs (3) and its slot holders (3), never its ended
    # history.
    assert read <= 3 + 3, read
    # The operators' counts read the queued runs (2, from runs_owner_active_idx) and the slot holders
    # (3). Before, the queued count named `owner IS NOT NULL` to meet that index's predicate, and
    # PostgreSQL 17 and later drop an IS NOT NULL condition on a NOT NULL column before they look for an
    # index: it read all 406 runs.
    assert read_overall <= 2 + 3, read_overall
    assert "runs_owner_active_idx" in plan and "runs_slot_holders_idx" in plan, plan


def test_retention_reads_settled_runs_oldest_end_first(db: Database, history: dict[str, Any]) -> None:
    with db.transaction() as conn:
        before = _reads(conn)
        rows = db_module.fetch_all(conn, "runs_lock_past_retention",
                                   {"now": T, "retention_days": 30, "limit": 10})
        read = _reads(conn) - before
        ends = [r["finished_at"] for r in conn.execute("SELECT finished_at FROM runs WHERE id = ANY(%s)",
                                                       ([r["id"] for r in rows],))]
    assert len(rows) == 10
    oldest = sorted(ends)
    assert oldest[0] == T - timedelta(days=399)
    assert read <= 10, read  # the ten oldest settled runs, by runs_prunable_idx in finished order


@pytest.mark.parametrize("overlap", ["skip", "queue_one"])
def test_the_overlap_reads_find_a_running_run_among_the_slot_holders(db: Database, db_url: str,
                                                                   history: dict[str, Any], overlap: str) -> None:
    """The tick's due read and a manual trigger's overlap read: the schedule's newest active run, a running
    one found among its owner's slot holders, a queued one by runs_schedule_active_idx; neither walks the
    schedule's ended history."""
    schedule = history["schedule"]
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE schedules SET overlap = %s, next_fire_at = %s WHERE id = %s", (overlap, T, schedule["id"]))
    newest_running = max(history["running"], key=lambda r: r["created_at"])
    params = {"now": history["now"], "after_at": "-infinity", "after_id": "00000000-0000-0000-0000-000000000000",
              "parts": 1, "part": 0, "limit": 10}
    with db.transaction() as conn:
        before = _reads(conn)
        manual = db_module.fetch_one(conn, "runs_overlap_of_schedule", {"schedule_id": schedule["id"]})
        due = db_module.fetch_all(conn, "schedules_lock_due", params)
        read = _reads(conn) - before
    # The queued runs and the one awaiting approval are newer than the running ones (fired later).
    assert manual is not None and manual["active_run_id"] == history["waiting"]["id"]
    assert [(r["id"], r["active_run_id"]) for r in due] == [(schedule["id"], history["waiting"]["id"])]
    # Each read: the schedule's 3 queued and waiting runs, its owner's 3 slot holders, and the
    # queued-behind probe's 3 (runs_schedule_active_idx) — never its 400 ended runs.
    assert read <= 2 * (3 + 3 + 3), read
    with psycopg.connect(db_url, autocommit=True) as conn:  # only running runs left active
        conn.execute("UPDATE runs SET state = 'cancelled', finished_at = now(), "
                     "diagnosis = '{}' WHERE state IN ('queued', 'awaiting_approval')")
    with db.transaction() as conn:
        manual = db_module.fetch_one(conn, "runs_overlap_of_schedule", {"schedule_id": schedule["id"]})
        due = db_module.fetch_all(conn, "schedules_lock_due", params)
    assert manual is not None and manual["active_run_id"] == newest_running["id"]
    assert [r["active_run_id"] for r in due] == [newest_running["id"]]


def test_a_webhook_runs_claim_and_end_enter_the_hook_index_only_while_held(db: Database, db_url: str) -> None:
    """Migration 0046: runs_hook_dispatch_idx holds held webhook runs only; an unheld one's claim and end
    (neither HOT) add no entry to it, and a held one stays in it (its rate reads it there)."""
    schedule = factories.schedule(db_url)
    unheld = factories.run(db_url, schedule_row=schedule, source="webhook", admitted_at=datetime.now(UTC))
    held = factories.run(db_url, schedule_row=schedule, source="webhook", admitted_at=datetime.now(UTC),
                         held_until=datetime.now(UTC) - timedelta(seconds=1))
    with db.transaction() as conn:
        assert "runs_hook_dispatch_idx" not in _indexes_of(conn, unheld["id"])
        assert "runs_hook_dispatch_idx" in _indexes_of(conn, held["id"])
        for run in (unheld, held):
            claimed = moves.claim(conn, run["id"])
            assert claimed is not None and claimed["state"] == "running"
            assert moves.succeed(conn, run["id"], int(claimed["fence"]),
                                 output={"conversation_id": "x", "entry_seq": 1},
                                 events=[trace.Event(EventType.STEP_FINISHED, "model", {"outcome": "succeeded"})])
        assert _indexes_of(conn, unheld["id"]) == EVERY_ROW | {"runs_unsettled_idx"}
        assert _indexes_of(conn, held["id"]) == EVERY_ROW | {"runs_unsettled_idx", "runs_hook_dispatch_idx"}


def test_a_hooks_rate_window_reads_held_and_unheld_runs_by_their_dispatch_instant(db: Database,
                                                                                   db_url: str) -> None:
    """runs_hook_rate_window answers the n-th newest coalesce(held_until, created_at) within the last
    60 s or ahead, over held and unheld webhook runs alike (two index branches since 0046)."""
    schedule = factories.schedule(db_url)
    now = datetime.now(UTC)
    instants = []
    for i in range(8):
        created = now - timedelta(seconds=70 - 9 * i)  # from 70 s ago to 7 s ago
        held = now + timedelta(seconds=i) if i % 3 == 0 else None  # every third one held, ahead
        factories.run(db_url, schedule_row=schedule, source="webhook", created_at=created, held_until=held)
        instants.append(held or created)
    factories.run(db_url, schedule_row=schedule, source="scheduled", created_at=now - timedelta(seconds=1))
    window = sorted((at for at in instants if at > now - timedelta(seconds=60)), reverse=True)
    with db.transaction() as conn:
        for offset in range(len(window) + 1):
            row = db_module.fetch_one(conn, "runs_hook_rate_window",
                                      {"schedule_id": schedule["id"], "offset": offset, "now": now})
            expected = window[offset] if offset < len(window) else None
            assert (row["at"] if row else None) == expected, offset


def test_a_chat_run_enters_no_schedule_index(api: Api, db: Database) -> None:
    """Migration 0047: a chat turn (no schedule) is not in runs_schedule_created_idx, which its insert,
    claim, end and settlement each entered with a NULL key that no reader asked for."""
    conversation = api.conversation()
    answer = api.alice.post(f"/v1/conversations/{conversation['id']}/messages", {"content": "hello"})
    assert answer.status == 202, answer.text
    with db.transaction() as conn:
        found = _indexes_of(conn, answer.json["run_id"])
    assert "runs_schedule_created_idx" not in found
    assert {"runs_pkey", "runs_occurrence_id_key", "runs_owner_created_idx"} <= found
