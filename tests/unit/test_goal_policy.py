"""The loop body's pure checks (``kairos.schedules.loop_policy``) and the goal_report arguments
(``kairos.execution.goal_report.check``): fixed policies, caps, the goal envelope and its safe projection."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kairos.errors import ValidationFailed
from kairos.execution import goal_report
from kairos.schedules import loop_policy

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def body(**fields: Any) -> dict[str, Any]:
    return {"conversation_id": str(uuid.uuid4()), "goal": {"outcome": "o"}, "cron": "0 9 * * *",
            "ends_at": (NOW + timedelta(days=10)).isoformat(), "max_occurrences": 5, **fields}


def rules(raw: Any, **kw: Any) -> list[tuple[str, str]]:
    with pytest.raises(ValidationFailed) as refused:
        loop_policy.parse_loop(raw, now=NOW, **kw)
    return [(f.field, f.rule) for f in refused.value.fields]


def test_a_loop_body_gets_the_fixed_policies() -> None:
    checked = loop_policy.parse_loop(body(), now=NOW)
    assert checked.goal is not None and checked.goal.outcome == "o"
    assert {k: checked.schedule_body[k] for k in ("catch_up", "overlap", "mode", "kind")} == {
        "catch_up": False, "overlap": "skip", "mode": "append", "kind": "cron"}
    assert checked.schedule_body["prompt"] == loop_policy.DEFAULT_PROMPT
    assert "goal" not in checked.schedule_body
    assert loop_policy.parse_loop(body(cron=None, interval_seconds=600), now=NOW).schedule_body["kind"] == "interval"


def test_every_problem_is_reported_at_once() -> None:
    found = rules(body(catch_up=True, overlap="allow", backfill={}, max_occurrences=501,
                       ends_at=(NOW + timedelta(days=90, seconds=1)).isoformat(), goal={"outcome": ""}, extra=1))
    assert set(found) >= {("catch_up", "loop_policy"), ("overlap", "loop_policy"), ("backfill", "loop_policy"),
                          ("max_occurrences", "max"), ("ends_at", "max_horizon"), ("extra", "unknown_field")}
    assert any(f == "goal.outcome" for f, _ in found)


def test_the_caps_are_inclusive() -> None:
    assert loop_policy.parse_loop(body(ends_at=(NOW + timedelta(days=90)).isoformat(), max_occurrences=500), now=NOW)


def test_required_fields() -> None:
    raw = body()
    for name in ("goal", "ends_at", "max_occurrences", "conversation_id"):
        raw.pop(name)
    assert set(rules(raw)) == {("goal", "required"), ("ends_at", "required"), ("max_occurrences", "required"),
                               ("conversation_id", "required")}
    assert rules([1, 2]) == [("body", "type")]


def test_an_edit_may_leave_the_goal_but_not_the_conversation() -> None:
    raw = body()
    raw.pop("goal")
    assert rules(raw, creating=False) == [("conversation_id", "unknown_field")]
    raw.pop("conversation_id")
    assert loop_policy.parse_loop(raw, now=NOW, creating=False).goal is None


def test_the_envelope_binds_and_the_projection_hides_the_verification() -> None:
    goal = loop_policy.Goal(outcome="  ship   it ", constraints=["no  force push", " "], verification="ci green")
    loop = uuid.uuid4()
    one = loop_policy.envelope(goal, schedule_id=loop, revision=1, agent={"model": "m"})
    assert (one["outcome"], one["constraints"], one["verification"]) == ("ship it", ["no force push"], "ci green")
    assert one["digest"] != loop_policy.envelope(goal, schedule_id=loop, revision=2, agent={"model": "m"})["digest"]
    assert one["digest"] != loop_policy.envelope(goal, schedule_id=loop, revision=1, agent={"model": "n"})["digest"]
    shown = loop_policy.safe(one)
    assert shown is not None and "verification" not in shown
    assert shown["verification_digest"] == loop_policy.digest("ci green")
    same = loop_policy.Goal(outcome="ship it", constraints=["no force push"], verification="ci green")
    assert loop_policy.same_goal(one, same)
    assert not loop_policy.same_goal(one, loop_policy.Goal(outcome="ship it"))
    assert "ci green" in goal_report.instructions(one) and "goal_report" in goal_report.instructions(one)


@pytest.mark.parametrize(("arguments", "fields"), [
    ({"disposition": "continue", "summary": "s"}, []),
    ({"disposition": "needs_input", "summary": "s", "question": "q?"}, []),
    ({"disposition": "needs_input", "summary": "s"}, ["question"]),
    ({"disposition": "done", "summary": "s"}, ["disposition"]),
    ({"disposition": "complete"}, ["summary"]),
    ({"disposition": "blocked", "summary": "s", "why": "x"}, ["why"]),
    ({"disposition": "continue", "summary": "s", "question": 3}, ["question"]),
])
def test_goal_report_arguments(arguments: dict[str, Any], fields: list[str]) -> None:
    checked = goal_report.check(arguments)
    if not fields:
        assert isinstance(checked, goal_report.Report) and checked.disposition == arguments["disposition"]
    else:
        assert isinstance(checked, list) and [p["field"] for p in checked] == fields
