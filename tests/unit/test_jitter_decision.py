"""The fire decision with jitter (``kairos.tick.decision``): due means the dispatch instant has come.

Pure: a schedule every 600 s with 300 s of jitter, its id chosen so that its offsets are the ones a
case needs (``identity.dispatch_offset`` is deterministic), decided at instants around them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from kairos import calendar, identity
from kairos.states import Decision, Overlap, ScheduleKind
from kairos.tick.decision import Due, decide

T = datetime(2030, 1, 7, 7, 0, tzinfo=UTC)
STEP = timedelta(seconds=600)
JITTER = 300


def _due(schedule_id: uuid.UUID, *, catch_up: bool = False) -> Due:
    rule = calendar.Rule(kind=ScheduleKind.INTERVAL, interval_seconds=600, starts_at=T)
    return Due(id=schedule_id, kind=ScheduleKind.INTERVAL, rule=rule, next_fire_at=T, revision=1,
               catch_up=catch_up, overlap=Overlap.ALLOW, fire_count=0, max_occurrences=None, jitter_seconds=JITTER)


def _id_where(ok: Callable[[int, int], bool]) -> uuid.UUID:
    """A schedule id whose offsets at T and T + 600 s satisfy ``ok``."""
    for n in range(1, 100_000):
        candidate = uuid.UUID(int=n)
        if ok(identity.dispatch_offset(candidate, T, JITTER), identity.dispatch_offset(candidate, T + STEP, JITTER)):
            return candidate
    raise AssertionError("no such id")


def test_a_fire_nominally_due_but_before_its_dispatch_instant_is_the_next_cursor() -> None:
    # After a missed tick, at T + 610 s: T is long past its dispatch instant, T + 600 s is nominally due
    # but waits for its offset (more than 10 s). It is not dispatched early; it becomes the cursor.
    sid = _id_where(lambda first, second: second > 10)
    plan = decide(_due(sid), T + timedelta(seconds=610))
    [occurrence] = plan.occurrences
    assert occurrence.fire_at == T and occurrence.decision is Decision.SKIPPED_LATE  # > 120 s after dispatch
    assert occurrence.dispatch_at == T + timedelta(seconds=identity.dispatch_offset(sid, T, JITTER))
    assert plan.next_fire_at == T + STEP and not plan.completed and plan.runs_created == 0


def test_lateness_counts_from_the_dispatch_instant() -> None:
    sid = _id_where(lambda first, second: first >= 200 and second > 130)
    dispatch = identity.dispatch_at(sid, T, JITTER)
    in_time = decide(_due(sid), dispatch + timedelta(seconds=120))
    late = decide(_due(sid), dispatch + timedelta(seconds=121))
    assert [o.decision for o in in_time.occurrences] == [Decision.DISPATCHED]  # 320 s after T, yet in time
    assert [o.decision for o in late.occurrences] == [Decision.SKIPPED_LATE]


def test_a_cursor_before_its_dispatch_instant_records_nothing() -> None:
    sid = _id_where(lambda first, second: first >= 10)
    plan = decide(_due(sid), T + timedelta(seconds=5))
    assert plan.occurrences == () and plan.next_fire_at == T and plan.runs_created == 0


def test_missed_fires_collapse_up_to_the_last_dispatched_one_with_catch_up() -> None:
    sid = _id_where(lambda first, second: True)
    # Down for an hour: fires T .. T + 3600 s are nominally due at T + 3600 s + 1 s; the last of them
    # waits for its offset unless that is 0.
    now = T + timedelta(seconds=3601)
    last = T + 6 * STEP
    plan = decide(_due(sid, catch_up=True), now)
    [occurrence] = plan.occurrences
    expected_latest = last if identity.dispatch_at(sid, last, JITTER) <= now else last - STEP
    assert occurrence.fire_at == expected_latest and occurrence.decision is Decision.DISPATCHED
    assert occurrence.covers_from == T and occurrence.covers_until == expected_latest
    assert plan.next_fire_at == expected_latest + STEP
