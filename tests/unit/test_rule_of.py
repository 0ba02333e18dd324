"""``calendar.Rule.of`` is the one way to build a schedule's rule from its data: a schedule row (the
tick's due rows) and a request or stored ``Schedule`` (``schedules.request.rule_of``) give the same rule,
and no other module calls the ``Rule`` constructor."""

from __future__ import annotations

import ast
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from kairos import calendar
from kairos.schedules.request import rule_of
from kairos.states import DstFold, DstGap, ScheduleKind
from kairos.tick.decision import Due

ROW = {"kind": "cron", "cron": "0 9 * * 1-5", "interval_seconds": None,
       "starts_at": datetime(2026, 1, 1, tzinfo=UTC), "ends_at": None, "timezone": "Europe/Berlin",
       "dst_gap": "skip", "dst_fold": "first"}


def test_a_row_and_an_object_with_the_same_fields_give_the_same_rule() -> None:
    expected = calendar.Rule(kind=ScheduleKind.CRON, cron="0 9 * * 1-5", starts_at=ROW["starts_at"],
                             timezone="Europe/Berlin", dst_gap=DstGap("skip"), dst_fold=DstFold("first"))
    assert calendar.Rule.of(ROW) == expected
    assert calendar.Rule.of(SimpleNamespace(**ROW)) == expected
    assert rule_of(SimpleNamespace(**ROW)) == expected
    due = Due.from_row({**ROW, "id": None, "next_fire_at": ROW["starts_at"], "revision": 1, "catch_up": False,
                        "overlap": "allow", "fire_count": 0, "max_occurrences": None})
    assert (due.rule, due.kind) == (expected, ScheduleKind.CRON)


def test_an_unknown_value_is_the_enum_s_value_error_and_a_webhook_has_no_rule() -> None:
    with pytest.raises(ValueError):
        calendar.Rule.of({**ROW, "dst_gap": "never"})
    with pytest.raises(ValueError):
        rule_of(SimpleNamespace(**{**ROW, "kind": "webhook"}))


def test_no_module_but_the_calendar_calls_the_rule_constructor() -> None:
    package = Path(calendar.__file__).resolve().parent
    found = [
        f"{path.relative_to(package)}:{node.lineno}"
        for path in sorted(package.rglob("*.py")) if path != Path(calendar.__file__).resolve()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call) and (
            (isinstance(node.func, ast.Attribute) and node.func.attr == "Rule")
            or (isinstance(node.func, ast.Name) and node.func.id == "Rule"))
    ]
    assert found == [], f"build a calendar.Rule with calendar.Rule.of: {found}"
