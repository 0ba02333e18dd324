"""The tool loop on real PostgreSQL with a real local model server (chat-completions tool calls) and a
real local HTTP target: schedules made from a chat turn under the API's limits and refused from
scheduled work; an http call parked for approval with no worker held, applied exactly once after the
approval; approvals raced, denied and expired; a crash after the approved call never repeating it."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from kairos.db import Database
from kairos.execution.execute import process
from kairos.tick import Tick
from tests import factories
from tests.support.api import Api
from tests.support.executors import OPENAI_SETTINGS, FakeOpenAI, openai_agent, tool_call
from tests.support.peer import Peer, respond


def rows(url: str, query: str, *args: Any) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        return conn.execute(query, args).fetchall()


def run_row(url: str, run_id: object) -> dict[str, Any]:
    [row] = rows(url, "SELECT * FROM runs WHERE id = %s", run_id)
    return row


def chat(api: Api, fake: FakeOpenAI, *, content: str = "please", **agent: Any) -> tuple[str, uuid.UUID]:
    created = api.alice.post("/v1/conversations", {"agent": {**openai_agent(fake), **agent}})
    assert created.status == 201, created.text
    conversation_id = created.json["conversation"]["id"]
    turn = api.alice.post(f"/v1/conversations/{conversation_id}/messages", {"content": content})
    assert turn.status == 202, turn.text
    api.messages()
    return conversation_id, uuid.UUID(turn.json["run_id"])


def work(db: Database, run_id: uuid.UUID, **kwargs: Any) -> Any:
    return process(db, run_id, settings=OPENAI_SETTINGS, **kwargs)


# --- the schedules tool ------------------------------------------------------------------------------


def test_a_chat_turn_creates_a_schedule_through_the_tool(api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    fake_openai.script = [
        tool_call("call-1", "schedules_create", {"prompt": "Brief me", "cron": "0 7 * * 1-5",
                                                 "timezone": "Europe/Berlin"}),
        {"content": "Scheduled for weekdays at 07:00."},
    ]
    conversation_id, run_id = chat(api, fake_openai, tools=["schedules"], approval="never")

    outcome = work(db, run_id)

    assert outcome.result == "succeeded"
    [schedule] = rows(api.url, "SELECT * FROM schedules WHERE conversation_id = %s", conversation_id)
    assert (schedule["cron"], schedule["timezone"], schedule["prompt"]) == ("0 7 * * 1-5", "Europe/Berlin", "Brief me")
    first, second = fake_openai.bodies()
    assert {t["function"]["name"] for t in first["tools"]} == {"schedules_create", "schedules_list",
                                                               "schedules_cancel"}
    tool_message = second["messages"][-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "call-1"
    assert json.loads(tool_message["content"])["schedule"]["id"] == str(schedule["id"])
    assert second["messages"][-2]["tool_calls"][0]["function"]["name"] == "schedules_create"
    steps = rows(api.url, "SELECT n, kind, name, state FROM run_steps WHERE run_id = %s ORDER BY n", run_id)
    assert [(s["n"], s["kind"], s["name"], s["state"]) for s in steps] == [
        (1, "model", "gpt-e2e", "succeeded"), (2, "tool", "schedules_create", "succeeded"),
        (3, "model", "gpt-e2e", "succeeded")]
    kinds = rows(api.url, "SELECT kind, state FROM effects WHERE run_id = %s ORDER BY created_at", run_id)
    assert sorted((k["kind"], k["state"]) for k in kinds) == [
        ("model_call", "settled"), ("model_call", "settled"), ("tool_call", "settled")]
    entries = api.alice.get(f"/v1/conversations/{conversation_id}").json["conversation"]["entries"]
    assert entries[-1]["content"] == "Scheduled for weekdays at 07:00."


def test_the_eleventh_schedule_is_refused_to_the_model_as_a_tool_error(
        api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    fake_openai.script = [tool_call("c1", "schedules_create", {"prompt": "one more", "cron": "0 9 * * *"}),
                          {"content": "I could not."}]
    conversation_id, run_id = chat(api, fake_openai, tools=["schedules"], approval="never")
    for hour in range(10):
        factories.schedule(api.url, conversation_id=uuid.UUID(conversation_id), cron=f"0 {hour} * * *")

    assert work(db, run_id).result == "succeeded"

    answer = json.loads(fake_openai.bodies()[1]["messages"][-1]["content"])
    assert answer["error"]["code"] == "limit_exceeded"
    assert answer["error"]["fields"][0]["rule"] == "max_per_conversation"
    assert len(rows(api.url, "SELECT 1 FROM schedules WHERE conversation_id = %s", conversation_id)) == 10


def test_the_schedules_tool_is_refused_in_scheduled_work(api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    fake_openai.script = [tool_call("c1", "schedules_create", {"prompt": "recurse", "cron": "0 9 * * *"}),
                          {"content": "Not allowed."}]
    created = api.alice.post("/v1/conversations", {"agent": {**openai_agent(fake_openai), "tools": ["schedules"],
                                                             "approval": "never"}})
    conversation_id = created.json["conversation"]["id"]
    schedule = api.alice.post("/v1/schedules", {"conversation_id": conversation_id, "prompt": "daily",
                                                "cron": "0 9 * * *", "mode": "append"}).json["schedule"]
    triggered = api.alice.post(f"/v1/schedules/{schedule['id']}/trigger").json["run_id"]

    assert work(db, uuid.UUID(triggered)).result == "succeeded"

    answer = json.loads(fake_openai.bodies()[1]["messages"][-1]["content"])
    assert answer["error"]["code"] == "scheduling_not_allowed"
    assert len(rows(api.url, "SELECT 1 FROM schedules WHERE conversation_id = %s", conversation_id)) == 1


@pytest.mark.parametrize(("arguments", "field", "rule"), [
    ({"prompt": "p", "kind": "webhook"}, "kind", "enum"),
    ({"prompt": "p", "cron": "0 9 * * *", "mode": "fresh", "agent": {"executor": "echo", "approval": "never",
                                                                    "tools": ["http"]}}, "agent", "unknown_field"),
    ({"prompt": "p", "cron": "0 9 * * *", "corpus": {"source": {"items": ["a"]}, "instructions": "x"}},
     "corpus", "unknown_field"),
    ({"prompt": "p", "cron": "0 9 * * *", "catch_up": True}, "catch_up", "unknown_field"),
    ({"prompt": "p", "interval_seconds": "3600"}, "interval_seconds", "type"),
    ({"cron": "0 9 * * *"}, "prompt", "required"),
])
def test_the_schedules_tool_takes_exactly_its_declared_schema(
        api: Api, db: Database, fake_openai: FakeOpenAI, arguments: dict[str, Any], field: str, rule: str) -> None:
    # Given a chat model that asks for what the API offers a person but the tool's schema does not
    fake_openai.script = [tool_call("c1", "schedules_create", arguments), {"content": "I could not."}]
    conversation_id, run_id = chat(api, fake_openai, tools=["schedules"], approval="never")

    assert work(db, run_id).result == "succeeded"

    # Then the model gets a tool error naming the field, and nothing is made
    answer = json.loads(fake_openai.bodies()[1]["messages"][-1]["content"])
    assert answer["error"]["code"] == "validation_failed"
    assert {"field": field, "rule": rule} in [{k: f[k] for k in ("field", "rule")} for f in answer["error"]["fields"]]
    assert rows(api.url, "SELECT 1 FROM schedules WHERE conversation_id = %s", conversation_id) == []


def test_the_loop_is_bounded_by_max_steps(api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    fake_openai.script = [tool_call(f"c{i}", "schedules_list", {}) for i in range(5)]
    _, run_id = chat(api, fake_openai, tools=["schedules"], approval="never", max_steps=2)

    outcome = work(db, run_id)

    assert outcome.result == "failed" and outcome.reason_code == "step_limit"
    assert len(fake_openai.requests) == 2
    # The trace stays well formed: every step opened is closed exactly once, in order.
    events = rows(api.url, "SELECT type, step FROM run_events WHERE run_id = %s AND type LIKE 'step.%%' "
                           "ORDER BY seq", run_id)
    opened: list[str] = []
    for event in events:
        if event["type"] == "step.started":
            assert not opened, events
            opened.append(event["step"])
        else:
            assert opened == [event["step"]], events
            opened.clear()
    assert opened == [] and len(events) == 8  # model, tool:2, model:3, tool:4 — each started and finished


# --- approvals -----------------------------------------------------------------------------------------


@pytest.fixture
def target() -> Any:
    with Peer(respond(200, '{"ok": true}')) as peer:
        yield peer


def parked(api: Api, db: Database, fake: FakeOpenAI, target: Peer) -> tuple[uuid.UUID, dict[str, Any]]:
    fake.script = [tool_call("post-1", "http_post", {"url": target.url("/hook"), "body": {"order": 42}}),
                   {"content": "Posted."}]
    _, run_id = chat(api, fake, tools=["http"])
    outcome = work(db, run_id)
    assert outcome.result == "awaiting_approval"
    [approval] = rows(api.url, "SELECT * FROM approvals WHERE run_id = %s", run_id)
    return run_id, approval


def test_an_http_call_waits_for_approval_without_a_worker_and_is_applied_exactly_once(
        api: Api, db: Database, fake_openai: FakeOpenAI, target: Peer) -> None:
    run_id, approval = parked(api, db, fake_openai, target)

    run = run_row(api.url, run_id)
    assert run["state"] == "awaiting_approval" and run["lease_token"] is None and run["lease_expires_at"] is None
    assert approval["state"] == "pending" and approval["tool"] == "http_post" and target.received == []
    listed = api.alice.get("/v1/approvals?state=pending").json["approvals"]
    assert [a["id"] for a in listed] == [str(approval["id"])]
    assert json.loads(listed[0]["preview"]["arguments"])["body"] == {"order": 42}
    notes = [n["kind"] for n in api.alice.get(f"/v1/conversations/{run['source_conversation_id']}/inbox")
             .json["notes"]]
    assert "approval_requested" in notes

    approved = api.alice.post(f"/v1/approvals/{approval['id']}/approve")

    assert approved.status == 200 and approved.json["approval"]["state"] == "approved"
    assert [m["run_id"] for m in api.messages()] == [str(run_id)]
    assert work(db, run_id).result == "succeeded"
    assert len(target.received) == 1 and json.loads(target.received[0].body) == {"order": 42}
    assert len(fake_openai.requests) == 2  # the first turn was folded, not asked again
    assert rows(api.url, "SELECT state FROM approvals WHERE id = %s", approval["id"]) == [{"state": "applied"}]
    assert run_row(api.url, run_id)["attempt"] == 2
    types = [r["type"] for r in rows(api.url, "SELECT type FROM run_events WHERE run_id = %s ORDER BY seq", run_id)]
    assert "approval.waiting" in types and "approval.approved" in types and types[-1] == "run.succeeded"


def test_a_long_body_does_not_hide_where_an_approved_call_goes(
        api: Api, db: Database, fake_openai: FakeOpenAI, target: Peer) -> None:
    import hashlib

    from kairos.executors.base import canonical_json

    # Given an http call whose body ("a…" sorts before "url") is longer than the preview's bound
    url = target.url("/exfiltrate?to=somewhere-else")
    body = {"a_note": "x" * 2_500, "order": 42}
    fake_openai.script = [tool_call("post-1", "http_post", {"url": url, "body": body}), {"content": "Posted."}]
    _, run_id = chat(api, fake_openai, tools=["http"])
    assert work(db, run_id).result == "awaiting_approval"
    [approval] = rows(api.url, "SELECT id FROM approvals WHERE run_id = %s", run_id)

    # When the approver reads the request
    shown = api.alice.get(f"/v1/approvals/{approval['id']}")

    # Then the target is there whole and first, and only the body is cut, with its size and digest
    assert shown.status == 200, shown.text
    preview = shown.json["approval"]["preview"]
    assert preview["target"] == {"method": "POST", "url": url}
    assert preview["arguments"].startswith(f'{{"url": "{url}", "body": {{"a_note": "xxx')
    assert preview["truncated"] is True and len(preview["arguments"]) < 2_200
    sent = canonical_json(body)
    assert preview["body"] == {"bytes": len(sent), "sha256": hashlib.sha256(sent).hexdigest(), "truncated": True}


def test_an_approval_given_after_the_runs_delivery_deadline_still_applies_the_call(
        api: Api, db: Database, fake_openai: FakeOpenAI, target: Peer) -> None:
    # A scheduled run without catch-up carries expires_at (fire + max delay); it started on time.
    run_id, approval = parked(api, db, fake_openai, target)
    with psycopg.connect(api.url, autocommit=True) as conn:
        conn.execute("UPDATE runs SET expires_at = now() - interval '1 hour' WHERE id = %s", (run_id,))

    assert api.alice.post(f"/v1/approvals/{approval['id']}/approve").status == 200

    assert work(db, run_id).result == "succeeded"
    assert len(target.received) == 1 and run_row(api.url, run_id)["expires_at"] is None


def test_two_approvers_race_and_one_wins(api: Api, db: Database, fake_openai: FakeOpenAI, target: Peer) -> None:
    _, approval = parked(api, db, fake_openai, target)
    start = threading.Barrier(2)
    statuses: list[int] = []

    def decide(verb: str) -> None:
        start.wait(timeout=10)
        statuses.append(api.alice.post(f"/v1/approvals/{approval['id']}/{verb}").status)

    threads = [threading.Thread(target=decide, args=(verb,)) for verb in ("approve", "deny")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(statuses) == [200, 409]


def test_a_cancel_retires_the_request_and_a_late_approval_changes_nothing(
        api: Api, db: Database, fake_openai: FakeOpenAI, target: Peer) -> None:
    run_id, approval = parked(api, db, fake_openai, target)
    assert api.alice.post(f"/v1/runs/{run_id}/cancel").json["run"]["state"] == "cancelled"
    late = api.alice.post(f"/v1/approvals/{approval['id']}/approve")
    assert late.status == 409
    assert rows(api.url, "SELECT state FROM approvals WHERE id = %s", approval["id"]) == [{"state": "retired"}]
    assert run_row(api.url, run_id)["state"] == "cancelled" and target.received == []


def test_denial_and_expiry_end_the_run_policy_blocked(
        api: Api, db: Database, fake_openai: FakeOpenAI, target: Peer) -> None:
    denied_run, denied = parked(api, db, fake_openai, target)
    assert api.alice.post(f"/v1/approvals/{denied['id']}/deny").status == 200
    run = run_row(api.url, denied_run)
    assert (run["state"], run["diagnosis"]["reason_code"]) == ("policy_blocked", "approval_denied")

    fake_openai.requests.clear()
    expired_run, expiring = parked(api, db, fake_openai, target)
    with psycopg.connect(api.url, autocommit=True) as conn:
        conn.execute("UPDATE approvals SET expires_at = now() - interval '1 second' WHERE id = %s", (expiring["id"],))
    report = Tick(db, api.sqs, api.queue_url, metrics=None).run()
    assert report.approvals_expired == 1
    run = run_row(api.url, expired_run)
    assert (run["state"], run["diagnosis"]["reason_code"]) == ("policy_blocked", "approval_expired")
    assert api.alice.post(f"/v1/approvals/{expiring['id']}/approve").status == 409
    assert target.received == []


def test_another_owners_approval_is_the_same_404_as_a_missing_one(
        api: Api, db: Database, fake_openai: FakeOpenAI, target: Peer) -> None:
    _, approval = parked(api, db, fake_openai, target)
    for path in (f"/v1/approvals/{approval['id']}", f"/v1/approvals/{approval['id']}/approve"):
        method = "GET" if path.count("/") == 3 else "POST"
        foreign = api.bob(method, path)
        missing = api.bob(method, path.replace(str(approval["id"]), str(uuid.uuid4())))
        assert foreign.status == missing.status == 404 and foreign.text == missing.text
    assert api.bob.get("/v1/approvals").json["approvals"] == []
    assert rows(api.url, "SELECT state FROM approvals WHERE id = %s", approval["id"]) == [{"state": "pending"}]


class Crash(BaseException):
    """The worker dies right after the approved call went out (not an Exception: nothing catches it)."""


def test_a_crash_after_the_approved_call_never_repeats_it(
        api: Api, db: Database, fake_openai: FakeOpenAI, target: Peer) -> None:
    from kairos.probes import Probes

    run_id, approval = parked(api, db, fake_openai, target)
    assert api.alice.post(f"/v1/approvals/{approval['id']}/approve").status == 200

    def crash(**_: Any) -> None:
        raise Crash()

    with pytest.raises(Crash):
        work(db, run_id, probes=Probes().on("after_send", crash))
    assert len(target.received) == 1
    with psycopg.connect(api.url, autocommit=True) as conn:  # the dead worker's lease runs out
        conn.execute("UPDATE runs SET lease_expires_at = now() - interval '1 second' WHERE id = %s", (run_id,))
    Tick(db, api.sqs, api.queue_url, metrics=None).run(now=datetime.now(UTC) + timedelta(seconds=1))

    run = run_row(api.url, run_id)
    assert run["state"] in ("failed", "abandoned") and run["diagnosis"]["reason_code"] == "ambiguous_effect"
    assert work(db, run_id).result != "succeeded"
    assert len(target.received) == 1


def test_a_bedrock_agent_runs_the_same_loop_through_converse(api: Api, db: Database) -> None:
    import boto3
    from botocore.stub import Stubber

    from kairos.executors.bedrock import BedrockExecutor

    created = api.alice.post("/v1/conversations", {"agent": {
        "executor": "bedrock", "model": "anthropic.claude-3-haiku-20240307-v1:0", "tools": ["schedules"],
        "approval": "never", "stream": False}})  # Converse answered whole (ConverseStream: test_bedrock_executor)
    conversation_id = created.json["conversation"]["id"]
    run_id = uuid.UUID(api.alice.post(f"/v1/conversations/{conversation_id}/messages",
                                      {"content": "every morning at 8, please"}).json["run_id"])
    client = boto3.client("bedrock-runtime", region_name="eu-central-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing", endpoint_url="https://bedrock-runtime.test")
    usage = {"inputTokens": 20, "outputTokens": 5, "totalTokens": 25}
    with Stubber(client) as stub:  # every request is checked against the Converse service model
        stub.add_response("converse", {
            "output": {"message": {"role": "assistant", "content": [{"toolUse": {
                "toolUseId": "tu-1", "name": "schedules_create",
                "input": {"prompt": "Good morning", "cron": "0 8 * * *", "timezone": "Europe/Paris"}}}]}},
            "stopReason": "tool_use", "usage": usage, "metrics": {"latencyMs": 1}})
        stub.add_response("converse", {
            "output": {"message": {"role": "assistant", "content": [{"text": "Done: every day at 08:00."}]}},
            "stopReason": "end_turn", "usage": usage, "metrics": {"latencyMs": 1}})
        executor = BedrockExecutor(client)
        outcome = process(db, run_id, settings=OPENAI_SETTINGS, executor_factory=lambda name, **_: executor)
        stub.assert_no_pending_responses()

    assert outcome.result == "succeeded"
    [schedule] = rows(api.url, "SELECT cron, timezone FROM schedules WHERE conversation_id = %s", conversation_id)
    assert schedule == {"cron": "0 8 * * *", "timezone": "Europe/Paris"}
    entries = api.alice.get(f"/v1/conversations/{conversation_id}").json["conversation"]["entries"]
    assert entries[-1]["content"] == "Done: every day at 08:00."


def test_a_turn_asking_for_too_many_or_too_large_calls_is_a_malformed_reply(
        api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    many = {"tool_calls": [tool_call(f"c{i}", "schedules_list", {})["tool_calls"][0] for i in range(9)]}
    huge = tool_call("big", "schedules_create", {"prompt": "x" * 20_000})
    for script in (many, huge):
        fake_openai.script = [script]
        _, run_id = chat(api, fake_openai, tools=["schedules"], approval="never")
        outcome = work(db, run_id)
        assert (outcome.result, outcome.reason_code) == ("failed", "malformed_reply")
        # the turn is shown failed, and nothing is kept for a later attempt to fold
        assert rows(api.url, "SELECT state, record FROM run_steps WHERE run_id = %s", run_id) == [
            {"state": "failed", "record": None}]


# --- retention ------------------------------------------------------------------------------------------


def test_retention_forgets_an_old_runs_step_log_and_approval_preview_and_keeps_a_recent_runs(
        api: Api, db: Database, fake_openai: FakeOpenAI, target: Peer) -> None:
    from kairos.tick.prune import Prune

    # Given a run whose approved http call was applied (its step log holds the model's turns and the
    # call's arguments and answer; its approval a preview of the arguments), ended 31 days ago
    old, approval = parked(api, db, fake_openai, target)
    assert api.alice.post(f"/v1/approvals/{approval['id']}/approve").status == 200
    assert work(db, old).result == "succeeded"
    # and a run that ended today with a step log of its own
    fake_openai.script = [tool_call("c1", "schedules_list", {}), {"content": "Listed."}]
    _, recent = chat(api, fake_openai, tools=["schedules"], approval="never")
    assert work(db, recent).result == "succeeded"
    recent_steps = rows(api.url, "SELECT * FROM run_steps WHERE run_id = %s ORDER BY n", recent)
    old_steps = rows(api.url, "SELECT record FROM run_steps WHERE run_id = %s", old)
    assert any("order" in json.dumps(s["record"]) for s in old_steps), "the call's arguments are in the log"
    reservations = {run: len(rows(api.url, "SELECT 1 FROM usage_reservations WHERE run_id = %s", run))
                    for run in (old, recent)}
    assert reservations[old] == 2 and reservations[recent] == 2  # one a model call
    ledger = rows(api.url, "SELECT * FROM usage_ledger ORDER BY owner, day")
    factories.ended_ago(api.url, old)
    factories.ended_ago(api.url, recent, days=0)  # ended today, settled

    # When the pruner passes
    report = Prune(db).run_once()

    # Then the old run's step log is forgotten (what each step was stays) and its approval shows the
    # tool but no arguments
    assert (report.runs, report.steps, report.previews, report.reservations) == (1, len(old_steps), 1, 2)
    forgotten = rows(api.url, "SELECT record, input, output, pruned_at, kind, state FROM run_steps "
                              "WHERE run_id = %s ORDER BY n", old)
    assert len(forgotten) == len(old_steps)
    assert all(s["record"] is None and s["input"] is None and s["output"] is None and s["pruned_at"] is not None
               for s in forgotten)
    assert [s["kind"] for s in forgotten] == ["model", "tool", "model"]
    # and its settled budget reservations are gone while the daily ledger's totals stay
    assert rows(api.url, "SELECT 1 FROM usage_reservations WHERE run_id = %s", old) == []
    assert len(rows(api.url, "SELECT 1 FROM usage_reservations WHERE run_id = %s", recent)) == 2
    assert rows(api.url, "SELECT * FROM usage_ledger ORDER BY owner, day") == ledger
    shown = api.alice.get(f"/v1/approvals/{approval['id']}").json["approval"]
    assert shown["preview"] == {"tool": "http_post", "pruned": True}
    assert (shown["state"], shown["args_digest"]) == ("applied", approval["args_digest"])
    # and the recent run keeps its log; a second pass forgets nothing more
    assert rows(api.url, "SELECT * FROM run_steps WHERE run_id = %s ORDER BY n", recent) == recent_steps
    assert Prune(db).run_once() == type(report)()
