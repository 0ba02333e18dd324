"""The fire decision: what one due schedule turns into, as a pure function of its row and "now".

Role: given a schedule row locked by the fire step and the database's "now", say which occurrences
to record (each with its decision and the range it covers), whether a run is created (and behind
which run it waits), and where the cursor goes. Nothing here reads a clock or touches the database,
so the same inputs always give the same plan: two ticks that both see the row (one after the other,
under the row lock) reach the same deterministic occurrence and run ids.

Guarantees:
* The due instants are the cursor ``next_fire_at`` (itself a fire) and the rule's fires after it
  whose dispatch instant is at most now. A fire's dispatch instant is its nominal ``fire_at`` plus its
  jitter offset (``kairos.identity.dispatch_offset``: 0 without ``jitter_seconds``); since the jitter
  is at most half the rule's shortest period, dispatch instants keep the fires' order, and at most
  the latest nominally due fire can still wait for its dispatch instant (it then becomes the cursor).
  Lateness counts from the dispatch instant. They end in one run at most: the latest instant is dispatched when it is
  at most ``grace`` late, or whatever its lateness with ``catch_up`` (missed instants collapse into
  that one run, ``covers_*`` recording them). Without catch-up, earlier missed instants become one
  ``skipped_late`` occurrence at the last skipped instant; when even the latest is too late, one
  ``skipped_late`` occurrence (``expired`` for a ``once`` schedule) covers them all.
* Counting stops at ``COUNT_CAP`` instants (``covers_count`` is then a lower bound); the range
  ``covers_from`` .. ``covers_until`` is always exact.
* Overlap (``kairos.overlap``) applies only to an occurrence that would create a run: ``allow``
  dispatches, ``skip`` records ``skipped_overlap``, ``queue_one`` records ``queued_behind`` with a run
  blocked by the newest active run unless one is already waiting (then ``skipped_overlap``),
  ``cancel_replace`` dispatches a run that replaces the active one (the fire step applies it).
* The cursor moves to the first fire strictly after now; no next fire, ``max_occurrences`` runs
  created, or the one occurrence of a ``once`` schedule recorded (dispatched or expired) completes
  the schedule.

Must not: read the Lambda clock, EventBridge's time, or anything but its arguments.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any
from uuid import UUID

from kairos import calendar, identity, overlap
from kairos.states import Decision, Overlap, ScheduleKind, Source, parse

GRACE = timedelta(seconds=120)
COUNT_CAP = 10_000
# Windows tried, smallest first, to find the latest due instants once counting stopped at the cap:
# the first window holding two fires answers, so a dense rule never scans a long window.
_TAIL_WINDOWS = (
    timedelta(hours=1),
    timedelta(days=1),
    timedelta(days=32),
    timedelta(days=400),
    timedelta(days=3700),
)
RUN_DECISIONS = frozenset({Decision.DISPATCHED, Decision.QUEUED_BEHIND})


@dataclass(frozen=True, slots=True)
class Due:
    """A schedule as the decision sees it: its rule, cursor, policies and the runs it has going."""

    id: UUID
    kind: ScheduleKind
    rule: calendar.Rule
    next_fire_at: datetime
    revision: int
    catch_up: bool
    overlap: Overlap
    fire_count: int
    max_occurrences: int | None
    jitter_seconds: int = 0
    active_run_id: UUID | None = None  # newest run in queued/running/awaiting_approval (overlap only)
    waiting_run_id: UUID | None = None  # a queued run already blocked behind another (queue_one)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Due:
        rule = _rule_of(row["kind"], row["cron"], row["interval_seconds"], _utc(row["starts_at"]),
                        _utc(row["ends_at"]), row["timezone"], row["dst_gap"], row["dst_fold"])
        return cls(
            id=row["id"],
            kind=rule.kind,
            rule=rule,
            next_fire_at=row["next_fire_at"],
            revision=int(row["revision"]),
            catch_up=bool(row["catch_up"]),
            overlap=parse(Overlap, row["overlap"]),
            fire_count=int(row["fire_count"]),
            max_occurrences=row["max_occurrences"],
            jitter_seconds=int(row.get("jitter_seconds") or 0),
            active_run_id=row.get("active_run_id"),
            waiting_run_id=row.get("waiting_run_id"),
        )


def _utc(instant: datetime | None) -> datetime | None:
    """An aware instant in UTC; anything else as it is (the calendar's check refuses a naive one)."""
    if instant is None or instant.tzinfo is None:
        return instant
    return instant.astimezone(UTC)


@lru_cache(maxsize=16384)
def _rule_of(kind: str, cron: str | None, interval_seconds: int | None, starts_at: datetime | None,
             ends_at: datetime | None, timezone: str, dst_gap: str, dst_fold: str) -> calendar.Rule:
    """``calendar.Rule.of`` a row's rule columns, remembered: the schedules of one rule share one ``Rule``
    (built once, its enums parsed once; ``_scan``'s cache then compares it with itself). Keyed with the
    instants in UTC: two aware datetimes of one zone that differ only by ``fold`` compare and hash equal,
    two UTC ones only when they are the same instant (the calendar reads rules' instants as instants)."""
    return calendar.Rule.of({"kind": kind, "cron": cron, "interval_seconds": interval_seconds,
                             "starts_at": starts_at, "ends_at": ends_at, "timezone": timezone,
                             "dst_gap": dst_gap, "dst_fold": dst_fold})


@dataclass(frozen=True, slots=True)
class PlannedOccurrence:
    id: UUID
    fire: calendar.Fire
    decision: Decision
    dispatch_at: datetime  # fire_at plus the fire's jitter offset: lateness and expiry count from it
    covers_from: datetime | None = None
    covers_until: datetime | None = None
    covers_count: int = 1
    run_id: UUID | None = None  # set exactly when the decision creates a run
    blocked_by_run_id: UUID | None = None  # queue_one: the run it waits for
    replaces_run_id: UUID | None = None  # cancel_replace: the active run it replaces if replace-safe

    @property
    def fire_at(self) -> datetime:
        return self.fire.fire_at


@dataclass(frozen=True, slots=True)
class Plan:
    schedule_id: UUID
    revision: int  # recorded on each occurrence
    read_next_fire_at: datetime  # the cursor value read: the guard of the cursor update
    occurrences: tuple[PlannedOccurrence, ...]
    next_fire_at: datetime | None  # None exactly when completed
    last_fire_at: datetime | None
    runs_created: int
    completed: bool


@dataclass(frozen=True, slots=True)
class _Window:
    first: calendar.Fire
    previous: calendar.Fire | None  # the instant before the latest, when more than one is due
    latest: calendar.Fire
    count: int  # capped at COUNT_CAP


@lru_cache(maxsize=4096)
def _scan(rule: calendar.Rule, cursor: datetime, now: datetime) -> tuple[_Window | None, calendar.Fire | None]:
    """The due instants (the cursor itself, then the rule's fires in (cursor, now]) and the next fire.

    One pass of the rule's iterator gives both: the first fire after ``now`` is the new cursor. Pure,
    so it is memoized: schedules that share a rule and a cursor (every "0 7 * * 1-5" in one zone at
    07:00) cost one evaluation per tick instead of one each.
    """
    if rule.ends_at is not None and cursor > rule.ends_at:
        return None, None
    first = calendar.describe(cursor, rule.timezone)
    previous: calendar.Fire | None = None
    latest = first
    count = 1
    for fire in calendar.iter_fires(rule, cursor):
        if fire.fire_at > now:
            return _Window(first, previous, latest, count), fire
        previous, latest = latest, fire
        count += 1
        if count >= COUNT_CAP:
            break
    else:
        return _Window(first, previous, latest, count), None  # the rule has no more fires
    # Counting stopped: the latest two instants are found searching back from now.
    following = calendar.next_fire(rule, now)
    tail = _last_two(rule, latest.fire_at, now)
    if not tail:
        return _Window(first, previous, latest, count), following
    if len(tail) == 1:
        return _Window(first, latest, tail[0], count), following
    return _Window(first, tail[0], tail[1], count), following


def _last_two(rule: calendar.Rule, after: datetime, now: datetime) -> list[calendar.Fire]:
    """The last (up to) two fires in (after, now], looking at short windows before long ones."""

    def scan(start: datetime) -> list[calendar.Fire]:
        tail: list[calendar.Fire] = []
        for fire in calendar.fires_between(rule, start, now):
            tail = [*tail[-1:], fire]
        return tail

    for window in _TAIL_WINDOWS:
        start = max(after, now - window)
        tail = scan(start)
        if len(tail) == 2 or start == after:
            return tail
    return scan(after)


def _occurrence(due: Due, fire: calendar.Fire, decision: Decision, *, covers: tuple[datetime, datetime, int] | None,
                blocked_by: UUID | None = None, replaces: UUID | None = None) -> PlannedOccurrence:
    occurrence_id = identity.occurrence_id(due.id, Source.SCHEDULED, fire_at=fire.fire_at)
    run_id = identity.run_id(occurrence_id) if decision in RUN_DECISIONS else None
    covers_from, covers_until, covers_count = covers if covers is not None else (None, None, 1)
    return PlannedOccurrence(
        id=occurrence_id,
        fire=fire,
        decision=decision,
        dispatch_at=identity.dispatch_at(due.id, fire.fire_at, due.jitter_seconds),
        covers_from=covers_from,
        covers_until=covers_until,
        covers_count=covers_count,
        run_id=run_id,
        blocked_by_run_id=blocked_by if decision is Decision.QUEUED_BEHIND else None,
        replaces_run_id=replaces if run_id is not None else None,
    )




def _due_scan(due: Due, now: datetime) -> tuple[_Window | None, calendar.Fire | None]:
    """``_scan`` with the jitter applied: fires whose dispatch instant is after ``now`` are not due yet.

    Dispatch instants keep the fires' order, so only the latest nominally due fire can be waiting; it
    is cut off by scanning again up to just before it (a loop, so a rule whose gaps fell under twice
    the jitter after it was checked still ends right). The cursor itself waiting means nothing is due.

    ``_scan`` is memoized, so it is asked in UTC: the row's instants come in the session's zone, where
    the two passes through a repeated wall time compare and hash equal (they differ only by ``fold``).
    """
    cursor, now = due.next_fire_at.astimezone(UTC), now.astimezone(UTC)
    window, following = _scan(due.rule, cursor, now)
    if due.jitter_seconds <= 0:
        return window, following
    while window is not None and identity.dispatch_at(due.id, window.latest.fire_at, due.jitter_seconds) > now:
        following = window.latest
        if following.fire_at <= cursor:
            return None, following
        window, _ = _scan(due.rule, cursor, following.fire_at - _MICROSECOND)
    return window, following


_MICROSECOND = timedelta(microseconds=1)


def decide(due: Due, now: datetime, *, grace: timedelta = GRACE) -> Plan:
    """The plan for one due schedule at database time ``now`` (see the module docstring)."""
    window, following = _due_scan(due, now)
    occurrences: list[PlannedOccurrence] = []
    if window is not None:
        dispatch_at = identity.dispatch_at(due.id, window.latest.fire_at, due.jitter_seconds)
        in_time = now - dispatch_at <= grace
        if due.catch_up or in_time:
            if not due.catch_up and window.previous is not None:
                occurrences.append(
                    _occurrence(due, window.previous, Decision.SKIPPED_LATE,
                                covers=(window.first.fire_at, window.previous.fire_at, window.count - 1))
                )
            verdict = overlap.decide(due.overlap, due.active_run_id, due.waiting_run_id)
            collapsed = due.catch_up and window.count > 1
            occurrences.append(
                _occurrence(due, window.latest, verdict.decision, blocked_by=verdict.blocked_by,
                            replaces=verdict.replaces,
                            covers=(window.first.fire_at, window.latest.fire_at, window.count) if collapsed else None)
            )
        else:
            late = Decision.EXPIRED if due.kind is ScheduleKind.ONCE else Decision.SKIPPED_LATE
            occurrences.append(
                _occurrence(due, window.latest, late,
                            covers=(window.first.fire_at, window.latest.fire_at, window.count))
            )
    runs_created = sum(1 for o in occurrences if o.run_id is not None)
    next_fire_at = None if following is None else following.fire_at
    completed = (
        next_fire_at is None
        # A once schedule has one occurrence: recorded, whatever its decision, the schedule is done,
        # even when its cursor was moved before starts_at (the rule would still offer starts_at).
        or (due.kind is ScheduleKind.ONCE and bool(occurrences))
        or (due.max_occurrences is not None and due.fire_count + runs_created >= due.max_occurrences)
    )
    return Plan(
        schedule_id=due.id,
        revision=due.revision,
        read_next_fire_at=due.next_fire_at,
        occurrences=tuple(occurrences),
        next_fire_at=None if completed else next_fire_at,
        last_fire_at=window.latest.fire_at if window is not None else None,
        runs_created=runs_created,
        completed=completed,
    )
