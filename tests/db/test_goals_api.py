"""The loop routes' validation on real PostgreSQL: every refused field is named with its rule, answered
4xx, and changes nothing; the server caps; the fixed policies that no body (create, PATCH of a loop,
POST or PATCH of a schedule) can loosen; the safe goal projection; another owner's loop and request
are the same 404 bytes as missing ones."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kairos.db import Database
from tests import factories
from tests.support.api import Api, count, rows
from tests.support.executors import FakeOpenAI, openai_agent


def conversation(api: Api, fake: FakeOpenAI, who: Any = None) -> str:
    client = who or api.alice
    created = client.post("/v1/conversations", {"agent": openai_agent(fake)})
    assert created.status == 201, created.text
    return str(created.json["conversation"]["id"])


def body(conversation_id: str, **fields: Any) -> dict[str, Any]:
    return {"conversation_id": conversation_id, "goal": {"outcome": "Ship the release notes",
                                                         "verification": "the notes page lists every merged PR"},
            "cron": "0 9 * * 1-5", "timezone": "Europe/Berlin",
            "ends_at": (datetime.now(UTC) + timedelta(days=30)).isoformat(), "max_occurrences": 40, **fields}


def refused(answer: Any) -> list[tuple[str, str]]:
    assert 400 <= answer.status < 500, answer.text
    return [(f["field"], f["rule"]) for f in answer.error["fields"]]


IN_91_DAYS = (datetime.now(UTC) + timedelta(days=91)).isoformat()


@pytest.mark.parametrize(("change", "expected"), [
    ({"catch_up": True}, ("catch_up", "loop_policy")),
    ({"overlap": "allow"}, ("overlap", "loop_policy")),
    ({"overlap": "queue_one"}, ("overlap", "loop_policy")),
    ({"overlap": "cancel_replace"}, ("overlap", "loop_policy")),
    ({"mode": "fork"}, ("mode", "loop_policy")),
    ({"backfill": {"from": "2026-01-01T00:00:00Z"}}, ("backfill", "loop_policy")),
    ({"kind": "once"}, ("kind", "loop_policy")),
    ({"kind": "webhook"}, ("kind", "loop_policy")),
    ({"agent": {"executor": "echo"}}, ("agent", "loop_policy")),
    ({"status": "active"}, ("status", "loop_policy")),
    ({"owner": "mallory"}, ("owner", "unknown_field")),
    ({"ends_at": None}, ("ends_at", "required")),
    ({"ends_at": IN_91_DAYS}, ("ends_at", "max_horizon")),
    ({"max_occurrences": None}, ("max_occurrences", "required")),
    ({"max_occurrences": 501}, ("max_occurrences", "max")),
    ({"goal": None}, ("goal", "required")),
    ({"goal": {"outcome": ""}}, ("goal.outcome", "min_length")),
    ({"goal": {"outcome": "x", "tone": "nice"}}, ("goal.tone", "unknown_field")),
    ({"cron": "61 9 * * *"}, ("cron", "cron_syntax")),
])
def test_a_refused_loop_names_the_field_and_rule_and_writes_nothing(
        api: Api, fake_openai: FakeOpenAI, change: dict[str, Any], expected: tuple[str, str]) -> None:
    conversation_id = conversation(api, fake_openai)
    payload = {k: v for k, v in {**body(conversation_id), **change}.items() if v is not None}

    answer = api.alice.post("/v1/loops", payload)

    assert expected in refused(answer)
    assert count(api, "schedules") == 0


def test_the_fixed_values_themselves_are_accepted(api: Api, fake_openai: FakeOpenAI) -> None:
    conversation_id = conversation(api, fake_openai)
    answer = api.alice.post("/v1/loops", body(conversation_id, catch_up=False, overlap="skip", mode="append"))
    assert answer.status == 201, answer.text


def test_caps_at_their_bounds_are_accepted(api: Api, fake_openai: FakeOpenAI) -> None:
    conversation_id = conversation(api, fake_openai)
    at_cap = (datetime.now(UTC) + timedelta(days=89, hours=23)).isoformat()
    answer = api.alice.post("/v1/loops", body(conversation_id, ends_at=at_cap, max_occurrences=500))
    assert answer.status == 201, answer.text
    shown = answer.json["schedule"]
    assert (shown["max_occurrences"], shown["loop"], shown["status"], shown["goal_revision"]) == (
        500, True, "active", 1)


def test_a_loop_too_frequent_is_refused_like_a_schedule(api: Api, fake_openai: FakeOpenAI) -> None:
    conversation_id = conversation(api, fake_openai)
    answer = api.alice.post("/v1/loops", body(conversation_id, cron="* * * * *"))
    assert answer.status == 422 and answer.error["code"] == "limit_exceeded"
    assert count(api, "schedules") == 0


def test_a_loop_needs_an_agent_that_calls_tools(api: Api) -> None:
    conversation_id = api.conversation()["id"]  # an echo agent
    assert ("conversation_id", "loop_agent") in refused(api.alice.post("/v1/loops", body(conversation_id)))
    assert count(api, "schedules") == 0


def test_the_api_shows_only_the_safe_goal(api: Api, fake_openai: FakeOpenAI) -> None:
    conversation_id = conversation(api, fake_openai)
    created = api.alice.post("/v1/loops", body(conversation_id)).json["schedule"]
    for shown in (created, api.alice.get(f"/v1/loops/{created['id']}").json["schedule"],
                  api.alice.get(f"/v1/schedules/{created['id']}").json["schedule"]):
        assert set(shown["goal"]) == {"outcome", "constraints", "verification_digest", "revision", "digest"}
        assert "the notes page" not in str(shown)
    [stored] = rows(api.url, "SELECT goal FROM schedules WHERE id = %(id)s", {"id": created["id"]})
    assert stored["goal"]["verification"] == "the notes page lists every merged PR"  # kept privately


def test_a_loop_can_never_be_made_through_post_schedules(api: Api, fake_openai: FakeOpenAI) -> None:
    conversation_id = conversation(api, fake_openai)
    base = {"conversation_id": conversation_id, "prompt": "p", "cron": "0 9 * * *"}
    for extra in ({"goal": {"outcome": "x"}}, {"loop": True}, {"goal_revision": 1}, {"input_run_id": None}):
        answer = api.alice.post("/v1/schedules", {**base, **extra})
        assert (next(iter(extra)), "unknown_field") in refused(answer)
    assert count(api, "schedules") == 0


def test_no_field_of_a_loop_can_be_patched_to_loosen_it(api: Api, fake_openai: FakeOpenAI) -> None:
    conversation_id = conversation(api, fake_openai)
    other = conversation(api, fake_openai)
    loop = api.alice.post("/v1/loops", body(conversation_id)).json["schedule"]
    path = f"/v1/loops/{loop['id']}"
    for patch, expected in (({"catch_up": True}, ("catch_up", "loop_policy")),
                            ({"overlap": "allow"}, ("overlap", "loop_policy")),
                            ({"mode": "fresh"}, ("mode", "loop_policy")),
                            ({"backfill": True}, ("backfill", "loop_policy")),
                            ({"kind": "once"}, ("kind", "loop_policy")),
                            ({"ends_at": IN_91_DAYS}, ("ends_at", "max_horizon")),
                            ({"ends_at": None}, ("ends_at", "required")),
                            ({"max_occurrences": 501}, ("max_occurrences", "max")),
                            ({"max_occurrences": None}, ("max_occurrences", "required")),
                            ({"conversation_id": other}, ("conversation_id", "immutable"))):
        assert expected in refused(api.alice.patch(path, patch)), patch
    assert api.alice.patch(f"/v1/schedules/{loop['id']}", {"name": "renamed"}).error["code"] == "loop_policy"
    [row] = rows(api.url, "SELECT revision, catch_up, overlap, mode, status FROM schedules WHERE id = %(id)s",
                 {"id": loop["id"]})
    assert row == {"revision": loop["revision"], "catch_up": False, "overlap": "skip", "mode": "append",
                   "status": "active"}


def test_patch_without_a_goal_keeps_the_goal_and_the_status(api: Api, fake_openai: FakeOpenAI) -> None:
    conversation_id = conversation(api, fake_openai)
    loop = api.alice.post("/v1/loops", body(conversation_id)).json["schedule"]
    edited = api.alice.patch(f"/v1/loops/{loop['id']}", {"max_occurrences": 12, "cron": "0 10 * * 1-5",
                                                         "max_delay_seconds": 900},
                             headers={"If-Match": f'"{loop["revision"]}"'})
    assert edited.status == 200, edited.text
    shown = edited.json["schedule"]
    assert (shown["status"], shown["goal_revision"], shown["max_occurrences"], shown["cron"]) == (
        "active", 1, 12, "0 10 * * 1-5")
    assert shown["revision"] == loop["revision"] + 1 and shown["max_delay_seconds"] == 900
    stale = api.alice.patch(f"/v1/loops/{loop['id']}", {"max_occurrences": 13},
                            headers={"If-Match": f'"{loop["revision"]}"'})
    assert stale.status == 412
    same = api.alice.patch(f"/v1/loops/{loop['id']}", {"goal": {
        "outcome": "Ship  the release notes", "verification": "the notes page lists every merged PR"}})
    assert same.json["schedule"]["status"] == "active"  # the same goal, normalized: not a revision of it


def test_a_new_goal_puts_the_loop_in_draft_until_resume(api: Api, fake_openai: FakeOpenAI) -> None:
    conversation_id = conversation(api, fake_openai)
    loop = api.alice.post("/v1/loops", body(conversation_id)).json["schedule"]
    edited = api.alice.patch(f"/v1/loops/{loop['id']}", {"goal": {"outcome": "Ship the changelog"}}).json["schedule"]
    assert (edited["status"], edited["goal_revision"], edited["goal"]["revision"]) == (
        "draft", edited["revision"], edited["revision"])
    [revision] = rows(api.url, "SELECT definition FROM schedule_revisions WHERE schedule_id = %(id)s "
                               "AND revision = %(r)s", {"id": loop["id"], "r": edited["revision"]})
    assert revision["definition"]["goal"]["outcome"] == "Ship the changelog"  # every goal is kept
    assert api.alice.post(f"/v1/schedules/{loop['id']}/pause").status == 409  # draft is not active
    resumed = api.alice.post(f"/v1/schedules/{loop['id']}/resume")
    assert resumed.status == 200 and resumed.json["schedule"]["status"] == "active"


def test_a_completed_or_cancelled_loop_cannot_be_edited(api: Api, fake_openai: FakeOpenAI) -> None:
    conversation_id = conversation(api, fake_openai)
    loop = api.alice.post("/v1/loops", body(conversation_id)).json["schedule"]
    assert api.alice.delete(f"/v1/schedules/{loop['id']}").status == 200
    answer = api.alice.patch(f"/v1/loops/{loop['id']}", {"goal": {"outcome": "x"}})
    assert answer.status == 409 and ("status", "editable") in refused(answer)


def test_another_owners_loop_and_request_are_the_same_404_bytes(
        api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    conversation_id = conversation(api, fake_openai)
    loop = api.alice.post("/v1/loops", body(conversation_id)).json["schedule"]
    plain = api.alice.post("/v1/schedules", {"conversation_id": conversation_id, "prompt": "p",
                                             "cron": "0 9 * * *"}).json["schedule"]
    missing = str(uuid.uuid4())
    for method, template, payload in (("GET", "/v1/loops/{}", None),
                                      ("PATCH", "/v1/loops/{}", {"goal": {"outcome": "mine now"}})):
        foreign = api.bob(method, template.format(loop["id"]), payload)
        absent = api.bob(method, template.format(missing), payload)
        assert foreign.status == absent.status == 404 and foreign.text == absent.text
        not_a_loop = api.alice(method, template.format(plain["id"]), payload)
        mine_absent = api.alice(method, template.format(missing), payload)
        assert not_a_loop.status == 404 and not_a_loop.text == mine_absent.text
    answer_foreign = api.bob.post(f"/v1/input-requests/{missing}/answer", {"answer": "x"})
    answer_garbage = api.bob.post("/v1/input-requests/not-a-uuid/answer", {"answer": "x"})
    assert answer_foreign.status == answer_garbage.status == 404 and answer_foreign.text == answer_garbage.text
    assert api.bob.get("/v1/input-requests").json["input_requests"] == []
    assert rows(api.url, "SELECT goal ->> 'outcome' AS outcome FROM schedules WHERE id = %(id)s",
                {"id": loop["id"]}) == [{"outcome": "Ship the release notes"}]


def test_an_answer_body_is_strict(api: Api) -> None:
    missing = str(uuid.uuid4())
    for payload, field in (({}, "answer"), ({"answer": ""}, "answer"), ({"answer": "x", "run_id": "y"}, "run_id")):
        answer = api.alice.post(f"/v1/input-requests/{missing}/answer", payload)
        assert answer.status == 422 and field in [f["field"] for f in answer.error["fields"]], answer.text
    assert api.alice.get("/v1/input-requests?state=bogus").status == 422


def test_a_retried_create_with_its_idempotency_key_makes_one_loop(api: Api, fake_openai: FakeOpenAI) -> None:
    conversation_id = conversation(api, fake_openai)
    payload = body(conversation_id)
    first = api.alice.post("/v1/loops", payload, headers={"Idempotency-Key": "loop-1"})
    again = api.alice.post("/v1/loops", payload, headers={"Idempotency-Key": "loop-1"})
    other = api.alice.post("/v1/loops", {**payload, "max_occurrences": 3}, headers={"Idempotency-Key": "loop-1"})
    assert (first.status, again.status, other.status) == (201, 201, 422)
    assert first.json == again.json and count(api, "schedules") == 1


def test_a_loop_runs_diagnosis_never_offers_the_retry_the_api_refuses(api: Api) -> None:
    # A loop's run and a plain schedule's run, both failed by a retry-eligible peer error (as stored)
    diagnosis = {"summary": "The agent's endpoint answered with an error.", "scope": "target",
                 "reason_code": "peer_error", "retry_eligible": True,
                 "recovery_actions": ["retry_run", "check_target"]}
    loop = factories.loop(api.url, owner="alice", conversation_id=factories.conversation(api.url, owner="alice")["id"])
    plain = factories.schedule(api.url, owner="alice")
    loop_run = factories.run(api.url, schedule_row=loop, state="failed", diagnosis=diagnosis)
    plain_run = factories.run(api.url, schedule_row=plain, state="failed", diagnosis=diagnosis)

    # The loop's run is not retried by hand ...
    refused = api.alice.post(f"/v1/runs/{loop_run['id']}/retry")
    assert refused.status == 409 and refused.error["code"] == "loop_policy", refused.text
    # ... so no read of it offers retry_run (the console draws a button per action); the rest stands
    for shown in (api.alice.get(f"/v1/runs/{loop_run['id']}").json["run"]["diagnosis"],
                  *[r["diagnosis"] for r in api.alice.get(f"/v1/runs?schedule_id={loop['id']}").json["runs"]],
                  api.alice.get(f"/v1/runs/{loop_run['id']}/output").json["output"]["diagnosis"],
                  api.alice.post(f"/v1/runs/{loop_run['id']}/cancel").json["run"]["diagnosis"]):
        assert shown == {**diagnosis, "recovery_actions": ["check_target"], "actions": [
            {"action": "check_target", "method": "PATCH", "path": f"/v1/schedules/{loop['id']}",
             "field": "agent.base_url"}]}, shown
    # while a plain schedule's run keeps it, and its retry is taken
    plain_shown = api.alice.get(f"/v1/runs/{plain_run['id']}").json["run"]["diagnosis"]
    assert {k: v for k, v in plain_shown.items() if k != "actions"} == diagnosis
    assert [a["action"] for a in plain_shown["actions"]] == ["retry_run", "check_target"]
    assert api.alice.post(f"/v1/runs/{plain_run['id']}/retry").status == 202
