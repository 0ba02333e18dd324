"""Every recovery action a diagnosis may offer is executable: it names a route of the API's route table
and, when it is a change, a field the route's body takes (``PATCH /v1/schedules/{id}``: the fields of
``ScheduleRequest``, ``agent.*`` those of ``AgentConfig``, ``limits.*`` those of ``ScheduleLimits``).
The walk covers the whole closed list, and every action any diagnosis offers."""

from __future__ import annotations

import uuid

import pytest

from kairos import diagnosis
from kairos.agents import AgentConfig
from kairos.api import app
from kairos.schedules.edit import _EDITABLE
from kairos.schedules.request import ScheduleLimits, ScheduleRequest

# The models of the object fields a PATCH body may reach into.
NESTED = {"agent": AgentConfig, "limits": ScheduleLimits}
ROUTE_KEYS = {spec.key for spec in app.ROUTES}


def test_the_closed_list_and_the_executable_forms_are_the_same_actions() -> None:
    assert set(diagnosis.ACTION_ROUTES) == diagnosis.RECOVERY_ACTIONS
    offered = {a for code in (*diagnosis.REASON_CODES, *diagnosis.RUN_REASON_CODES)
               for a in diagnosis.diagnose(code)["recovery_actions"]}
    assert offered <= diagnosis.RECOVERY_ACTIONS


@pytest.mark.parametrize("action", sorted(diagnosis.RECOVERY_ACTIONS))
def test_each_action_names_a_route_that_exists_and_a_field_its_body_takes(action: str) -> None:
    form = diagnosis.ACTION_ROUTES[action]
    key = f"{form['method']} " + form["path"].replace("{run_id}", "{id}").replace("{schedule_id}", "{id}")
    assert key in ROUTE_KEYS, key
    if "field" not in form:
        return
    assert key == "PATCH /v1/schedules/{id}"
    top, _, inner = form["field"].partition(".")
    assert top in _EDITABLE and top in ScheduleRequest.model_fields
    if inner:
        assert inner in NESTED[top].model_fields, form["field"]


def test_a_diagnosis_shows_each_actions_form_filled_in_for_the_run() -> None:
    run_id, schedule_id = uuid.uuid4(), uuid.uuid4()
    shown = diagnosis.with_actions(diagnosis.diagnose("runtime_limit"), run_id=run_id, schedule_id=schedule_id)
    assert shown["actions"] == [
        {"action": "raise_runtime_limit", "method": "PATCH", "path": f"/v1/schedules/{schedule_id}",
         "field": "limits.runtime_seconds"},
        {"action": "check_target", "method": "PATCH", "path": f"/v1/schedules/{schedule_id}",
         "field": "agent.base_url"}]
    # A chat turn has no schedule: only what applies to the run itself is a control
    turn = diagnosis.with_actions(diagnosis.diagnose("internal"), run_id=run_id, schedule_id=None)
    assert turn["actions"] == [
        {"action": "retry_run", "method": "POST", "path": f"/v1/runs/{run_id}/retry"},
        {"action": "report_issue", "method": "GET", "path": f"/v1/runs/{run_id}/events"}]
