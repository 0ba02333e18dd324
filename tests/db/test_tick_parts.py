"""The tick's fire workers split the due schedules by owner (``kairos.tick.loop``, ``Tick._fire_all``).

Two workers' first batches are held inside their transactions, after the owners' queue and slot
locks are taken, until both got there: they can only both get there when their batches share no
owner (a worker that reached a lock the other holds waits for its commit). Then: a worker that dies
mid-batch loses no fire (the next tick fires the rest, each once), and a worker that is slow has its
part fired by the others.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from kairos import db as db_module
from kairos import occurrences
from kairos.db import Database
from kairos.probes import Probes
from kairos.tick import Tick
from tests import factories
from tests.support.aws import SqsQueue

T = datetime(2026, 3, 2, 7, 0, tzinfo=UTC)
WAIT = 60.0  # seconds: a deadline for conditions that hold within milliseconds on an idle machine


class Died(Exception):
    """The simulated end of a fire worker (a Lambda invocation dying mid-batch)."""


def owners_by_part(url: str, per_part: int, parts: int = 2) -> list[list[str]]:
    """``per_part`` owner names in each of ``parts`` parts, by the same hash as ``schedules_lock_due``."""
    found: list[list[str]] = [[] for _ in range(parts)]
    with psycopg.connect(url) as conn:
        for i in range(1000):
            name = f"owner-{i}"
            row = conn.execute("SELECT mod(hashtextextended(%s, 0) & 2147483647, %s)", (name, parts)).fetchone()
            assert row is not None
            if len(found[row[0]]) < per_part:
                found[row[0]].append(name)
            if all(len(f) == per_part for f in found):
                return found
    raise AssertionError("no owners found for every part")


def populate(url: str, owners: list[str], each: int) -> dict[uuid.UUID, str]:
    """``each`` due schedules per owner, interleaved across owners in (next_dispatch_at, id) order:
    any run of consecutive due schedules longer than the owner count repeats an owner."""
    conversations = {owner: factories.conversation(url, owner=owner)["id"] for owner in owners}
    owner_of: dict[uuid.UUID, str] = {}
    step = 0
    for _ in range(each):
        for owner in owners:
            step += 1
            at = T - timedelta(seconds=100) + timedelta(seconds=step)  # within the grace
            row = factories.schedule(url, owner=owner, conversation_id=conversations[owner], kind="interval",
                                     interval_seconds=3600, starts_at=at, next_fire_at=at)
            owner_of[row["id"]] = owner
    return owner_of


def recorded(url: str) -> tuple[Counter[uuid.UUID], Counter[uuid.UUID], int]:
    with psycopg.connect(url) as conn:
        occ = Counter(r[0] for r in conn.execute("SELECT schedule_id FROM occurrences").fetchall())
        runs = Counter(r[0] for r in conn.execute("SELECT schedule_id FROM runs").fetchall())
        due = conn.execute("SELECT count(*) FROM schedules WHERE status = 'active' AND next_fire_at <= %s",
                           (T,)).fetchone()
    assert due is not None
    return occ, runs, int(due[0])


@pytest.fixture
def batches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, frozenset[uuid.UUID]]]:
    """(thread name, schedule ids) of each batch the fire step records."""
    seen: list[tuple[str, frozenset[uuid.UUID]]] = []
    record = occurrences.record

    def spy(conn: Any, planned: list[dict[str, Any]], **kwargs: Any) -> Any:
        seen.append((threading.current_thread().name, frozenset(uuid.UUID(str(p["schedule_id"])) for p in planned)))
        return record(conn, planned, **kwargs)

    monkeypatch.setattr("kairos.tick.fire.occurrences.record", spy)
    return seen


def test_two_fire_workers_hold_their_owner_locks_at_once(db: Database, db_url: str, sqs_queue: SqsQueue,
                                                          batches: list[tuple[str, frozenset[uuid.UUID]]]) -> None:
    parts = owners_by_part(db_url, 3)
    owner_of = populate(db_url, [o for pair in zip(*parts, strict=True) for o in pair], 4)
    both_inside = threading.Barrier(2, timeout=WAIT)
    held: set[str] = set()

    def hold_first_batch() -> None:
        # Each worker's first batch, after its owners' locks are taken, waits for the other's: without
        # the parts the second batch shares owners with the first and waits on their locks (the barrier
        # breaks, the tick raises).
        name = threading.current_thread().name
        if name not in held:
            held.add(name)
            both_inside.wait()

    tick = Tick(db, sqs_queue.client, sqs_queue.url, metrics=None, batch_size=4, fire_workers=2,
                probes=Probes().on("after_inserts", hold_first_batch))
    report = tick.run(now=T)

    assert report.dispatched == len(owner_of) == 24
    first = {}
    for thread, ids in batches:
        first.setdefault(thread, {owner_of[i] for i in ids})
    assert len(first) == 2 and not set.intersection(*first.values())
    occ, runs, due = recorded(db_url)
    assert set(occ.values()) == {1} and set(runs.values()) == {1} and len(occ) == 24 and due == 0


@pytest.mark.parametrize("workers", [2, 3])
def test_a_worker_dying_mid_batch_loses_no_fire_and_doubles_none(db: Database, db_url: str, sqs_queue: SqsQueue,
                                                                 workers: int) -> None:
    owners = [o for part in owners_by_part(db_url, 3, workers) for o in part]
    owner_of = populate(db_url, owners, 4)
    died: list[str] = []

    def die_once() -> None:  # the second worker's first batch, after its inserts, before its commit
        if threading.current_thread().name == "tick-fire-1" and not died:
            died.append("tick-fire-1")
            raise Died

    with pytest.raises(Died):
        Tick(db, sqs_queue.client, sqs_queue.url, metrics=None, batch_size=3, fire_workers=workers,
             probes=Probes().on("after_inserts", die_once)).run(now=T)
    assert died
    # The same minute again: the next tick fires what the dead worker's batch (rolled back) and the
    # halted others left, each once.
    Tick(db, sqs_queue.client, sqs_queue.url, metrics=None, batch_size=3, fire_workers=workers).run(now=T)

    occ, runs, due = recorded(db_url)
    assert due == 0 and len(occ) == len(owner_of) and set(occ.values()) == {1} and set(runs.values()) == {1}
    sent = Counter(sqs_queue.run_ids())
    assert set(sent.values()) == {1}


def test_a_slow_workers_part_is_fired_by_the_others(db: Database, db_url: str, sqs_queue: SqsQueue,
                                                    batches: list[tuple[str, frozenset[uuid.UUID]]]) -> None:
    parts = owners_by_part(db_url, 2)
    owner_of = populate(db_url, [o for pair in zip(*parts, strict=True) for o in pair], 5)
    slow_part = {owner for owner in parts[1]}
    helped = threading.Event()
    first: set[str] = set()

    def slow_first_batch() -> None:
        # Worker 1, after its first batch committed, stalls until worker 0 (its own part done) has
        # recorded a batch of worker 1's owners.
        name = threading.current_thread().name
        if name == "tick-fire-1" and name not in first:
            first.add(name)
            assert helped.wait(WAIT), "worker 0 never fired the slow worker's part"

    def spot_help() -> None:
        if any(t == "tick-fire-0" and {owner_of[i] for i in ids} & slow_part for t, ids in batches):
            helped.set()

    probes = Probes().on("after_commit", slow_first_batch).on("after_commit", spot_help)
    report = Tick(db, sqs_queue.client, sqs_queue.url, metrics=None, batch_size=3, fire_workers=2,
                  probes=probes).run(now=T)

    assert helped.is_set() and report.dispatched == len(owner_of)
    occ, runs, due = recorded(db_url)
    assert due == 0 and set(occ.values()) == {1} and set(runs.values()) == {1} and len(occ) == len(owner_of)


@pytest.mark.parametrize("parts", [1, 2, 8])
def test_a_part_of_the_due_schedules_is_read_in_the_due_index_order(db_url: str, parts: int) -> None:
    """The part's filter is applied to the rows the due index yields in order, up to the limit: no
    read of every due row and sort (what an estimate of one row in two hundred passing would plan)."""
    conversation = factories.conversation(db_url)["id"]
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("""INSERT INTO schedules (id, owner, conversation_id, prompt, kind, cron, status, next_fire_at)
                        SELECT gen_random_uuid(), 'owner-' || (i %% 300), %s, 'p', 'cron', '0 7 * * *', 'active',
                               %s::timestamptz - i * interval '1 millisecond'
                          FROM generate_series(1, 6000) AS i""", (conversation, T))
        conn.execute("VACUUM ANALYZE schedules")
        params = {"now": T, "limit": 500, "after_at": datetime(1, 1, 1, tzinfo=UTC),
                  "after_id": "00000000-0000-0000-0000-000000000000", "part": parts - 1, "parts": parts}
        plan = "\n".join(str(r[0]) for r in conn.execute("EXPLAIN " + db_module.q("schedules_lock_due"),
                                                            params).fetchall())
    # The due scan itself (above the subplans: an overlap read sorts a schedule's few active runs).
    due_scan = plan.split("SubPlan")[0]
    assert "Index Scan using schedules_due_key_idx" in due_scan and "Sort" not in due_scan, plan
