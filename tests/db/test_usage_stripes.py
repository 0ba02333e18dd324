"""The budget ledger's stripes against real PostgreSQL (kairos.budgets, migration 0041): one owner's
reservations spread over 8 stripe rows with their own allowances, and the daily ceiling still exact —
under racing reservations, after a call used more than its estimate, and when the ceiling changes."""

from __future__ import annotations

import threading
import uuid
from datetime import date
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.rows import dict_row

from kairos import budgets
from kairos.chaos import invariants
from kairos.settings import Settings
from tests import factories


def _rows(url: str, sql: str, *params: Any) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def _calls(url: str, runs: int, per_run: int, *, owner: str = "alice") -> list[tuple[uuid.UUID, uuid.UUID]]:
    """(run, effect) pairs: ``runs`` manual runs of one schedule, each with ``per_run`` model-call effects
    reserved and not yet charged."""
    sched = factories.schedule(url, owner=owner)
    pairs = []
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(runs):
            run_id = factories.run(url, schedule_row=sched, source="manual")["id"]
            for n in range(per_run):
                effect_id = uuid.uuid4()
                conn.execute("INSERT INTO effects (id, run_id, fence, attempt, step, kind, mutation, target, "
                             "request_digest) VALUES (%s, %s, 0, 0, %s, 'model_call', false, 't', 'd')",
                             (effect_id, run_id, f"model-{n}"))
                pairs.append((run_id, effect_id))
    return pairs


def _reserve(conn: psycopg.Connection[Any], call: tuple[uuid.UUID, uuid.UUID], tokens: int, settings: Settings,
             owner: str = "alice") -> bool:
    run_id, effect_id = call
    return budgets.reserve(conn, effect_id=effect_id, run_id=run_id, owner=owner, model="m", input_tokens=tokens,
                           max_output_tokens=0, settings=settings)


def _total(url: str, owner: str = "alice") -> int:
    (row,) = _rows(url, "SELECT coalesce(sum(reserved_tokens + input_tokens + output_tokens), 0) AS n "
                        "FROM usage_ledger_stripes WHERE owner = %s", owner)
    return int(row["n"])


def _settle(url: str, effect_id: uuid.UUID, input_tokens: int, output_tokens: int = 0) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE effects SET state = 'settled', settled_at = now(), usage = jsonb_build_object("
                     "'input_tokens', %s::int, 'output_tokens', %s::int, 'calls', 1) WHERE id = %s",
                     (input_tokens, output_tokens, effect_id))


def test_racing_reservations_of_one_owner_fill_the_ceiling_exactly_and_never_pass_it(db_url: str) -> None:
    """16 connections of one owner race 64 reservations of 70 tokens against a 1,000-token day: exactly
    14 are granted (14 x 70 = 980 fits, a 15th would make 1,050) — none past the ceiling, and none
    refused that fitted the day's exact total, though the stripes' first shares (116 each, the first
    call's stripe the rest) hold only 9."""
    settings = Settings(owner_daily_tokens=1000)
    calls = _calls(db_url, 16, 4)
    start = threading.Barrier(16)
    granted: list[bool] = []
    errors: list[BaseException] = []

    def worker(mine: list[tuple[uuid.UUID, uuid.UUID]]) -> None:
        try:
            with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as conn:
                start.wait(timeout=60)
                for call in mine:
                    granted.append(_reserve(conn, call, 70, settings))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(calls[i::16],)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == [] and len(granted) == 64
    assert granted.count(True) == 14
    assert _total(db_url) == 980
    charged = _rows(db_url, "SELECT count(*) AS n, count(DISTINCT charge_stripe) AS stripes FROM effects "
                            "WHERE charge_day IS NOT NULL")
    assert charged[0]["n"] == 14 and charged[0]["stripes"] > 1  # spread over stripes, not one row


def test_a_reservation_that_fits_only_the_whole_days_room_is_granted(db_url: str) -> None:
    """After 8 small calls (one per stripe's share), one call bigger than any stripe's share but within
    the day's room is booked (the slow path shares out again); one a token too big is refused."""
    settings = Settings(owner_daily_tokens=1000)
    calls = _calls(db_url, 3, 1)
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as conn:
        assert _reserve(conn, calls[0], 100, settings)
        assert not _reserve(conn, calls[1], 901, settings)
        assert _reserve(conn, calls[2], 900, settings)
    assert _total(db_url) == 1000
    allowances = _rows(db_url, "SELECT sum(allowance_tokens) AS n FROM usage_ledger_stripes WHERE owner = 'alice'")
    assert allowances[0]["n"] == 1000


def test_the_settlement_lands_on_the_stripe_its_reservation_was_booked_on(db_url: str) -> None:
    settings = Settings(owner_daily_tokens=100_000)
    calls = _calls(db_url, 6, 1)
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as conn:
        for call in calls:
            assert _reserve(conn, call, 500, settings)
    booked = {r["id"]: r["charge_stripe"] for r in _rows(db_url, "SELECT id, charge_stripe FROM effects")}
    run_id, effect_id = calls[3]
    stripe = booked[effect_id]
    assert stripe == uuid.UUID(str(run_id)).bytes[15] % 8  # the run's own stripe first
    before = {r["stripe"]: r for r in _rows(db_url, "SELECT * FROM usage_ledger_stripes WHERE owner = 'alice'")}

    _settle(db_url, effect_id, 70, 30)

    after = {r["stripe"]: r for r in _rows(db_url, "SELECT * FROM usage_ledger_stripes WHERE owner = 'alice'")}
    for n, row in after.items():
        if n == stripe:
            assert row["reserved_tokens"] == before[n]["reserved_tokens"] - 500
            assert (row["input_tokens"], row["output_tokens"], row["calls"], row["runs"]) == (70, 30, 1, 1)
        else:
            assert row == before[n]


def test_a_call_that_used_more_than_its_estimate_counts_before_any_stripe_grants_again(db_url: str) -> None:
    """A call reserved 100 and used 700 (its stripe now holds more than its allowance): the other stripes'
    shares, made when the day held 100, must not be granted as they were — the day has 300 left."""
    settings = Settings(owner_daily_tokens=1000)
    first, *rest = _calls(db_url, 8, 1)
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as conn:
        assert _reserve(conn, first, 100, settings)
        _settle(db_url, first[1], 700)
        granted = [_reserve(conn, call, 100, settings) for call in rest]
    assert granted == [True, True, True, False, False, False, False]
    assert _total(db_url) == 1000


def test_a_changed_ceiling_holds_at_once(db_url: str) -> None:
    """Stripes shared out for 1,000 tokens; the setting drops to 500, then rises to 2,000: each
    reservation is decided on the ceiling of its own call, exactly."""
    calls = _calls(db_url, 12, 1)
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as conn:
        assert [_reserve(conn, c, 100, Settings(owner_daily_tokens=1000)) for c in calls[:4]] == [True] * 4
        lowered = Settings(owner_daily_tokens=500)
        assert [_reserve(conn, c, 100, lowered) for c in calls[4:7]] == [True, False, False]
        assert _total(db_url) == 500
        raised = Settings(owner_daily_tokens=2000)
        assert [_reserve(conn, c, 300, raised) for c in calls[7:12]] == [True] * 5
        assert _total(db_url) == 2000
        assert not _reserve(conn, calls[6], 1, raised)
    shared = _rows(db_url, "SELECT DISTINCT ceiling_tokens FROM usage_ledger_stripes WHERE owner = 'alice'")
    assert shared == [{"ceiling_tokens": 2000}]


def test_the_cost_ceiling_is_exact_across_stripes(db_url: str) -> None:
    """As the token ceiling: $1 a day, calls of $0.3 (1,000 input tokens at $300/M): three, not four —
    whatever stripe each lands on."""
    settings = Settings(owner_daily_cost_usd=1.0, model_prices={"m": (300.0, 300.0)})
    calls = _calls(db_url, 5, 1)
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as conn:
        assert [_reserve(conn, c, 1000, settings) for c in calls] == [True, True, True, False, False]
    (row,) = _rows(db_url, "SELECT sum(reserved_cost_usd) AS c, sum(allowance_cost_usd) AS a "
                           "FROM usage_ledger_stripes WHERE owner = 'alice'")
    assert row["c"] == Decimal("0.9") and row["a"] <= Decimal("1")


def test_usage_days_and_the_chaos_invariant_sum_the_stripes(db_url: str) -> None:
    settings = Settings(owner_daily_tokens=1_000_000)
    calls = _calls(db_url, 8, 2)
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as conn:
        for call in calls:
            assert _reserve(conn, call, 400, settings)
        today = budgets.today(conn)
    for n, (_, effect_id) in enumerate(calls):
        _settle(db_url, effect_id, 10 + n, 5)
    stripes = _rows(db_url, "SELECT count(*) AS n FROM usage_ledger_stripes WHERE owner = 'alice' AND calls > 0")
    assert stripes[0]["n"] > 1  # the usage is spread over stripes

    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as conn:
        (day,) = budgets.days(conn, owner="alice", start=today, until=date.fromordinal(today.toordinal() + 1))
    inputs = sum(10 + n for n in range(16))
    assert (day.input_tokens, day.output_tokens, day.calls, day.runs) == (inputs, 80, 16, 8)
    (ledger,) = _rows(db_url, "SELECT * FROM usage_ledger WHERE owner = 'alice'")
    assert (ledger["reserved_tokens"], ledger["input_tokens"], ledger["calls"], ledger["runs"]) == (0, inputs, 16, 8)

    checks = invariants.check(db_url, {}, {"prompt_tokens": inputs, "completion_tokens": 80, "calls": 16})
    (usage,) = [c for c in checks if c.name.startswith("usage equal to the ledger")]
    assert (usage.counted, usage.violations) == (16, 0)
