"""``kairos.states.parse``: the remembered ``kind(value)`` the tick reads its rows' enums with."""

from __future__ import annotations

import pytest

from kairos.states import Decision, DstGap, Overlap, ScheduleKind, parse


@pytest.mark.parametrize("kind", [ScheduleKind, DstGap, Overlap, Decision])
def test_every_value_and_member_parses_to_its_member(kind: type) -> None:
    for member in kind:
        assert parse(kind, member.value) is member
        assert parse(kind, member) is member
        assert parse(kind, member.value) is kind(member.value)


def test_same_value_in_two_kinds_gives_each_its_own_member() -> None:
    assert parse(DstGap, "skip") is DstGap.SKIP
    assert parse(Overlap, "skip") is Overlap.SKIP
    assert parse(DstGap, "auto") is not parse(Overlap, "allow")


@pytest.mark.parametrize("value", ["nope", "", None, 3, ["skip"], {"skip": 1}])
def test_anything_else_raises_what_the_enum_raises(value: object) -> None:
    with pytest.raises(ValueError) as expected:
        DstGap(value)  # type: ignore[arg-type]
    for _ in range(2):  # a refusal is never remembered as an answer
        with pytest.raises(ValueError) as raised:
            parse(DstGap, value)  # type: ignore[arg-type]
        assert str(raised.value) == str(expected.value)
