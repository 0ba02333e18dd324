"""A webhook schedule's ``flow`` through the API on real PostgreSQL: create and PATCH store the checked
settings and show them in the schedule; every bad value is a 422 naming the field path and the rule."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.api import Api, rows


def create(api: Api, **fields: Any) -> Any:
    conversation = api.conversation()
    return api.alice.post("/v1/schedules", {"conversation_id": conversation["id"], "prompt": "on hook",
                                            "kind": "webhook", **fields})


def test_flow_is_stored_checked_and_shown(api: Api) -> None:
    answer = create(api, flow={"debounce_seconds": 30, "concurrency": {"key": "/pull_request/number"}})

    assert answer.status == 201, answer.text
    shown = answer.json["schedule"]["flow"]
    assert shown == {"debounce_seconds": 30, "concurrency": {"key": "/pull_request/number", "limit": 1},
                     "over_rate": "reject"}, "defaults filled in"
    (row,) = rows(api.url, "SELECT flow FROM schedules WHERE id = %(id)s", {"id": answer.json["schedule"]["id"]})
    assert row["flow"] == shown
    read = api.alice.get(f"/v1/schedules/{answer.json['schedule']['id']}")
    assert read.json["schedule"]["flow"] == shown


def test_a_schedule_without_flow_shows_null(api: Api) -> None:
    answer = create(api)
    assert answer.status == 201 and answer.json["schedule"]["flow"] is None


@pytest.mark.parametrize(("flow", "field", "rule"), [
    ({"debounce_seconds": 0}, "flow.debounce_seconds", "min"),
    ({"debounce_seconds": 3601}, "flow.debounce_seconds", "max"),
    ({"debounce_seconds": "30"}, "flow.debounce_seconds", "type"),
    ({"batch": {"max_events": 1, "max_wait_seconds": 10}}, "flow.batch.max_events", "min"),
    ({"batch": {"max_events": 101, "max_wait_seconds": 10}}, "flow.batch.max_events", "max"),
    ({"batch": {"max_events": 10, "max_wait_seconds": 301}}, "flow.batch.max_wait_seconds", "max"),
    ({"batch": {"max_events": 10, "max_wait_seconds": 0}}, "flow.batch.max_wait_seconds", "min"),
    ({"batch": {"max_events": 10}}, "flow.batch.max_wait_seconds", "required"),
    ({"batch": {"max_events": 10, "max_wait_seconds": 5, "extra": 1}}, "flow.batch.extra", "unknown_field"),
    ({"debounce_seconds": 5, "batch": {"max_events": 10, "max_wait_seconds": 5}}, "flow.batch", "exclusive"),
    ({"concurrency": {"key": "pull_request/number"}}, "flow.concurrency.key", "json_pointer"),
    ({"concurrency": {"key": "/a~2b"}}, "flow.concurrency.key", "json_pointer"),
    ({"concurrency": {"key": "/a", "limit": 0}}, "flow.concurrency.limit", "min"),
    ({"concurrency": {"key": "/a", "limit": 101}}, "flow.concurrency.limit", "max"),
    ({"concurrency": {"limit": 2}}, "flow.concurrency.key", "required"),
    ({"over_rate": "queue"}, "flow.over_rate", "enum"),
    ({"throttle": 3}, "flow.throttle", "unknown_field"),
    ([1], "flow", "type"),
])
def test_each_bad_value_is_a_422_naming_field_and_rule(api: Api, flow: Any, field: str, rule: str) -> None:
    answer = create(api, flow=flow)

    assert answer.status == 422, answer.text
    assert {"field": field, "rule": rule} in [{"field": f["field"], "rule": f["rule"]}
                                              for f in answer.error["fields"]], answer.error
    assert rows(api.url, "SELECT count(*) AS n FROM schedules")[0]["n"] == 0


def test_flow_is_for_webhook_schedules_only(api: Api) -> None:
    conversation = api.conversation()
    answer = api.alice.post("/v1/schedules", {"conversation_id": conversation["id"], "prompt": "p",
                                              "cron": "0 * * * *", "flow": {"debounce_seconds": 5}})
    assert answer.status == 422
    assert [(f["field"], f["rule"]) for f in answer.error["fields"]] == [("flow", "not_for_kind")]


def test_patch_sets_replaces_and_clears_flow_under_new_revisions(api: Api) -> None:
    schedule = create(api).json["schedule"]
    path = f"/v1/schedules/{schedule['id']}"

    batch = api.alice.patch(path, {"flow": {"batch": {"max_events": 10, "max_wait_seconds": 60},
                                            "over_rate": "defer"}})
    assert batch.status == 200, batch.text
    assert batch.json["schedule"]["flow"] == {"batch": {"max_events": 10, "max_wait_seconds": 60},
                                              "over_rate": "defer"}
    renamed = api.alice.patch(path, {"name": "kept flow"})
    assert renamed.json["schedule"]["flow"] == batch.json["schedule"]["flow"], "an edit of another field keeps it"
    refused = api.alice.patch(path, {"flow": {"debounce_seconds": 10, "batch": {"max_events": 3,
                                                                                 "max_wait_seconds": 3}}})
    assert refused.status == 422 and refused.error["fields"][0]["field"] == "flow.batch"
    cleared = api.alice.patch(path, {"flow": None})
    assert cleared.status == 200 and cleared.json["schedule"]["flow"] is None
    revisions = rows(api.url, "SELECT revision, definition -> 'flow' AS flow FROM schedule_revisions "
                              "WHERE schedule_id = %(id)s ORDER BY revision", {"id": schedule["id"]})
    assert [r["revision"] for r in revisions] == [1, 2, 3, 4]
    assert revisions[1]["flow"]["over_rate"] == "defer" and revisions[3]["flow"] is None
