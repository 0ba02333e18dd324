"""Per-owner budgets against real PostgreSQL: daily token and cost ceilings reserved at the effect and
settled with the actual usage (kairos.budgets; running slots: tests/db/test_slots.py)."""

from __future__ import annotations

import threading
import uuid
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.rows import dict_row

from kairos import budgets
from kairos.db import Database
from kairos.execution.claim import Outcome
from kairos.execution.execute import process
from kairos.executors.base import ExecutorError, Reply
from kairos.probes import Probes
from kairos.settings import Settings
from tests import factories
from tests.support.aws import SqsQueue
from tests.support.executors import ScriptedExecutor, raising


def _rows(url: str, sql: str, *params: Any) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def _one(url: str, sql: str, *params: Any) -> dict[str, Any]:
    (row,) = _rows(url, sql, *params)
    return row


def _running(url: str, owner: str) -> int:
    return int(_one(url, "SELECT count(*) AS n FROM runs WHERE owner = %s AND state = 'running'", owner)["n"])


def _manual_runs(url: str, n: int, *, owner: str = "alice", agent: dict[str, Any] | None = None) -> list[uuid.UUID]:
    """``n`` queued manual runs of one schedule (manual: no run supersedes another)."""
    sched = factories.schedule(url, owner=owner, **({"agent": agent} if agent else {}))
    return [factories.run(url, schedule_row=sched, source="manual")["id"] for _ in range(n)]


# --- daily ceilings ---------------------------------------------------------------------------------


def _ledger(url: str, owner: str = "alice") -> dict[str, Any]:
    found = _rows(url, "SELECT * FROM usage_ledger WHERE owner = %s", owner)
    return found[0] if found else {}


def test_over_the_token_ceiling_the_run_fails_budget_exhausted_before_any_call(db: Database, db_url: str) -> None:
    (run_id,) = _manual_runs(db_url, 1)
    executor = ScriptedExecutor()

    outcome = process(db, run_id, settings=Settings(owner_daily_tokens=100), executor_factory=executor.factory)

    assert (outcome.result, outcome.reason_code) == ("failed", "budget_exhausted")
    assert executor.timeouts == []  # nothing sent
    run = _one(db_url, "SELECT state, diagnosis FROM runs WHERE id = %s", run_id)
    assert run["state"] == "failed" and run["diagnosis"]["reason_code"] == "budget_exhausted"
    assert run["diagnosis"]["retry_eligible"] is True
    assert _rows(db_url, "SELECT 1 FROM effects WHERE run_id = %s", run_id) == []
    assert _rows(db_url, "SELECT 1 FROM usage_reservations") == []
    assert _ledger(db_url) == {}


def test_over_the_cost_ceiling_the_run_fails_budget_exhausted(db: Database, db_url: str) -> None:
    (run_id,) = _manual_runs(db_url, 1, agent={"executor": "echo", "model": "dear", "max_tokens": 1000})
    settings = Settings(owner_daily_cost_usd=0.5, model_prices={"dear": (100.0, 1000.0)})  # 1000 out: $1
    executor = ScriptedExecutor()

    outcome = process(db, run_id, settings=settings, executor_factory=executor.factory)

    assert outcome.reason_code == "budget_exhausted" and executor.timeouts == []


def test_the_cost_ceiling_holds_whatever_the_owner_calls_the_model(db: Database, db_url: str) -> None:
    """``pricey`` is priced; its other spellings and its dated snapshots cost the same, and a model no
    price names costs the highest price listed (there is no ``"*"``): none passes the ceiling free."""
    settings = Settings(owner_daily_cost_usd=0.5, model_prices={"pricey": (100.0, 1000.0), "cheap": (0.01, 0.01)})
    for model in ("Pricey", " PRICEY ", "pricey-2024-08-06", "Pricey-20240806", "mystery-model"):
        (run_id,) = _manual_runs(db_url, 1, agent={"executor": "echo", "model": model, "max_tokens": 1000})
        executor = ScriptedExecutor()

        outcome = process(db, run_id, settings=settings, executor_factory=executor.factory)

        assert (outcome.result, outcome.reason_code) == ("failed", "budget_exhausted"), model
        assert executor.timeouts == [], model
    # The cheap model still runs under the same ceiling, and is charged its own price.
    (run_id,) = _manual_runs(db_url, 1, agent={"executor": "echo", "model": "Cheap-2025-01-31", "max_tokens": 1000})
    executor = ScriptedExecutor(on_send=lambda p, t: Reply(content="ok", usage={"prompt_tokens": 100_000,
                                                                                 "completion_tokens": 0}))
    assert process(db, run_id, settings=settings, executor_factory=executor.factory).result == "succeeded"
    assert _ledger(db_url)["cost_usd"] == Decimal("0.001")  # 100,000 x $0.01/M


def test_settlement_replaces_the_reservation_with_the_actual_usage_and_price(db: Database, db_url: str) -> None:
    (run_id,) = _manual_runs(db_url, 1, agent={"executor": "echo", "model": "m1", "max_tokens": 200})
    settings = Settings(model_prices={"m1": (2.0, 8.0), "*": (100.0, 100.0)})
    during: list[dict[str, Any]] = []
    probes = Probes().on("after_reserve", lambda **_: during.append(_ledger(db_url)))
    executor = ScriptedExecutor(on_send=lambda p, t: Reply(content="ok", usage={"prompt_tokens": 30,
                                                                                 "completion_tokens": 50}))

    outcome = process(db, run_id, settings=settings, executor_factory=executor.factory, probes=probes)

    assert outcome.result == "succeeded"
    (reserved,) = during
    estimate = int(_one(db_url, "SELECT tokens FROM usage_reservations")["tokens"])
    assert estimate > 200 and reserved["reserved_tokens"] == estimate and reserved["input_tokens"] == 0
    assert reserved["reserved_cost_usd"] > 0
    ledger = _ledger(db_url)
    cost = Decimal("0.00046")  # 30 x $2/M + 50 x $8/M
    assert (ledger["reserved_tokens"], ledger["reserved_cost_usd"]) == (0, 0)
    assert (ledger["input_tokens"], ledger["output_tokens"], ledger["cost_usd"]) == (30, 50, cost)
    assert (ledger["calls"], ledger["runs"]) == (1, 1)
    usage = _one(db_url, "SELECT usage FROM runs WHERE id = %s", run_id)["usage"]
    assert {k: usage[k] for k in ("input_tokens", "output_tokens", "calls", "steps")} == {
        "input_tokens": 30, "output_tokens": 50, "calls": 1, "steps": 1}
    assert Decimal(str(usage["cost_usd"])) == cost
    assert usage["prompt_tokens"] == 30  # the provider's own counts stay


def test_a_failed_call_gives_its_reservation_back_and_charges_nothing(db: Database, db_url: str) -> None:
    (run_id,) = _manual_runs(db_url, 1)
    executor = ScriptedExecutor(on_send=raising(ExecutorError("reply_too_large", "too big")))

    outcome = process(db, run_id, settings=Settings(), executor_factory=executor.factory)

    assert outcome.result == "failed"
    ledger = _ledger(db_url)
    assert (ledger["reserved_tokens"], ledger["input_tokens"], ledger["output_tokens"]) == (0, 0, 0)
    assert (ledger["calls"], ledger["runs"]) == (0, 0)
    assert _one(db_url, "SELECT settled_at IS NOT NULL AS done FROM usage_reservations")["done"]


def test_runs_racing_for_the_last_tokens_never_overspend_and_the_ledger_sums_their_usage(db_url: str) -> None:
    """Ten runs reserve at once (a barrier after their claims) with room for three reservations and a
    half: three run, seven fail budget_exhausted before any call. Each call uses exactly its estimate,
    so without an atomic reservation more than three would pass and the day would overspend."""
    agent = {"executor": "echo", "model": "m1", "max_tokens": 300}
    # One run of another owner measures the estimate every run here reserves (same prompt and agent).
    (probe,) = _manual_runs(db_url, 1, owner="carol", agent=agent)
    database = Database(db_url, max_size=14)
    try:
        assert process(database, probe, settings=Settings(),
                       executor_factory=ScriptedExecutor().factory).result == "succeeded"
        estimate = int(_one(db_url, "SELECT tokens FROM usage_reservations WHERE owner = 'carol'")["tokens"])
        ceiling = 3 * estimate + estimate // 2
        settings = Settings(owner_daily_tokens=ceiling, model_prices={"m1": (1.0, 3.0)}, owner_concurrency=20)
        run_ids = _manual_runs(db_url, 10, agent=agent)
        barrier = threading.Barrier(len(run_ids))
        probes = Probes().on("after_claim", lambda **_: barrier.wait(timeout=60))
        executor = ScriptedExecutor(on_send=lambda p, t: Reply(content="ok", usage={
            "prompt_tokens": estimate - 300, "completion_tokens": 300}))
        outcomes: list[Outcome] = []

        def one(run_id: uuid.UUID) -> None:
            outcomes.append(process(database, run_id, settings=settings, executor_factory=executor.factory,
                                    probes=probes))

        threads = [threading.Thread(target=one, args=(r,)) for r in run_ids]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        database.close()

    results = sorted((o.result, o.reason_code) for o in outcomes)
    assert results == [("failed", "budget_exhausted")] * 7 + [("succeeded", None)] * 3
    assert len(executor.timeouts) == 3
    ledger = _ledger(db_url)
    spent = ledger["input_tokens"] + ledger["output_tokens"]
    assert spent == 3 * estimate <= ceiling and ledger["reserved_tokens"] == 0
    usages = [r["usage"] for r in _rows(db_url, "SELECT usage FROM runs WHERE owner = 'alice' AND state = 'succeeded'")]
    assert sum(u["input_tokens"] for u in usages) == ledger["input_tokens"]
    assert sum(u["output_tokens"] for u in usages) == ledger["output_tokens"]
    assert sum(Decimal(str(u["cost_usd"])) for u in usages) == ledger["cost_usd"]
    assert (ledger["calls"], ledger["runs"]) == (3, 3)


def test_a_reservation_that_waited_on_another_sees_it_once_committed(db_url: str) -> None:
    """A holds a stripe of the owner's day with an uncommitted reservation; B, asking for more than any
    stripe has room for, takes the slow path and waits on A's stripe (seen in pg_stat_activity, no
    sleep) and, once A commits, is refused: the exact total is decided on the rows as A left them, not
    on what B's statement saw when it started."""
    from kairos import budgets

    run_ids = _manual_runs(db_url, 2)
    effect_ids = [uuid.uuid4(), uuid.uuid4()]
    with psycopg.connect(db_url, autocommit=True) as conn:
        for run_id, effect_id in zip(run_ids, effect_ids, strict=True):
            conn.execute("INSERT INTO effects (id, run_id, fence, attempt, step, kind, mutation, target, "
                         "request_digest) VALUES (%s, %s, 0, 0, 'model', 'model_call', false, 't', 'd')",
                         (effect_id, run_id))
        # The day's row exists already (an earlier call today, from before the stripes: stripe 0 alone,
        # never shared out), so B's statement could see a stale one.
        conn.execute("INSERT INTO usage_ledger_stripes (owner, day) VALUES ('alice', (now() AT TIME ZONE 'UTC')::date)")
    settings = Settings(owner_daily_tokens=150)
    a = psycopg.connect(db_url, row_factory=dict_row)
    b = psycopg.connect(db_url, row_factory=dict_row)
    try:
        assert budgets.reserve(a, effect_id=effect_ids[0], run_id=run_ids[0], owner="alice", model="m",
                               input_tokens=50, max_output_tokens=50, settings=settings)
        b_pid = b.info.backend_pid
        got: list[bool] = []
        waiter = threading.Thread(target=lambda: got.append(budgets.reserve(
            b, effect_id=effect_ids[1], run_id=run_ids[1], owner="alice", model="m", input_tokens=50,
            max_output_tokens=50, settings=settings)))
        waiter.start()
        with psycopg.connect(db_url, autocommit=True) as watch:
            while not watch.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                                    (b_pid,)).fetchone()[0]:  # type: ignore[index]
                assert waiter.is_alive()
        a.commit()
        waiter.join(timeout=30)
        b.commit()
    finally:
        a.close()
        b.close()
    assert got == [False]
    assert _ledger(db_url)["reserved_tokens"] == 100


def test_a_closed_call_settles_at_commit_so_the_owners_day_row_stays_free_until_then(db_url: str) -> None:
    """Two model calls of one run close in one transaction: until it commits, the owner's day row is not
    locked by it (another run of the owner may reserve meanwhile); at its commit both settle, the run
    counted once for the day and both reservations given back."""
    (run_id,) = _manual_runs(db_url, 1)
    effect_ids = [uuid.uuid4(), uuid.uuid4()]
    settings = Settings(owner_daily_tokens=10_000)
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        for n, effect_id in enumerate(effect_ids):
            conn.execute("INSERT INTO effects (id, run_id, fence, attempt, step, kind, mutation, target, "
                         "request_digest) VALUES (%s, %s, 0, 0, %s, 'model_call', false, 't', 'd')",
                         (effect_id, run_id, f"model-{n}"))
            assert budgets.reserve(conn, effect_id=effect_id, run_id=run_id, owner="alice", model="m",
                                   input_tokens=50, max_output_tokens=50, settings=settings)
    assert _ledger(db_url)["reserved_tokens"] == 200
    closing = psycopg.connect(db_url, row_factory=dict_row)
    try:
        closing.execute("UPDATE effects SET state = 'settled', settled_at = now(), "
                        "usage = '{\"input_tokens\": 7, \"output_tokens\": 3}' WHERE id = ANY(%s)", (effect_ids,))
        with psycopg.connect(db_url, autocommit=True) as other:  # NOWAIT: an error if the row were locked
            other.execute("SELECT 1 FROM usage_ledger_stripes WHERE owner = 'alice' FOR NO KEY UPDATE NOWAIT")
        assert _ledger(db_url)["reserved_tokens"] == 200  # nothing settled before the commit
        closing.commit()
    finally:
        closing.close()
    ledger = _ledger(db_url)
    assert (ledger["reserved_tokens"], ledger["input_tokens"], ledger["output_tokens"]) == (0, 14, 6)
    assert (ledger["calls"], ledger["runs"]) == (2, 1)
    reservations = _rows(db_url, "SELECT tokens, input_tokens, settled_at FROM usage_reservations WHERE run_id = %s",
                         run_id)
    assert [(r["tokens"], r["input_tokens"]) for r in reservations] == [(100, 7), (100, 7)]
    assert all(r["settled_at"] is not None for r in reservations)


class _Crash(BaseException):
    """Lambda killing the process (not an Exception: nothing catches it)."""


def _crash(**_: Any) -> None:
    raise _Crash()


def test_a_vanished_workers_reservation_is_given_back_by_the_rescue_and_the_replay_charges_once(
        db: Database, db_url: str, sqs_queue: SqsQueue) -> None:
    from datetime import UTC, datetime, timedelta

    from kairos.tick.repair import Repair

    (run_id,) = _manual_runs(db_url, 1)
    executor = ScriptedExecutor()
    try:
        process(db, run_id, settings=Settings(), executor_factory=executor.factory,
                probes=Probes().on("after_send", _crash))
    except _Crash:
        pass
    held = _ledger(db_url)
    assert held["reserved_tokens"] > 0 and held["calls"] == 0

    Repair(db, sqs_queue.client, sqs_queue.url).rescue_once(now=datetime.now(UTC) + timedelta(hours=1))

    assert _ledger(db_url)["reserved_tokens"] == 0  # the rescue closed the effect: the reservation is back
    assert process(db, run_id, settings=Settings(), executor_factory=executor.factory).result == "succeeded"
    ledger = _ledger(db_url)
    assert (ledger["reserved_tokens"], ledger["input_tokens"], ledger["output_tokens"]) == (0, 3, 5)
    assert (ledger["calls"], ledger["runs"]) == (1, 1)


def test_today_is_the_utc_date_of_the_given_now_and_else_the_databases(db_url: str) -> None:
    # Given an instant late on 1 March UTC, written in a zone where it is already 2 March
    late = datetime(2026, 3, 2, 1, 30, tzinfo=timezone(timedelta(hours=2)))
    database = Database(db_url)
    try:
        with database.transaction() as conn:
            # When the day is asked for at that instant, and then at the database's own clock
            moved = budgets.today(conn, now=late)
            real = budgets.today(conn)
            clock = conn.execute("SELECT (now() AT TIME ZONE 'UTC')::date AS d").fetchone()
    finally:
        database.close()
    # Then the moved clock gives its UTC day, and no now gives the database's
    assert moved == date(2026, 3, 1)
    assert clock is not None and real == clock["d"]
