"""Runs wait in PostgreSQL for a running slot (kairos.budgets, migration 0030), against real PostgreSQL:
the release that hands an owner's free slots to its oldest waiting runs, under racing workers; the
claim of a released run; concurrency keys; approvals and questions giving their slot up.

Messages are modelled by a deque of run ids: what the handoff would send (``handoff.admit`` at intake,
``budgets.unsent`` of an ended run: what ``handoff.send_released`` sends). Every run is "sent" once."""

from __future__ import annotations

import functools
import threading
import uuid
from collections import deque
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row

from kairos import budgets, handoff
from kairos.db import Database
from kairos.execution.claim import Outcome, claim
from kairos.execution.execute import process
from kairos.execution.sqs import GAVE_UP_SLOT
from kairos.executors.base import PreparedCall, Reply
from kairos.probes import Probes
from kairos.settings import Settings
from tests import factories
from tests.support.executors import ScriptedExecutor


def _rows(url: str, sql: str, *params: Any) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def _one(url: str, sql: str, *params: Any) -> dict[str, Any]:
    (row,) = _rows(url, sql, *params)
    return row


def _held(url: str, owner: str = "alice") -> int:
    """Runs holding one of the owner's slots: running, or released and not yet claimed."""
    return int(_one(url, "SELECT count(*) AS n FROM runs WHERE owner = %s "
                         "AND (state = 'running' OR admitted_at IS NOT NULL)", owner)["n"])


def _running(url: str, owner: str = "alice") -> int:
    return int(_one(url, "SELECT count(*) AS n FROM runs WHERE owner = %s AND state = 'running'", owner)["n"])


def _queued(url: str, n: int, *, owner: str = "alice", slot_limit: int = 4, **columns: Any) -> list[uuid.UUID]:
    """``n`` queued manual runs of one schedule, nobody released yet, oldest first."""
    sched = factories.schedule(url, owner=owner)
    return [factories.run(url, schedule_row=sched, source="manual", slot_limit=slot_limit, **columns)["id"]
            for _ in range(n)]


def _ended(database: Database, run_id: uuid.UUID) -> list[uuid.UUID]:
    """What the worker sends after a run ended: the runs its statement released."""
    with database.transaction() as conn:
        return budgets.unsent(conn, [run_id])


def test_twenty_runs_with_four_slots_eight_workers_never_run_more_than_four_each_sent_once(db_url: str) -> None:
    """Eight workers, twenty runs, four slots. Phase one holds every call open: exactly four runs are
    released and claimed, no worker has anything else to claim (nothing else was sent). Phase two lets
    them finish: each end releases the next, oldest first; every run is sent exactly once, and no claim
    ever finds its slot taken (no slot_wait: nothing is sent that cannot be claimed)."""
    total, slots, workers = 20, 4, 8
    run_ids = _queued(db_url, total, slot_limit=slots)
    settings = Settings(owner_concurrency=slots)
    database = Database(db_url, max_size=workers + 4)
    cond = threading.Condition()
    queue: deque[uuid.UUID] = deque(handoff.admit(database, run_ids))
    sent: list[uuid.UUID] = list(queue)
    seen: dict[str, Any] = {"in_flight": 0, "max_in_flight": 0, "finished": 0, "samples": [], "other": [],
                            "claimed": []}
    release = threading.Event()

    def on_send(prepared: PreparedCall, timeout: float) -> Reply:
        with cond:
            seen["in_flight"] += 1
            seen["max_in_flight"] = max(seen["max_in_flight"], seen["in_flight"])
            cond.notify_all()
        release.wait(timeout=60)
        with cond:
            seen["in_flight"] -= 1
        return Reply(content="done", usage={"prompt_tokens": 1, "completion_tokens": 1})

    def sample(run_id: uuid.UUID, **_: Any) -> None:
        count = _held(db_url)
        with cond:
            seen["samples"].append(count)
            seen["claimed"].append(run_id)

    executor = ScriptedExecutor(on_send=on_send)
    probes = Probes().on("after_claim", sample)

    def work() -> None:
        while True:
            with cond:
                cond.wait_for(lambda: queue or seen["finished"] == total)
                if not queue:
                    return
                run_id = queue.popleft()
            outcome: Outcome = process(database, run_id, settings=settings, executor_factory=executor.factory,
                                       probes=probes)
            released = _ended(database, run_id) if outcome.result in GAVE_UP_SLOT else []
            with cond:
                if outcome.result == "succeeded":
                    seen["finished"] += 1
                else:
                    seen["other"].append(outcome)
                queue.extend(released)
                sent.extend(released)
                cond.notify_all()

    threads = [threading.Thread(target=work, name=f"worker-{i}") for i in range(workers)]
    try:
        for t in threads:
            t.start()
        with cond:
            cond.wait_for(lambda: seen["in_flight"] >= slots, timeout=60)
            held = seen["in_flight"]
        # Phase one: four in their call; the sixteen others wait in the database, unsent.
        assert held == slots and len(sent) == slots
        assert _running(db_url) == slots
        waiting = _one(db_url, "SELECT count(*) AS n FROM runs WHERE state = 'queued' AND admitted_at IS NULL "
                               "AND handoff_at IS NULL")["n"]
        assert waiting == total - slots
    finally:
        release.set()
        for t in threads:
            t.join(timeout=120)
        database.close()

    assert not any(t.is_alive() for t in threads)
    assert seen["other"] == []  # never a slot_wait: no run was sent that could not be claimed
    assert seen["max_in_flight"] == slots
    assert seen["samples"] and max(seen["samples"]) <= slots
    assert sorted(sent) == sorted(run_ids)  # each run sent exactly once
    # Released oldest first: the first four released are the four oldest.
    assert sorted(sent[:slots]) == sorted(run_ids[:slots])
    assert _rows(db_url, "SELECT state, count(*) AS n FROM runs GROUP BY state") == [
        {"state": "succeeded", "n": total}]
    assert _rows(db_url, "SELECT 1 FROM run_events WHERE type = 'run.deferred'") == []


def _together(*calls: Any) -> list[Any]:
    """Runs the calls at once, each on its own thread (a barrier); their results in call order."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def one(index: int) -> None:
        barrier.wait(timeout=30)
        results[index] = calls[index]()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    return results


def _claim_result(database: Database, run_id: uuid.UUID) -> str:
    got = claim(database, run_id, now=None, probes=Probes(), owner_slots=4)
    return got.result if isinstance(got, Outcome) else "claimed"


def _end_now(database: Database, run_id: uuid.UUID) -> list[uuid.UUID]:
    with database.transaction() as conn:
        conn.execute("UPDATE runs SET state = 'cancelled', finished_at = now() WHERE id = %s", (run_id,))
    return _ended(database, run_id)


def _intake(database: Database, owner: str) -> list[uuid.UUID]:
    with database.transaction() as conn:
        return budgets.release(conn, [owner])


def test_eight_racing_claims_of_runs_nobody_released_exactly_the_free_slots_win(db_url: str) -> None:
    """Stray messages (runs nobody released) for eight runs at once, one held already, four slots:
    exactly three claims win, five find no slot and leave their runs waiting, five rounds."""
    sched = factories.schedule(db_url)
    factories.run(db_url, schedule_row=sched, source="manual", state="running")
    database = Database(db_url, max_size=12)
    try:
        for _ in range(5):
            contenders = [factories.run(db_url, schedule_row=sched, source="manual")["id"] for _ in range(8)]
            results = _together(*(functools.partial(_claim_result, database, r) for r in contenders))
            assert sorted(results) == ["claimed"] * 3 + ["slot_wait"] * 5
            assert _running(db_url) == 4 and _held(db_url) == 4
            _rows(db_url, "UPDATE runs SET state = 'cancelled', lease_token = NULL, lease_expires_at = NULL, "
                          "finished_at = now() WHERE id = ANY(%s) RETURNING id", contenders)
            assert _held(db_url) == 1  # the cancelled waiting runs released nothing: nothing else waits
    finally:
        database.close()


def test_racing_ends_and_intakes_never_hand_out_more_slots_than_the_owner_has(db_url: str) -> None:
    """Four runs holding the four slots end at once while four intakes release at once, twenty runs
    waiting: exactly four runs hold a slot afterwards, the four oldest waiting (ten rounds)."""
    database = Database(db_url, max_size=12)
    try:
        for round_ in range(10):
            owner = f"owner-{round_}"
            holders = _queued(db_url, 4, owner=owner)
            assert sorted(_intake(database, owner)) == sorted(holders)
            waiting = _queued(db_url, 20, owner=owner)
            results = _together(*(functools.partial(_end_now, database, h) for h in holders),
                                *(functools.partial(_intake, database, owner) for _ in range(4)))
            assert _held(db_url, owner) == 4
            assert sorted(r for got in results for r in got) == sorted(waiting[:4])
    finally:
        database.close()


def test_a_released_run_keeps_every_claim_guard(db: Database, db_url: str) -> None:
    """A released run past its expiry ends expired at its claim, and gives its slot to the next one."""
    sched = factories.schedule(db_url)
    expired = factories.run(db_url, schedule_row=sched, source="manual", slot_limit=1,
                            expires_at=datetime.now(UTC) - timedelta(seconds=1))
    paused = factories.schedule(db_url, status="paused")
    of_paused = factories.run(db_url, schedule_row=paused, source="manual", slot_limit=1)
    nxt = factories.run(db_url, schedule_row=sched, source="manual", slot_limit=1)
    assert handoff.admit(db, [expired["id"], nxt["id"]]) == [expired["id"]]
    settings = Settings(owner_concurrency=1)

    first = process(db, expired["id"], settings=settings, executor_factory=ScriptedExecutor().factory)
    assert (first.result, first.state) == ("refused", "expired")
    assert _ended(db, expired["id"]) == [of_paused["id"]]  # the next oldest, whatever its schedule
    second = process(db, of_paused["id"], settings=settings, executor_factory=ScriptedExecutor().factory)
    assert (second.result, second.reason_code) == ("refused", "schedule_paused")
    assert _ended(db, of_paused["id"]) == [nxt["id"]]
    assert process(db, nxt["id"], settings=settings, executor_factory=ScriptedExecutor().factory).result == \
        "succeeded"


def test_awaiting_approval_or_input_gives_the_slot_up_and_an_approved_run_waits_for_one(
        db: Database, db_url: str) -> None:
    """One slot. A run parked for approval releases the waiting run; a run parked for its owner's
    answer likewise; the approved run goes back to queued and waits (not sent) until a slot frees."""
    parked, waiting, last = _queued(db_url, 3, slot_limit=1)
    assert handoff.admit(db, [parked]) == [parked]
    _rows(db_url, "UPDATE runs SET state = 'running', attempt = 1, fence = 1, lease_token = gen_random_uuid(), "
                  "lease_expires_at = now() + interval '2 minutes', started_at = now() WHERE id = %s RETURNING id",
          parked)
    _rows(db_url, "UPDATE runs SET state = 'awaiting_approval', lease_token = NULL, lease_expires_at = NULL "
                  "WHERE id = %s RETURNING id", parked)
    assert _ended(db, parked) == [waiting]
    _rows(db_url, "UPDATE runs SET state = 'running', attempt = 1, fence = 1, lease_token = gen_random_uuid(), "
                  "lease_expires_at = now() + interval '2 minutes', started_at = now() WHERE id = %s RETURNING id",
          waiting)
    _rows(db_url, "UPDATE runs SET state = 'awaiting_input', lease_token = NULL, lease_expires_at = NULL "
                  "WHERE id = %s RETURNING id", waiting)
    assert _ended(db, waiting) == [last]
    # The approval requeues the parked run: the slot is the last one's, so it waits, unsent.
    _rows(db_url, "UPDATE runs SET state = 'queued' WHERE id = %s RETURNING id", parked)
    assert handoff.admit(db, [parked]) == []
    assert _one(db_url, "SELECT admitted_at FROM runs WHERE id = %s", parked)["admitted_at"] is None
    _rows(db_url, "UPDATE runs SET state = 'cancelled', finished_at = now() WHERE id = %s RETURNING id", last)
    assert _ended(db, last) == [parked]


def test_a_concurrency_key_lets_one_run_per_key_hold_a_slot_in_arrival_order(db_url: str) -> None:
    """Six runs of one webhook schedule for two keys, limit 1, four slots, four workers: never two
    running for one key (sampled from the database at every claim and end), all finish, each key's
    runs in the order they arrived; the other key's runs are not held up by a full key."""
    sched = factories.schedule(db_url, kind="webhook")
    keys = ["pr-1", "pr-2", "pr-1", "pr-1", "pr-2", "pr-2"]
    run_ids = [factories.run(db_url, schedule_row=sched, source="webhook", concurrency_key=k,
                             concurrency_limit=1)["id"] for k in keys]
    key_of = dict(zip(run_ids, keys, strict=True))
    settings = Settings(owner_concurrency=4)
    database = Database(db_url, max_size=8)
    cond = threading.Condition()
    queue: deque[uuid.UUID] = deque(handoff.admit(database, run_ids))
    assert sorted(queue) == sorted([run_ids[0], run_ids[1]])  # one per key, though two slots are free
    samples: list[int] = []
    order: list[uuid.UUID] = []
    done = {"n": 0}

    def sample(**_: Any) -> None:
        most = _one(db_url, "SELECT coalesce(max(n), 0) AS n FROM (SELECT count(*) AS n FROM runs "
                            "WHERE state = 'running' GROUP BY concurrency_key) AS k")["n"]
        with cond:
            samples.append(int(most))

    def claimed(run_id: uuid.UUID, **_: Any) -> None:
        sample()
        with cond:
            order.append(run_id)

    probes = Probes().on("after_claim", claimed).on("before_finish", sample)

    def work() -> None:
        while True:
            with cond:
                cond.wait_for(lambda: queue or done["n"] == len(run_ids))
                if not queue:
                    return
                run_id = queue.popleft()
            outcome = process(database, run_id, settings=settings, executor_factory=ScriptedExecutor().factory,
                              probes=probes)
            released = _ended(database, run_id)
            with cond:
                assert outcome.result == "succeeded"
                done["n"] += 1
                queue.extend(released)
                cond.notify_all()

    threads = [threading.Thread(target=work) for _ in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        database.close()
    assert not any(t.is_alive() for t in threads)
    assert samples and max(samples) == 1
    for key in ("pr-1", "pr-2"):
        assert [r for r in order if key_of[r] == key] == [r for r in run_ids if key_of[r] == key]
    assert _rows(db_url, "SELECT state, count(*) AS n FROM runs GROUP BY state") == [
        {"state": "succeeded", "n": len(run_ids)}]


def test_runs_awaiting_approval_hold_no_slot_and_other_owners_are_not_counted(db_url: str) -> None:
    settings = Settings(owner_concurrency=2)
    sched = factories.schedule(db_url)
    for _ in range(3):
        factories.run(db_url, schedule_row=sched, source="manual", state="awaiting_approval")
    bob = factories.schedule(db_url, owner="bob")
    for _ in range(2):
        factories.run(db_url, schedule_row=bob, source="manual", state="running")
    run_id = factories.run(db_url, schedule_row=sched, source="manual", slot_limit=2)["id"]
    database = Database(db_url)
    try:
        assert handoff.admit(database, [run_id]) == [run_id]
        outcome = process(database, run_id, settings=settings, executor_factory=ScriptedExecutor().factory)
    finally:
        database.close()
    assert outcome.result == "succeeded"
