"""Usage counted call for call (kairos.budgets): a real local model server answering every call with
the same usage (120 input, 30 output tokens), and four runs that make two model calls each — one parked
for an approval, one goal-loop run parked on a question, a plain tool loop, a corpus run. The usage the
server answered must be what each run reports (GET /v1/runs/{id}), what the day reports (GET
/v1/usage) and what the ledger the daily ceilings read holds: a token ceiling just above the true total
refuses the next run before it calls the model."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from kairos.db import Database
from kairos.execution.execute import process
from kairos.settings import Settings
from kairos.tick import Tick
from tests.support.api import Api
from tests.support.corpus import EXPORTS, SOURCE, rows
from tests.support.corpus import corpus_env as corpus_env
from tests.support.corpus import s3 as s3
from tests.support.executors import FakeOpenAI, openai_agent, tool_call
from tests.support.peer import Peer, respond

IN, OUT = 120, 30
PRICES = {"gpt-e2e": (1.0, 2.0)}  # US dollars per million tokens: a call costs $0.00018
CALL_COST = Decimal("0.00018")


def settings(**more: Any) -> Settings:
    return Settings(egress_allow=("127.0.0.1",), corpus_buckets=(SOURCE,), export_bucket=EXPORTS,
                    model_prices=PRICES, **more)


def work(db: Database, run_id: uuid.UUID, **more: Any) -> Any:
    return process(db, run_id, settings=settings(**more))


def chat(api: Api, fake: FakeOpenAI, content: str = "please", corpus: Any = None, **agent: Any) -> uuid.UUID:
    created = api.alice.post("/v1/conversations", {"agent": {**openai_agent(fake), **agent}})
    assert created.status == 201, created.text
    body: dict[str, Any] = {"content": content}
    if corpus is not None:
        body["corpus"] = corpus
    turn = api.alice.post(f"/v1/conversations/{created.json['conversation']['id']}/messages", body)
    assert turn.status == 202, turn.text
    api.messages()
    return uuid.UUID(turn.json["run_id"])


def run_usage(api: Api, run_id: uuid.UUID) -> dict[str, Any]:
    answer = api.alice.get(f"/v1/runs/{run_id}")
    assert answer.status == 200, answer.text
    usage: dict[str, Any] = answer.json["run"]["usage"] or {}
    return usage


def counted(usage: dict[str, Any]) -> dict[str, Any]:
    return {k: usage.get(k) for k in ("input_tokens", "output_tokens", "calls", "tool_calls", "steps")}


def approval_run(api: Api, db: Database, fake: FakeOpenAI, target: Peer) -> uuid.UUID:
    """(a) A model turn asks for an http call the agent's policy gates: the run parks; approved, the
    resumed attempt sends it and asks the model again."""
    fake.script = [tool_call("post-1", "http_post", {"url": target.url("/hook"), "body": {"order": 42}}),
                   {"content": "Posted."}]
    run_id = chat(api, fake, tools=["http"])
    assert work(db, run_id).result == "awaiting_approval"
    # What the parked attempt spent is the run's already, before anyone decides.
    assert counted(run_usage(api, run_id)) == {"input_tokens": IN, "output_tokens": OUT, "calls": 1,
                                                "tool_calls": None, "steps": 1}
    [approval] = api.alice.get("/v1/approvals?state=pending").json["approvals"]
    assert api.alice.post(f"/v1/approvals/{approval['id']}/approve").status == 200
    assert work(db, run_id).result == "succeeded"
    assert len(target.received) == 1
    return run_id


def question_run(api: Api, db: Database, fake: FakeOpenAI) -> uuid.UUID:
    """(b) A goal-loop run reports needs_input and parks; answered, it reports continue."""
    created = api.alice.post("/v1/conversations", {"agent": openai_agent(fake)})
    loop = api.alice.post("/v1/loops", {
        "conversation_id": created.json["conversation"]["id"], "prompt": "Tidy the backlog",
        "goal": {"outcome": "No stale issues", "verification": "count stale issues: 0"},
        "interval_seconds": 3600, "ends_at": (datetime.now(UTC) + timedelta(days=7)).isoformat(),
        "max_occurrences": 10})
    assert loop.status == 201, loop.text
    loop_id = loop.json["schedule"]["id"]
    with psycopg.connect(api.url, autocommit=True) as conn:
        conn.execute("UPDATE schedules SET next_fire_at = now() - interval '1 second', "
                     "starts_at = now() - interval '1 second' WHERE id = %s", (loop_id,))
    Tick(db, api.sqs, api.queue_url, metrics=None).run()
    [fired] = rows(api.url, "SELECT id FROM runs WHERE schedule_id = %s", loop_id)
    run_id: uuid.UUID = fired["id"]
    api.messages()
    fake.script = [tool_call("ask-1", "goal_report", {"disposition": "needs_input", "summary": "Need a decision",
                                                      "question": "Close the 'maybe' issues?"})]
    assert work(db, run_id).result == "awaiting_input"
    assert counted(run_usage(api, run_id))["calls"] == 1
    [request] = api.alice.get("/v1/input-requests?state=pending").json["input_requests"]
    answered = api.alice.post(f"/v1/input-requests/{request['id']}/answer", {"answer": "Yes"})
    assert answered.status == 200, answered.text
    api.messages()
    fake.script = [tool_call("done-1", "goal_report", {"disposition": "continue", "summary": "Closed them"})]
    assert work(db, run_id).result == "succeeded"
    return run_id


def tool_loop_run(api: Api, db: Database, fake: FakeOpenAI) -> uuid.UUID:
    """(c) A chat turn whose model lists schedules through the tool, then answers."""
    fake.script = [tool_call("list-1", "schedules_list", {}), {"content": "You have none."}]
    run_id = chat(api, fake, tools=["schedules"], approval="never")
    assert work(db, run_id).result == "succeeded"
    return run_id


def corpus_run(api: Api, db: Database, fake: FakeOpenAI) -> uuid.UUID:
    """(d) A chat turn's corpus run over 20 items in partitions of 10: one model call a partition."""
    line = json.dumps({"kind": "note", "id": "n1"})
    fake.script = [{"content": line}, {"content": line}]
    run_id = chat(api, fake, content="summarise", corpus={
        "source": {"items": [f"note {i}" for i in range(20)]}, "instructions": "Extract.", "partition_size": 10})
    assert work(db, run_id).result == "succeeded"
    return run_id


def test_usage_equals_the_model_servers_answers_for_the_run_the_day_and_the_ceiling(
        api: Api, db: Database, fake_openai: FakeOpenAI, corpus_env: Any) -> None:
    fake_openai.usage = {"prompt_tokens": IN, "completion_tokens": OUT, "total_tokens": IN + OUT}
    with Peer(respond(200, '{"ok": true}')) as target:
        runs = {"approval": approval_run(api, db, fake_openai, target),
                "question": question_run(api, db, fake_openai),
                "tool_loop": tool_loop_run(api, db, fake_openai),
                "corpus": corpus_run(api, db, fake_openai)}
    answered = len(fake_openai.requests)  # every one a 200 with 120/30
    assert answered == 8

    # The run: each made two model calls; a tool call is a step, not a model call.
    for name, run_id in runs.items():
        usage = run_usage(api, run_id)
        tools = 1 if name in ("approval", "tool_loop") else None
        assert counted(usage) == {"input_tokens": 2 * IN, "output_tokens": 2 * OUT, "calls": 2,
                                  "tool_calls": tools, "steps": 2 + (tools or 0)}, name
        assert usage["prompt_tokens"] == 2 * IN and usage["completion_tokens"] == 2 * OUT, name
        assert Decimal(str(usage["cost_usd"])) == 2 * CALL_COST, name

    # The day: the sum of its runs, every run that called the model counted once.
    today = rows(api.url, "SELECT (now() AT TIME ZONE 'UTC')::date AS d")[0]["d"]
    day_answer = api.alice.get(f"/v1/usage?from={today}&until={today + timedelta(days=1)}")
    assert day_answer.status == 200, day_answer.text
    [day] = day_answer.json["days"]
    assert (day["input_tokens"], day["output_tokens"], day["calls"], day["runs"]) == (
        answered * IN, answered * OUT, answered, 4)
    assert day["calls"] == sum(run_usage(api, r)["calls"] for r in runs.values())
    assert Decimal(str(day["cost_usd"])) == answered * CALL_COST

    # The ledger the ceilings read holds the same, with nothing left reserved.
    [ledger] = rows(api.url, "SELECT * FROM usage_ledger WHERE owner = 'alice'")
    assert (ledger["input_tokens"], ledger["output_tokens"], ledger["cost_usd"]) == (
        answered * IN, answered * OUT, answered * CALL_COST)
    assert (ledger["reserved_tokens"], ledger["reserved_cost_usd"]) == (0, 0)

    # A token ceiling just above the true total: the next call's estimate (its input and the agent's
    # max_tokens, 64) cannot fit, so the run fails before the model is called.
    fake_openai.script = []
    total = answered * (IN + OUT)
    refused = chat(api, fake_openai, content="one more")
    outcome = work(db, refused, owner_daily_tokens=total + 64)
    assert (outcome.result, outcome.reason_code) == ("failed", "budget_exhausted")
    assert len(fake_openai.requests) == answered


class Crash(BaseException):
    """The worker process dies here."""


def test_a_retry_and_a_rescue_lose_nothing_the_earlier_attempts_spent(
        api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    from kairos.probes import Probes
    from kairos.tick.repair import Repair

    fake_openai.usage = {"prompt_tokens": IN, "completion_tokens": OUT, "total_tokens": IN + OUT}
    # Attempt 1: a model turn asks for schedules_list, the tool answers, the next turn gets a 503: the
    # run is requeued. Attempt 2 dies after reserving its model call, before sending it; the rescue
    # requeues the run. Attempt 3 asks the model again and publishes. Two answers carried usage.
    fake_openai.statuses = [200, 503]
    fake_openai.script = [tool_call("list-1", "schedules_list", {}), {"content": "You have none."}]
    run_id = chat(api, fake_openai, tools=["schedules"], approval="never")
    assert work(db, run_id).result == "retry"
    assert counted(run_usage(api, run_id)) == {"input_tokens": IN, "output_tokens": OUT, "calls": 1,
                                                "tool_calls": 1, "steps": 2}

    probes = Probes()

    def die(**_: Any) -> None:
        raise Crash()

    probes.on("after_reserve", die)
    with pytest.raises(Crash):
        process(db, run_id, settings=settings(), probes=probes)
    with psycopg.connect(api.url, autocommit=True) as conn:
        conn.execute("UPDATE runs SET lease_expires_at = now() - interval '1 second' WHERE id = %s", (run_id,))
    assert Repair(db, api.sqs, api.queue_url, restart_limit=5).rescue_once().requeued == 1
    api.messages()
    fake_openai.script = [{"content": "You have none."}]
    assert work(db, run_id).result == "succeeded"

    assert fake_openai.statuses == [] and len(fake_openai.requests) == 3  # 200, 503, 200
    usage = run_usage(api, run_id)
    assert counted(usage) == {"input_tokens": 2 * IN, "output_tokens": 2 * OUT, "calls": 2, "tool_calls": 1,
                              "steps": 3}
    [ledger] = rows(api.url, "SELECT * FROM usage_ledger WHERE owner = 'alice'")
    assert (ledger["input_tokens"], ledger["output_tokens"], ledger["calls"], ledger["runs"]) == (
        2 * IN, 2 * OUT, 2, 1)
    assert (ledger["reserved_tokens"], ledger["reserved_cost_usd"]) == (0, 0)


def test_a_corpus_call_whose_reply_cannot_be_stored_still_counts_what_the_model_answered(
        api: Api, db: Database, fake_openai: FakeOpenAI, corpus_env: Any) -> None:
    # The server answers (and bills) 120/30, but its text holds a NUL: the run fails unstorable_reply
    fake_openai.usage = {"prompt_tokens": IN, "completion_tokens": OUT, "total_tokens": IN + OUT}
    fake_openai.script = [{"raw": json.dumps({
        "id": "c", "object": "chat.completion", "usage": fake_openai.usage,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "bad \u0000 answer"}}]}).encode()}]
    run_id = chat(api, fake_openai, content="summarise", corpus={
        "source": {"items": [f"note {i}" for i in range(10)]}, "instructions": "Extract.", "partition_size": 10})
    outcome = work(db, run_id)
    assert (outcome.result, outcome.reason_code) == ("failed", "unstorable_reply")
    assert len(fake_openai.requests) == 1

    assert counted(run_usage(api, run_id)) == {"input_tokens": IN, "output_tokens": OUT, "calls": 1,
                                                "tool_calls": None, "steps": 1}
    [ledger] = rows(api.url, "SELECT * FROM usage_ledger WHERE owner = 'alice'")
    assert (ledger["input_tokens"], ledger["output_tokens"], ledger["calls"], ledger["runs"]) == (IN, OUT, 1, 1)
    assert (ledger["reserved_tokens"], ledger["reserved_cost_usd"]) == (0, 0)
