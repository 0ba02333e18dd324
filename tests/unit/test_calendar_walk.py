"""The field walk against croniter: the same wall times, and the same fires under every DST policy.

``kairos.calendar`` walks each compiled expression's fields itself (``_field_walls``); croniter is
kept in the dev extra as the oracle (``_croniter_walls``). Two differential checks over random
expressions (every field's syntax: ``*``, ``*/N``, values, ranges, ``a-b/N``, ``N/S``, lists, month
and weekday names, weekday 7; day fields with and without ``*``, so Vixie's AND and OR):

* walls: the first matches after random instants, walk vs croniter, compared one by one;
* fires: ``iter_fires`` vs croniter's walls resolved by the same DST policy code
  (``_resolve(_croniter_walls(...))``, what the calendar did before the walk), at instants around
  every offset change of 2026 in Europe/Berlin, America/New_York, Australia/Lord_Howe (30-minute
  DST) and of 1985/86 in Asia/Kathmandu (+05:30 to +05:45), under all twelve gap/fold pairs.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from itertools import islice, product

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kairos import calendar
from kairos.calendar import Rule, iter_fires
from kairos.errors import ValidationFailed
from kairos.states import DstFold, DstGap, ScheduleKind

RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
ZONES = {
    "Europe/Berlin": 2026,
    "America/New_York": 2026,
    "Australia/Lord_Howe": 2026,
    "Asia/Kathmandu": 1985,
}
POLICIES = list(product(DstGap, DstFold))


def random_part(rng: random.Random, index: int) -> str:
    low, high = RANGES[index]
    kind = rng.choice(["star", "step", "value", "value", "range", "range_step", "start_step"])
    if kind == "star":
        return "*"
    if kind == "step":
        return f"*/{rng.randint(1, max(1, (high - low) // 2))}"
    a = rng.randint(low, high)
    b = rng.randint(a, high)

    def named(v: int) -> str:
        if index == 3 and rng.random() < 0.2:
            return MONTHS[v - 1]
        if index == 4 and v < 7 and rng.random() < 0.2:
            return DAYS[v]
        return str(v)

    if kind == "value":
        return named(a)
    if kind == "range":
        return f"{named(a)}-{named(b)}"
    if kind == "range_step":
        return f"{a}-{b}/{rng.randint(1, max(1, b - a + 1))}"
    return f"{a}/{rng.randint(1, max(1, high - a + 1))}"


def random_field(rng: random.Random, index: int) -> str:
    if index in (2, 4) and rng.random() < 0.35:
        return "*"  # unrestricted day fields are common: Vixie's AND
    return ",".join(random_part(rng, index) for _ in range(rng.choice([1, 1, 1, 2, 3])))


def random_expression(rng: random.Random) -> str:
    while True:
        fields = [random_field(rng, i) for i in range(5)]
        if rng.random() < 0.5:  # keep many expressions dense enough to reach the DST windows
            fields[0] = rng.choice(["*/15", "0,30", "30", "*/7", "0", "45", "*"])
            fields[1] = rng.choice(["*", "1-3", "2", "0-4", "*/2", "2,3"])
        expression = " ".join(fields)
        try:
            calendar._compile(expression)
        except ValidationFailed:  # e.g. '0 0 31 2 *': never fires
            continue
        return expression


def first_walls(spec: calendar._Cron, start: datetime, count: int, *, oracle: bool) -> list[datetime]:
    walls = calendar._croniter_walls(spec, start) if oracle else calendar._field_walls(spec, start)
    return list(islice(walls, count))


def test_the_walk_matches_croniter_on_random_expressions_and_instants() -> None:
    rng = random.Random(14)
    for _ in range(600):
        expression = random_expression(rng)
        spec = calendar._compile(expression)
        start = datetime(1980, 1, 1) + timedelta(seconds=rng.randint(0, 60 * 365 * 86400))
        if rng.random() < 0.3:
            start = start.replace(second=0, microsecond=0)  # on a minute boundary: strictly after it
        assert first_walls(spec, start, 12, oracle=False) == first_walls(spec, start, 12, oracle=True), (
            expression, start)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**32 - 1), offset=st.integers(0, 40 * 365 * 86400))
def test_the_walk_matches_croniter_hypothesis(seed: int, offset: int) -> None:
    expression = random_expression(random.Random(seed))
    spec = calendar._compile(expression)
    start = datetime(1990, 1, 1) + timedelta(seconds=offset)
    assert first_walls(spec, start, 8, oracle=False) == first_walls(spec, start, 8, oracle=True), expression


@pytest.mark.parametrize(
    "expression",
    ["0 0 29 2 *", "0 0 29 2 1", "59 23 31 12 *", "0 12 31 * *", "* * * * *", "0 0 1 1 0", "*/30 * 30 2,3 *",
     "0 0 */10 * 1/2", "0 0 1-7 * mon", "5 4 * * sun,7", "0 0 * * 7", "0 9 15 * fri"],
)
def test_the_walk_matches_croniter_on_hard_expressions(expression: str) -> None:
    spec = calendar._compile(expression)
    for start in (datetime(2024, 2, 28, 23, 59), datetime(2026, 12, 31, 23, 59, 30), datetime(2027, 2, 28),
                  datetime(2099, 12, 31, 23, 58), datetime(2026, 3, 29, 1, 59, 59, 999999)):
        assert first_walls(spec, start, 20, oracle=False) == first_walls(spec, start, 20, oracle=True)


def oracle_fires(rule: Rule, after: datetime, count: int) -> list[calendar.Fire]:
    """croniter's walls through the calendar's own DST policy code: the pipeline before the walk."""
    assert rule.cron is not None
    spec = calendar._compile(rule.cron)
    zone = calendar._zone(rule.timezone)
    gap, fold = calendar._policies(spec, rule.dst_gap, rule.dst_fold)
    walls = calendar._croniter_walls(spec, calendar._wall_start(zone, after))
    return list(islice(calendar._resolve(walls, zone, gap, fold, after, None), count))


def transitions(zone: str, year: int) -> list[datetime]:
    """The zone's UTC-offset changes in a UTC year."""
    return [instant for instant, _, _ in calendar._year_transitions(zone, year)]


@pytest.mark.parametrize("zone", sorted(ZONES))
def test_fires_match_croniter_with_the_dst_policies_around_every_change(zone: str) -> None:
    rng = random.Random(zone)
    changes = transitions(zone, ZONES[zone])
    assert changes, zone
    compared = 0
    for change in changes:
        for _ in range(40):
            expression = random_expression(rng)
            after = change + timedelta(minutes=rng.randint(-6 * 60, 2 * 60), seconds=rng.choice([0, 0, 17]))
            gap, fold = rng.choice(POLICIES)
            rule = Rule(ScheduleKind.CRON, cron=expression, timezone=zone, dst_gap=gap, dst_fold=fold)
            ours = list(islice(iter_fires(rule, after), 10))
            assert ours == oracle_fires(rule, after, 10), (expression, after, gap, fold)
            compared += 1
    assert compared >= 40


@pytest.mark.parametrize("zone", sorted(ZONES))
@pytest.mark.parametrize(("gap", "fold"), POLICIES)
def test_dense_expressions_match_under_every_policy(zone: str, gap: DstGap, fold: DstFold) -> None:
    for change in transitions(zone, ZONES[zone]):
        for expression in ("*/15 * * * *", "30 * * * *", "0,30 0-4 * * *", "45 1,2,3 * * *", "* 2 * * *"):
            rule = Rule(ScheduleKind.CRON, cron=expression, timezone=zone, dst_gap=gap, dst_fold=fold)
            after = change - timedelta(hours=3)
            assert list(islice(iter_fires(rule, after), 40)) == oracle_fires(rule, after, 40), (expression, change)
