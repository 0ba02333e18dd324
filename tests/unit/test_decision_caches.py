"""The fire decision's memos (``kairos.tick.decision``): rows read in a zone with daylight saving.

A schedule row's instants come back in the database session's zone. In a zone, the two passes through
a repeated wall time (01:30 EDT and 01:30 EST on 2026-11-01 in New York) compare and hash equal: they
differ only by ``fold``. The decision's memos (the rule built from the row's columns, the scan of a
rule from a cursor) must still tell them apart, and tell different rules apart.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from kairos.states import Decision
from kairos.tick.decision import Due, decide

NEW_YORK = ZoneInfo("America/New_York")
FIRST_PASS = datetime(2026, 11, 1, 5, 30, tzinfo=UTC)  # 01:30 EDT (fold 0)
SECOND_PASS = datetime(2026, 11, 1, 6, 30, tzinfo=UTC)  # 01:30 EST (fold 1), an hour later


def _row(schedule: int, cursor: datetime, **rule: Any) -> dict[str, Any]:
    return {"id": uuid.UUID(int=schedule), "kind": "cron", "cron": "30 * * * *", "interval_seconds": None,
            "starts_at": None, "ends_at": None, "timezone": "UTC", "dst_gap": "auto", "dst_fold": "auto",
            "next_fire_at": cursor, "revision": 1, "catch_up": False, "overlap": "allow", "fire_count": 0,
            "max_occurrences": None, "jitter_seconds": 0, **rule}


def test_the_instants_used_are_the_ones_the_test_means() -> None:
    first, second = FIRST_PASS.astimezone(NEW_YORK), SECOND_PASS.astimezone(NEW_YORK)
    assert first == second and hash(first) == hash(second)  # what the memos must not be fooled by
    assert first.astimezone(UTC) != second.astimezone(UTC)


def test_cursors_on_the_two_passes_of_a_repeated_wall_time_are_scanned_apart() -> None:
    # Two schedules of one rule, their cursors read in New York time: 01:30 EDT and 01:30 EST. At 06:31Z
    # the first has two fires due (05:30Z, then 06:30Z: one skipped late, one dispatched), the second one.
    now = (SECOND_PASS + timedelta(minutes=1)).astimezone(NEW_YORK)
    early = decide(Due.from_row(_row(1, FIRST_PASS.astimezone(NEW_YORK))), now)
    late = decide(Due.from_row(_row(2, SECOND_PASS.astimezone(NEW_YORK))), now)
    assert [(o.fire_at, o.decision) for o in early.occurrences] == [
        (FIRST_PASS, Decision.SKIPPED_LATE), (SECOND_PASS, Decision.DISPATCHED)]
    assert [(o.fire_at, o.decision, o.covers_count) for o in late.occurrences] == [
        (SECOND_PASS, Decision.DISPATCHED, 1)]
    assert early.next_fire_at == late.next_fire_at == SECOND_PASS + timedelta(hours=1)


def test_rules_whose_window_differs_only_by_fold_are_different_rules() -> None:
    # ends_at on the first pass (01:30 EDT) and on the second (01:30 EST): read in New York time they
    # compare equal, but the first rule ends before 06:30Z and the second fires then (its last fire).
    cursor = FIRST_PASS
    now = SECOND_PASS + timedelta(minutes=1)
    ends_first = decide(Due.from_row(_row(3, cursor, ends_at=FIRST_PASS.astimezone(NEW_YORK))), now)
    ends_second = decide(Due.from_row(_row(4, cursor, ends_at=SECOND_PASS.astimezone(NEW_YORK))), now)
    assert [(o.fire_at, o.decision) for o in ends_first.occurrences] == [(FIRST_PASS, Decision.SKIPPED_LATE)]
    assert ends_first.completed and ends_first.next_fire_at is None
    assert [o.fire_at for o in ends_second.occurrences] == [FIRST_PASS, SECOND_PASS]
    assert ends_second.occurrences[-1].decision is Decision.DISPATCHED and ends_second.completed


def test_schedules_of_one_rule_share_its_rule_and_other_rules_do_not() -> None:
    a = Due.from_row(_row(5, FIRST_PASS))
    b = Due.from_row(_row(6, SECOND_PASS))
    c = Due.from_row(_row(7, FIRST_PASS, timezone="Europe/Berlin"))
    d = Due.from_row(_row(8, FIRST_PASS, dst_fold="both"))
    assert a.rule is b.rule
    assert c.rule.timezone == "Europe/Berlin" and c.rule is not a.rule
    assert d.rule.dst_fold == "both" and d.rule is not a.rule


def test_a_rule_with_an_unknown_policy_is_refused_every_time() -> None:
    # The enum's ValueError (the fire step pauses such a schedule); nothing is remembered for it.
    for _ in range(2):
        try:
            Due.from_row(_row(9, FIRST_PASS, dst_gap="sideways"))
        except ValueError:
            continue
        raise AssertionError("an unknown dst_gap was accepted")



def test_a_naive_window_is_kept_as_it_is() -> None:
    # Only aware instants are put in UTC for the key: a naive one (never from a timestamptz column) is
    # not read as the host's local time, it stays naive for the calendar's check to refuse.
    naive = datetime(2026, 11, 1, 5, 30)
    rule = Due.from_row(_row(10, FIRST_PASS, ends_at=naive)).rule
    assert rule.ends_at == naive and rule.ends_at is not None and rule.ends_at.tzinfo is None
