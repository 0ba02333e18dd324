"""Fires that fell while a schedule was paused: recorded at its resume, so a pause leaves no silent hole.

Role: ``record_at_resume`` runs in the transaction that resumes a timed schedule. It evaluates the
rule (``kairos.calendar``, the one evaluator) over the pause — fires with ``paused_at < fire_at <= now``
— and records them as one ``skipped_paused`` occurrence (source ``scheduled``, no run) whose
``covers_from`` / ``covers_until`` are the first and last of them and ``covers_count`` how many; none
when no fire fell in the pause. ``reason_problems`` bounds the free-text reason a pause may carry.

Guarantees: one occurrence per pause — its id is derived from the schedule and the instant the pause
began, so a repeated resume records nothing twice. Counting stops at ``COUNT_CAP`` fires
(``covers_count`` is then a lower bound); the covered range is always exact.

Must not: dispatch anything (the fires are gone, not owed), or log the reason (it is the owner's text).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import psycopg

from kairos import calendar, db, identity, occurrences
from kairos.errors import FieldError
from kairos.instants import rfc3339
from kairos.schedules.request import PAUSE_REASON_MAX
from kairos.states import Decision, Source

COUNT_CAP = 10_000
_TAIL_WINDOWS = (timedelta(hours=1), timedelta(days=1), timedelta(days=32), timedelta(days=400))


def reason_problems(reason: object) -> list[FieldError]:
    if reason is None:
        return []
    if not isinstance(reason, str):
        return [FieldError("reason", "type", "give the reason as a string")]
    if len(reason) > PAUSE_REASON_MAX:
        return [FieldError("reason", "max_length", f"at most {PAUSE_REASON_MAX} characters")]
    return []


def record_at_resume(conn: psycopg.Connection[db.Row], schedule_id: uuid.UUID, *, revision: int,
                     paused_at: datetime | None, rule: calendar.Rule, now: datetime) -> int:
    """Records the ``skipped_paused`` occurrence of the pause that began at ``paused_at`` (under the
    schedule's ``revision``); the number of fires it covers (0: none, nothing recorded)."""
    if paused_at is None:
        return 0
    covered = _covered(rule, paused_at, now)
    if covered is None:
        return 0
    first, last, count = covered
    occurrence_id = identity.occurrence_id(schedule_id, Source.SCHEDULED, key=f"paused:{rfc3339(paused_at)}")
    occurrences.record(conn, [occurrences.planned(
        occurrence_id=occurrence_id, schedule_id=schedule_id, source=Source.SCHEDULED, fire=first,
        revision=revision, decision=Decision.SKIPPED_PAUSED, run_id=None, covers_from=first.fire_at,
        covers_until=last.fire_at, covers_count=count)], now=now)
    return count


def _covered(rule: calendar.Rule, after: datetime, until: datetime,
             ) -> tuple[calendar.Fire, calendar.Fire, int] | None:
    """The first and last fire in ``(after, until]`` and how many (capped), or None when there are none."""
    first: calendar.Fire | None = None
    last: calendar.Fire | None = None
    count = 0
    for fire in calendar.fires_between(rule, after, until):
        first = first or fire
        last = fire
        count += 1
        if count >= COUNT_CAP:
            break
    if first is None or last is None:
        return None
    if count < COUNT_CAP:
        return first, last, count
    # Counting stopped: the last fire is found searching back from `until`, short windows first.
    for window in _TAIL_WINDOWS:
        start = max(last.fire_at, until - window)
        tail = None
        for fire in calendar.fires_between(rule, start, until):
            tail = fire
        if tail is not None:
            return first, tail, count
        if start == last.fire_at:
            return first, last, count
    for fire in calendar.fires_between(rule, last.fire_at, until):
        last = fire
    return first, last, count
