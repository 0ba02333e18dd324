"""An independent oracle for the calendar, compared with ``iter_fires`` under every policy.

The oracle shares nothing with ``kairos.calendar`` but ``zoneinfo``: its own cron field expander and
Vixie day matcher, a walk over local wall minutes that finds each minute's UTC instant(s) by
round-tripping fold 0 and fold 1 (two instants = a repeated wall time, none = a wall time in a gap),
the first existing wall minute after a gap, and the dst_gap/dst_fold policies (docs/architecture.md)
applied to that. Hypothesis generates the expressions (minute/hour lists, steps, ranges, ``N/S`` starts with a
step; day fields with and without ``*``).

Three checks:
* dense: every wall minute of an eight-hour window around each UTC-offset change in six zones
  with hard transitions, under each of the twelve gap/fold policy pairs;
* sparse: a whole year per zone, walking matching days and their minutes, with random policies,
  and named hard cases around every change under every policy;
* spacing: ``min_spacing`` never reports more than the real smallest gap over the next years.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import cache
from itertools import pairwise, product
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kairos import calendar
from kairos.calendar import Fire, Rule, fires_between, min_spacing
from kairos.states import DstFold, DstGap, ScheduleKind

ZONES = {
    # zone: years whose offset changes are examined
    "America/New_York": (2026, 2037),
    "Europe/Berlin": (2026,),
    "Australia/Lord_Howe": (2026,),  # 30-minute changes
    "Pacific/Apia": (2011, 2012),  # DST both ways, and the missing 2011-12-30
    "Asia/Kathmandu": (1985,),  # +05:30 -> +05:45 at local midnight of 1986-01-01
    "America/Santiago": (2022, 2026),  # changes at local midnight
}
POLICIES = list(product(DstGap, DstFold))
MINUTE = timedelta(minutes=1)
SLACK = timedelta(hours=27)  # more than any offset change, so window edges see every candidate
RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))


# ------------------------------------------------------------------------------------- the oracle


def expand(text: str, index: int) -> frozenset[int]:
    low, high = RANGES[index]
    values: set[int] = set()
    for part in text.split(","):
        base, _, step = part.partition("/")
        if base == "*":
            a, b = low, high
        elif "-" in base:
            a, b = (int(x) for x in base.split("-"))
        elif step and index == 4:  # 'N/S' is 'N-6/S' for day-of-week (7 is Sunday, 0), as croniter reads it
            a, b = int(base) % 7, 6
        elif step:  # 'N/S' is 'N-max/S'
            a, b = int(base), high
        else:
            a = b = int(base)
        values.update(range(a, b + 1, int(step) if step else 1))
    return frozenset(v % 7 for v in values) if index == 4 else frozenset(values)


@dataclass(frozen=True)
class Matcher:
    minutes: frozenset[int]
    hours: frozenset[int]
    doms: frozenset[int]
    months: frozenset[int]
    dows: frozenset[int]
    day_and: bool  # Vixie: either day field begins with '*'
    real_time: bool  # minute or hour begins with '*'

    @classmethod
    def of(cls, expr: str) -> Matcher:
        f = expr.split()
        return cls(
            *(expand(f[i], i) for i in range(5)),
            day_and=f[2].startswith("*") or f[4].startswith("*"),
            real_time=f[0].startswith("*") or f[1].startswith("*"),
        )

    def day(self, d: date) -> bool:
        if d.month not in self.months:
            return False
        dom, dow = d.day in self.doms, d.isoweekday() % 7 in self.dows
        return (dom and dow) if self.day_and else (dom or dow)

    def wall(self, w: datetime) -> bool:
        return w.minute in self.minutes and w.hour in self.hours and self.day(w.date())


def instants(zone: ZoneInfo, wall: datetime) -> list[datetime]:
    """The UTC instants whose local wall time is ``wall``: two in a fold, none in a gap."""
    found = {wall.replace(tzinfo=zone, fold=f).astimezone(UTC) for f in (0, 1)}
    return sorted(u for u in found if u.astimezone(zone).replace(tzinfo=None) == wall)


def after_gap(zone: ZoneInfo, wall: datetime) -> datetime:
    """The first instant after the gap holding ``wall``: the earliest instant of the next existing minute."""
    w = wall
    while not (found := instants(zone, w)):
        w += MINUTE
    return found[0]


def oracle(
    expr: str, zone: ZoneInfo, gap: DstGap, fold: DstFold, lo: datetime, hi: datetime, walls: Iterator[datetime]
) -> list[datetime]:
    m = Matcher.of(expr)
    if gap is DstGap.AUTO:
        gap = DstGap.SKIP if m.real_time else DstGap.SHIFT_FORWARD
    if fold is DstFold.AUTO:
        fold = DstFold.BOTH if m.real_time else DstFold.FIRST
    out: set[datetime] = set()
    for wall in walls:
        if not m.wall(wall):
            continue
        found = instants(zone, wall)
        if len(found) == 2:
            out.update({DstFold.FIRST: found[:1], DstFold.LAST: found[1:], DstFold.BOTH: found}[fold])
        elif found:
            out.add(found[0])
        elif gap is DstGap.SHIFT_FORWARD:
            out.add(after_gap(zone, wall))
    return sorted(u for u in out if lo < u <= hi)


def every_minute(zone: ZoneInfo, lo: datetime, hi: datetime) -> Iterator[datetime]:
    w = (lo.astimezone(zone).replace(tzinfo=None) - SLACK).replace(second=0, microsecond=0)
    end = hi.astimezone(zone).replace(tzinfo=None) + SLACK
    while w <= end:
        yield w
        w += MINUTE


def matching_minutes(m: Matcher, zone: ZoneInfo, lo: datetime, hi: datetime) -> Iterator[datetime]:
    """Every wall minute of the matching days only (the sparse walk: whole years stay cheap)."""
    d = (lo.astimezone(zone) - SLACK).date()
    end = (hi.astimezone(zone) + SLACK).date()
    while d <= end:
        if m.day(d):
            for h in sorted(m.hours):
                for mi in sorted(m.minutes):
                    yield datetime(d.year, d.month, d.day, h, mi)
        d += timedelta(days=1)


@cache
def transitions(name: str) -> tuple[datetime, ...]:
    """Offset changes found by scanning hourly (to the hour: they only centre the windows)."""
    zone, found = ZoneInfo(name), []
    for year in ZONES[name]:
        t = datetime(year, 1, 1, tzinfo=UTC)
        previous = t.astimezone(zone).utcoffset()
        while t.year == year:
            t += timedelta(hours=1)
            offset = t.astimezone(zone).utcoffset()
            if offset != previous:
                found.append(t)
            previous = offset
    return tuple(found)


def check(expr: str, name: str, gap: DstGap, fold: DstFold, lo: datetime, hi: datetime, walls: Iterator[datetime]):
    rule = Rule(ScheduleKind.CRON, cron=expr, timezone=name, dst_gap=gap, dst_fold=fold)
    got = list(fires_between(rule, lo, hi))
    zone = ZoneInfo(name)
    expected = oracle(expr, zone, gap, fold, lo, hi, walls)
    assert [f.fire_at for f in got] == expected, (expr, name, gap, fold)
    for f in got:
        local = f.fire_at.astimezone(zone)
        assert (f.local_time, f.utc_offset, f.fold) == (
            local.replace(tzinfo=None, fold=0),
            local.utcoffset(),
            local.fold,
        )
        assert isinstance(f, Fire) and f.fire_at.tzinfo is UTC and f.timezone == name
    return got


# ------------------------------------------------------------------------------------ strategies


def numbers(low: int, high: int) -> st.SearchStrategy[str]:
    single = st.integers(low, high).map(str)
    span = st.tuples(st.integers(low, high), st.integers(low, high)).map(lambda ab: f"{min(ab)}-{max(ab)}")
    steps = st.integers(1, max(1, (high - low) // 2))
    stepped = st.tuples(span, steps).map(lambda s: f"{s[0]}/{s[1]}")
    start_stepped = st.tuples(st.integers(low, high), steps).map(lambda s: f"{s[0]}/{s[1]}")  # N-max/S
    return st.lists(st.one_of(single, span, stepped, start_stepped), min_size=1, max_size=3).map(",".join)


def starred(low: int, high: int) -> st.SearchStrategy[str]:
    return st.one_of(st.just("*"), st.integers(2, max(2, (high - low + 1) // 2)).map(lambda n: f"*/{n}"))


def field(index: int) -> st.SearchStrategy[str]:
    low, high = RANGES[index]
    return st.one_of(starred(low, high), numbers(low, high))


def day_field(index: int, anchor: int | None) -> st.SearchStrategy[str]:
    """A day field, often containing ``anchor`` so windows around a transition have matches."""
    low, high = RANGES[index]
    if anchor is None:
        return field(index)
    with_anchor = numbers(low, high).map(lambda s: f"{s},{anchor}")
    return st.one_of(st.just("*"), starred(low, high), with_anchor, with_anchor, numbers(low, high))


@st.composite
def expressions(draw: st.DrawFn, day: date | None = None, sparse: bool = False) -> str:
    if sparse:  # at most a few matches a day, so whole years stay cheap
        minute = draw(st.one_of(st.integers(0, 59).map(str), st.sampled_from(["0,30", "15,59", "*/30", "59"])))
        hour = draw(
            st.one_of(
                st.lists(st.integers(0, 23), min_size=1, max_size=2, unique=True).map(lambda h: ",".join(map(str, h))),
                st.sampled_from(["*/12", "0-1", "23", "1-3/2", "2"]),
            )
        )
    else:
        minute, hour = draw(field(0)), draw(field(1))
    dom = draw(day_field(2, day.day if day else None))
    month = draw(st.one_of(st.just("*"), st.just(str(day.month)) if day else field(3), field(3)))
    dow = draw(day_field(4, day.isoweekday() % 7 if day else None))
    return f"{minute} {hour} {dom} {month} {dow}"


@st.composite
def transition_windows(draw: st.DrawFn) -> tuple[str, datetime, str]:
    name = draw(st.sampled_from(sorted(ZONES)))
    at = draw(st.sampled_from(transitions(name)))
    expr = draw(expressions(day=at.astimezone(ZoneInfo(name)).date()))
    return name, at, expr


# ---------------------------------------------------------------------------------------- checks


def test_the_oracle_finds_the_transitions_it_is_meant_to_test() -> None:
    assert len(transitions("America/New_York")) == 4
    assert datetime(2011, 12, 30, 10, tzinfo=UTC) in transitions("Pacific/Apia")
    assert datetime(1985, 12, 31, 19, tzinfo=UTC) in transitions("Asia/Kathmandu")  # the change is at 18:30
    zone = ZoneInfo("Pacific/Apia")
    assert instants(zone, datetime(2011, 12, 30, 9)) == []
    assert after_gap(zone, datetime(2011, 12, 30, 9)) == datetime(2011, 12, 30, 10, tzinfo=UTC)
    assert len(instants(ZoneInfo("America/New_York"), datetime(2026, 11, 1, 1, 30))) == 2


@pytest.mark.parametrize(("gap", "fold"), POLICIES, ids=[f"{g.value}-{f.value}" for g, f in POLICIES])
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(case=transition_windows())
def test_every_wall_minute_around_offset_changes_matches_the_oracle(
    gap: DstGap, fold: DstFold, case: tuple[str, datetime, str]
) -> None:
    name, at, expr = case
    lo, hi = at - timedelta(hours=4), at + timedelta(hours=4)
    check(expr, name, gap, fold, lo, hi, every_minute(ZoneInfo(name), lo, hi))


@pytest.mark.parametrize("name", sorted(ZONES))
@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(expr=expressions(sparse=True), gap=st.sampled_from(DstGap), fold=st.sampled_from(DstFold))
def test_a_whole_year_matches_the_oracle(name: str, expr: str, gap: DstGap, fold: DstFold) -> None:
    year = ZONES[name][0]
    lo, hi = datetime(year - 1, 12, 31, 12, tzinfo=UTC), datetime(year + 1, 1, 1, 12, tzinfo=UTC)
    zone = ZoneInfo(name)
    check(expr, name, gap, fold, lo, hi, matching_minutes(Matcher.of(expr), zone, lo, hi))


@pytest.mark.parametrize(
    ("expr", "name"),
    [
        ("0,58 1,3 * * *", "America/New_York"),
        ("*/15 1-3 * * 0", "America/New_York"),
        ("30 * * * *", "Australia/Lord_Howe"),
        ("0 0 * * *", "America/Santiago"),
        ("0 9 * * *", "Pacific/Apia"),
        ("0,15 0 1 1 *", "Asia/Kathmandu"),
    ],
)
@pytest.mark.parametrize(("gap", "fold"), POLICIES, ids=[f"{g.value}-{f.value}" for g, f in POLICIES])
def test_named_hard_cases_match_the_oracle_around_every_change(
    expr: str, name: str, gap: DstGap, fold: DstFold
) -> None:
    for at in transitions(name):
        lo, hi = at - timedelta(days=1), at + timedelta(days=1)
        got = check(expr, name, gap, fold, lo, hi, matching_minutes(Matcher.of(expr), ZoneInfo(name), lo, hi))
        assert got or expr.endswith("1 1 *") or expr.endswith("* * 0"), at  # these fire around every change


@pytest.mark.parametrize("name", sorted(ZONES))
@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(expr=expressions(sparse=True), gap=st.sampled_from(DstGap), fold=st.sampled_from(DstFold))
def test_min_spacing_never_exceeds_the_real_smallest_gap(name: str, expr: str, gap: DstGap, fold: DstFold) -> None:
    """No DST change can sneak a gap shorter than ``min_spacing`` past the frequency limit."""
    year = ZONES[name][0]
    after = datetime(year, 1, 1, tzinfo=UTC)
    rule = Rule(ScheduleKind.CRON, cron=expr, timezone=name, dst_gap=gap, dst_fold=fold)
    real = [f.fire_at for f in fires_between(rule, after, after + timedelta(days=370))]
    spacing = min_spacing(rule, after)
    if len(real) >= 2:
        smallest = min(b - a for a, b in pairwise(real))
        assert spacing is not None and spacing <= smallest, (expr, name, gap, fold, spacing, smallest)


@pytest.mark.parametrize("name", sorted(ZONES))
@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(expr=expressions(sparse=True), gap=st.sampled_from(DstGap), fold=st.sampled_from(DstFold))
def test_bounded_min_spacing_is_exact(name: str, expr: str, gap: DstGap, fold: DstFold) -> None:
    """With ``ends_at`` close enough to enumerate, ``min_spacing`` is the exact smallest real gap."""
    year = ZONES[name][0]
    after, ends = datetime(year, 1, 1, tzinfo=UTC), datetime(year, 12, 31, tzinfo=UTC)
    rule = Rule(ScheduleKind.CRON, cron=expr, timezone=name, dst_gap=gap, dst_fold=fold, ends_at=ends)
    real = [f.fire_at for f in fires_between(rule, after, ends)]
    expected = min((b - a for a, b in pairwise(real)), default=None)
    assert min_spacing(rule, after) == expected


@settings(max_examples=40, deadline=None, derandomize=True)
@given(expr=expressions(day=date(2026, 3, 1)), start_day=st.integers(0, 400))
def test_the_spacing_window_walker_agrees_with_croniter(expr: str, start_day: int) -> None:
    """``min_spacing`` enumerates short windows from the expanded fields; it must match croniter's walk."""
    spec = calendar._compile(expr)
    start = datetime(2026, 1, 1, 5, 7) + timedelta(days=start_day)
    end = start + timedelta(hours=30)
    direct = list(calendar._walls_between(spec, start, end))
    via_croniter = []
    for wall in calendar._croniter_walls(spec, start):
        if wall > end:
            break
        via_croniter.append(wall)
    assert direct == via_croniter
