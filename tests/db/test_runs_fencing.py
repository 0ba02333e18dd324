"""Exactly once under redelivery, lost leases and crashes: real PostgreSQL, real threads, no sleeps."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from kairos import effects, trace
from kairos.db import Database
from kairos.diagnosis import diagnose
from kairos.execution.claim import Outcome
from kairos.execution.execute import process
from kairos.execution.heartbeat import Heartbeat
from kairos.executors.base import PreparedCall, Reply
from kairos.probes import Probes
from kairos.runs import moves
from kairos.settings import Settings
from kairos.states import EventType
from kairos.tick.repair import Repair
from tests import factories
from tests.support.executors import ScriptedExecutor

SETTINGS = Settings()
WAIT = 30  # seconds: an upper bound for events that happen at once; never a timing assumption


class Crash(BaseException):
    """Lambda killing the process: nothing after the hook point runs (not an Exception: nothing catches it)."""


def _crash(**_: Any) -> None:
    raise Crash()


def _snapshot(url: str, run_id: uuid.UUID) -> dict[str, Any]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        row = conn.execute("SELECT * FROM runs WHERE id = %s", (run_id,)).fetchone()
        assert row is not None
        return {
            "run": row,
            "events": conn.execute("SELECT * FROM run_events WHERE run_id = %s ORDER BY seq", (run_id,)).fetchall(),
            "effects": conn.execute("SELECT * FROM effects WHERE run_id = %s ORDER BY created_at",
                                    (run_id,)).fetchall(),
            "entries": conn.execute("SELECT * FROM conversation_entries WHERE conversation_id = %s ORDER BY seq",
                                    (row["conversation_id"],)).fetchall(),
        }


def _expire_lease_and_requeue(url: str, run_id: uuid.UUID) -> None:
    """What the tick's rescuer does to a replayable run whose worker stopped heartbeating."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE runs SET lease_expires_at = now() - interval '1 second' WHERE id = %s", (run_id,))
        moved = conn.execute(
            """UPDATE runs SET state = 'queued', lease_token = NULL, lease_expires_at = NULL,
                      restarts = restarts + 1
                WHERE id = %s AND state = 'running' AND lease_expires_at < now()""", (run_id,)).rowcount
    assert moved == 1


def _expire_lease(url: str, run_id: uuid.UUID) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE runs SET lease_expires_at = now() - interval '1 second' WHERE id = %s", (run_id,))


def test_concurrent_claims_have_exactly_one_winner(db: Database, db_url: str) -> None:
    run = factories.run(db_url)
    barrier = threading.Barrier(8)
    won: list[int] = []

    def contend() -> None:
        with db.transaction() as conn:
            barrier.wait(WAIT)
            row = moves.claim(conn, run["id"])
            if row is not None:
                won.append(int(row["fence"]))

    threads = [threading.Thread(target=contend) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert won == [1]


def test_five_deliveries_two_of_them_concurrent_make_one_execution(db: Database, db_url: str) -> None:
    run = factories.run(db_url)
    in_call, release = threading.Event(), threading.Event()

    def held(prepared: PreparedCall, timeout: float) -> Reply:
        in_call.set()
        assert release.wait(WAIT)
        return Reply(content="the one answer")

    executor = ScriptedExecutor(on_send=held)
    barrier = threading.Barrier(2)
    finished = threading.Semaphore(0)
    outcomes: list[Outcome] = []

    def deliver() -> None:
        barrier.wait(WAIT)
        try:
            outcomes.append(process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory))
        finally:
            finished.release()

    # Deliveries 1 and 2 arrive at the same moment.
    concurrent = [threading.Thread(target=deliver) for _ in range(2)]
    for t in concurrent:
        t.start()
    assert in_call.wait(WAIT)
    assert finished.acquire(timeout=WAIT)  # the loser of the claim returns while the winner is in its call
    # Delivery 3 arrives while the run executes.
    outcomes.append(process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory))
    release.set()
    for t in concurrent:
        t.join(WAIT)
    # Deliveries 4 and 5 arrive after the end.
    for _ in range(2):
        outcomes.append(process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory))

    assert sorted(o.result for o in outcomes) == ["skipped"] * 4 + ["succeeded"]
    assert len(executor.timeouts) == 1
    snap = _snapshot(db_url, run["id"])
    assert [e["type"] for e in snap["events"]].count("run.succeeded") == 1
    assert [e["type"] for e in snap["events"] if e["type"].startswith("run.")] == ["run.claimed", "run.succeeded"]
    assert snap["run"]["attempt"] == 1 and snap["run"]["fence"] == 1
    assert [e["content"] for e in snap["entries"] if e["role"] == "assistant"] == ["the one answer"]


def test_a_worker_paused_past_its_lease_affects_nothing_after_another_claims(db: Database, db_url: str) -> None:
    run = factories.run(db_url)
    paused, wake = threading.Event(), threading.Event()

    def frozen(prepared: PreparedCall, timeout: float) -> Reply:
        paused.set()
        assert wake.wait(WAIT)
        return Reply(content="stale answer from A")

    beats: list[Heartbeat] = []
    probes_a = Probes().on("heartbeat_started", lambda heartbeat, **_: beats.append(heartbeat))
    executor_a = ScriptedExecutor(on_send=frozen)
    outcome_a: list[Outcome] = []
    worker_a = threading.Thread(target=lambda: outcome_a.append(process(
        db, run["id"], settings=SETTINGS, executor_factory=executor_a.factory, probes=probes_a,
        heartbeat_interval=3600)))  # frozen: its heartbeat does not run on its own
    worker_a.start()
    assert paused.wait(WAIT)

    # A's lease runs out; the rescuer requeues the run and B claims and finishes it.
    _expire_lease_and_requeue(db_url, run["id"])
    executor_b = ScriptedExecutor(on_send=lambda p, t: Reply(content="answer from B"))
    outcome_b = process(db, run["id"], settings=SETTINGS, executor_factory=executor_b.factory)
    assert outcome_b.result == "succeeded"
    before = _snapshot(db_url, run["id"])

    # A wakes up: its heartbeat, then its settle, entry, events and terminal write all find nothing.
    assert beats[0].beat_once() is False
    assert beats[0].lost.is_set()
    wake.set()
    worker_a.join(WAIT)

    assert outcome_a[0].result == "lease_lost"
    after = _snapshot(db_url, run["id"])
    assert after == before
    assert after["run"]["state"] == "succeeded" and after["run"]["fence"] == 2
    assert after["run"]["output"]["attempt"] == 2
    assert [e["content"] for e in after["entries"] if e["role"] == "assistant"] == ["answer from B"]
    # A's reservation was closed by B's claim (a model call: failed, replayable); A settled nothing.
    assert [(e["fence"], e["state"], e["error_code"]) for e in after["effects"]] == [
        (1, "failed", "lease_lost"), (2, "settled", None)]
    assert max(e["fence"] for e in after["events"]) == 2


def test_every_fenced_write_with_a_stale_fence_writes_nothing(db: Database, db_url: str) -> None:
    run = factories.run(db_url)
    # Attempt 1 claims, reserves, and is then fenced out by a rescue and a second claim.
    with db.transaction() as conn:
        first = moves.claim(conn, run["id"])
        assert first is not None
        assert moves.append_entry(conn, run["id"], 1, run["source_conversation_id"], role="user",
                                 content="x") is None  # not this run's target yet: nothing written
        conn.execute("UPDATE runs SET conversation_id = source_conversation_id WHERE id = %s", (run["id"],))
        old_effect = effects.reserve(conn, run["id"], 1, 1, "model", "http_call", True, "t", "d")
        assert old_effect is not None
    _expire_lease_and_requeue(db_url, run["id"])
    with db.transaction() as conn:
        assert moves.claim(conn, run["id"]) is not None  # fence 2
    before = _snapshot(db_url, run["id"])

    with db.transaction() as conn:
        assert moves.lock(conn, run["id"], 1) is None
        assert trace.append(conn, run["id"], EventType.STEP_STARTED, fence=1, step="model") is None
        assert moves.append_entry(conn, run["id"], 1, run["source_conversation_id"], role="assistant",
                                 content="stale") is None
        assert effects.reserve(conn, run["id"], 1, 1, "other", "model_call", False, "t", "d") is None
        assert effects.settle(conn, old_effect, fence=1) is None
        assert effects.fail(conn, old_effect, fence=1, error_code="timeout") is None
        assert moves.succeed(conn, run["id"], 1, output={"entry_seq": 1}) is False
        assert moves.fail(conn, run["id"], 1, diagnosis=diagnose("internal")) is False
        assert moves.finish_cancelled(conn, run["id"], 1) is False
        assert moves.requeue(conn, run["id"], 1, attempt=1, delay_seconds=1) is False
    assert Heartbeat(db, run["id"], 1).beat_once() is False

    assert _snapshot(db_url, run["id"]) == before


def test_a_crash_between_reserving_a_mutation_and_settling_it_is_never_replayed(db: Database, db_url: str) -> None:
    run = factories.run(db_url, source="webhook")  # not abandoned for lateness: only the effect decides
    executor = ScriptedExecutor(mutation=True)

    with pytest.raises(Crash):
        process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory,
                     probes=Probes().on("after_reserve", _crash))
    snap = _snapshot(db_url, run["id"])
    assert snap["run"]["state"] == "running"
    assert [e["state"] for e in snap["effects"]] == ["reserved"]

    # SQS delivers the id again, before and after the lease ran out: the run is not claimable.
    assert process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory).result == "skipped"
    _expire_lease(db_url, run["id"])
    assert process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory).result == "skipped"

    # The tick's rescuer finds the reserved mutation: ambiguous, the run fails and is not requeued.
    report = Repair(db, None, "").rescue_once()
    assert (report.rescued, report.failed, report.requeued) == (1, 1, 0)
    assert process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory).result == "skipped"

    snap = _snapshot(db_url, run["id"])
    assert snap["run"]["state"] == "failed" and snap["run"]["diagnosis"]["reason_code"] == "ambiguous_effect"
    assert [e["state"] for e in snap["effects"]] == ["ambiguous"]
    assert executor.timeouts == []  # the call was never made again (nor at all, here)


def test_a_requeued_run_with_a_reserved_mutation_refuses_to_replay_at_claim(db: Database, db_url: str) -> None:
    """Defence in depth: even a rescuer that requeued regardless could not make the worker replay."""
    run = factories.run(db_url)
    executor = ScriptedExecutor(mutation=True)
    with pytest.raises(Crash):
        process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory,
                     probes=Probes().on("after_send", _crash))  # the call went out, then the worker died
    _expire_lease_and_requeue(db_url, run["id"])

    outcome = process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory)

    assert (outcome.result, outcome.reason_code) == ("failed", "ambiguous_effect")
    assert len(executor.timeouts) == 1  # sent once, by the crashed attempt only
    snap = _snapshot(db_url, run["id"])
    assert [(e["fence"], e["state"]) for e in snap["effects"]] == [(1, "ambiguous")]
    assert [e["type"] for e in snap["events"] if e["fence"] == 2] == [
        "run.claimed", "step.started", "effect.settled", "step.finished", "run.failed"]


def test_a_crash_after_reserving_a_model_call_is_replayed_on_the_next_claim(db: Database, db_url: str) -> None:
    """Decision: a reserved, unsettled non-mutation (a model call) changed nothing outside; the next
    claim closes it ``failed`` (lease_lost) and runs the call again. The restart limit bounds the cost."""
    run = factories.run(db_url)
    executor = ScriptedExecutor()
    with pytest.raises(Crash):
        process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory,
                     probes=Probes().on("after_send", _crash))
    _expire_lease_and_requeue(db_url, run["id"])

    outcome = process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory)

    assert outcome.result == "succeeded"
    assert len(executor.timeouts) == 2
    snap = _snapshot(db_url, run["id"])
    assert [(e["fence"], e["state"]) for e in snap["effects"]] == [(1, "failed"), (2, "settled")]
    assert [e["role"] for e in snap["entries"]] == ["user", "assistant"]  # the prompt entry written once
    assert snap["run"]["output"]["attempt"] == 2


def test_a_crash_before_commit_of_success_publishes_nothing(db: Database, db_url: str) -> None:
    run = factories.run(db_url)
    executor = ScriptedExecutor()
    with pytest.raises(Crash):
        process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory,
                     probes=Probes().on("before_finish", _crash))

    snap = _snapshot(db_url, run["id"])
    assert snap["run"]["state"] == "running" and snap["run"]["output"] is None
    assert [e["role"] for e in snap["entries"]] == ["user"]  # the answer rolled back with the terminal write
    assert [e["state"] for e in snap["effects"]] == ["reserved"]
    assert "output.published" not in [e["type"] for e in snap["events"]]
