"""The calendar: the one evaluator that turns a schedule rule into fire instants.

Preview and dispatch both call this module, so what a user previews is exactly what the tick fires.

Rules (docs/architecture.md "Schedules and time"):

* ``cron``: five Vixie fields (minute hour day-of-month month day-of-week) matched on the *local
  wall clock* of an IANA zone (each expression compiled once into sorted allowed values per field,
  walked month → day → hour → minute); every wall time is then resolved to UTC through ``zoneinfo``
  under two explicit policies. ``dst_gap``: ``shift_forward`` (a wall time inside a spring-forward
  gap fires at the first instant after the gap; several such matches collapse into that one fire) or
  ``skip``. ``dst_fold``: ``first``, ``last`` or ``both`` instances of a repeated wall time.
  ``auto`` (the default for both) is Vixie cron's behaviour: an expression whose minute or hour
  field begins with ``*`` follows real time (``skip`` + ``both``); any other fires once per
  wall-clock match (``shift_forward`` + ``first``). Day fields follow Vixie: when day-of-month or
  day-of-week begins with ``*`` a day must match both, otherwise either (croniter ORs ``*/N`` day
  fields; we do not inherit that). ``N/S`` in any field means ``N-max/S``, as croniter, cronsim,
  Kubernetes and EventBridge read it (day-of-week max 6); like ``N-max/S`` it begins with a digit, so
  under ``auto`` ``0 0/6 * * *`` fires once per wall-clock match, as ``0 0-23/6 * * *`` does.
  ``starts_at``, when given, is the earliest instant a cron fires.
* ``interval``: ``starts_at + k * interval_seconds`` for k >= 0, in UTC.
* ``once``: ``starts_at``.
* ``ends_at`` is inclusive: nothing fires after it.

Guarantees: fires come strictly after ``after``, ascending, with unique ``fire_at``; each carries its
UTC instant (``tzinfo=UTC``), the wall time at that instant, the offset, the fold, the zone and the
tzdata version. Zones are read from the shipped ``tzdata`` package (never the host's
``/usr/share/zoneinfo``), so ``TZDATA_VERSION`` names exactly the data every fire was computed with.
Bad rules raise ``ValidationFailed`` naming field and rule (``starts_at`` and ``ends_at`` must lie in
``kairos.instants``' range: ``min`` / ``max``); legacy abbreviation zones ('EST', 'CET',
'PST8PDT', ...) are refused with the location to use instead. ``min_spacing`` measures the real
(DST-aware) shortest gap for the frequency limit.

Must not: touch the database or read the clock (callers pass ``after``). croniter is not a
dependency of the layer: it is the test oracle (dev extra) that ``_croniter_walls`` wraps and the
differential tests compare ``_field_walls`` with.
"""

from __future__ import annotations

import calendar as _gregorian
import copy
import difflib
import heapq
import math
import re
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import cache, lru_cache
from importlib import resources
from itertools import islice, pairwise
from typing import TYPE_CHECKING, Any, TypeVar
from zoneinfo import ZoneInfo

import tzdata

from kairos.errors import ENUM, MIN, TYPE, FieldError, ValidationFailed
from kairos.instants import out_of_range, rfc3339
from kairos.states import DstFold, DstGap, ScheduleKind, parse

if TYPE_CHECKING:
    from croniter import croniter

__all__ = [
    "TZDATA_VERSION",
    "DstFold",  # re-exported for callers that build rules
    "DstGap",
    "Fire",
    "Rule",
    "ScheduleKind",
    "check_rule",
    "cron_problems",
    "describe",
    "fires",
    "fires_between",
    "iter_fires",
    "min_spacing",
    "next_fire",
    "rfc3339",  # re-exported: the one RFC 3339 writer lives in kairos.instants
    "zone_problems",
]

TZDATA_VERSION: str = tzdata.IANA_VERSION

_ZERO = timedelta(0)
_MICRO = timedelta(microseconds=1)
_DAY = timedelta(days=1)
_MINUTE = timedelta(minutes=1)
# Any UTC offset change spans less than this (Pacific/Apia's 2011 jump was 24 h).
_MAX_SHIFT = timedelta(hours=26)


@dataclass(frozen=True, slots=True)
class Fire:
    fire_at: datetime  # aware, tzinfo=UTC
    local_time: datetime  # naive wall time at fire_at in `timezone`
    utc_offset: timedelta  # offset at fire_at
    fold: int  # 0, or 1 for the second instance of a repeated wall time
    timezone: str
    tzdata_version: str


@dataclass(frozen=True, slots=True)
class Rule:
    kind: ScheduleKind
    cron: str | None = None
    interval_seconds: int | None = None
    starts_at: datetime | None = None  # ONCE: the instant; INTERVAL: the anchor; CRON: earliest fire
    ends_at: datetime | None = None  # inclusive bound: no fire after it
    timezone: str = "UTC"
    dst_gap: DstGap = DstGap.AUTO
    dst_fold: DstFold = DstFold.AUTO

    @classmethod
    def of(cls, source: object) -> Rule:
        """The one way to build a schedule's rule from its data: a schedule row (a mapping with its
        columns, as the tick reads due rows) or anything with them as attributes (a ``ScheduleRequest``,
        a stored ``kairos.schedules.Schedule``). ``kind``, ``dst_gap`` and ``dst_fold`` are parsed into
        their enums (the enum's ``ValueError`` for an unknown value); a row without a column is a
        ``KeyError``. Whether the kind has a calendar at all is the caller's question
        (``kairos.schedules.request.rule_of`` refuses a webhook)."""
        if isinstance(source, Mapping):
            row: Mapping[str, Any] = source
            get: Callable[[str], Any] = row.__getitem__
        else:
            def get(name: str) -> Any:
                return getattr(source, name)
        return cls(
            kind=parse(ScheduleKind, get("kind")),
            cron=get("cron"),
            interval_seconds=get("interval_seconds"),
            starts_at=get("starts_at"),
            ends_at=get("ends_at"),
            timezone=get("timezone"),
            dst_gap=parse(DstGap, get("dst_gap")),
            dst_fold=parse(DstFold, get("dst_fold")),
        )


# --------------------------------------------------------------------------------------------- zones

# Legacy abbreviation zones are refused: 'EST' is a fixed UTC-5 all year, which is never what someone
# writing "EST" for New York means in July. 'UTC' and 'GMT' stay.
_LEGACY_ZONES: dict[str, str] = {
    "EST": "America/New_York",
    "EST5EDT": "America/New_York",
    "CST6CDT": "America/Chicago",
    "MST": "America/Phoenix",
    "MST7MDT": "America/Denver",
    "PST8PDT": "America/Los_Angeles",
    "HST": "Pacific/Honolulu",
    "CET": "Europe/Berlin",
    "MET": "Europe/Berlin",
    "EET": "Europe/Athens",
    "WET": "Europe/Lisbon",
}
_ZONE_NAMES: frozenset[str] = frozenset(
    resources.files("tzdata").joinpath("zones").read_text(encoding="utf-8").split()
) - {"Factory", *_LEGACY_ZONES}


@cache
def _zone(name: str) -> ZoneInfo:
    """The zone from the shipped tzdata package; unknown names raise ``ValidationFailed``."""
    if name not in _ZONE_NAMES:
        raise ValidationFailed([_unknown_zone(name)])
    with resources.files("tzdata.zoneinfo").joinpath(*name.split("/")).open("rb") as data:
        return ZoneInfo.from_file(data, key=name)


def _unknown_zone(name: object) -> FieldError:
    hint = ""
    if isinstance(name, str) and name.upper() in _LEGACY_ZONES:
        hint = (
            f" {name!r} is a legacy abbreviation zone that ignores the local daylight-saving rules; use the "
            f"location, e.g. {_LEGACY_ZONES[name.upper()]!r}."
        )
    elif isinstance(name, str) and name:
        folded = {z.casefold(): z for z in _ZONE_NAMES}
        match = folded.get(name.casefold()) or next(iter(difflib.get_close_matches(name, _ZONE_NAMES, n=1)), None)
        if match:
            hint = f" Did you mean {match!r}?"
    return FieldError(
        "timezone",
        "known_zone",
        f"{name!r} is not an IANA time zone name.{hint} Use a name such as 'Europe/Berlin', "
        "'America/New_York' or 'UTC' (case-sensitive); abbreviations like 'EST' or offsets like '+02:00' "
        "are not accepted.",
    )


def _is_utc(zone: ZoneInfo) -> bool:
    return zone.key in ("UTC", "Etc/UTC", "Etc/UCT", "UCT", "Etc/Universal", "Universal", "Etc/Zulu", "Zulu")


def _offset_at(zone: ZoneInfo, instant: datetime) -> timedelta:
    offset = instant.astimezone(zone).utcoffset()
    if offset is None:  # never for an aware datetime in a ZoneInfo
        raise RuntimeError(f"{zone.key} gave no UTC offset for {instant.isoformat()}")
    return offset


def _transition_in(zone: ZoneInfo, lo: datetime, hi: datetime) -> datetime:
    """The first instant in (lo, hi] whose offset differs from lo's (to the second; tzdata is whole seconds)."""
    before = _offset_at(zone, lo)
    lo_s, hi_s = math.floor(lo.timestamp()), math.ceil(hi.timestamp())
    while hi_s - lo_s > 1:
        mid = (lo_s + hi_s) // 2
        if _offset_at(zone, datetime.fromtimestamp(mid, UTC)) == before:
            lo_s = mid
        else:
            hi_s = mid
    return datetime.fromtimestamp(hi_s, UTC)


@lru_cache(maxsize=8192)
def _year_transitions(zone_name: str, year: int) -> tuple[tuple[datetime, timedelta, timedelta], ...]:
    """Every UTC-offset change of the zone in a UTC year: (instant, offset before, offset after).

    Python has no public transition API, so offsets are sampled every 12 hours and each change is
    bisected to the second. Two changes less than 12 hours apart that cancel out would be missed;
    tzdata has none since 1970.
    """
    zone = _zone(zone_name)
    start = datetime(year, 1, 1, tzinfo=UTC)
    end = datetime(year + 1, 1, 1, tzinfo=UTC) if year < 9999 else datetime.max.replace(tzinfo=UTC)
    step = timedelta(hours=12)
    found: list[tuple[datetime, timedelta, timedelta]] = []
    cursor, offset = start, _offset_at(zone, start)
    while cursor < end:
        probe = min(cursor + step, end)
        probe_offset = _offset_at(zone, probe)
        if probe_offset == offset:
            cursor = probe
            continue
        instant = _transition_in(zone, cursor, probe)
        after = _offset_at(zone, instant)
        found.append((instant, offset, after))
        cursor, offset = instant, after
    return tuple(found)


def _transitions(zone: ZoneInfo, start: datetime, end: datetime) -> list[tuple[datetime, timedelta, timedelta]]:
    if _is_utc(zone):
        return []
    out: list[tuple[datetime, timedelta, timedelta]] = []
    for year in range(start.year, end.year + 1):
        out.extend(t for t in _year_transitions(zone.key, year) if start <= t[0] <= end)
    return out


# ---------------------------------------------------------------------------------------------- cron

_FIELDS: tuple[tuple[str, int, int], ...] = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day-of-month", 1, 31),
    ("month", 1, 12),
    ("day-of-week", 0, 7),
)
_NAMES: tuple[dict[str, int], ...] = (
    {},
    {},
    {},
    {n.lower(): i for i, n in enumerate(_gregorian.month_abbr) if n},
    {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6},
)
_PART = re.compile(r"^(?:(?P<star>\*)|(?P<a>[0-9A-Za-z]+)(?:-(?P<b>[0-9A-Za-z]+))?)(?:/(?P<step>[0-9]+))?$")
_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # the most each month ever has
_SHORTEST_MONTH = min(_MONTH_DAYS)


@dataclass(frozen=True, slots=True)
class _Cron:
    """A validated cron expression compiled once (cached by expression): per-field sorted allowed
    values that ``_field_walls`` walks, and the canonical text the croniter test oracle reads."""

    text: str  # canonical expression (numbers, single spaces): what croniter gets in the tests
    day_or: bool  # croniter's day_or: True only when Vixie would OR the day fields
    real_time: bool  # minute or hour begins with '*': follows real time under `auto`
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    doms: frozenset[int]
    months: frozenset[int]
    dows: frozenset[int]  # 0 = Sunday .. 6
    day_and: bool  # Vixie: a day must match both day fields (else either)
    month_list: tuple[int, ...] = ()  # the months, ascending (the field walk's outer loop)

    def day_matches(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        dom_ok = day.day in self.doms
        dow_ok = (day.weekday() + 1) % 7 in self.dows
        return (dom_ok and dow_ok) if self.day_and else (dom_ok or dow_ok)


def _field_value(token: str, index: int, errors: list[str]) -> int | None:
    name, low, high = _FIELDS[index]
    if token.isdigit():
        value = int(token)
    elif token.lower() in _NAMES[index]:
        return _NAMES[index][token.lower()]
    else:
        names = ""
        if _NAMES[index]:
            names = f" or a name ({', '.join(_NAMES[index])})"
        errors.append(f"{name} value {token!r} is not a number{names}")
        return None
    if not low <= value <= high:
        errors.append(f"{name} {value} is out of range {low}-{high}")
        return None
    return value


@lru_cache(maxsize=4096)
def _check_field(text: str, index: int) -> tuple[str, frozenset[int], tuple[str, ...], tuple[int, ...]]:
    """Vixie syntax of one field: comma-separated ``*``, ``a``, ``a-b``, each with an optional ``/step``;
    ``a/step`` means ``a-max/step``.

    Returns the field in canonical form (``*`` parts as written, everything else as explicit
    numbers: what the croniter test oracle reads), the values it allows (``*`` and ``*/N`` expanded
    over the field's range, day-of-week 0-6 with 7 read as 0), the problems found (one message each)
    and the allowed values ascending. Memoized per (text, position): distinct expressions share most
    fields (``*``, an hour); a tick meets most rules first that day (a daily rule), compiling each here."""
    name, low, high = _FIELDS[index]
    errors: list[str] = []
    parts: list[str] = []
    values: set[int] = set()  # the explicit (non-'*') parts' values
    starred: set[int] = set()  # what the '*' and '*/N' parts allow
    for part in text.split(","):
        match = _PART.match(part)
        if match is None:
            if part == "":
                errors.append(f"{name} field {text!r} has an empty list item")
            elif any(c in part.upper() for c in "LW#?H"):
                errors.append(
                    f"{name} {part!r} uses a non-standard cron extension (L, W, #, ?, H); "
                    "use numbers, ranges like 1-5, lists like 1,15 and steps like */15"
                )
            else:
                errors.append(
                    f"{name} {part!r} is not valid cron syntax; use *, a number, a range a-b, a list, or a step "
                    "such as */N, a-b/N or N/S"
                )
            continue
        step = match["step"]
        if step is not None and int(step) == 0:
            errors.append(f"{name} step in {part!r} must be at least 1")
            continue
        if match["star"]:
            parts.append(part)
            starred.update(range(low, (6 if index == 4 else high) + 1, int(step or 1)))
            continue
        a = _field_value(match["a"], index, errors)
        b = _field_value(match["b"], index, errors) if match["b"] is not None else None
        if a is None or (match["b"] is not None and b is None):
            continue
        if b is not None and b < a:
            errors.append(
                f"{name} range {a}-{b} runs backwards; write it low-high, or as two ranges {a}-{high},{low}-{b}"
            )
            continue
        if b is None and step is not None:
            # 'N/S' is 'N-max/S' (croniter, cronsim, Kubernetes, EventBridge). The day-of-week max is 6
            # (Saturday) as they read it: '1/2' is Mon, Wed, Fri, never also 7 (= Sunday); '7/2' is '0/2'.
            if index == 4:
                a, b = a % 7, 6
            else:
                b = high
        # Ranges and steps are written out as explicit values: croniter (the test oracle) reads a
        # one-value range ('5-5', '1-1/1') as the whole field, and values leave nothing to interpret.
        values.update(v % 7 if index == 4 else v for v in range(a, (a if b is None else b) + 1, int(step or 1)))
    parts.extend(str(v) for v in sorted(values))
    return ",".join(parts), (allowed := frozenset(values | starred)), tuple(errors), tuple(sorted(allowed))


@lru_cache(maxsize=16384)  # a tick of 10,000 distinct rules compiles each once per container
def _compile(expression: str) -> _Cron:
    """Validate and prepare a cron expression; raises ``ValidationFailed`` on the ``cron`` field."""
    fields = expression.split()
    if len(fields) != 5:
        hint = ""
        if len(fields) == 6:
            hint = " Kairos cron has no seconds or year field; drop it."
        elif expression.strip().startswith("@"):
            hint = " Shorthands like @daily are not accepted; write '0 0 * * *'."
        raise ValidationFailed(
            [
                FieldError(
                    "cron",
                    "five_fields",
                    f"cron must have exactly 5 fields (minute hour day-of-month month day-of-week), "
                    f"got {len(fields)} in {expression!r}.{hint} Example: '0 7 * * 1-5' = 07:00 on weekdays.",
                )
            ]
        )
    minute, hour, dom, month, dow = checked = (_check_field(fields[0], 0), _check_field(fields[1], 1),
                                               _check_field(fields[2], 2), _check_field(fields[3], 3),
                                               _check_field(fields[4], 4))
    if minute[2] or hour[2] or dom[2] or month[2] or dow[2]:
        raise ValidationFailed(
            [FieldError("cron", "cron_syntax", message) for field in checked for message in field[2]]
        )
    canonical = [minute[0], hour[0], dom[0], month[0], dow[0]]
    doms, months, dows = dom[1], month[1], dow[1]
    minutes, hours = minute[3], hour[3]
    day_and = fields[2].startswith("*") or fields[4].startswith("*")
    day_or = not day_and
    if day_or and (len(doms) == 31 or len(dows) == 7):
        # Vixie ORs the day fields, and one of them matches every day: every day matches. croniter
        # (the test oracle) would instead AND a full field, so it gets the equivalent '*' for both.
        canonical[2] = canonical[4] = "*"
        doms, dows = frozenset(range(1, 32)), frozenset(range(7))
        day_and, day_or = True, False
    spec = _Cron(
        text=" ".join(canonical),
        day_or=day_or,
        real_time=fields[0].startswith("*") or fields[1].startswith("*"),
        minutes=minutes,
        hours=hours,
        doms=doms,
        months=months,
        dows=dows,
        day_and=day_and,
        month_list=month[3],
    )
    if day_and and dom[3][0] > _SHORTEST_MONTH:  # else a day every month has is listed: the usual case
        _check_fires(spec, expression)
    return spec


def _check_fires(spec: _Cron, expression: str) -> None:
    """Refuse an expression no calendar day can ever match (e.g. ``0 0 31 2 *``).

    Under OR any listed weekday matches some day of every month. Under AND each (month, day) pair
    that exists meets every weekday within the 400-year Gregorian cycle, so it is enough that one
    month in the month field has one listed day. So ``_compile`` asks only for an AND rule whose
    smallest listed day is not in every month.
    """
    if any(d <= _MONTH_DAYS[m - 1] for m in spec.months for d in spec.doms):
        return
    months = ",".join(str(m) for m in sorted(spec.months))
    days = ",".join(str(d) for d in sorted(spec.doms))
    raise ValidationFailed(
        [
            FieldError(
                "cron",
                "fires_never",
                f"cron {expression!r} never fires: day-of-month {days} does not occur in month {months}. "
                "Choose days that exist in those months (February has at most 29).",
            )
        ]
    )


def _policies(spec: _Cron, gap: DstGap, fold: DstFold) -> tuple[DstGap, DstFold]:
    return _policy_pair(spec.real_time, gap, fold)


@lru_cache(maxsize=64)
def _policy_pair(real_time: bool, gap: DstGap, fold: DstFold) -> tuple[DstGap, DstFold]:
    """The two DST policies with ``auto`` resolved for an expression that does (not) follow real time."""
    gap, fold = parse(DstGap, gap), parse(DstFold, fold)
    if gap is DstGap.AUTO:
        gap = DstGap.SKIP if real_time else DstGap.SHIFT_FORWARD
    if fold is DstFold.AUTO:
        fold = DstFold.BOTH if real_time else DstFold.FIRST
    return gap, fold


# ---------------------------------------------------------------------------------------- resolution


def _resolve(
    walls: Iterable[datetime],
    zone: ZoneInfo,
    gap: DstGap,
    fold: DstFold,
    lower: datetime,
    upper: datetime | None,
) -> Iterator[Fire]:
    """Resolve ascending naive wall times to fires in (lower, upper], ascending and unique.

    A wall time maps to one instant, or (fold) two, or (gap) none. UTC has neither, so its walls are
    their instants (``_resolve_utc``); any other zone goes through ``_resolve_zoned``.
    """
    if _is_utc(zone):
        return _resolve_utc(walls, zone.key, lower, upper)
    return _resolve_zoned(walls, zone, gap, fold, lower, upper)


def _with_zone(wall: datetime, tzinfo: Any) -> datetime:
    """``wall.replace(tzinfo=tzinfo)``: the constructor is about twice as fast as ``replace`` (its
    keyword parsing), and the resolvers make one or two of these for every wall time."""
    return datetime(wall.year, wall.month, wall.day, wall.hour, wall.minute, wall.second, wall.microsecond, tzinfo,
                    fold=wall.fold)


def _second_pass(wall: datetime) -> datetime:
    """``wall.replace(fold=1)`` (as ``_with_zone``)."""
    return datetime(wall.year, wall.month, wall.day, wall.hour, wall.minute, wall.second, wall.microsecond,
                    wall.tzinfo, fold=1)


def _resolve_utc(walls: Iterable[datetime], name: str, lower: datetime, upper: datetime | None) -> Iterator[Fire]:
    version = TZDATA_VERSION
    utc = UTC
    for wall in walls:
        instant = _with_zone(wall, utc)
        if instant <= lower:
            continue
        if upper is not None and instant > upper:
            return
        yield Fire(instant, wall, _ZERO, 0, name, version)


def _resolve_zoned(
    walls: Iterable[datetime],
    zone: ZoneInfo,
    gap: DstGap,
    fold: DstFold,
    lower: datetime,
    upper: datetime | None,
) -> Iterator[Fire]:
    """``_resolve`` in a zone with transitions. Instants of the first pass through a fold and of
    ordinary times ascend with the wall clock; only second-pass instants (fold=1) can come after
    instants of later wall times, so they wait in a heap until the stream passes them. Gap-shifted
    matches all land on the transition instant and collapse there.
    """
    name = zone.key
    version = TZDATA_VERSION
    utc = UTC
    pending: list[tuple[datetime, datetime, timedelta]] = []  # (fire_at, wall, offset) of fold=1 instances
    last: datetime | None = None

    for wall in walls:
        off_first = zone.utcoffset(wall)  # the zone's offset for the wall time's first and second pass
        off_second = zone.utcoffset(_second_pass(wall))
        if off_first is None or off_second is None:  # never: a ZoneInfo has an offset for every wall time
            raise RuntimeError(f"{name} gave no UTC offset for {wall.isoformat()}")
        if off_first == off_second:  # an ordinary wall time
            fire = Fire(_with_zone(wall - off_first, utc), wall, off_first, 0, name, version)
        elif off_first > off_second:  # repeated wall time: fold=0 is the earlier instant
            if fold is DstFold.LAST or fold is DstFold.BOTH:
                heapq.heappush(pending, (_with_zone(wall - off_second, utc), wall, off_second))
            if fold is DstFold.LAST:
                continue
            fire = Fire(_with_zone(wall - off_first, utc), wall, off_first, 0, name, version)
        else:  # inside a gap: fold=0 (old offset) lands after the transition, fold=1 before it
            if gap is DstGap.SKIP:
                continue
            instant = _gap_end(zone, _with_zone(wall - off_second, utc), _with_zone(wall - off_first, utc))
            fire = _describe(instant, zone)
        while pending and pending[0][0] < fire.fire_at:
            instant, pwall, poff = heapq.heappop(pending)
            if instant > lower and instant != last:
                if upper is not None and instant > upper:
                    return
                last = instant
                yield Fire(instant, pwall, poff, 1, name, version)
        if fire.fire_at <= lower or fire.fire_at == last:
            continue
        if upper is not None and fire.fire_at > upper:
            break
        last = fire.fire_at
        yield fire
    while pending:
        instant, pwall, poff = heapq.heappop(pending)
        if instant > lower and instant != last and (upper is None or instant <= upper):
            last = instant
            yield Fire(instant, pwall, poff, 1, name, version)


@lru_cache(maxsize=4096)
def _gap_end(zone: ZoneInfo, before: datetime, after: datetime) -> datetime:
    """The first instant after the gap that contains the instants (before, after]."""
    return _transition_in(zone, before, after)


def _describe(instant: datetime, zone: ZoneInfo) -> Fire:
    local = instant.astimezone(zone)
    offset = local.utcoffset()
    if offset is None:  # never for an aware datetime in a ZoneInfo
        raise RuntimeError(f"{zone.key} gave no UTC offset for {instant.isoformat()}")
    return Fire(
        instant.astimezone(UTC),
        datetime(local.year, local.month, local.day, local.hour, local.minute, local.second, local.microsecond),
        offset,
        local.fold,
        zone.key,
        TZDATA_VERSION,
    )


@lru_cache(maxsize=65536)
def _month_days(doms: frozenset[int], dows: frozenset[int], day_and: bool, year: int, month: int) -> tuple[int, ...]:
    """The days of one month that match the day fields (Vixie AND / OR), ascending; cached per month."""
    first_weekday, length = _gregorian.monthrange(year, month)  # Monday = 0
    if day_and:
        return tuple(d for d in range(1, length + 1) if d in doms and (first_weekday + d) % 7 in dows)
    return tuple(d for d in range(1, length + 1) if d in doms or (first_weekday + d) % 7 in dows)


def _field_walls(spec: _Cron, start: datetime) -> Iterator[datetime]:
    """Wall times the expression matches strictly after the naive ``start``, ascending, to year 9999.

    A walk over the compiled fields, month → day → hour → minute, in local wall time: each level
    starts at the start's own value (found by bisection) only while every level above is still on the
    start's, else at its first allowed value. No per-minute iteration and no date arithmetic beyond
    building each match; ``_croniter_walls`` is the oracle it is tested against.
    """
    try:
        first = datetime(start.year, start.month, start.day, start.hour, start.minute, tzinfo=start.tzinfo,
                         fold=start.fold) + _MINUTE
    except OverflowError:
        return
    year, month0, day0, hour0, minute0 = first.year, first.month, first.day, first.hour, first.minute
    months, hours, minutes = spec.month_list, spec.hours, spec.minutes
    doms, dows, day_and = spec.doms, spec.dows, spec.day_and
    on_start = True  # every level above the current one is still at the start's value
    while year <= 9999:
        for month in months[bisect_left(months, month0) if on_start else 0:]:
            if on_start and month != month0:
                on_start = False
            days = _month_days(doms, dows, day_and, year, month)
            for day in days[bisect_left(days, day0) if on_start else 0:]:
                if on_start and day != day0:
                    on_start = False
                for hour in hours[bisect_left(hours, hour0) if on_start else 0:]:
                    if on_start and hour != hour0:
                        on_start = False
                    for minute in minutes[bisect_left(minutes, minute0) if on_start else 0:]:
                        yield datetime(year, month, day, hour, minute)
                    on_start = False
                on_start = False
            on_start = False
        on_start = False
        year += 1


@lru_cache(maxsize=4096)
def _prototype(text: str, day_or: bool) -> croniter:
    """A parsed croniter per expression (the test oracle only; croniter is a dev dependency)."""
    from croniter import croniter

    return croniter(text, datetime(2000, 1, 1), ret_type=datetime, day_or=day_or)


def _croniter_walls(spec: _Cron, start: datetime) -> Iterator[datetime]:
    """The test oracle: wall times croniter matches strictly after the naive ``start``, ascending.

    Nothing in the layer calls it and the layer does not ship croniter (it is in the dev extra): the
    differential tests hold ``_field_walls`` and ``_walls_between`` to it.
    """
    it = copy.copy(_prototype(spec.text, spec.day_or))
    it.set_current(start, force=True)
    while True:
        try:
            yield it.get_next()
        except (OverflowError, ValueError):  # croniter's CroniterBadDateError is a ValueError
            return


def _walls_between(spec: _Cron, start: datetime, end: datetime) -> Iterator[datetime]:
    """Wall times in (start, end] from the expanded fields (used by ``min_spacing`` on short windows).

    The same match as croniter's, computed directly so that windows around every offset change stay
    cheap; a test holds the two together.
    """
    day = start.date()
    last = end.date()
    while day <= last:
        if spec.day_matches(day):
            low = start.hour if day == start.date() else 0
            high = end.hour if day == last else 23
            for hour in spec.hours:
                if not low <= hour <= high:
                    continue
                for minute in spec.minutes:
                    wall = datetime.combine(day, time(hour, minute))
                    if start < wall <= end:
                        yield wall
        day += _DAY


# --------------------------------------------------------------------------------------- public API


def _require_aware(value: datetime, field: str) -> None:
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise ValidationFailed([_naive(field)])


def _naive(field: str) -> FieldError:
    return FieldError(
        field,
        "timezone_aware",
        f"{field} must carry a UTC offset, e.g. '2026-03-08T07:00:00Z' or '2026-03-08T08:00:00+01:00'",
    )


def cron_problems(expression: object) -> list[FieldError]:
    """Every problem of a cron expression on its own (field ``cron``), whatever the rest of the rule."""
    if not expression or not isinstance(expression, str):
        return [FieldError("cron", "required", "kind 'cron' needs a cron expression, e.g. '0 7 * * 1-5'")]
    # ASCII only: str.split() and int() also read Unicode spaces (U+3000, U+00A0) and digits (fullwidth,
    # Arabic-Indic), so without this a rule could be stored that other cron readers see differently.
    if not expression.isascii():
        foreign = sorted({c for c in expression if not c.isascii()})
        shown = ", ".join(f"U+{ord(c):04X}" for c in foreign[:5])
        return [FieldError("cron", "cron_syntax", f"cron takes ASCII characters only (digits 0-9, letters, space, "
                                                  f"* , - /); found {shown}")]
    try:
        _compile(expression)
    except ValidationFailed as exc:
        return list(exc.fields)
    return []


def zone_problems(name: object) -> list[FieldError]:
    """The ``known_zone`` problem of a zone name, or nothing when the calendar knows it."""
    if isinstance(name, str) and name in _ZONE_NAMES:
        return []
    return [_unknown_zone(name)]


def check_rule(rule: Rule) -> None:
    """Raise ``ValidationFailed`` listing every problem of the rule (field + rule + a fix); else return.

    The problems every kind shares come first (zone, DST policies, window), then the kind's own, from
    its checker in ``_KIND_CHECKS``. ``kind = webhook`` is not a timed rule: ``ValueError`` (a
    programming error, not a user error), raised before anything else is looked at.
    """
    kind = parse(ScheduleKind, rule.kind)
    own = _KIND_CHECKS[kind](rule)
    errors = [*_shared_problems(rule), *own]
    if errors:
        raise ValidationFailed(errors)


def _shared_problems(rule: Rule) -> list[FieldError]:
    """The zone, the two DST policies and the ``starts_at`` / ``ends_at`` window, in that order."""
    if (rule.starts_at is None and rule.ends_at is None and type(rule.dst_gap) is DstGap
            and type(rule.dst_fold) is DstFold and type(rule.timezone) is str and rule.timezone in _ZONE_NAMES):
        return []  # the usual row (a known zone, parsed policies, no window): nothing below can object
    errors: list[FieldError] = zone_problems(rule.timezone)
    try:
        parse(DstGap, rule.dst_gap)
    except ValueError:
        errors.append(
            FieldError("dst_gap", ENUM, f"dst_gap must be one of {', '.join(DstGap)}; got {rule.dst_gap!r}")
        )
    try:
        parse(DstFold, rule.dst_fold)
    except ValueError:
        errors.append(
            FieldError("dst_fold", ENUM, f"dst_fold must be one of {', '.join(DstFold)}; got {rule.dst_fold!r}")
        )
    for field, value in (("starts_at", rule.starts_at), ("ends_at", rule.ends_at)):
        if value is not None and (not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None):
            errors.append(_naive(field))
        elif value is not None and (bound := out_of_range(value, field)) is not None:
            errors.append(bound)
    aware = not any(e.field in ("starts_at", "ends_at") for e in errors)
    # Compared as instants: Python compares two datetimes of one tzinfo by their wall times, so the two
    # passes through a repeated wall time (fold 0 and 1, an hour apart) would compare equal.
    if (aware and rule.starts_at is not None and rule.ends_at is not None
            and rule.ends_at.astimezone(UTC) <= rule.starts_at.astimezone(UTC)):
        errors.append(
            FieldError(
                "ends_at",
                "after_starts_at",
                f"ends_at ({rule.ends_at.isoformat()}) must be later than starts_at ({rule.starts_at.isoformat()})",
            )
        )
    return errors


def _check_cron(rule: Rule) -> list[FieldError]:
    return [*cron_problems(rule.cron), *_not_for_kind(rule, "interval_seconds", ScheduleKind.INTERVAL)]


def _check_interval(rule: Rule) -> list[FieldError]:
    return [
        *_not_for_kind(rule, "cron", ScheduleKind.CRON),
        *_interval_problems(rule.interval_seconds),
        *_needs_starts_at(rule, "the anchor the interval counts from"),
    ]


def _check_once(rule: Rule) -> list[FieldError]:
    return [
        *_not_for_kind(rule, "cron", ScheduleKind.CRON),
        *_not_for_kind(rule, "interval_seconds", ScheduleKind.INTERVAL),
        *_needs_starts_at(rule, "the instant to fire at"),
    ]


def _check_webhook(rule: Rule) -> list[FieldError]:
    raise ValueError("webhook schedules have no calendar")


# One checker per kind: the problems of the fields the kind needs or must not have, in field order
# (cron, interval_seconds, starts_at).
_KIND_CHECKS: dict[ScheduleKind, Callable[[Rule], list[FieldError]]] = {
    ScheduleKind.CRON: _check_cron,
    ScheduleKind.INTERVAL: _check_interval,
    ScheduleKind.ONCE: _check_once,
    ScheduleKind.WEBHOOK: _check_webhook,
}


def _not_for_kind(rule: Rule, field: str, owner: ScheduleKind) -> list[FieldError]:
    """``field`` (which only kind ``owner`` takes) set on a rule of another kind."""
    if getattr(rule, field) is None:
        return []
    kind = ScheduleKind(rule.kind)
    return [FieldError(field, "not_for_kind", f"{field} applies only to kind {owner.value!r}; "
                                              f"remove it for kind {kind.value!r}")]


def _interval_problems(seconds: object) -> list[FieldError]:
    if seconds is None:
        return [FieldError("interval_seconds", "required",
                           "kind 'interval' needs interval_seconds, e.g. 3600 for hourly")]
    if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds <= 0:
        # The words the API's request model uses for the same mistakes (kairos.errors).
        return [
            FieldError(
                "interval_seconds",
                MIN if isinstance(seconds, int) and not isinstance(seconds, bool) else TYPE,
                f"interval_seconds must be a whole number of seconds greater than 0, got {seconds!r}",
            )
        ]
    return []


def _needs_starts_at(rule: Rule, what: str) -> list[FieldError]:
    if rule.starts_at is not None:
        return []
    return [FieldError("starts_at", "required", f"kind {ScheduleKind(rule.kind).value!r} needs starts_at, {what}")]


def iter_fires(rule: Rule, after: datetime) -> Iterator[Fire]:
    """Fires strictly after ``after`` (aware), ascending, unique ``fire_at``; ends at ``ends_at``.

    Validates eagerly (raises before the first ``next``); a rule found valid once is not checked
    again (``_checked``: the tick asks for the next fire of the same rules every minute).
    """
    _checked(rule)
    _require_aware(after, "after")
    return _iter_checked(rule, after.astimezone(UTC))


def _checked(rule: Rule) -> None:
    """``check_rule``, remembered for valid rules (equal rules are equally valid: the checks compare
    instants, never their offsets); a rule that cannot be hashed is checked every time."""
    try:
        _check_valid(rule)
    except TypeError:
        check_rule(rule)


@lru_cache(maxsize=16384)
def _check_valid(rule: Rule) -> None:
    check_rule(rule)  # raises for an invalid rule: lru_cache keeps only returns


_T = TypeVar("_T")


def _field(value: _T | None, rule: Rule, name: str) -> _T:
    """A field ``check_rule`` requires for the rule's kind (the callers run on checked rules only)."""
    if value is None:
        raise RuntimeError(f"a {rule.kind} rule has no {name}")
    return value


def _iter_checked(rule: Rule, after: datetime) -> Iterator[Fire]:
    zone = _zone(rule.timezone)
    upper = rule.ends_at.astimezone(UTC) if rule.ends_at is not None else None
    kind = parse(ScheduleKind, rule.kind)
    if kind is ScheduleKind.ONCE:
        at = _field(rule.starts_at, rule, "starts_at").astimezone(UTC)
        return iter([_describe(at, zone)] if at > after and (upper is None or at <= upper) else [])
    if kind is ScheduleKind.INTERVAL:
        step = timedelta(seconds=_field(rule.interval_seconds, rule, "interval_seconds"))
        return _iter_interval(_field(rule.starts_at, rule, "starts_at").astimezone(UTC), step, after, upper, zone)
    spec = _compile(_field(rule.cron, rule, "cron"))
    gap, fold = _policies(spec, rule.dst_gap, rule.dst_fold)
    lower = after
    if rule.starts_at is not None and rule.starts_at - _MICRO > after:
        lower = rule.starts_at.astimezone(UTC) - _MICRO
    return _resolve(_field_walls(spec, _wall_start(zone, lower)), zone, gap, fold, lower, upper)


@lru_cache(maxsize=1024)
def _wall_start(zone: ZoneInfo, lower: datetime) -> datetime:
    """The naive wall time to start matching from so that no fire after ``lower`` is missed.

    Usually ``lower``'s own wall time; when a fold lies ahead, the second pass through it may fire
    later than ``lower`` at earlier wall times, so start from the smaller offset of the next 26 hours.
    Memoized per (zone, instant): a tick scans every rule of a zone from the same cursor. ``lower`` is
    always in UTC (no fold), so equal keys are the same instant.
    """
    offset = _offset_at(zone, lower)
    try:
        offset = min(offset, _offset_at(zone, lower + _MAX_SHIFT))
    except OverflowError:
        pass
    return _with_zone(lower + offset, None)


def _iter_interval(
    anchor: datetime, step: timedelta, after: datetime, upper: datetime | None, zone: ZoneInfo
) -> Iterator[Fire]:
    k = max(0, (after - anchor) // step + 1)
    while True:
        try:
            at = anchor + k * step
        except OverflowError:
            return
        if upper is not None and at > upper:
            return
        yield _describe(at, zone)
        k += 1


def next_fire(rule: Rule, after: datetime) -> Fire | None:
    """The first fire strictly after ``after``, or None when the rule has no more."""
    return next(iter_fires(rule, after), None)


def fires(rule: Rule, after: datetime, count: int) -> list[Fire]:
    """The next ``count`` fires strictly after ``after`` (fewer when the rule ends)."""
    return list(islice(iter_fires(rule, after), max(0, count)))


def fires_between(rule: Rule, after: datetime, until: datetime) -> Iterator[Fire]:
    """Fires with ``after < fire_at <= until``."""
    _require_aware(until, "until")
    stream = iter_fires(rule, after)
    limit = until.astimezone(UTC)

    def bounded() -> Iterator[Fire]:
        for fire in stream:
            if fire.fire_at > limit:
                return
            yield fire

    return bounded()


def describe(instant: datetime, timezone: str) -> Fire:
    """The wall time, offset and fold of any instant in a zone (webhook occurrences use this)."""
    _require_aware(instant, "instant")
    return _described(instant.astimezone(UTC), timezone)


@lru_cache(maxsize=1024)
def _described(instant: datetime, timezone: str) -> Fire:
    """``describe`` memoized per (UTC instant, zone): a tick describes one cursor for every rule of a
    zone. Keyed in UTC, which has no folds: two aware datetimes of one zone that differ only by fold
    compare and hash equal, two UTC ones never do unless they are the same instant."""
    return _describe(instant, _zone(timezone))


# ------------------------------------------------------------------------------------------ spacing

# Offset changes are examined this far ahead; the wall-clock structure covers the rest.
_SPACING_YEARS = 4
# Matching days are scanned this far ahead for the shortest day-to-day step (28 years is one full
# weekday/date cycle of the Gregorian calendar between 1901 and 2099).
_DAY_SCAN_YEARS = 28
_WINDOW_CAP = timedelta(days=8)
# A bounded rule (ends_at) with at most this many wall matches is measured exactly by listing them.
_ENUMERABLE = 5000


def min_spacing(rule: Rule, after: datetime) -> timedelta | None:
    """The smallest gap between consecutive real fires after ``after`` (None if it fires at most once).

    interval: the interval. once: None. cron with an ``ends_at`` close enough to list every match
    (at most 5,000): exactly the smallest real gap in the window. Otherwise the minimum of (a) the
    gap between the first two fires, (b) the wall-clock minimum from the cron structure (consecutive
    minutes, consecutive hours, and day to day over the matching days of the next 28 years), and
    (c) the exact real gaps of the fires around every UTC-offset change of the zone in the next four
    years, resolved exactly as ``iter_fires`` resolves them (so ``0,58 1,3 * * *`` in New York
    reports the 2 minutes between 01:58 EST and 03:00 EDT). It never reports more than a real gap in
    that horizon (what the frequency limit needs); a DST change can only shorten gaps that are
    already under eight days, which is as far as (c) looks.
    """
    first_two = fires(rule, after, 2)
    if len(first_two) < 2:
        return None
    best = first_two[1].fire_at - first_two[0].fire_at
    kind = ScheduleKind(rule.kind)
    if kind is ScheduleKind.INTERVAL:
        return timedelta(seconds=_field(rule.interval_seconds, rule, "interval_seconds"))
    spec = _compile(_field(rule.cron, rule, "cron"))
    zone = _zone(rule.timezone)
    upper = rule.ends_at.astimezone(UTC) if rule.ends_at is not None else None
    lower = first_two[0].fire_at - _MICRO  # the first fire is real; nothing fires between lower and it
    gap, fold = _policies(spec, rule.dst_gap, rule.dst_fold)
    if upper is not None:
        enumerable, exact = _enumerated_spacing(spec, zone, gap, fold, lower, upper)
        if enumerable:
            return exact
    wall = _wall_minimum(spec, (lower + _offset_at(zone, lower)).date(), upper, zone, best)
    best = min(best, wall)
    horizon = lower + timedelta(days=366 * _SPACING_YEARS)
    if upper is not None:
        horizon = min(horizon, upper)
    margin = min(wall, _WINDOW_CAP) + _MINUTE
    for instant, before, after_offset in _transitions(zone, lower, horizon + margin):
        shift = abs(after_offset - before)
        lo = max(lower, instant - shift - margin)
        hi = instant + shift + margin
        if upper is not None:
            hi = min(hi, upper)
        walls = _walls_between(
            spec,
            (lo + min(before, after_offset)).replace(tzinfo=None) - _MINUTE,
            (hi + max(before, after_offset)).replace(tzinfo=None),
        )
        window = [f.fire_at for f in _resolve(walls, zone, gap, fold, lo, hi)]
        for a, b in pairwise(window):
            best = min(best, b - a)
    return best


def _enumerated_spacing(
    spec: _Cron, zone: ZoneInfo, gap: DstGap, fold: DstFold, lower: datetime, upper: datetime
) -> tuple[bool, timedelta | None]:
    """(True, exact smallest gap) when (lower, upper] holds few enough matches to list; else (False, None)."""
    if upper - lower > timedelta(days=366 * _DAY_SCAN_YEARS):
        return False, None
    start = (lower + _offset_at(zone, lower)).replace(tzinfo=None) - _MAX_SHIFT
    end = (upper + _offset_at(zone, upper)).replace(tzinfo=None) + _MAX_SHIFT
    walls = list(islice(_walls_between(spec, start, end), _ENUMERABLE + 1))
    if len(walls) > _ENUMERABLE:
        return False, None
    instants = [f.fire_at for f in _resolve(walls, zone, gap, fold, lower, upper)]
    return True, min((b - a for a, b in pairwise(instants)), default=None)


def _wall_minimum(spec: _Cron, start: date, upper: datetime | None, zone: ZoneInfo, known: timedelta) -> timedelta:
    """The smallest wall-clock step between consecutive matches (no DST), given a known real gap."""
    best = known
    minutes, hours = spec.minutes, spec.hours
    if len(minutes) > 1:
        best = min(best, timedelta(minutes=min(b - a for a, b in pairwise(minutes))))
    if len(hours) > 1:
        step = min(b - a for a, b in pairwise(hours))
        best = min(best, timedelta(hours=step, minutes=minutes[0] - minutes[-1]))
    # Day to day: the last match of one matching day to the first of the next.
    span = timedelta(hours=hours[-1] - hours[0], minutes=minutes[-1] - minutes[0])
    if _DAY - span >= best:
        return best
    end = date(min(start.year + _DAY_SCAN_YEARS, 9999), 12, 31)
    if upper is not None:
        end = min(end, (upper + _offset_at(zone, upper)).date())
    day_step = _min_day_step(spec, start, end)
    if day_step is not None:
        best = min(best, day_step * _DAY - span)
    return best


def _min_day_step(spec: _Cron, start: date, end: date) -> int | None:
    """The fewest days between two consecutive matching days in [start, end], or None."""
    previous: int | None = None
    best: int | None = None
    first, last = start.toordinal(), end.toordinal()
    months = sorted(spec.months)
    for year in range(start.year, end.year + 1):
        for month in months:
            first_weekday, length = _gregorian.monthrange(year, month)  # Monday = 0
            base = date(year, month, 1).toordinal() - 1
            if base + length < first or base + 1 > last:
                continue
            for day in range(1, length + 1):
                dom_ok = day in spec.doms
                dow_ok = (first_weekday + day) % 7 in spec.dows  # cron: Sunday = 0
                if not ((dom_ok and dow_ok) if spec.day_and else (dom_ok or dow_ok)):
                    continue
                ordinal = base + day
                if not first <= ordinal <= last:
                    continue
                if previous is not None and (best is None or ordinal - previous < best):
                    best = ordinal - previous
                    if best == 1:
                        return 1
                previous = ordinal
    return best
