"""Bad input through the API handler: every field error in one answer, one rule vocabulary, bounded
input (issue 10, items 5, 8 and the 500s of item 10), on a real database.

Each answer is the one error shape (docs/api.md), ``{"error": {"code", "message", "fields": [{"field", "rule",
"message"}]}}`` (``Answer.error`` checks the keys), a 4xx naming field and rule, never a 500.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from kairos import agents, calendar, schedules, webhooks
from kairos.api import app as api_app
from kairos.api.resolver import RouteSpec
from kairos.errors import ValidationFailed
from tests.support.api import Answer, Api, rows

JSON_ROUTES = [spec for spec in api_app.ROUTES if spec.has_body or spec.path == "/v1/hooks/{token}"]


def fields_of(answer: Answer) -> list[tuple[str, str]]:
    return [(f["field"], f["rule"]) for f in answer.error["fields"]]


def assert_shape(answer: Answer, status: int = 422, code: str = "validation_failed") -> None:
    assert answer.status == status, answer.text
    error = answer.error
    assert error["code"] == code and error["message"] and error["fields"], answer.text
    for problem in error["fields"]:
        assert set(problem) == {"field", "rule", "message"} and all(problem.values()), problem


@pytest.fixture
def conversation(api: Api) -> str:
    return str(api.conversation()["id"])


# ---- all at once --------------------------------------------------------------------------------


def test_a_bad_mode_cron_and_timezone_come_back_together_in_one_422(api: Api, conversation: str) -> None:
    answer = api.alice.post("/v1/schedules", {"conversation_id": conversation, "prompt": "brief me",
                                              "mode": "copy", "cron": "0 25 * * *", "timezone": "Mars/Olympus"})
    assert_shape(answer)
    assert set(fields_of(answer)) == {("mode", "enum"), ("cron", "cron_syntax"), ("timezone", "known_zone")}
    assert rows(api.url, "SELECT id FROM schedules") == [], "a refusal writes nothing"


def test_a_conversation_body_is_judged_whole(api: Api) -> None:
    """Undeclared field, bad title and every agent problem in one answer (the title used to hide the agent)."""
    answer = api.alice.post("/v1/conversations", {"agent": {"executor": "gpt", "max_tokens": 0},
                                                  "title": "t" * 201, "owner": "bob"})
    assert_shape(answer)
    assert set(fields_of(answer)) == {("owner", "unknown_field"), ("title", "max_length"),
                                      ("agent.executor", "enum"), ("agent.max_tokens", "min")}
    assert rows(api.url, "SELECT id FROM conversations") == []
    missing = api.alice.post("/v1/conversations", {"title": 5})
    assert set(fields_of(missing)) == {("agent", "required"), ("title", "type")}


# ---- one vocabulary -----------------------------------------------------------------------------


def test_the_same_error_has_the_same_rule_through_the_api_and_the_library(api: Api, conversation: str) -> None:
    schedule = api.alice.post("/v1/schedules", {"conversation_id": conversation, "prompt": "p",
                                                "cron": "0 7 * * *", "timezone": "Europe/Berlin"})
    hook, _ = api.webhook_schedule()
    sid, hid = schedule.json["schedule"]["id"], hook["id"]

    # Through the API: the resolver's own validation (query, token body) and the library's (schedule body).
    through_api = {
        "count too small": api.alice.get(f"/v1/schedules/{sid}/preview?count=0"),
        "count too large": api.alice.get(f"/v1/schedules/{sid}/preview?count=101"),
        "after without offset": api.alice.get(f"/v1/schedules/{sid}/preview?after=2030-01-01T00:00:00"),
        "after too early": api.alice.get(f"/v1/schedules/{sid}/preview?after=0001-01-01T00:00:00%2B01:00"),
        "overlap too small": api.alice.post(f"/v1/schedules/{hid}/token", {"overlap_seconds": -1}),
        "overlap too large": api.alice.post(f"/v1/schedules/{hid}/token", {"overlap_seconds": 10**9}),
        "max_occurrences too small": api.alice.post("/v1/schedules", {"conversation_id": conversation,
                                                                      "prompt": "p", "cron": "0 * * * *",
                                                                      "max_occurrences": 0}),
        "starts_at without offset": api.alice.post("/v1/schedules", {"conversation_id": conversation,
                                                                     "prompt": "p", "kind": "once",
                                                                     "starts_at": "2031-01-01T00:00:00"}),
    }
    api_rules = {}
    for what, answer in through_api.items():
        assert_shape(answer)
        (api_rules[what],) = {rule for _, rule in fields_of(answer)}

    # Through the library: the same mistakes.
    stored = schedules.Schedule(**{**_schedule_fields(api, sid)})
    library: dict[str, Any] = {
        "count too small": lambda: schedules.preview(stored, after=datetime.now(UTC), count=0),
        "count too large": lambda: schedules.preview(stored, after=datetime.now(UTC), count=101),
        "after without offset": lambda: schedules.preview(stored, after=datetime(2030, 1, 1), count=1),
        "after too early": lambda: schedules.preview(
            stored, after=datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1))), count=1),
        "overlap too small": lambda: webhooks.rotate_token(None, uuid.UUID(hid), owner="alice",  # type: ignore[arg-type]
                                                           overlap_seconds=-1),
        "overlap too large": lambda: webhooks.rotate_token(None, uuid.UUID(hid), owner="alice",  # type: ignore[arg-type]
                                                           overlap_seconds=10**9),
        "max_occurrences too small": lambda: schedules.parse_request(
            {"conversation_id": conversation, "prompt": "p", "cron": "0 * * * *", "max_occurrences": 0}, owner="alice"),
        "starts_at without offset": lambda: schedules.parse_request(
            {"conversation_id": conversation, "prompt": "p", "kind": "once", "starts_at": "2031-01-01T00:00:00"},
            owner="alice"),
    }
    library_rules = {}
    for what, call in library.items():
        with pytest.raises(ValidationFailed) as info:
            call()
        (library_rules[what],) = {f.rule for f in info.value.fields}
    assert api_rules == library_rules
    assert api_rules == {
        "count too small": "min", "count too large": "max", "after without offset": "timezone_aware",
        "after too early": "min", "overlap too small": "min", "overlap too large": "max",
        "max_occurrences too small": "min", "starts_at without offset": "timezone_aware",
    }
    # And an agent's bound is the same word in a conversation, a schedule and the library.
    bad_agent = {"executor": "echo", "model": "m", "max_tokens": 0}
    in_conversation = api.alice.post("/v1/conversations", {"agent": bad_agent})
    in_schedule = api.alice.post("/v1/schedules", {"conversation_id": conversation, "prompt": "p", "mode": "fresh",
                                                   "cron": "0 * * * *", "agent": bad_agent})
    with pytest.raises(ValidationFailed) as info:
        agents.validate(bad_agent, owner="alice")
    expected = ("agent.max_tokens", "min")
    assert expected in fields_of(in_conversation) and expected in fields_of(in_schedule)
    assert expected in [(f.field, f.rule) for f in info.value.fields]


def _schedule_fields(api: Api, schedule_id: str) -> dict[str, Any]:
    (row,) = rows(api.url, "SELECT * FROM schedules WHERE id = %(id)s", {"id": schedule_id})
    return {name: value for name, value in row.items() if name in schedules.Schedule.__dataclass_fields__}


# ---- bounded input ------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", JSON_ROUTES, ids=lambda spec: spec.key)
@pytest.mark.parametrize("where", ["whole body", "inside a field"])
def test_json_nested_990_levels_is_a_422_naming_body_and_depth_on_every_json_route(
        api: Api, spec: RouteSpec, where: str) -> None:
    _, token = api.webhook_schedule()
    target = spec.path.replace("{id}", str(uuid.uuid4())).replace("{name}", "key").replace("{token}", token)
    deep = b"[" * 990 + b"]" * 990
    raw = deep if where == "whole body" else b'{"agent": {"executor": "echo", "x": ' + deep + b"}}"
    answer = api.alice(spec.method, target, raw=raw)
    assert_shape(answer)
    assert fields_of(answer) == [("body", "max_depth")]


def test_depth_counts_structure_not_brackets_in_strings(api: Api) -> None:
    schedule, token = api.webhook_schedule()
    text = '"' + "[{" * 500 + '\\"]' + '"'  # brackets and an escaped quote inside one string
    accepted = api.anonymous.post(f"/v1/hooks/{token}", raw=('{"s": ' + text + ', "n": ' + "[" * 63 + "]" * 63
                                                             + "}").encode())
    assert accepted.status == 202, accepted.text
    refused = api.anonymous.post(f"/v1/hooks/{token}", raw=("[" * 65 + "]" * 65).encode())
    assert_shape(refused)
    assert fields_of(refused) == [("body", "max_depth")]
    assert len(rows(api.url, "SELECT id FROM runs WHERE schedule_id = %(s)s", {"s": schedule["id"]})) == 1


@pytest.mark.parametrize(("value", "rule"), [("9999-12-31T23:59:59-01:00", "max"),
                                             ("0001-01-01T00:00:00+01:00", "min")])
def test_instants_that_overflow_are_a_422_naming_the_field(api: Api, conversation: str, value: str,
                                                           rule: str) -> None:
    once = api.alice.post("/v1/schedules", {"conversation_id": conversation, "prompt": "p", "kind": "once",
                                            "starts_at": value})
    assert_shape(once)
    assert fields_of(once) == [("starts_at", rule)]
    ends = api.alice.post("/v1/schedules", {"conversation_id": conversation, "prompt": "p", "cron": "0 * * * *",
                                            "ends_at": value})
    assert_shape(ends)
    assert ("ends_at", rule) in fields_of(ends)
    anchored = api.alice.post("/v1/schedules", {"conversation_id": conversation, "prompt": "p", "mode": "copy",
                                                "kind": "interval", "interval_seconds": 3600, "starts_at": value})
    assert_shape(anchored)
    assert set(fields_of(anchored)) == {("mode", "enum"), ("starts_at", rule)}
    schedule = api.alice.post("/v1/schedules", {"conversation_id": conversation, "prompt": "p", "cron": "0 * * * *"})
    sid = schedule.json["schedule"]["id"]
    preview = api.alice.get(f"/v1/schedules/{sid}/preview?after={value.replace('+', '%2B')}")
    assert_shape(preview)
    assert fields_of(preview) == [("after", rule)]


# ---- cron syntax users bring --------------------------------------------------------------------


@pytest.mark.parametrize("cron", ["0/15 * * * *", "5/10 * * * *", "0 16/3 * * *"])
def test_start_with_a_step_crons_are_accepted_through_the_api(api: Api, conversation: str, cron: str) -> None:
    answer = api.alice.post("/v1/schedules", {"conversation_id": conversation, "prompt": "p", "cron": cron,
                                              "timezone": "Europe/Berlin"})
    assert answer.status == 201, answer.text
    preview = api.alice.get(f"/v1/schedules/{answer.json['schedule']['id']}/preview?count=3"
                            "&after=2029-12-31T22:59:00Z")  # 23:59 in Berlin
    assert preview.status == 200, preview.text
    expected = {"0/15 * * * *": ["00:00", "00:15", "00:30"], "5/10 * * * *": ["00:05", "00:15", "00:25"],
                "0 16/3 * * *": ["16:00", "19:00", "22:00"]}[cron]
    assert [f["local_time"][11:16] for f in preview.json["fires"]] == expected


@pytest.mark.parametrize("cron", ["\uff10 7 * * *", "0\u30007 * * *", "0 7 * * \uff11-\uff15", "0\u00a07 * * *"])
def test_a_cron_with_anything_but_ascii_is_a_422_on_create_and_patch(
        api: Api, conversation: str, cron: str) -> None:
    # Fullwidth digits and Unicode spaces read as cron by str.split() and int(), not by other cron readers.
    created = api.alice.post("/v1/schedules", {"conversation_id": conversation, "prompt": "p", "cron": cron})
    assert created.status == 422 and ("cron", "cron_syntax") in fields_of(created), created.text
    schedule = api.alice.post("/v1/schedules", {"conversation_id": conversation, "prompt": "p",
                                                "cron": "0 7 * * 1-5"})
    patched = api.alice.patch(f"/v1/schedules/{schedule.json['schedule']['id']}", {"cron": cron})
    assert patched.status == 422 and ("cron", "cron_syntax") in fields_of(patched), patched.text
    stored = api.alice.get(f"/v1/schedules/{schedule.json['schedule']['id']}").json["schedule"]
    assert stored["cron"] == "0 7 * * 1-5"


def test_a_start_with_a_step_every_minute_is_refused_by_the_limit(api: Api, conversation: str) -> None:
    answer = api.alice.post("/v1/schedules", {"conversation_id": conversation, "prompt": "p", "cron": "0/1 * * * *"})
    assert_shape(answer, code="limit_exceeded")
    assert fields_of(answer) == [("cron", "min_interval")]


def test_the_calendar_names_the_same_mistakes_with_the_same_words(api: Api, conversation: str) -> None:
    """The calendar said 'positive' and 'one_of' where the API says 'min' and 'enum'."""
    answer = api.alice.post("/v1/schedules", {"conversation_id": conversation, "prompt": "p", "kind": "interval",
                                              "interval_seconds": 0, "dst_gap": "sideways"})
    assert_shape(answer)
    with pytest.raises(ValidationFailed) as info:
        calendar.check_rule(calendar.Rule(calendar.ScheduleKind.INTERVAL, interval_seconds=0,
                                          starts_at=datetime(2030, 1, 1, tzinfo=UTC),
                                          dst_gap="sideways"))  # type: ignore[arg-type]
    library = {(f.field, f.rule) for f in info.value.fields}
    assert set(fields_of(answer)) == library == {("interval_seconds", "min"), ("dst_gap", "enum")}


# ---- times are RFC 3339 text, days YYYY-MM-DD (issue 37, item 13) -----------------------------------


def test_unix_seconds_are_refused_where_an_instant_or_a_day_is_documented(api: Api, conversation: str) -> None:
    schedule = api.alice.post("/v1/schedules", {"conversation_id": conversation, "prompt": "p", "cron": "0 * * * *"})
    sid = schedule.json["schedule"]["id"]
    for after in ("1700000000", "0", "1700000000.5", "20300101T070000Z", "2030-01-01"):
        preview = api.alice.get(f"/v1/schedules/{sid}/preview?after={after}")
        assert_shape(preview)
        assert fields_of(preview) == [("after", "type")], (after, preview.text)
    good = api.alice.get(f"/v1/schedules/{sid}/preview?count=1&after=2030-01-01T07:30:00%2B02:00")
    assert good.status == 200 and good.json["fires"][0]["fire_at"] == "2030-01-01T06:00:00Z"
    backfill = api.alice.post(f"/v1/schedules/{sid}/backfill", {"from": 1700000000, "until": "1700003600"})
    assert_shape(backfill)
    assert set(fields_of(backfill)) == {("from", "type"), ("until", "type")}
    for query, field in (("from=86400", "from"), ("until=1700000000", "until"), ("from=20260101", "from")):
        usage = api.alice.get(f"/v1/usage?{query}")
        assert_shape(usage)
        assert fields_of(usage) == [(field, "type")], (query, usage.text)


@pytest.mark.parametrize("until", ["0001-01-01", "0001-01-07"])
def test_a_usage_window_before_the_calendar_begins_is_a_422_naming_until(api: Api, until: str) -> None:
    answer = api.alice.get(f"/v1/usage?until={until}")
    assert_shape(answer)
    assert fields_of(answer) == [("until", "min")]
    assert api.alice.get("/v1/usage?from=0001-01-01&until=0001-01-03").status == 200


# ---- routes without a body refuse one (issue 37, item 13) ------------------------------------------

BODYLESS = [spec for spec in api_app.ROUTES if spec.method != "GET" and not spec.has_body and not spec.public]


def test_every_route_that_takes_no_body_is_listed() -> None:
    assert {s.key for s in BODYLESS} >= {"POST /v1/approvals/{id}/approve", "POST /v1/approvals/{id}/deny",
                                         "POST /v1/runs/{id}/cancel",
                                         "POST /v1/schedules/{id}/trigger",
                                         "DELETE /v1/secrets/{name}", "DELETE /v1/schedules/{id}"}


@pytest.mark.parametrize("spec", BODYLESS, ids=lambda spec: spec.key)
def test_a_body_sent_to_a_route_that_takes_none_is_a_422(api: Api, spec: RouteSpec) -> None:
    target = spec.path.replace("{id}", str(uuid.uuid4())).replace("{name}", "key")
    answer = api.alice(spec.method, target, {"arguments": {"url": "https://elsewhere.example"}})
    assert_shape(answer)
    assert fields_of(answer) == [("body", "no_body")]
    assert api.alice(spec.method, target, raw=b"text", headers={"content-type": "text/plain"}).status == 422
    # No body (or only whitespace) reaches the route: a missing object's 404.
    assert api.alice(spec.method, target).status == 404
    assert api.alice(spec.method, target, raw=b" \r\n").status == 404


def test_approve_with_arguments_is_refused_and_decides_nothing(api: Api) -> None:
    from tests import factories

    parked = factories.run(api.url, state="awaiting_approval", attempt=1, fence=1)
    approval = factories.approval(api.url, run_row=parked)
    answer = api.alice.post(f"/v1/approvals/{approval['id']}/approve", {"arguments": {"order": 1}})
    assert_shape(answer)
    assert rows(api.url, "SELECT state FROM approvals WHERE id = %(id)s", {"id": approval["id"]}) == [
        {"state": "pending"}]
    assert api.alice.post(f"/v1/approvals/{approval['id']}/approve").status == 200


def test_the_openapi_document_gives_a_204_no_body(api: Api) -> None:
    document = api.anonymous.get("/v1/openapi.json").json
    no_content = [(path, method) for path, operations in document["paths"].items()
                  for method, operation in operations.items() if "204" in operation["responses"]]
    assert no_content == [("/v1/secrets/{name}", "delete")]
    assert document["paths"]["/v1/secrets/{name}"]["delete"]["responses"]["204"] == {"description": "No Content"}


# ---- integer query parameters are ASCII digits -------------------------------------------------------

NOT_ASCII_DIGITS = ["%EF%BC%91%EF%BC%90",  # U+FF11 U+FF10: a fullwidth "10", which Python's int() reads as 10
                    "%D9%A3",  # U+0663: an Arabic-Indic three
                    "%2B10", "%2010", "1_0", "10.0", "1e1"]


def integer_query_parameters() -> list[tuple[str, str]]:
    """Every (path, name) of an integer query parameter of a GET route, from the served OpenAPI document."""
    from tests.support.openapi import served

    found = []
    for path, operations in json.loads(served())["paths"].items():
        for parameter in operations.get("get", {}).get("parameters", []):
            if parameter["in"] == "query" and parameter["schema"].get("type") == "integer":
                found.append((path, parameter["name"]))
    return found


def test_every_integer_query_parameter_takes_ascii_digits_only(api: Api) -> None:
    params = integer_query_parameters()
    assert {("/v1/schedules/{id}/preview", "count"), ("/v1/runs", "limit"), ("/v1/runs/{id}/events", "after")} <= set(
        params)
    for path, name in params:
        target = path.replace("{id}", str(uuid.uuid4()))
        for value in NOT_ASCII_DIGITS:
            answer = api.alice.get(f"{target}?{name}={value}")
            assert_shape(answer)
            assert fields_of(answer) == [(name, "type")], (path, name, value, answer.text)
        assert api.alice.get(f"{target}?{name}=2").status != 422, (path, name)  # plain digits pass validation
