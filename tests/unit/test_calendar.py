"""The calendar's named behaviours: DST policies, Vixie day semantics, interval/once, errors, spacing.

Each test names the expectation it holds. Instants are written in UTC with the local reading in a
comment, so a reader can check them against a wall clock.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest
import tzdata
from hypothesis import given, settings
from hypothesis import strategies as st

from kairos import calendar
from kairos.calendar import (
    TZDATA_VERSION,
    Fire,
    Rule,
    check_rule,
    describe,
    fires,
    fires_between,
    iter_fires,
    min_spacing,
    next_fire,
)
from kairos.errors import ValidationFailed
from kairos.states import DstFold, DstGap, ScheduleKind

NY = "America/New_York"


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


def cron(expr: str, tz: str = "UTC", **kw: object) -> Rule:
    return Rule(ScheduleKind.CRON, cron=expr, timezone=tz, **kw)  # type: ignore[arg-type]


def between(rule: Rule, after: datetime, until: datetime) -> list[Fire]:
    return list(fires_between(rule, after, until))


def local(f: Fire) -> str:
    return f"{f.local_time:%Y-%m-%d %H:%M} {f.utc_offset} fold={f.fold}"


def errors_of(rule: Rule) -> set[tuple[str, str]]:
    with pytest.raises(ValidationFailed) as caught:
        check_rule(rule)
    return {(e.field, e.rule) for e in caught.value.fields}


# ------------------------------------------------------------------------------------- New York DST


def test_daily_0230_new_york_fires_once_on_spring_day_at_0300_edt() -> None:
    got = between(cron("30 2 * * *", NY), utc(2026, 3, 7, 12), utc(2026, 3, 9, 12))
    day = [f for f in got if f.local_time.date() == datetime(2026, 3, 8).date()]
    assert len(day) == 1
    assert day[0].fire_at == utc(2026, 3, 8, 7, 0)  # 03:00 EDT, the first instant after the gap
    assert day[0].local_time == datetime(2026, 3, 8, 3, 0)  # local_time is the wall time at fire_at
    assert day[0].utc_offset == timedelta(hours=-4)
    assert day[0].fold == 0


def test_daily_0230_new_york_fires_once_on_autumn_day_at_0230_est_after_the_fold() -> None:
    got = between(cron("30 2 * * *", NY), utc(2026, 10, 31, 12), utc(2026, 11, 2, 0))
    assert [f.fire_at for f in got] == [utc(2026, 11, 1, 7, 30)]  # 02:30 EST exists once
    assert got[0].utc_offset == timedelta(hours=-5)
    assert got[0].fold == 0


def test_daily_0130_new_york_autumn_auto_fires_once_at_first_instance_edt() -> None:
    got = between(cron("30 1 * * *", NY), utc(2026, 11, 1, 0), utc(2026, 11, 2, 0))
    assert [local(f) for f in got] == ["2026-11-01 01:30 -1 day, 20:00:00 fold=0"]
    assert got[0].fire_at == utc(2026, 11, 1, 5, 30)


def test_daily_0130_new_york_autumn_first_fires_at_edt() -> None:
    got = between(cron("30 1 * * *", NY, dst_fold=DstFold.FIRST), utc(2026, 11, 1, 0), utc(2026, 11, 2, 0))
    assert [f.fire_at for f in got] == [utc(2026, 11, 1, 5, 30)]


def test_daily_0130_new_york_autumn_both_fires_twice_an_hour_apart() -> None:
    got = between(cron("30 1 * * *", NY, dst_fold=DstFold.BOTH), utc(2026, 11, 1, 0), utc(2026, 11, 2, 0))
    assert [f.fire_at for f in got] == [utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 6, 30)]
    assert [f.fold for f in got] == [0, 1]
    assert [f.local_time for f in got] == [datetime(2026, 11, 1, 1, 30)] * 2
    assert [f.utc_offset for f in got] == [timedelta(hours=-4), timedelta(hours=-5)]


def test_daily_0130_new_york_autumn_last_fires_once_at_est() -> None:
    got = between(cron("30 1 * * *", NY, dst_fold=DstFold.LAST), utc(2026, 11, 1, 0), utc(2026, 11, 2, 0))
    assert [(f.fire_at, f.fold) for f in got] == [(utc(2026, 11, 1, 6, 30), 1)]


@pytest.mark.parametrize(
    ("day_start", "day_end", "real_hours"),
    [
        (utc(2026, 3, 8, 5), utc(2026, 3, 9, 4), 23),  # New York's 23-hour day
        (utc(2026, 11, 1, 4), utc(2026, 11, 2, 5), 25),  # and its 25-hour day
    ],
)
def test_minute_30_every_hour_fires_once_per_real_hour_across_both_changes(
    day_start: datetime, day_end: datetime, real_hours: int
) -> None:
    """`30 * * * *` follows real time: 23 fires on the 23-hour day, 25 on the 25-hour day, 1 h apart."""
    got = between(cron("30 * * * *", NY), day_start, day_end)
    assert (day_end - day_start) == timedelta(hours=real_hours)
    assert len(got) == real_hours
    assert {b.fire_at - a.fire_at for a, b in pairwise(got)} == {timedelta(hours=1)}


def test_every_15_minutes_fires_8_times_in_the_fold_between_0100_edt_and_0200_est() -> None:
    # [01:00 EDT, 02:00 EST) is two real hours: 01:00..01:45 twice.
    start, end = utc(2026, 11, 1, 5, 0), utc(2026, 11, 1, 7, 0)
    got = between(cron("*/15 * * * *", NY), start - timedelta(microseconds=1), end - timedelta(microseconds=1))
    assert len(got) == 8
    assert [f.fold for f in got] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert {b.fire_at - a.fire_at for a, b in pairwise(got)} == {timedelta(minutes=15)}


def test_every_15_minutes_never_fires_in_the_spring_gap() -> None:
    got = between(cron("*/15 * * * *", NY), utc(2026, 3, 8, 6, 0), utc(2026, 3, 8, 7, 30))
    # 01:15, 01:30, 01:45 EST, then 03:00, 03:15, 03:30 EDT: 02:xx does not exist.
    assert [f.local_time.strftime("%H:%M") for f in got] == ["01:15", "01:30", "01:45", "03:00", "03:15", "03:30"]


def test_gap_skip_does_not_fire_and_shift_forward_fires_at_0300() -> None:
    after, until = utc(2026, 3, 8, 0), utc(2026, 3, 8, 12)
    assert between(cron("30 2 * * *", NY, dst_gap=DstGap.SKIP), after, until) == []
    shifted = between(cron("30 2 * * *", NY, dst_gap=DstGap.SHIFT_FORWARD), after, until)
    assert [local(f) for f in shifted] == ["2026-03-08 03:00 -1 day, 20:00:00 fold=0"]


def test_several_matches_in_one_gap_collapse_into_one_fire() -> None:
    rule = cron("0,15,30,45 2 * * *", NY)  # not real-time: auto = shift_forward
    got = between(rule, utc(2026, 3, 8, 0), utc(2026, 3, 8, 12))
    assert [f.fire_at for f in got] == [utc(2026, 3, 8, 7)]
    # The 03:00 match itself lands on the same instant: still one fire.
    got = between(cron("0,30 2,3 * * *", NY), utc(2026, 3, 8, 0), utc(2026, 3, 8, 12))
    assert [f.local_time.strftime("%H:%M") for f in got] == ["03:00", "03:30"]


def test_real_time_expression_with_shift_forward_policy_fires_once_after_the_gap() -> None:
    rule = cron("*/15 2 * * *", NY, dst_gap=DstGap.SHIFT_FORWARD)
    got = between(rule, utc(2026, 3, 8, 0), utc(2026, 3, 8, 12))
    assert [f.fire_at for f in got] == [utc(2026, 3, 8, 7)]


def test_every_minute_in_fold_hour_auto_fires_120_times() -> None:
    got = between(cron("* 1 * * *", NY), utc(2026, 11, 1, 4), utc(2026, 11, 1, 8))
    assert len(got) == 120
    assert got[0].fire_at == utc(2026, 11, 1, 5, 0) and got[-1].fire_at == utc(2026, 11, 1, 6, 59)


# ---------------------------------------------------------------------------------- other zones


def test_berlin_0230_spring_shifts_to_0300_cest_and_autumn_fires_first_instance() -> None:
    rule = cron("30 2 * * *", "Europe/Berlin")
    spring = between(rule, utc(2026, 3, 28, 12), utc(2026, 3, 29, 12))
    assert [local(f) for f in spring] == ["2026-03-29 03:00 2:00:00 fold=0"]
    autumn = between(rule, utc(2026, 10, 24, 12), utc(2026, 10, 25, 12))
    assert [(f.fire_at, f.fold) for f in autumn] == [(utc(2026, 10, 25, 0, 30), 0)]


def test_lord_howe_30_minute_spring_gap_shifts_to_0230() -> None:
    # 2026-10-04 02:00 +10:30 jumps to 02:30 +11:00.
    got = between(cron("15 2 * * *", "Australia/Lord_Howe"), utc(2026, 10, 3, 12), utc(2026, 10, 4, 12))
    assert [local(f) for f in got] == ["2026-10-04 02:30 11:00:00 fold=0"]
    assert got[0].fire_at == utc(2026, 10, 3, 15, 30)


def test_lord_howe_30_minute_fold_fires_twice_half_an_hour_apart_under_both() -> None:
    # 2026-04-05 02:00 +11:00 falls back to 01:30 +10:30: 01:30..01:59 happens twice.
    rule = cron("45 1 * * *", "Australia/Lord_Howe", dst_fold=DstFold.BOTH)
    got = between(rule, utc(2026, 4, 4, 12), utc(2026, 4, 5, 12))
    assert [f.fire_at for f in got] == [utc(2026, 4, 4, 14, 45), utc(2026, 4, 4, 15, 15)]
    assert [f.utc_offset for f in got] == [timedelta(hours=11), timedelta(hours=10, minutes=30)]
    auto = between(cron("45 1 * * *", "Australia/Lord_Howe"), utc(2026, 4, 4, 12), utc(2026, 4, 5, 12))
    assert [f.fire_at for f in auto] == [utc(2026, 4, 4, 14, 45)]


def test_lord_howe_minute_30_hourly_fires_twice_at_0130_in_the_half_hour_fold() -> None:
    got = between(cron("30 * * * *", "Australia/Lord_Howe"), utc(2026, 4, 4, 13), utc(2026, 4, 4, 17))
    # 00:30 +11, 01:30 +11, 01:30 +10:30 (real time repeats it), 02:30 +10:30, 03:30 +10:30
    assert [f.local_time.strftime("%H:%M") for f in got] == ["00:30", "01:30", "01:30", "02:30", "03:30"]
    assert [f.fold for f in got] == [0, 0, 1, 0, 0]


def test_apia_daily_0900_has_no_fire_dated_2011_12_30_local() -> None:
    """Samoa skipped 2011-12-30 entirely (UTC-10 to UTC+14)."""
    rule = cron("0 9 * * *", "Pacific/Apia")
    got = between(rule, utc(2011, 12, 27), utc(2012, 1, 2))
    dates = [f.local_time.date().isoformat() for f in got]
    assert "2011-12-30" not in dates
    # auto (a fixed time) shifts the missing 09:00 to the first instant after the gap: 31st 00:00 +14.
    assert [local(f) for f in got if f.local_time.date().isoformat() == "2011-12-31"] == [
        "2011-12-31 00:00 14:00:00 fold=0",
        "2011-12-31 09:00 14:00:00 fold=0",
    ]
    skipped = between(cron("0 9 * * *", "Pacific/Apia", dst_gap=DstGap.SKIP), utc(2011, 12, 27), utc(2012, 1, 2))
    assert [f.local_time.day for f in skipped] == [27, 28, 29, 31, 1, 2]


def test_kathmandu_fires_at_plus_0545() -> None:
    f = next_fire(cron("0 9 * * *", "Asia/Kathmandu"), utc(2026, 5, 1))
    assert f is not None
    assert f.fire_at == utc(2026, 5, 1, 3, 15)
    assert f.utc_offset == timedelta(hours=5, minutes=45)


def test_kathmandu_1986_quarter_hour_gap_shifts_midnight_to_0015() -> None:
    got = between(cron("0 0 * * *", "Asia/Kathmandu"), utc(1985, 12, 30), utc(1986, 1, 2))
    assert [local(f) for f in got] == [
        "1985-12-31 00:00 5:30:00 fold=0",
        "1986-01-01 00:15 5:45:00 fold=0",
        "1986-01-02 00:00 5:45:00 fold=0",
    ]


def test_santiago_midnight_that_does_not_exist_fires_at_0100() -> None:
    # 2026-09-06 00:00 -04 jumps to 01:00 -03.
    got = between(cron("0 0 * * *", "America/Santiago"), utc(2026, 9, 5), utc(2026, 9, 7, 12))
    assert [local(f) for f in got] == [
        "2026-09-05 00:00 -1 day, 20:00:00 fold=0",
        "2026-09-06 01:00 -1 day, 21:00:00 fold=0",
        "2026-09-07 00:00 -1 day, 21:00:00 fold=0",
    ]
    skipped = between(cron("0 0 * * *", "America/Santiago", dst_gap=DstGap.SKIP), utc(2026, 9, 5), utc(2026, 9, 7, 12))
    assert [f.local_time.day for f in skipped] == [5, 7]


def test_santiago_autumn_midnight_fires_once_and_2330_repeats_only_under_both() -> None:
    # 2026-04-05 00:00 -03 falls back to 2026-04-04 23:00 -04: 23:00..23:59 on the 4th happens twice.
    after, until = utc(2026, 4, 4, 12), utc(2026, 4, 6, 12)
    midnight = between(cron("0 0 * * *", "America/Santiago"), after, until)
    assert [local(f) for f in midnight] == [
        "2026-04-05 00:00 -1 day, 20:00:00 fold=0",
        "2026-04-06 00:00 -1 day, 20:00:00 fold=0",
    ]
    both = between(cron("30 23 * * *", "America/Santiago", dst_fold=DstFold.BOTH), after, until)
    assert [f.fire_at for f in both] == [utc(2026, 4, 5, 2, 30), utc(2026, 4, 5, 3, 30), utc(2026, 4, 6, 3, 30)]


# ------------------------------------------------------------------------------------ day fields


def test_vixie_ands_the_day_fields_when_one_begins_with_star() -> None:
    """`*/2` day-of-month with Monday: odd days that are Mondays (croniter alone would OR them)."""
    got = fires(cron("0 0 */2 * 1"), utc(2026, 1, 1), 4)
    assert [f.local_time.date().isoformat() for f in got] == ["2026-01-05", "2026-01-19", "2026-02-09", "2026-02-23"]
    assert all(f.local_time.weekday() == 0 and f.local_time.day % 2 == 1 for f in got)


def test_vixie_ands_when_day_of_week_begins_with_star() -> None:
    got = fires(cron("0 0 13 * */5"), utc(2026, 1, 1), 3)  # the 13th when it is a Sunday or a Friday
    assert [f.local_time.date().isoformat() for f in got] == ["2026-02-13", "2026-03-13", "2026-09-13"]


def test_vixie_ors_the_day_fields_when_neither_begins_with_star() -> None:
    got = fires(cron("0 0 1,15 * 1"), utc(2026, 1, 1), 6)  # the 1st, the 15th, and every Monday
    assert [f.local_time.day for f in got] == [5, 12, 15, 19, 26, 1]


def test_full_day_of_week_range_with_a_day_of_month_fires_every_day() -> None:
    got = fires(cron("0 0 1 * 0-6"), utc(2026, 1, 1), 3)
    assert [f.local_time.day for f in got] == [2, 3, 4]
    got = fires(cron("0 0 1-31 * 1"), utc(2026, 1, 1), 3)
    assert [f.local_time.day for f in got] == [2, 3, 4]


def test_month_and_weekday_names_and_sunday_as_7() -> None:
    got = fires(cron("0 7 * feb mon-fri"), utc(2026, 1, 1), 2)
    assert [f.local_time.isoformat() for f in got] == ["2026-02-02T07:00:00", "2026-02-03T07:00:00"]
    sundays = fires(cron("0 7 * * 7"), utc(2026, 1, 1), 2)
    assert [f.local_time.weekday() for f in sundays] == [6, 6]


def test_leap_day_fires_every_four_years() -> None:
    got = fires(cron("0 12 29 2 *", "Europe/Berlin"), utc(2026, 1, 1), 2)
    assert [f.local_time.date().isoformat() for f in got] == ["2028-02-29", "2032-02-29"]


# --------------------------------------------------------------------------- N/S: a start with a step


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("0/15 * * * *", ["00:00", "00:15", "00:30", "00:45", "01:00"]),
        ("5/10 * * * *", ["00:05", "00:15", "00:25", "00:35", "00:45"]),
        ("0 16/3 * * *", ["16:00", "19:00", "22:00", "16:00", "19:00"]),
        ("59/15 3 * * *", ["03:59"] * 5),
    ],
)
def test_a_start_with_a_step_runs_from_the_start_to_the_fields_end(expr: str, expected: list[str]) -> None:
    """The forms croniter, cronsim, Kubernetes and EventBridge users write: `N/S` is `N-max/S`."""
    got = fires(cron(expr), utc(2026, 1, 1) - timedelta(seconds=1), 5)
    assert [f"{f.local_time:%H:%M}" for f in got] == expected


def test_a_start_with_a_step_works_in_every_day_field_with_names() -> None:
    doms = fires(cron("0 0 5/10 * *"), utc(2026, 1, 1), 4)
    assert [f.local_time.day for f in doms] == [5, 15, 25, 5]
    months = fires(cron("0 0 1 2/5 *"), utc(2026, 1, 1), 3)
    assert [f.local_time.month for f in months] == [2, 7, 12]
    assert [f.local_time.month for f in fires(cron("0 0 1 jan/5 *"), utc(2026, 1, 1), 3)] == [6, 11, 1]
    # Day-of-week runs to Saturday (6), as croniter reads it: Mon, Wed, Fri and never also Sunday (7).
    weekdays = fires(cron("0 0 * * 1/2"), utc(2026, 1, 4), 4)  # 2026-01-04 is a Sunday
    assert [f.local_time.strftime("%a") for f in weekdays] == ["Mon", "Wed", "Fri", "Mon"]
    for sunday_start in ("7/2", "sun/2", "0/2"):
        got = fires(cron(f"0 0 * * {sunday_start}"), utc(2026, 1, 3), 5)  # from Saturday 2026-01-03
        assert [f.local_time.strftime("%a") for f in got] == ["Sun", "Tue", "Thu", "Sat", "Sun"], sunday_start


def test_a_start_with_a_step_keeps_the_range_forms_dst_behaviour() -> None:
    """`30 1/1` begins with a digit like `30 1-23/1`: once per wall-clock match (the fold's first
    instance), where `30 */1` follows real time and fires in both instances of 01:30."""
    after, until = utc(2026, 11, 1, 4), utc(2026, 11, 1, 8)  # New York falls back at 06:00 UTC
    start_step = [f.fire_at for f in between(cron("30 1/1 * * *", NY), after, until)]
    assert start_step == [f.fire_at for f in between(cron("30 1-23/1 * * *", NY), after, until)]
    assert start_step == [utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 7, 30)]  # 01:30 EDT, 02:30 EST
    real_time = [f.fire_at for f in between(cron("30 */1 * * *", NY), after, until)]
    assert real_time == [utc(2026, 11, 1, 4, 30), utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 6, 30),
                         utc(2026, 11, 1, 7, 30)]


_FIELD_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(data=st.data(), index=st.integers(0, 4), zone=st.sampled_from(["UTC", NY, "Europe/Berlin"]))
def test_a_start_with_a_step_fires_exactly_as_the_range_it_stands_for(data: st.DataObject, index: int,
                                                                      zone: str) -> None:
    low, high = _FIELD_RANGES[index]
    start = data.draw(st.integers(low, high), label="start")
    step = data.draw(st.integers(1, high - low + 1), label="step")
    end = 6 if index == 4 else high
    base = ["7", "3", "*", "*", "*"] if index > 1 else ["*", "*", "*", "*", "*"]
    short, long = list(base), list(base)
    short[index] = f"{start}/{step}"
    long[index] = f"{start % 7 if index == 4 else start}-{end}/{step}"
    if index == 1:
        short[0] = long[0] = "0"
    after = utc(2026, 3, 1) + timedelta(days=data.draw(st.integers(0, 300), label="day"))
    a, b = cron(" ".join(short), zone), cron(" ".join(long), zone)
    assert [f.fire_at for f in fires(a, after, 30)] == [f.fire_at for f in fires(b, after, 30)], (short, long)


# ----------------------------------------------------------------------------- iteration contract


def test_fires_are_strictly_after_ascending_unique_and_utc() -> None:
    rule = cron("*/10 * * * *", NY, dst_fold=DstFold.BOTH)
    after = utc(2026, 11, 1, 5, 0)
    got = fires(rule, after, 30)
    assert got[0].fire_at > after
    assert all(a.fire_at < b.fire_at for a, b in pairwise(got))
    assert all(f.fire_at.tzinfo is UTC for f in got)
    assert all(f.timezone == NY and f.tzdata_version == tzdata.IANA_VERSION for f in got)


def test_after_inside_the_fold_still_sees_the_second_pass() -> None:
    rule = cron("0,30 1 * * *", NY, dst_fold=DstFold.BOTH)
    # after = 01:45 EDT: 01:00 and 01:30 EST are still ahead though their wall times are earlier.
    got = fires(rule, utc(2026, 11, 1, 5, 45), 3)
    assert [(f.fire_at, f.fold) for f in got] == [
        (utc(2026, 11, 1, 6, 0), 1),
        (utc(2026, 11, 1, 6, 30), 1),
        (utc(2026, 11, 2, 6, 0), 0),
    ]
    # after = 01:00 EST exactly: that fire is not strictly after.
    assert fires(rule, utc(2026, 11, 1, 6, 0), 1)[0].fire_at == utc(2026, 11, 1, 6, 30)


def test_after_accepts_any_offset() -> None:
    after = datetime(2026, 1, 1, 9, 0, tzinfo=timezone(timedelta(hours=2)))  # 07:00 UTC
    assert fires(cron("0 7,8 * * *"), after, 1)[0].fire_at == utc(2026, 1, 1, 8)


def test_fires_between_bounds_after_exclusive_until_inclusive() -> None:
    got = between(cron("0 * * * *"), utc(2026, 1, 1, 0), utc(2026, 1, 1, 3))
    assert [f.fire_at.hour for f in got] == [1, 2, 3]


def test_cron_starts_at_is_the_earliest_fire_and_ends_at_is_inclusive() -> None:
    rule = cron("0 * * * *", starts_at=utc(2026, 1, 1, 5), ends_at=utc(2026, 1, 1, 8))
    got = fires(rule, utc(2026, 1, 1), 10)
    assert [f.fire_at.hour for f in got] == [5, 6, 7, 8]
    assert next_fire(rule, utc(2026, 1, 1, 8)) is None


def test_fires_count_zero_and_exhausted_rules() -> None:
    assert fires(cron("0 * * * *"), utc(2026, 1, 1), 0) == []
    assert fires(cron("0 * * * *", ends_at=utc(2026, 1, 1, 1)), utc(2026, 1, 1), 5)[-1].fire_at == utc(2026, 1, 1, 1)


def test_interval_fires_at_anchor_plus_multiples_in_utc() -> None:
    rule = Rule(ScheduleKind.INTERVAL, interval_seconds=5400, starts_at=utc(2026, 1, 1, 0, 0), timezone=NY)
    assert [f.fire_at for f in fires(rule, utc(2025, 12, 1), 2)] == [utc(2026, 1, 1), utc(2026, 1, 1, 1, 30)]
    assert fires(rule, utc(2026, 1, 1), 1)[0].fire_at == utc(2026, 1, 1, 1, 30)  # strictly after the anchor
    assert fires(rule, utc(2026, 1, 1, 1, 29, 59), 1)[0].fire_at == utc(2026, 1, 1, 1, 30)
    first = fires(rule, utc(2026, 1, 1), 1)[0]
    assert first.local_time == datetime(2025, 12, 31, 20, 30) and first.utc_offset == timedelta(hours=-5)


def test_interval_keeps_fixed_utc_spacing_across_dst_and_describes_each_instant() -> None:
    rule = Rule(ScheduleKind.INTERVAL, interval_seconds=3600, starts_at=utc(2026, 11, 1, 4), timezone=NY)
    got = fires(rule, utc(2026, 11, 1, 4), 3)  # 01:00 EDT, 01:00 EST, 02:00 EST
    assert [local(f) for f in got] == [
        "2026-11-01 01:00 -1 day, 20:00:00 fold=0",
        "2026-11-01 01:00 -1 day, 19:00:00 fold=1",
        "2026-11-01 02:00 -1 day, 19:00:00 fold=0",
    ]


def test_interval_ends_at_is_inclusive() -> None:
    rule = Rule(ScheduleKind.INTERVAL, interval_seconds=600, starts_at=utc(2026, 1, 1), ends_at=utc(2026, 1, 1, 0, 20))
    assert [f.fire_at.minute for f in fires(rule, utc(2025, 1, 1), 10)] == [0, 10, 20]


def test_once_fires_once_when_after_is_before_it() -> None:
    rule = Rule(ScheduleKind.ONCE, starts_at=utc(2026, 3, 8, 7), timezone=NY)
    got = fires(rule, utc(2026, 1, 1), 5)
    assert [local(f) for f in got] == ["2026-03-08 03:00 -1 day, 20:00:00 fold=0"]
    assert fires(rule, utc(2026, 3, 8, 7), 5) == []
    assert next_fire(rule, utc(2026, 3, 8, 7)) is None


def test_describe_gives_wall_time_offset_and_fold_of_any_instant() -> None:
    first = describe(utc(2026, 11, 1, 5, 30), NY)
    second = describe(utc(2026, 11, 1, 6, 30), NY)
    assert (first.local_time, first.fold, first.utc_offset) == (datetime(2026, 11, 1, 1, 30), 0, timedelta(hours=-4))
    assert (second.local_time, second.fold, second.utc_offset) == (datetime(2026, 11, 1, 1, 30), 1, timedelta(hours=-5))
    assert second.fire_at == utc(2026, 11, 1, 6, 30) and second.fire_at.tzinfo is UTC
    assert second.local_time.tzinfo is None
    assert describe(datetime(2026, 1, 1, 12, tzinfo=timezone(timedelta(hours=1))), "UTC").fire_at == utc(2026, 1, 1, 11)
    assert describe(utc(2026, 1, 1), "UTC").tzdata_version == TZDATA_VERSION == tzdata.IANA_VERSION


def test_describe_refuses_naive_instants_and_unknown_zones() -> None:
    with pytest.raises(ValidationFailed) as caught:
        describe(datetime(2026, 1, 1), "UTC")
    assert caught.value.fields[0].rule == "timezone_aware"
    with pytest.raises(ValidationFailed) as caught:
        describe(utc(2026, 1, 1), "Mars/Olympus")
    assert (caught.value.fields[0].field, caught.value.fields[0].rule) == ("timezone", "known_zone")


def test_zones_come_from_the_shipped_tzdata_package() -> None:
    zone = calendar._zone("Europe/Berlin")
    assert zone.key == "Europe/Berlin"
    # from_file zones are distinct objects from the process-wide ZoneInfo cache (which may read the host's files).
    from zoneinfo import ZoneInfo

    assert zone is not ZoneInfo("Europe/Berlin")
    assert TZDATA_VERSION == tzdata.IANA_VERSION


def test_concurrent_iterations_of_one_expression_do_not_disturb_each_other() -> None:
    """Iterations share one parsed croniter per expression; each thread must still see its own sequence."""
    import threading

    rule = cron("*/7 1-3 * * 1-5", NY, dst_fold=DstFold.BOTH)
    starts = [utc(2026, 11, 1) + timedelta(hours=7 * i) for i in range(8)]
    expected = {s: [f.fire_at for f in fires(rule, s, 200)] for s in starts}
    barrier = threading.Barrier(len(starts))
    got: dict[datetime, list[datetime]] = {}

    def run(start: datetime) -> None:
        barrier.wait()
        got[start] = [f.fire_at for f in fires(rule, start, 200)]

    threads = [threading.Thread(target=run, args=(s,)) for s in starts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == expected


# ---------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        (cron("0 7 * * *", "Europe/Berln"), ("timezone", "known_zone")),
        (cron("0 7 * * *", "EST"), ("timezone", "known_zone")),
        (cron("0 0 7 * * *"), ("cron", "five_fields")),
        (cron("0 7 * *"), ("cron", "five_fields")),
        (cron("@daily"), ("cron", "five_fields")),
        (cron("0 25 * * *"), ("cron", "cron_syntax")),
        (cron("60 1 * * *"), ("cron", "cron_syntax")),
        (cron("0 0 0 * *"), ("cron", "cron_syntax")),
        (cron("0 0 L * *"), ("cron", "cron_syntax")),
        (cron("0 0 * * 1#2"), ("cron", "cron_syntax")),
        (cron("0 0 ? * 1"), ("cron", "cron_syntax")),
        (cron("H 0 * * *"), ("cron", "cron_syntax")),
        (cron("*/0 * * * *"), ("cron", "cron_syntax")),
        (cron("0/x * * * *"), ("cron", "cron_syntax")),
        (cron("0/0 * * * *"), ("cron", "cron_syntax")),
        (cron("60/5 * * * *"), ("cron", "cron_syntax")),
        (cron("30-10 * * * *"), ("cron", "cron_syntax")),
        (cron("0,,5 * * * *"), ("cron", "cron_syntax")),
        (cron("0 0 * foo *"), ("cron", "cron_syntax")),
        # ASCII only: Unicode spaces and digits read by str.split() / int() are refused, not normalised
        (cron("0\u30007 * * *"), ("cron", "cron_syntax")),  # ideographic (fullwidth) space
        (cron("0\u00a07 * * *"), ("cron", "cron_syntax")),  # no-break space
        (cron("\uff10 7 * * *"), ("cron", "cron_syntax")),  # fullwidth digit zero
        (cron("0 7 * * \u0661-\u0665"), ("cron", "cron_syntax")),  # Arabic-Indic digits
        (cron("0 0 31 2 *"), ("cron", "fires_never")),
        (cron("0 0 30,31 2 */2"), ("cron", "fires_never")),
        (cron(""), ("cron", "required")),
        (Rule(ScheduleKind.CRON), ("cron", "required")),
        (
            Rule(ScheduleKind.INTERVAL, interval_seconds=0, starts_at=datetime(2026, 1, 1, tzinfo=UTC)),
            ("interval_seconds", "min"),
        ),
        (
            Rule(ScheduleKind.INTERVAL, interval_seconds=-60, starts_at=datetime(2026, 1, 1, tzinfo=UTC)),
            ("interval_seconds", "min"),
        ),
        (
            Rule(ScheduleKind.INTERVAL, interval_seconds="60", starts_at=datetime(2026, 1, 1, tzinfo=UTC)),  # type: ignore[arg-type]
            ("interval_seconds", "type"),
        ),
        (cron("0 * * * *", starts_at=datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1)))), ("starts_at", "min")),
        (cron("0 * * * *", ends_at=datetime(9999, 12, 31, tzinfo=timezone(timedelta(hours=-1)))), ("ends_at", "max")),
        (Rule(ScheduleKind.INTERVAL, starts_at=datetime(2026, 1, 1, tzinfo=UTC)), ("interval_seconds", "required")),
        (Rule(ScheduleKind.INTERVAL, interval_seconds=60), ("starts_at", "required")),
        (Rule(ScheduleKind.ONCE), ("starts_at", "required")),
        (Rule(ScheduleKind.ONCE, starts_at=datetime(2026, 1, 1)), ("starts_at", "timezone_aware")),
        (cron("0 * * * *", ends_at=datetime(2026, 1, 1)), ("ends_at", "timezone_aware")),
        (
            Rule(
                ScheduleKind.ONCE, starts_at=datetime(2026, 1, 2, tzinfo=UTC), ends_at=datetime(2026, 1, 1, tzinfo=UTC)
            ),
            ("ends_at", "after_starts_at"),
        ),
        (
            cron("0 * * * *", starts_at=datetime(2026, 1, 1, tzinfo=UTC), ends_at=datetime(2026, 1, 1, tzinfo=UTC)),
            ("ends_at", "after_starts_at"),
        ),
        (cron("0 * * * *", dst_gap="sideways"), ("dst_gap", "enum")),
        (cron("0 * * * *", dst_fold="twice"), ("dst_fold", "enum")),
        (
            Rule(ScheduleKind.ONCE, cron="0 * * * *", starts_at=datetime(2026, 1, 1, tzinfo=UTC)),
            ("cron", "not_for_kind"),
        ),
        (cron("0 * * * *", interval_seconds=60), ("interval_seconds", "not_for_kind")),
    ],
    ids=lambda v: v if isinstance(v, tuple) else "",
)
def test_check_rule_names_field_and_rule(rule: Rule, expected: tuple[str, str]) -> None:
    assert expected in errors_of(rule)


def test_a_window_across_the_two_passes_of_a_repeated_wall_time_is_valid() -> None:
    """01:30 EDT then 01:30 EST (New York, 2026-11-01): an hour apart, though Python compares the two
    datetimes of one zone by wall time and finds them equal."""
    zone = ZoneInfo("America/New_York")
    first, second = datetime(2026, 11, 1, 1, 30, tzinfo=zone), datetime(2026, 11, 1, 1, 30, fold=1, tzinfo=zone)
    assert second.astimezone(UTC) - first.astimezone(UTC) == timedelta(hours=1)
    check_rule(cron("*/5 * * * *", starts_at=first, ends_at=second))  # valid: raises nothing
    assert ("ends_at", "after_starts_at") in errors_of(cron("*/5 * * * *", starts_at=second, ends_at=first))


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        (
            Rule(ScheduleKind.CRON, cron="0 25 * * *", interval_seconds=60, timezone="Mars/Base",  # type: ignore[arg-type]
                 dst_gap="sideways", dst_fold="twice", starts_at=datetime(2026, 1, 1)),
            [("timezone", "known_zone"), ("dst_gap", "enum"), ("dst_fold", "enum"), ("starts_at", "timezone_aware"),
             ("cron", "cron_syntax"), ("interval_seconds", "not_for_kind")],
        ),
        (
            Rule(ScheduleKind.INTERVAL, cron="0 * * * *", interval_seconds=0, timezone="Mars/Base",
                 ends_at=datetime(2026, 1, 1)),
            [("timezone", "known_zone"), ("ends_at", "timezone_aware"), ("cron", "not_for_kind"),
             ("interval_seconds", "min"), ("starts_at", "required")],
        ),
        (
            Rule(ScheduleKind.ONCE, cron="0 * * * *", interval_seconds=60, dst_fold="twice"),  # type: ignore[arg-type]
            [("dst_fold", "enum"), ("cron", "not_for_kind"), ("interval_seconds", "not_for_kind"),
             ("starts_at", "required")],
        ),
    ],
    ids=["cron", "interval", "once"],
)
def test_check_rule_lists_shared_problems_then_the_kinds_in_field_order(
    rule: Rule, expected: list[tuple[str, str]]
) -> None:
    with pytest.raises(ValidationFailed) as caught:
        check_rule(rule)
    assert [(e.field, e.rule) for e in caught.value.fields] == expected


def test_check_rule_refuses_a_webhook_before_looking_at_its_fields() -> None:
    with pytest.raises(ValueError, match="no calendar"):
        check_rule(Rule(ScheduleKind.WEBHOOK, cron="not cron", timezone="Mars/Base"))


def test_check_rule_messages_say_what_is_wrong_and_what_would_be_right() -> None:
    with pytest.raises(ValidationFailed) as caught:
        check_rule(cron("0 25 * * *"))
    assert caught.value.fields[0].message == "hour 25 is out of range 0-23"
    with pytest.raises(ValidationFailed) as caught:
        check_rule(cron("0 7 * * *", "Europe/Berln"))
    assert "'Europe/Berlin'" in caught.value.fields[0].message
    with pytest.raises(ValidationFailed) as caught:
        check_rule(cron("0 7 * * *", "EST"))
    assert "'America/New_York'" in caught.value.fields[0].message
    with pytest.raises(ValidationFailed) as caught:
        check_rule(cron("0 7 * * *", "europe/berlin"))
    assert "Did you mean 'Europe/Berlin'?" in caught.value.fields[0].message
    with pytest.raises(ValidationFailed) as caught:
        check_rule(cron("0 0 7 * * *"))
    message = caught.value.fields[0].message
    assert "exactly 5 fields" in message and "got 6" in message and "seconds" in message
    with pytest.raises(ValidationFailed) as caught:
        check_rule(cron("0 0 31 2 *"))
    assert "never fires" in caught.value.fields[0].message
    with pytest.raises(ValidationFailed) as caught:
        check_rule(cron("0/x * * * *"))
    assert "*/N" in caught.value.fields[0].message and "N/S" in caught.value.fields[0].message


def test_check_rule_reports_every_problem_at_once() -> None:
    rule = cron("0 25 32 * *", "Nowhere/City", ends_at=datetime(2026, 1, 1))
    assert errors_of(rule) == {
        ("timezone", "known_zone"),
        ("cron", "cron_syntax"),
        ("ends_at", "timezone_aware"),
    }


def test_check_rule_accepts_valid_rules() -> None:
    for rule in [
        cron("*/5 * * * *"),
        cron("0 7 * * 1-5", "Europe/Berlin", dst_gap=DstGap.SKIP, dst_fold=DstFold.BOTH),
        cron("0 0 29 2 *"),
        cron("0 9-17/2 1,15 jan-jun mon"),
        cron("0 0 * * 0-7"),
        Rule(ScheduleKind.INTERVAL, interval_seconds=300, starts_at=utc(2026, 1, 1)),
        Rule(ScheduleKind.ONCE, starts_at=utc(2026, 1, 1), ends_at=utc(2026, 1, 2)),
    ]:
        check_rule(rule)


def test_iter_fires_validates_eagerly_including_after() -> None:
    with pytest.raises(ValidationFailed) as caught:
        iter_fires(cron("0 7 * * *"), datetime(2026, 1, 1))
    assert (caught.value.fields[0].field, caught.value.fields[0].rule) == ("after", "timezone_aware")
    with pytest.raises(ValidationFailed):
        iter_fires(cron("0 0 31 2 *"), utc(2026, 1, 1))
    with pytest.raises(ValueError, match="webhook"):
        iter_fires(Rule(ScheduleKind.WEBHOOK), utc(2026, 1, 1))


# ----------------------------------------------------------------------------------- min_spacing


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        (cron("*/1 * * * *"), timedelta(minutes=1)),
        (cron("* * * * *", NY), timedelta(minutes=1)),
        (cron("*/5 * * * *", NY), timedelta(minutes=5)),
        (cron("*/5 * * * *", "Australia/Lord_Howe"), timedelta(minutes=5)),
        (cron("0 * * * *"), timedelta(hours=1)),
        (cron("0 9 * * 1-5", "Europe/Berlin"), timedelta(days=1)),  # Berlin changes on Sundays: no short weekday
        (cron("0 9 * * *", "Europe/Berlin"), timedelta(hours=23)),  # Saturday 09:00 CET -> Sunday 09:00 CEST
        (cron("0 9 * * 1", NY), timedelta(days=7) - timedelta(hours=1)),
        (cron("0,58 1,3 * * *", NY), timedelta(minutes=2)),  # 01:58 EST -> 03:00 EDT on the spring day
        (cron("0,58 1,3 * * *", "UTC"), timedelta(minutes=58)),
        (cron("30 1 * * *", NY, dst_fold=DstFold.BOTH), timedelta(hours=1)),  # 01:30 EDT -> 01:30 EST
        (cron("30 1 * * *", NY), timedelta(hours=23)),  # 01:30 EST on the spring day -> 01:30 EDT next day
        (cron("59 1 * * *", NY, dst_fold=DstFold.LAST), timedelta(hours=23)),
        (cron("55 23 * * *", "UTC"), timedelta(days=1)),
        (cron("58 23 31 12 *"), timedelta(days=365)),
        (Rule(ScheduleKind.INTERVAL, interval_seconds=60, starts_at=utc(2026, 1, 1)), timedelta(seconds=60)),
        (
            Rule(ScheduleKind.INTERVAL, interval_seconds=86400, starts_at=utc(2026, 1, 1), timezone=NY),
            timedelta(days=1),
        ),
    ],
)
def test_min_spacing_is_the_smallest_real_gap(rule: Rule, expected: timedelta) -> None:
    assert min_spacing(rule, utc(2026, 1, 1)) == expected


def test_min_spacing_sees_the_two_minute_dst_gap_that_the_wall_clock_hides() -> None:
    rule = cron("0,58 1,3 * * *", NY)
    got = between(rule, utc(2026, 3, 8, 5), utc(2026, 3, 8, 9))
    assert [f.local_time.strftime("%H:%M") for f in got] == ["01:00", "01:58", "03:00", "03:58"]
    assert got[2].fire_at - got[1].fire_at == timedelta(minutes=2)
    assert min_spacing(rule, utc(2026, 1, 1)) == timedelta(minutes=2)


def test_min_spacing_shift_forward_collapse_onto_an_existing_fire_counts_the_real_neighbour() -> None:
    # 01:59 EST then the gap-shifted 02:30 at 03:00 EDT: one real minute apart.
    assert min_spacing(cron("59 1,2 * * *", NY), utc(2026, 1, 1)) == timedelta(minutes=1)


def test_min_spacing_is_none_when_the_rule_fires_at_most_once() -> None:
    assert min_spacing(Rule(ScheduleKind.ONCE, starts_at=utc(2026, 6, 1)), utc(2026, 1, 1)) is None
    assert min_spacing(cron("*/1 * * * *", ends_at=utc(2026, 1, 1, 0, 1)), utc(2026, 1, 1)) is None
    assert min_spacing(cron("*/1 * * * *", ends_at=utc(2026, 1, 1, 0, 2)), utc(2026, 1, 1)) == timedelta(minutes=1)
    interval = Rule(
        ScheduleKind.INTERVAL, interval_seconds=600, starts_at=utc(2026, 1, 1), ends_at=utc(2026, 1, 1, 0, 5)
    )
    assert min_spacing(interval, utc(2025, 1, 1)) is None


def test_min_spacing_respects_ends_at() -> None:
    # The 2-minute DST gap is in March; a rule that ends in February never meets it.
    rule = cron("0,58 1,3 * * *", NY, ends_at=utc(2026, 2, 1))
    assert min_spacing(rule, utc(2026, 1, 1)) == timedelta(minutes=58)


def test_bounded_min_spacing_counts_only_fires_inside_the_window() -> None:
    # Only 09:01 today and 09:00 tomorrow fall in (after, ends_at]: the 1-minute wall step never happens.
    rule = cron("0,1 9 * * *", ends_at=utc(2026, 1, 2, 9, 0))
    assert min_spacing(rule, utc(2026, 1, 1, 9, 0, 30)) == timedelta(hours=23, minutes=59)


def test_min_spacing_is_fast_enough_for_an_api_call() -> None:
    import time

    for expr in ("*/5 * * * *", "* * * * *", "0 9 * * 1", "0 0 29 2 *"):
        rule = cron(expr, NY)
        min_spacing(rule, utc(2026, 1, 1))  # warm the zone's transition cache
        start = time.perf_counter()
        min_spacing(rule, utc(2026, 1, 1))
        assert time.perf_counter() - start < 0.25, expr  # typically a few ms; generous for slow CI


# --- the compile caches --------------------------------------------------------------------------------


def test_a_field_checked_before_gives_the_fires_of_the_expression_it_is_in_now() -> None:
    """Fields are checked once per (text, position) and shared between expressions: the same text in
    another position is another field ('7' as an hour and as Sunday, '*/30' as minutes 0,30 and as
    hour 0), and an expression differing in one field from one compiled before fires by its own."""
    calendar._check_field.cache_clear()
    after = utc(2026, 3, 2, 0, 0)  # a Monday

    def first(expression: str, zone: str = "UTC") -> datetime:
        fire = next_fire(cron(expression, zone), after)
        assert fire is not None
        return fire.fire_at

    assert first("0 7 * * *") == utc(2026, 3, 2, 7, 0)
    assert first("0 9 * * 7") == utc(2026, 3, 8, 9, 0)  # Sunday
    assert first("*/30 1 * * *") == utc(2026, 3, 2, 1, 0)
    assert first("0 */30 * * *") == utc(2026, 3, 3, 0, 0)
    assert first("0 8 * * *") == utc(2026, 3, 2, 8, 0)
    assert first("0 7 * * *", "Europe/Berlin") == utc(2026, 3, 2, 6, 0)
    assert calendar._check_field.cache_info().hits > 0


def test_a_bad_field_is_refused_every_time_it_is_met_with_the_same_problems() -> None:
    """The field cache keeps a field's problems, not just its values: a bad field refuses every
    expression it is in, each time, naming the same problem (and a good field beside it none)."""
    calendar._check_field.cache_clear()
    calendar._compile.cache_clear()
    messages = []
    for expression in ("61 7 * * *", "61 8 * * *", "61 7 * * *"):
        with pytest.raises(ValidationFailed) as caught:
            check_rule(cron(expression))
        messages.append([(e.field, e.rule, e.message) for e in caught.value.fields])
    assert messages[0] == messages[1] == messages[2] == [("cron", "cron_syntax", "minute 61 is out of range 0-59")]
    assert calendar.cron_problems("59 7 * * *") == []


# The cold path's caches (a tick of 10,000 distinct rules shares them): none may answer for another key.


def test_describe_cache_tells_apart_the_two_instants_of_a_repeated_wall_time() -> None:
    # 01:30 on 2026-11-01 happens twice in New York; as aware datetimes of that zone the two compare and
    # hash equal (they differ only by fold), so a cache keyed on them would answer the second with the first.
    zone = ZoneInfo("America/New_York")
    first = calendar.describe(datetime(2026, 11, 1, 1, 30, tzinfo=zone), "America/New_York")
    second = calendar.describe(datetime(2026, 11, 1, 1, 30, fold=1, tzinfo=zone), "America/New_York")
    assert (first.fire_at, first.fold, first.utc_offset) == (datetime(2026, 11, 1, 5, 30, tzinfo=UTC), 0,
                                                             timedelta(hours=-4))
    assert (second.fire_at, second.fold, second.utc_offset) == (datetime(2026, 11, 1, 6, 30, tzinfo=UTC), 1,
                                                                timedelta(hours=-5))
    tokyo = calendar.describe(datetime(2026, 11, 1, 5, 30, tzinfo=UTC), "Asia/Tokyo")
    assert (tokyo.timezone, tokyo.local_time) == ("Asia/Tokyo", datetime(2026, 11, 1, 14, 30))


def test_one_cron_text_in_two_zones_from_one_cursor_fires_in_each_zone() -> None:
    cursor = datetime(2026, 12, 7, 20, 0, tzinfo=UTC)
    berlin = next_fire(Rule(kind=ScheduleKind.CRON, cron="5 21 * * *", timezone="Europe/Berlin"), cursor)
    tokyo = next_fire(Rule(kind=ScheduleKind.CRON, cron="5 21 * * *", timezone="Asia/Tokyo"), cursor)
    utc = next_fire(Rule(kind=ScheduleKind.CRON, cron="5 21 * * *", timezone="UTC"), cursor)
    assert berlin is not None and tokyo is not None and utc is not None
    assert berlin.fire_at == datetime(2026, 12, 7, 20, 5, tzinfo=UTC)
    assert tokyo.fire_at == datetime(2026, 12, 8, 12, 5, tzinfo=UTC)
    assert utc.fire_at == datetime(2026, 12, 7, 21, 5, tzinfo=UTC)


def test_an_invalid_cron_after_valid_ones_sharing_its_fields_is_still_refused() -> None:
    cursor = datetime(2026, 12, 7, 20, 0, tzinfo=UTC)
    assert next_fire(Rule(kind=ScheduleKind.CRON, cron="0 0 30 1 *"), cursor) is not None
    assert next_fire(Rule(kind=ScheduleKind.CRON, cron="0 0 29 2 *"), cursor) is not None  # a leap day
    with pytest.raises(ValidationFailed) as never:
        next_fire(Rule(kind=ScheduleKind.CRON, cron="0 0 30 2 *"), cursor)  # shares "0", "0", "30", "2"
    assert [e.rule for e in never.value.fields] == ["fires_never"]
    with pytest.raises(ValidationFailed) as bad:
        next_fire(Rule(kind=ScheduleKind.CRON, cron="0 0 30 2,13 *"), cursor)
    assert [e.rule for e in bad.value.fields] == ["cron_syntax"]
