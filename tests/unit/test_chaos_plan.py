"""`kairos chaos` replays: the same seed gives the same workload and the same faults at the same points.

Given a seed and a length, when the plan is drawn twice, then both are equal (digest and content); a
different seed gives another plan; narrowing to a subset of fault kinds keeps exactly those faults at
the same steps and points, with the same workload; a shorter rehearsal is the first steps of a longer
one; an unknown kind is refused naming it.
"""

from __future__ import annotations

import pytest

from kairos.chaos.plan import FAULT_KINDS, make_plan, parse_kinds


def test_the_same_seed_yields_the_same_plan() -> None:
    first, again = make_plan(42, 30), make_plan(42, 30)
    assert first == again and first.digest() == again.digest()
    assert {f.kind for f in first.faults} == set(FAULT_KINDS), "30 minutes draw every kind"
    assert make_plan(43, 30).digest() != first.digest()


def test_a_subset_of_kinds_keeps_those_faults_and_the_workload() -> None:
    whole = make_plan(7, 20)
    narrowed = make_plan(7, 20, ("kill", "sqs_drop"))
    assert narrowed.actions == whole.actions
    assert narrowed.faults == tuple(f for f in whole.faults if f.kind in ("kill", "sqs_drop"))
    assert narrowed.faults and make_plan(7, 20, ()).faults == ()


def test_fault_kinds_are_parsed_and_unknown_ones_named() -> None:
    assert parse_kinds(None) == FAULT_KINDS and parse_kinds("none") == ()
    assert parse_kinds("kill, sqs_drop,kill") == ("kill", "sqs_drop")
    with pytest.raises(ValueError, match="'reboot'"):
        parse_kinds("kill,reboot")


def test_a_shorter_rehearsal_is_the_first_steps_of_a_longer_one() -> None:
    short, long = make_plan(7, 10), make_plan(7, 20)
    assert short.faults == tuple(f for f in long.faults if f.step < short.steps)
    assert [a for a in short.actions if a.kind != "corpus"] == [
        a for a in long.actions if a.step < short.steps and a.kind != "corpus"]
