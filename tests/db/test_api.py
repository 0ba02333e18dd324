"""The HTTP API through the handler (HTTP API v2 events), real PostgreSQL, moto SQS.

The authorization matrix covers every route and method: alice's objects are invisible to bob and his
answer is byte-identical to the one for a missing object; lists hold exactly the caller's rows; no
principal is 401 everywhere but the hook and the document. Then the error shape on every kind of bad
request, and each route's behaviour.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kairos import runtime, schedules, trace
from kairos.api import app as api_app
from kairos.api.resolver import RouteSpec
from kairos.states import EventType
from tests import factories
from tests.support.api import Answer, Api, ApiClient, rows

ID_ROUTES = [spec for spec in api_app.ROUTES if "{id}" in spec.path]
PRIVATE_ROUTES = [spec for spec in api_app.ROUTES if not spec.public]


def concrete(path: str, **ids: str) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: ids.get(m.group(1), "a-name"), path)


@pytest.fixture
def world(api: Api) -> dict[str, Any]:
    """alice: a conversation, a cron schedule, a webhook schedule and a webhook run; bob: the same kinds."""
    out: dict[str, Any] = {}
    for who in ("alice", "bob"):
        client = ApiClient(who)
        conversation = api.conversation(who)
        cron = client.post("/v1/schedules", {"conversation_id": conversation["id"], "prompt": "brief me",
                                             "cron": "0 7 * * 1-5", "timezone": "Europe/Berlin"})
        assert cron.status == 201, cron.text
        hook_schedule, token = api.webhook_schedule(who)
        run = api.anonymous.post(f"/v1/hooks/{token}", {"who": who})
        assert run.status == 202, run.text
        # A run parked for approval, with its request (the tool loop's tests make real ones).
        parked = factories.run(api.url, schedule_row=rows(api.url, "SELECT * FROM schedules WHERE id = %(id)s",
                                                          {"id": cron.json["schedule"]["id"]})[0],
                               state="awaiting_approval")
        approval = factories.approval(api.url, run_row=parked)
        # A goal loop with a run waiting on its owner's answer (tests/db/test_goals.py makes real ones).
        loop = factories.loop(api.url, owner=who, conversation_id=conversation["id"])
        asking = factories.run(api.url, schedule_row=loop, state="awaiting_input", attempt=1, fence=1)
        question = factories.input_request(api.url, run_row=asking)
        out[who] = {"conversation": conversation["id"], "schedule": cron.json["schedule"]["id"],
                    "hook": hook_schedule["id"], "token": token, "run": run.json["run_id"],
                    "approval": str(approval["id"]), "loop": str(loop["id"]),
                    "input_request": str(question["id"])}
    return out


def object_for(spec: RouteSpec, mine: dict[str, Any]) -> str:
    if spec.path.startswith("/v1/approvals"):
        return str(mine["approval"])
    if spec.path.startswith("/v1/loops"):
        return str(mine["loop"])
    if spec.path.startswith("/v1/input-requests"):
        return str(mine["input_request"])
    if spec.path.startswith("/v1/conversations"):
        return str(mine["conversation"])
    if spec.path.startswith("/v1/runs"):
        return str(mine["run"])
    if spec.path.endswith("/token"):
        return str(mine["hook"])
    return str(mine["schedule"])


_DAY = timedelta(days=1)
BODIES: dict[str, Any] = {
    "POST /v1/schedules/{id}/token": {"overlap_seconds": 60},
    "PATCH /v1/schedules/{id}": {"name": "renamed"},
    "POST /v1/conversations/{id}/messages": {"content": "hello"},
    "PATCH /v1/loops/{id}": {"name": "renamed"},
    "POST /v1/input-requests/{id}/answer": {"answer": "yes"},
    "POST /v1/schedules/{id}/backfill": {"from": (datetime.now(UTC) - 2 * _DAY).isoformat(),
                                         "until": (datetime.now(UTC) - _DAY).isoformat()},
}
# What the owner's own call answers when it is not 200: a run now and a backfill are accepted (202);
# a retry of the world's run is refused (409) while it is queued and accepted once the owner's
# cancel (an earlier route of the walk) ended it.
# A chat turn is accepted (202); the request is approved first, so the deny after it conflicts (409).
OWNER_STATUS: dict[str, set[int]] = {"POST /v1/schedules/{id}/trigger": {202},
                                     "POST /v1/schedules/{id}/test": {202},
                                     "POST /v1/conversations/{id}/messages": {202},
                                     "POST /v1/approvals/{id}/deny": {409},
                                     "POST /v1/schedules/{id}/backfill": {202},
                                     "POST /v1/runs/{id}/retry": {202, 409},
                                     # The world's run is a webhook run, not a corpus run: the corpus
                                     # reads answer 404 and pause / resume 409 not_corpus_run
                                     # (tests/db/test_corpus_api.py reaches them on a corpus run).
                                     "GET /v1/runs/{id}/corpus": {404},
                                     "GET /v1/runs/{id}/corpus/records": {404},
                                     "POST /v1/runs/{id}/pause": {409},
                                     "POST /v1/runs/{id}/resume": {409}}


# ---- authorization ----------------------------------------------------------------------------


def test_another_principals_object_answers_exactly_like_a_missing_one_on_every_id_route(
        api: Api, world: dict[str, Any]) -> None:
    before = {t: rows(api.url, f"SELECT t::text AS row FROM {t} t ORDER BY 1") for t in ("schedules", "runs")}
    covered = set()
    for spec in ID_ROUTES:
        alices = object_for(spec, world["alice"])
        missing = str(uuid.uuid4())
        body = BODIES.get(spec.key)
        foreign = api.bob(spec.method, concrete(spec.path, id=alices), body)
        absent = api.bob(spec.method, concrete(spec.path, id=missing), body)
        absent_for_alice = api.alice(spec.method, concrete(spec.path, id=missing), body)
        garbage = api.bob(spec.method, concrete(spec.path, id="not-a-uuid"), body)

        assert foreign.status == 404, (spec.key, foreign.text)
        assert foreign.text == absent.text == absent_for_alice.text == garbage.text, spec.key
        assert foreign.headers == absent.headers, spec.key
        assert alices not in foreign.text and missing not in absent.text
        covered.add(spec.key)
    assert covered == {s.key for s in ID_ROUTES} and len(covered) == 30
    after = {t: rows(api.url, f"SELECT t::text AS row FROM {t} t ORDER BY 1") for t in ("schedules", "runs")}
    assert after == before, "bob's attempts changed nothing of alice's"


def test_the_owner_reaches_every_id_route(api: Api, world: dict[str, Any]) -> None:
    for spec in ID_ROUTES:
        if spec.method == "DELETE":
            continue  # cancelling is checked on its own below
        answer = api.alice(spec.method, concrete(spec.path, id=object_for(spec, world["alice"])),
                           BODIES.get(spec.key))
        assert answer.status in OWNER_STATUS.get(spec.key, {200}), (spec.key, answer.text)


def test_lists_return_exactly_the_callers_rows(api: Api, world: dict[str, Any]) -> None:
    for who, other in (("alice", "bob"), ("bob", "alice")):
        client = ApiClient(who)
        listed = {s["id"] for s in client.get("/v1/schedules").json["schedules"]}
        stored = {r["id"] for r in rows(api.url, "SELECT id::text FROM schedules WHERE owner = %(o)s", {"o": who})}
        assert listed == stored == {world[who]["schedule"], world[who]["hook"], world[who]["loop"]}
        mine = client.get(f"/v1/schedules?conversation_id={world[who]['conversation']}").json["schedules"]
        theirs = client.get(f"/v1/schedules?conversation_id={world[other]['conversation']}")
        assert {s["id"] for s in mine} == {world[who]["schedule"], world[who]["loop"]}
        assert theirs.status == 200 and theirs.json == {"schedules": []}


def test_no_principal_is_401_on_every_private_route(api: Api, world: dict[str, Any]) -> None:
    bodies = []
    for spec in PRIVATE_ROUTES:
        target = concrete(spec.path, id=object_for(spec, world["alice"]))
        anonymous = api.anonymous(spec.method, target, BODIES.get(spec.key))
        wrong = api.alice(spec.method, target, BODIES.get(spec.key), as_user="not-a-configured-token")
        for answer in (anonymous, wrong):
            assert answer.status == 401, (spec.key, answer.text)
            assert answer.error["code"] == "unauthorized"
            bodies.append(answer.text)
    assert len(set(bodies)) == 1
    # Authentication comes before validation: a bad body does not tell an anonymous caller anything.
    assert api.anonymous.post("/v1/schedules", {"owner": "x"}).status == 401


def test_jwt_mode_takes_the_principal_from_the_authorizer_claims(api: Api, monkeypatch: pytest.MonkeyPatch,
                                                                world: dict[str, Any]) -> None:
    monkeypatch.setenv("KAIROS_AUTH", "jwt")
    runtime.reset()
    from kairos.local import apigw
    from tests.support.api import HANDLER
    from tests.support.aws import LambdaContext

    def call(target: str, claims: dict[str, Any] | None, bearer: str | None = None) -> dict[str, Any]:
        headers = {"authorization": f"Bearer {bearer}"} if bearer else {}
        event = apigw.build_event("GET", target, headers, None, claims=claims)
        return dict(HANDLER(event, LambdaContext(function_name="kairos-api")))

    schedule = f"/v1/schedules/{world['alice']['schedule']}"
    assert call(schedule, {"sub": "alice"})["statusCode"] == 200
    assert call(schedule, {"sub": "bob"})["statusCode"] == 404
    assert call(schedule, None, bearer="tok-alice-0123456789")["statusCode"] == 401, "dev tokens are off"
    assert call(schedule, {"sub": ""})["statusCode"] == 401


# ---- the error shape --------------------------------------------------------------------------


def test_unknown_route_and_wrong_method(api: Api) -> None:
    unknown = api.alice.get("/v1/nothing-here")
    unknown_anonymous = api.anonymous.get("/v1/nothing-here")
    wrong = api.alice("PUT", "/v1/schedules")
    assert unknown.status == unknown_anonymous.status == 404
    assert unknown.error["code"] == "not_found"
    assert wrong.status == 405
    assert wrong.error["code"] == "method_not_allowed"
    assert set(wrong.headers["Allow"].split(", ")) == {"GET", "POST"}


def test_malformed_json_is_400(api: Api) -> None:
    for raw in (b"{", b"\xff\xfe", b'{"agent": }'):
        answer = api.alice.post("/v1/conversations", raw=raw)
        assert answer.status == 400, raw
        assert answer.error == {"code": "malformed_json", "message": "the body is not valid JSON", "fields": []}


def test_bodies_refuse_undeclared_and_server_fields(api: Api, world: dict[str, Any]) -> None:
    conversation = world["alice"]["conversation"]
    base = {"conversation_id": conversation, "prompt": "p", "cron": "0 7 * * *", "timezone": "Europe/Berlin"}
    before = len(rows(api.url, "SELECT id FROM schedules"))
    for field in ("owner", "status", "state", "fence", "revision", "token_hash", "previous_token_hash",
                  "next_fire_at", "consecutive_failures", "whatever"):
        answer = api.alice.post("/v1/schedules", {**base, field: "x"})
        assert answer.status == 422, field
        assert {"field": field, "rule": "unknown_field"} in [
            {"field": f["field"], "rule": f["rule"]} for f in answer.error["fields"]], answer.text
    assert len(rows(api.url, "SELECT id FROM schedules")) == before, "refusals write nothing"
    owner = api.alice.post("/v1/conversations", {"agent": {"executor": "echo", "model": "m"}, "owner": "bob"})
    assert owner.status == 422 and owner.error["fields"][0] == {
        "field": "owner", "rule": "unknown_field", "message": owner.error["fields"][0]["message"]}


def test_validation_errors_name_field_and_rule(api: Api, world: dict[str, Any]) -> None:
    conversation = world["alice"]["conversation"]
    too_often = api.alice.post("/v1/schedules", {"conversation_id": conversation, "prompt": "p", "cron": "* * * * *"})
    bad_zone = api.alice.post("/v1/schedules", {"conversation_id": conversation, "prompt": "p", "cron": "0 7 * * *",
                                                "timezone": "Mars/Olympus"})
    no_agent = api.alice.post("/v1/conversations", {"title": "t"})
    literal_key = api.alice.post("/v1/conversations", {"agent": {"executor": "openai", "model": "m",
                                                                 "base_url": "https://x.test/v1",
                                                                 "api_key_secret": "sk-live-123"}})
    not_object = api.alice.post("/v1/schedules", [1, 2])
    for answer in (too_often, bad_zone, no_agent, literal_key, not_object):
        assert answer.status == 422, answer.text
        assert answer.error["fields"] and all(f["field"] and f["rule"] for f in answer.error["fields"])
    assert too_often.error["fields"][0]["rule"] == "min_interval"
    assert bad_zone.error["fields"][0]["field"] == "timezone"
    assert no_agent.error["fields"][0] == {"field": "agent", "rule": "required",
                                           "message": no_agent.error["fields"][0]["message"]}
    assert literal_key.error["fields"][0]["field"] == "agent.api_key_secret"
    assert "sk-live-123" not in literal_key.text
    assert not_object.error["fields"][0]["field"] == "body"


def test_text_postgres_cannot_store_is_refused_not_a_500(api: Api, world: dict[str, Any]) -> None:
    nul = api.alice.post("/v1/conversations", {"agent": {"executor": "echo", "model": "m"}, "title": "a\x00b"})
    surrogate = api.alice.post("/v1/schedules", raw=b'{"prompt": "\\ud800", "conversation_id": "x"}')
    assert nul.status == surrogate.status == 422
    assert nul.error["fields"][0] == {"field": "title", "rule": "invalid_character",
                                      "message": nul.error["fields"][0]["message"]}
    assert surrogate.error["fields"][0]["field"] == "prompt"


def test_other_media_types_are_415(api: Api) -> None:
    answer = api.alice.post("/v1/conversations", raw=b"agent=x", headers={"content-type": "text/plain"})
    assert answer.status == 415 and answer.error["code"] == "unsupported_media_type"


def test_query_parameters_are_validated(api: Api, world: dict[str, Any]) -> None:
    schedule = world["alice"]["schedule"]
    for target, field in ((f"/v1/schedules/{schedule}/preview?count=0", "count"),
                          (f"/v1/schedules/{schedule}/preview?count=101", "count"),
                          (f"/v1/schedules/{schedule}/preview?after=2030-01-01T00:00:00", "after"),
                          (f"/v1/schedules/{schedule}/preview?after=0001-01-01T00:00:00Z", "after"),
                          (f"/v1/runs/{world['alice']['run']}/events?after=-1", "after"),
                          ("/v1/schedules?conversation_id=nope", "conversation_id"),
                          ("/v1/usage?from=yesterday", "from"),
                          ("/v1/usage?from=2026-01-01&until=2026-13-01", "until"),
                          ("/v1/usage?from=2026-01-10&until=2026-01-10", "until"),
                          ("/v1/usage?from=2025-01-01&until=2026-01-03", "until")):
        answer = api.alice.get(target)
        assert answer.status == 422, (target, answer.text)
        assert answer.error["fields"][0]["field"] == field, answer.text


def test_an_unexpected_failure_is_a_bare_500(api: Api, world: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(*_: Any, **__: Any) -> Any:
        raise RuntimeError("SELECT secret FROM somewhere; token=abc")

    monkeypatch.setattr(schedules, "get", explode)
    answer = api.alice.get(f"/v1/schedules/{world['alice']['schedule']}")
    assert answer.status == 500
    assert answer.json == {"error": {"code": "internal", "message": "internal error", "fields": []}}


# ---- conversations ----------------------------------------------------------------------------


def test_conversation_create_read_and_inbox(api: Api) -> None:
    created = api.alice.post("/v1/conversations", {"agent": {"executor": "echo", "model": "echo"}, "title": "hi"})
    assert created.status == 201
    conversation = created.json["conversation"]
    assert conversation["title"] == "hi" and conversation["entries"] == []
    assert "owner" not in conversation
    read = api.alice.get(f"/v1/conversations/{conversation['id']}")
    assert read.json == created.json
    inbox = api.alice.get(f"/v1/conversations/{conversation['id']}/inbox")
    assert inbox.status == 200 and inbox.json == {"notes": []}


# ---- schedules --------------------------------------------------------------------------------


def test_create_canonicalizes_shorthand_and_returns_the_webhook_only_for_webhooks(api: Api,
                                                                                 world: dict[str, Any]) -> None:
    conversation = world["alice"]["conversation"]
    every = api.alice.post("/v1/schedules", {"conversation_id": conversation, "prompt": "p", "every_seconds": 3600})
    daily = api.alice.post("/v1/schedules", {"conversation_id": conversation, "prompt": "p", "cron": "30 6 * * *"})
    hook = api.alice.post("/v1/schedules", {"conversation_id": conversation, "prompt": "p", "kind": "webhook"})

    assert every.status == daily.status == hook.status == 201
    assert set(every.json) == {"schedule"} and every.json["schedule"]["kind"] == "interval"
    assert every.json["schedule"]["interval_seconds"] == 3600
    assert daily.json["schedule"]["kind"] == "interval" and daily.json["schedule"]["interval_seconds"] == 86_400
    token = hook.json["webhook"]["token"]
    assert hook.json["webhook"]["url"] == f"https://kairos.example.test/v1/hooks/{token}"
    assert len(token) >= 43
    shown = api.alice.get(f"/v1/schedules/{hook.json['schedule']['id']}")
    assert token not in shown.text and "token_hash" not in shown.text


def test_preview_lists_fires_with_local_time_offset_and_fold(api: Api, world: dict[str, Any]) -> None:
    conversation = world["alice"]["conversation"]
    created = api.alice.post("/v1/schedules", {"conversation_id": conversation, "prompt": "p",
                                               "cron": "30 1 * * *", "timezone": "Europe/London",
                                               "dst_fold": "both"})
    schedule_id = created.json["schedule"]["id"]
    default = api.alice.get(f"/v1/schedules/{schedule_id}/preview")
    autumn = api.alice.get(f"/v1/schedules/{schedule_id}/preview?count=3&after=2030-10-26T12:00:00Z")

    assert len(default.json["fires"]) == 10
    assert all(datetime.fromisoformat(f["fire_at"]) > datetime.now(UTC) - timedelta(minutes=1)
               for f in default.json["fires"])
    assert autumn.json == {"fires": [
        {"fire_at": "2030-10-27T00:30:00Z", "dispatch_at": "2030-10-27T00:30:00Z", "local_time": "2030-10-27T01:30:00",
         "utc_offset": "+01:00", "fold": 0},
        {"fire_at": "2030-10-27T01:30:00Z", "dispatch_at": "2030-10-27T01:30:00Z", "local_time": "2030-10-27T01:30:00",
         "utc_offset": "+00:00", "fold": 1},
        {"fire_at": "2030-10-28T01:30:00Z", "dispatch_at": "2030-10-28T01:30:00Z", "local_time": "2030-10-28T01:30:00",
         "utc_offset": "+00:00", "fold": 0},
    ]}  # without jitter a fire is dispatched at its instant
    hook = api.alice.get(f"/v1/schedules/{world['alice']['hook']}/preview")
    assert hook.status == 200 and hook.json == {"fires": []}


def test_pause_resume_cancel(api: Api, world: dict[str, Any]) -> None:
    target = f"/v1/schedules/{world['alice']['schedule']}"
    paused = api.alice.post(f"{target}/pause")
    again = api.alice.post(f"{target}/pause")
    resumed = api.alice.post(f"{target}/resume")
    cancelled = api.alice.delete(target)
    resume_cancelled = api.alice.post(f"{target}/resume")

    assert paused.status == 200 and paused.json["schedule"]["status"] == "paused"
    assert again.status == 409 and again.error["code"] == "conflict"
    assert resumed.json["schedule"]["status"] == "active"
    assert resumed.json["schedule"]["revision"] == paused.json["schedule"]["revision"] + 1
    assert cancelled.json["schedule"]["status"] == "cancelled"
    assert resume_cancelled.status == 409
    listed = {s["id"] for s in api.alice.get("/v1/schedules").json["schedules"]}
    assert world["alice"]["schedule"] not in listed, "cancelled schedules leave the list"
    assert api.alice.get(target).status == 200, "but can still be read"


# ---- runs -------------------------------------------------------------------------------------


def test_run_events_page_after_a_sequence_with_a_capped_limit(api: Api, world: dict[str, Any]) -> None:
    run_id = uuid.UUID(world["alice"]["run"])
    database = runtime.database()
    with database.transaction() as conn:
        for _ in range(259):
            trace.append(conn, run_id, EventType.STEP_FINISHED, data={"n": 1}, step="model")
    first = api.alice.get(f"/v1/runs/{run_id}/events?limit=1000")
    second = api.alice.get(f"/v1/runs/{run_id}/events?after={first.json['next_after']}&limit=1000")
    tail = api.alice.get(f"/v1/runs/{run_id}/events?after=258&limit=5")
    end = api.alice.get(f"/v1/runs/{run_id}/events?after=260")

    assert [e["seq"] for e in first.json["events"]] == list(range(1, 201))
    assert first.json["next_after"] == 200
    assert [e["seq"] for e in second.json["events"]] == list(range(201, 261))
    assert [e["seq"] for e in tail.json["events"]] == [259, 260]
    assert end.json == {"events": [], "next_after": 260}
    assert first.json["events"][0]["type"] == "run.queued"


def test_run_output_projection_states(api: Api, world: dict[str, Any]) -> None:
    queued = api.alice.get(f"/v1/runs/{world['alice']['run']}/output")
    def without_provenance(output: dict[str, Any]) -> dict[str, Any]:  # every projection names what produced it
        assert {"schedule_revision", "agent_digest"} <= set(output), output
        return {k: v for k, v in output.items() if k not in ("schedule_revision", "agent_digest")}

    assert without_provenance(queued.json["output"]) == {"state": "empty", "reason": "queued"}

    conversation = factories.conversation(api.url, owner="alice", entries=[("user", "q"), ("assistant", "the answer")])
    schedule = factories.schedule(api.url, owner="alice", conversation_id=conversation["id"])
    at = [datetime(2030, 1, 1, tzinfo=UTC) + timedelta(hours=h) for h in range(3)]
    done = factories.run(api.url, schedule_row=schedule, state="succeeded", conversation_id=conversation["id"],
                         output={"conversation_id": str(conversation["id"]), "entry_seq": 2, "attempt": 1},
                         fire_at=at[0])
    failed = factories.run(api.url, schedule_row=schedule, state="failed", fire_at=at[1])
    gone = factories.run(api.url, schedule_row=schedule, state="succeeded", fire_at=at[2],
                         output={"conversation_id": str(conversation["id"]), "entry_seq": 99})

    available = api.alice.get(f"/v1/runs/{done['id']}/output").json["output"]
    empty = api.alice.get(f"/v1/runs/{failed['id']}/output").json["output"]
    unavailable = api.alice.get(f"/v1/runs/{gone['id']}/output").json["output"]
    assert available["state"] == "available" and available["text"] == "the answer"
    assert empty["state"] == "empty" and empty["reason"] == "failed" and empty["diagnosis"]["reason_code"]
    assert without_provenance(unavailable) == {"state": "unavailable", "reason": "source_gone"}
    assert api.bob.get(f"/v1/runs/{done['id']}/output").status == 404


def test_cancel_a_queued_run(api: Api, world: dict[str, Any]) -> None:
    run_id = world["alice"]["run"]
    cancelled = api.alice.post(f"/v1/runs/{run_id}/cancel")
    again = api.alice.post(f"/v1/runs/{run_id}/cancel")
    assert cancelled.status == again.status == 200
    assert cancelled.json["run"]["state"] == "cancelled" and again.json == cancelled.json
    types = [e["type"] for e in api.alice.get(f"/v1/runs/{run_id}/events").json["events"]]
    assert types == ["run.queued", "run.cancelled"]


# ---- the document and concurrency -----------------------------------------------------------


def spec_status(spec: RouteSpec) -> int:
    return {"POST /v1/conversations": 201, "POST /v1/schedules": 201, "POST /v1/loops": 201,
            "POST /v1/hooks/{token}": 202,
            "POST /v1/schedules/{id}/trigger": 202, "POST /v1/schedules/{id}/backfill": 202,
            "POST /v1/schedules/{id}/test": 202,
            "POST /v1/runs/{id}/retry": 202, "POST /v1/conversations/{id}/messages": 202,
            "DELETE /v1/secrets/{name}": 204, "POST /v1/runs/{id}/pause": 202,
            "POST /v1/runs/{id}/resume": 202}.get(spec.key, 200)


def test_openapi_document_describes_every_route(api: Api) -> None:
    answer = api.anonymous.get("/v1/openapi.json")
    assert answer.status == 200
    doc = answer.json
    assert doc["openapi"].startswith("3.")
    for spec in api_app.ROUTES:
        if spec.page:  # the console's static files are in the route table, not in the JSON API's document
            assert spec.path not in doc["paths"]
            continue
        operation = doc["paths"][spec.path][spec.method.lower()]
        assert [c for c in operation["responses"] if str(c).startswith("2")] == [str(spec_status(spec))]
        assert operation["responses"]["422"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
        assert ("security" in operation) is not spec.public
    body = doc["paths"]["/v1/schedules"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/ScheduleRequest"}
    assert doc["components"]["schemas"]["ScheduleRequest"]["additionalProperties"] is False
    assert "HTTPValidationError" not in json.dumps(doc["paths"])


def test_concurrent_requests_of_two_principals_never_cross(api: Api, world: dict[str, Any]) -> None:
    barrier = threading.Barrier(16)

    def read(i: int) -> tuple[str, Answer]:
        who = ("alice", "bob")[i % 2]
        barrier.wait()
        return who, ApiClient(who).get(f"/v1/runs/{world[who]['run']}")

    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = list(pool.map(read, range(16)))
    for who, answer in answers:
        assert answer.status == 200 and answer.json["run"]["id"] == world[who]["run"]


def test_webhook_url_uses_the_request_host_when_no_public_url_is_set(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a deployment without KAIROS_PUBLIC_URL (the template cannot pass the API's own URL)
    monkeypatch.delenv("KAIROS_PUBLIC_URL")
    runtime.reset()
    conversation = api.conversation()
    # When a webhook schedule is created through API Gateway's domain
    answer = api.alice.post("/v1/schedules", {"conversation_id": conversation["id"], "prompt": "p", "kind": "webhook"},
                            domain="abc123.execute-api.us-east-1.amazonaws.com")
    # Then the URL is on that domain
    assert answer.status == 201, answer.text
    url = answer.json["webhook"]["url"]
    assert url.startswith("https://abc123.execute-api.us-east-1.amazonaws.com/v1/hooks/")
