"""Hot statements under statistics taken at a quiet moment (issue 14, migration 0017).

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
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from kairos import calendar, identity, occurrences
from kairos.db import Database
from kairos.runs import moves
from kairos.states import Decision, Source

from tests import factories

T = datetime(2026, 3, 2, 7, 0, tzinfo=UTC)
OWNERS, QUEUED_EACH = 30, 40
READS = "SELECT seq_tup_read + idx_tup_fetch AS n FROM pg_stat_xact_user_tables WHERE relname = 'runs'"


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
        conn.execute("ALTER TABLE runs SET (autovacuum_enabled = false)")  # the statistics stay as taken
        conn.execute("VACUUM ANALYZE runs")  # a quiet moment: nothing queued, nothing running
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


def _reads(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(READS).fetchone()
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
    # (2,404 here).
    assert read <= 10, read
