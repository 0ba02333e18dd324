"""The fire admits at insert (kairos.tick.fire, occurrences_insert with admit), against real PostgreSQL.

Under its owners' slot locks a fire inserts a run already holding a slot when the release would admit
it at once, and sends exactly those runs: no release round after its commit. These tests race two
fire workers against run workers ending runs of the same owners (the slot limit holds at every
sample, every run is sent exactly once, none is left waiting), show that a new run never jumps an
older waiting one, and that runs admitted by a fire that died before its send are sent by the repair,
once."""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter, deque
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from kairos import budgets, identity, runtime
from kairos.db import Database
from kairos.probes import Probes
from kairos.tick import Repair
from kairos.tick.fire import Fire
from tests import factories
from tests.support.aws import SqsQueue

T = datetime(2026, 3, 2, 7, 0, tzinfo=UTC)


def _rows(url: str, sql: str, *params: Any) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


@pytest.fixture
def slots(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    monkeypatch.setenv("KAIROS_OWNER_CONCURRENCY", "3")
    runtime.reset()
    yield 3
    runtime.reset()


class RecordingSqs:
    """An in-process SQS client that accepts every message and hands each run id to ``deliver``."""

    def __init__(self, deliver: Any) -> None:
        self.deliver = deliver

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        for entry in Entries:
            self.deliver(uuid.UUID(json.loads(entry["MessageBody"])["run_id"]))
        return {"Successful": [{"Id": e["Id"]} for e in Entries], "Failed": []}


def _owners_with_running(url: str, owners: int, per_owner: int, running: int) -> list[str]:
    """``owners`` owners, each with ``per_owner`` schedules due at T and ``running`` runs holding slots."""
    names = [f"admit-{i}" for i in range(owners)]
    for name in names:
        conv = factories.conversation(url, owner=name)
        holder = factories.schedule(url, owner=name, conversation_id=conv["id"], cron="0 0 1 1 *",
                                    next_fire_at=T + timedelta(days=300))
        for k in range(running):
            factories.run(url, schedule_row=holder, state="running", slot_limit=3, fire_at=T - timedelta(minutes=k + 1))
        for _ in range(per_owner):
            factories.schedule(url, owner=name, conversation_id=conv["id"], cron="*/5 * * * *", next_fire_at=T)
    return names


def test_racing_fires_and_ending_runs_never_exceed_the_slots_and_send_each_run_once(
        db_url: str, slots: int) -> None:
    """Six owners with three slots, all held by running runs; eight schedules each fall due. Two fire
    workers fire them in batches of five while four run workers end runs (each end releases the next
    waiting run, which its worker sends) and claim and end whatever is sent. Sampled all along, no
    owner ever has more than three runs holding a slot; at the end every run was sent exactly once and
    has run (nothing is left waiting beside a free slot, with no repair)."""
    owners = _owners_with_running(db_url, 6, 8, slots)
    database = Database(db_url, max_size=12)
    cond = threading.Condition()
    inbox: deque[uuid.UUID] = deque(r["id"] for r in _rows(db_url, "SELECT id FROM runs WHERE state = 'running'"))
    sent: Counter[uuid.UUID] = Counter()
    state: dict[str, Any] = {"fires_done": 0, "busy": 0, "errors": [], "max_held": 0}

    def deliver(run_id: uuid.UUID) -> None:
        with cond:
            sent[run_id] += 1
            inbox.append(run_id)
            cond.notify_all()

    sqs = RecordingSqs(deliver)

    def fire_worker() -> None:
        try:
            fire = Fire(database, sqs, "q", batch_size=5)
            while fire.run_once(now=T + timedelta(seconds=5)).locked:
                pass
        except BaseException as exc:
            state["errors"].append(repr(exc))
        finally:
            with cond:
                state["fires_done"] += 1
                cond.notify_all()

    def run_worker() -> None:
        try:
            while True:
                with cond:
                    while not inbox and not (state["fires_done"] == 2 and state["busy"] == 0):
                        cond.wait(timeout=1)
                    if not inbox:
                        return
                    run_id = inbox.popleft()
                    state["busy"] += 1
                try:
                    with database.transaction() as conn:  # the claim of a released run (or one running)
                        conn.execute("UPDATE runs SET state = 'running', lease_token = gen_random_uuid(), "
                                     "lease_expires_at = now() + interval '5 minutes', heartbeat_at = now() "
                                     "WHERE id = %s AND state = 'queued' AND admitted_at IS NOT NULL", (run_id,))
                    with database.transaction() as conn:  # its end: the trigger releases the next ones
                        conn.execute("UPDATE runs SET state = 'succeeded', finished_at = now(), output = '{}', "
                                     "lease_token = NULL, lease_expires_at = NULL "
                                     "WHERE id = %s AND state = 'running'", (run_id,))
                    with database.transaction() as conn:
                        released = budgets.unsent(conn, [run_id])
                    for other in released:
                        deliver(other)
                finally:
                    with cond:
                        state["busy"] -= 1
                        cond.notify_all()
        except BaseException as exc:
            state["errors"].append(repr(exc))

    def sampler(stop: threading.Event) -> None:
        with psycopg.connect(db_url, autocommit=True) as conn:
            while not stop.is_set():
                (held,) = conn.execute(
                    "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM runs WHERE owner = ANY(%s) "
                    "AND (state = 'running' OR admitted_at IS NOT NULL) GROUP BY owner) AS h", (owners,)).fetchone()
                state["max_held"] = max(state["max_held"], held)
                stop.wait(0.002)

    stop = threading.Event()
    sampling = threading.Thread(target=sampler, args=(stop,))
    sampling.start()
    threads = [threading.Thread(target=fire_worker) for _ in range(2)]
    threads += [threading.Thread(target=run_worker) for _ in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
    finally:
        stop.set()
        sampling.join()
        database.close()
    assert state["errors"] == []
    assert not any(t.is_alive() for t in threads)
    per_owner = _rows(db_url, "SELECT owner, count(*) FILTER (WHERE state = 'succeeded') AS done, count(*) AS n, "
                              "max(slot_limit) AS slot_limit FROM runs WHERE owner = ANY(%s) GROUP BY owner", owners)
    assert {r["owner"]: (r["done"], r["n"]) for r in per_owner} == {o: (11, 11) for o in owners}
    assert state["max_held"] <= slots
    new_runs = {r["id"] for r in _rows(db_url, "SELECT id FROM runs WHERE owner = ANY(%s) AND source = 'scheduled' "
                                               "AND created_at = %s", owners, T + timedelta(seconds=5))}
    assert len(new_runs) == 6 * 8
    assert {run_id: sent[run_id] for run_id in new_runs} == dict.fromkeys(new_runs, 1)


def test_a_new_run_does_not_jump_an_older_run_waiting_for_a_slot(
        db: Database, db_url: str, sqs_queue: SqsQueue, slots: int) -> None:
    """Two slots of three held, and an older run waiting beside the free one (a release a crash lost):
    the fire's new run does not take the slot ahead of it and is not sent; the repair's release then
    gives the slot to the older one, and the new one waits."""
    conv = factories.conversation(db_url, owner="bob")
    other = factories.schedule(db_url, owner="bob", conversation_id=conv["id"], cron="0 0 1 1 *",
                               next_fire_at=T + timedelta(days=300))
    for k in range(2):
        factories.run(db_url, schedule_row=other, state="running", slot_limit=3, fire_at=T - timedelta(minutes=k + 1))
    older = factories.run(db_url, schedule_row=other, source="manual", slot_limit=3,
                          fire_at=T - timedelta(minutes=3), created_at=T - timedelta(minutes=3))["id"]
    sched = factories.schedule(db_url, owner="bob", conversation_id=conv["id"], cron="*/5 * * * *", next_fire_at=T)

    report = Fire(db, sqs_queue.client, sqs_queue.url).run_once(now=T + timedelta(seconds=5))

    assert report.dispatched == 1
    [new] = _rows(db_url, "SELECT id, admitted_at, handoff_at FROM runs WHERE schedule_id = %s", sched["id"])
    assert new["admitted_at"] is None and new["handoff_at"] is None
    bodies = sqs_queue.drain()
    assert json.dumps({"run_id": str(new["id"])}) not in bodies

    Repair(db, sqs_queue.client, sqs_queue.url).run_once(now=T + timedelta(seconds=6))

    queued = _rows(db_url, "SELECT id, admitted_at FROM runs WHERE owner = 'bob' AND state = 'queued'")
    assert {r["id"]: r["admitted_at"] is not None for r in queued} == {older: True, new["id"]: False}


def test_runs_admitted_by_a_fire_that_died_before_its_send_are_sent_by_the_repair_once(
        db: Database, db_url: str, sqs_queue: SqsQueue, slots: int) -> None:
    """Five schedules of one owner with three slots fall due; the fire commits (three runs inserted
    holding a slot, two waiting) and dies before its send. Nothing was sent; the repair, once the
    runs are no longer fresh, sends the three holding a slot exactly once (a second repair sends
    nothing more) and the two waiting stay unsent."""
    conv = factories.conversation(db_url, owner="carol")
    for _ in range(5):
        factories.schedule(db_url, owner="carol", conversation_id=conv["id"], cron="*/5 * * * *", next_fire_at=T)

    class Died(Exception):
        pass

    def die() -> None:
        raise Died()

    fire = Fire(db, sqs_queue.client, sqs_queue.url, probes=Probes().on("after_commit", die))
    with pytest.raises(Died):
        fire.run_once(now=T + timedelta(seconds=5))
    runs = _rows(db_url, "SELECT id, admitted_at, handoff_at, released_by FROM runs WHERE owner = 'carol'")
    assert len(runs) == 5
    admitted = {r["id"] for r in runs if r["admitted_at"] is not None}
    assert len(admitted) == 3
    assert all(r["handoff_at"] is None and r["released_by"] is None for r in runs)
    assert sqs_queue.drain() == []

    repair = Repair(db, sqs_queue.client, sqs_queue.url)
    repair.run_once(now=T + timedelta(seconds=5) + repair.fresh + timedelta(seconds=1))
    repair.run_once(now=T + timedelta(seconds=5) + repair.fresh + timedelta(seconds=2))

    bodies = sqs_queue.drain()
    assert sorted(bodies) == sorted(json.dumps({"run_id": str(r)}) for r in admitted)
    stamped = _rows(db_url, "SELECT id FROM runs WHERE owner = 'carol' AND handoff_count = 1")
    assert {r["id"] for r in stamped} == admitted



def test_a_new_run_blocked_by_cancel_replace_gives_its_slot_to_the_batch_s_waiting_run_and_the_fire_sends_it(
        db: Database, db_url: str, sqs_queue: SqsQueue, slots: int) -> None:
    """Three slots, two held (the cancel_replace schedule's running run, which reserved a mutation,
    and another). Two new runs fall due: the cancel_replace one takes the free slot at insert (its id
    is the lower), the other waits. The replacement is not replace-safe, so the new run ends
    policy_blocked in the fire's transaction and its end releases the waiting one into its slot: the
    fire sends that one, once, and never the blocked one."""
    conv = factories.conversation(db_url, owner="dave")
    replacing = factories.schedule(db_url, owner="dave", conversation_id=conv["id"], cron="*/5 * * * *",
                                   next_fire_at=T, overlap="cancel_replace")
    old = factories.run(db_url, schedule_row=replacing, state="running", slot_limit=3,
                        fire_at=T - timedelta(minutes=5))["id"]
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO effects (id, run_id, fence, attempt, step, kind, mutation, target, request_digest,"
                     " state) VALUES (%s, %s, 1, 1, 'call', 'http_call', true, 'https://t.example/', 'd', 'reserved')",
                     (uuid.uuid4(), old))
    holder = factories.schedule(db_url, owner="dave", conversation_id=conv["id"], cron="0 0 1 1 *",
                                next_fire_at=T + timedelta(days=300))
    factories.run(db_url, schedule_row=holder, state="running", slot_limit=3, fire_at=T - timedelta(minutes=1))
    blocked_id = identity.run_id(identity.occurrence_id(replacing["id"], "scheduled", fire_at=T))
    while True:  # the plain schedule whose new run sorts after the blocked one's (ids are deterministic)
        plain = factories.schedule(db_url, owner="dave", conversation_id=conv["id"], cron="*/5 * * * *",
                                   next_fire_at=T)
        waiting_id = identity.run_id(identity.occurrence_id(plain["id"], "scheduled", fire_at=T))
        if waiting_id > blocked_id:
            break
        _rows(db_url, "UPDATE schedules SET status = 'paused', paused_at = now() WHERE id = %s RETURNING id",
              plain["id"])  # not due: out of the batch

    Fire(db, sqs_queue.client, sqs_queue.url).run_once(now=T + timedelta(seconds=5))

    got = {r["id"]: r for r in _rows(db_url, "SELECT id, state, admitted_at, released_by, handoff_count FROM runs "
                                             "WHERE id = ANY(%s)", [blocked_id, waiting_id])}
    assert got[blocked_id]["state"] == "policy_blocked" and got[blocked_id]["admitted_at"] is None
    assert got[waiting_id]["released_by"] == blocked_id and got[waiting_id]["handoff_count"] == 1
    assert sqs_queue.drain() == [json.dumps({"run_id": str(waiting_id)})]
