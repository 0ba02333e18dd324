"""Limits you can act on, on real PostgreSQL through the public handlers: a schedule's (and a conversation
agent's) ``limits`` set on create and PATCH (a new revision), refused beyond the server's caps naming the
field, shown with the schedule, and read by the run worker, the retry's attempt limit, the tool loop and
the webhook intake — a raised limit takes effect on the next run. And what produced an answer: every run
and its output carry ``schedule_revision`` and ``agent_digest``."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from kairos import cli, runs, runtime
from kairos.db import Database
from kairos.execution.execute import process
from kairos.executors.base import ExecutorError, PreparedCall, Reply
from kairos.settings import Settings
from tests.support.api import Api, hook
from tests.support.executors import (
    OPENAI_SETTINGS,
    FakeOpenAI,
    ScriptedExecutor,
    openai_agent,
    raising,
    tool_call,
)


def rows(url: str, query: str, *args: Any) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        return conn.execute(query, args).fetchall()


def hourly(api: Api, **fields: Any) -> dict[str, Any]:
    conversation = api.conversation()
    answer = api.alice.post("/v1/schedules", {"conversation_id": conversation["id"], "prompt": "p",
                                              "cron": "0 * * * *", **fields})
    assert answer.status == 201, answer.text
    return dict(answer.json["schedule"])


def trigger(api: Api, schedule: dict[str, Any]) -> uuid.UUID:
    answer = api.alice.post(f"/v1/schedules/{schedule['id']}/trigger")
    assert answer.status == 202, answer.text
    return uuid.UUID(answer.json["run_id"])


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def problems(answer: Any) -> set[tuple[str, str]]:
    return {(f["field"], f["rule"]) for f in answer.error["fields"]}


# --- set, shown, kept per revision ---------------------------------------------------------------


def test_limits_are_set_on_create_merged_by_patch_shown_and_kept_with_each_revision(api: Api) -> None:
    schedule = hourly(api, limits={"runtime_seconds": 120})
    assert schedule["limits"] == {"runtime_seconds": 120}

    edited = api.alice.patch(f"/v1/schedules/{schedule['id']}", {"limits": {"max_attempts": 5}})

    assert edited.status == 200, edited.text
    assert edited.json["schedule"]["limits"] == {"runtime_seconds": 120, "max_attempts": 5}
    assert edited.json["schedule"]["revision"] == 2
    # null inside the object resets that limit (RFC 7396), null for the object resets them all
    reset_one = api.alice.patch(f"/v1/schedules/{schedule['id']}", {"limits": {"runtime_seconds": None}})
    assert reset_one.json["schedule"]["limits"] == {"max_attempts": 5}
    reset_all = api.alice.patch(f"/v1/schedules/{schedule['id']}", {"limits": None})
    assert reset_all.json["schedule"]["limits"] is None
    kept = rows(api.url, "SELECT revision, definition->'limits' AS limits FROM schedule_revisions "
                         "WHERE schedule_id = %s ORDER BY revision", schedule["id"])
    assert [(r["revision"], r["limits"]) for r in kept] == [
        (1, {"runtime_seconds": 120}), (2, {"runtime_seconds": 120, "max_attempts": 5}), (3, {"max_attempts": 5}),
        (4, None)]
    assert api.alice.get(f"/v1/schedules/{schedule['id']}").json["schedule"]["limits"] is None


def test_a_limit_beyond_the_cap_is_422_naming_the_field_and_nothing_is_written(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    conversation = api.conversation()
    body = {"conversation_id": conversation["id"], "prompt": "p", "cron": "0 * * * *"}

    over = api.alice.post("/v1/schedules", {**body, "limits": {"runtime_seconds": 841, "max_attempts": 11,
                                                               "max_steps": 65}})

    assert over.status == 422, over.text
    assert problems(over) == {("limits.runtime_seconds", "server_cap"), ("limits.max_attempts", "server_cap"),
                              ("limits.max_steps", "server_cap")}
    assert "KAIROS_MAX_RUNTIME_SECONDS" in str(over.error["fields"])
    assert rows(api.url, "SELECT count(*) AS n FROM schedules")[0]["n"] == 0
    # The shape is strict too: a bad type, a bound, an unknown limit, a rate on a timed schedule
    shaped = api.alice.post("/v1/schedules", {**body, "limits": {"runtime_seconds": "60", "max_attempts": 0,
                                                                 "tokens": 5}})
    assert shaped.status == 422 and {f for f, _ in problems(shaped)} == {
        "limits.runtime_seconds", "limits.max_attempts", "limits.tokens"}, shaped.text
    rate = api.alice.post("/v1/schedules", {**body, "limits": {"rate_per_minute": 5}})
    assert rate.status == 422 and problems(rate) == {("limits.rate_per_minute", "not_for_kind")}, rate.text

    # The cap is the server's setting: lowered, a PATCH above it is refused and the revision stays
    schedule = hourly(api, limits={"runtime_seconds": 300})
    monkeypatch.setenv("KAIROS_MAX_RUNTIME_SECONDS", "200")
    runtime.reset()
    refused = api.alice.patch(f"/v1/schedules/{schedule['id']}", {"limits": {"runtime_seconds": 250}})
    assert refused.status == 422 and problems(refused) == {("limits.runtime_seconds", "server_cap")}
    assert api.alice.get(f"/v1/schedules/{schedule['id']}").json["schedule"]["revision"] == 1
    taken = api.alice.patch(f"/v1/schedules/{schedule['id']}", {"limits": {"runtime_seconds": 200}})
    assert taken.status == 200 and taken.json["schedule"]["limits"] == {"runtime_seconds": 200}
    # And a conversation's agent is held to the same caps
    agent = api.alice.post("/v1/conversations", {"agent": {"executor": "echo", "limits": {"runtime_seconds": 201}}})
    assert agent.status == 422 and problems(agent) == {("agent.limits.runtime_seconds", "server_cap")}, agent.text


# --- read by the worker: a raised limit takes effect on the next run ----------------------------


def test_a_raised_runtime_limit_takes_effect_on_the_next_run(api: Api, db: Database) -> None:
    schedule = hourly(api, limits={"runtime_seconds": 20})
    first = trigger(api, schedule)
    executor = ScriptedExecutor()
    assert process(db, first, settings=Settings(), executor_factory=executor.factory,
                   clock=FakeClock()).result == "succeeded"

    raised = api.alice.patch(f"/v1/schedules/{schedule['id']}", {"limits": {"runtime_seconds": 45}})
    assert raised.status == 200, raised.text
    second = trigger(api, schedule)
    assert process(db, second, settings=Settings(), executor_factory=executor.factory,
                   clock=FakeClock()).result == "succeeded"

    # The call's timeout is the run's remaining runtime: the limit in force when each run was recorded
    assert executor.timeouts == [20.0, 45.0]
    shown = [api.alice.get(f"/v1/runs/{r}").json["run"] for r in (first, second)]
    assert [s["limits"]["runtime_seconds"] for s in shown] == [20, 45]
    # A cap lowered after the run was recorded still holds when it runs
    third = trigger(api, schedule)
    process(db, third, settings=Settings(max_runtime_seconds=30), executor_factory=executor.factory, clock=FakeClock())
    assert executor.timeouts[-1] == 30.0


def test_a_runtime_limit_failure_names_the_patch_that_raises_it_and_the_retry_gets_the_raised_limit(
        api: Api, db: Database) -> None:
    schedule = hourly(api, limits={"runtime_seconds": 30})
    run_id = trigger(api, schedule)
    clock = FakeClock()

    def slow(prepared: PreparedCall, timeout: float) -> Reply:
        clock.t += timeout  # the call used all the time it was given
        raise ExecutorError("timeout", "no answer in time", outcome_unknown=True)

    outcome = process(db, run_id, settings=Settings(), executor_factory=ScriptedExecutor(on_send=slow).factory,
                      clock=clock)
    assert outcome.reason_code == "runtime_limit"

    # The diagnosis names the executable form of raise_runtime_limit ...
    diagnosis = api.alice.get(f"/v1/runs/{run_id}").json["run"]["diagnosis"]
    [action] = [a for a in diagnosis["actions"] if a["action"] == "raise_runtime_limit"]
    assert action == {"action": "raise_runtime_limit", "method": "PATCH", "path": f"/v1/schedules/{schedule['id']}",
                      "field": "limits.runtime_seconds"}
    # ... which, performed as it says, raises the limit
    section, name = action["field"].split(".")
    performed = api.alice(action["method"], action["path"], {section: {name: 90}})
    assert performed.status == 200, performed.text
    # and the retry (recorded now) runs under the raised limit
    retried = api.alice.post(f"/v1/runs/{run_id}/retry")
    assert retried.status == 202, retried.text
    executor = ScriptedExecutor()
    assert process(db, uuid.UUID(retried.json["run_id"]), settings=Settings(), executor_factory=executor.factory,
                   clock=FakeClock()).result == "succeeded"
    assert executor.timeouts == [90.0]


def test_max_attempts_bounds_the_retries_of_a_run(api: Api, db: Database) -> None:
    schedule = hourly(api, limits={"max_attempts": 1})
    run_id = trigger(api, schedule)
    failing = ScriptedExecutor(on_send=raising(ExecutorError("connect_failed", "refused", retry_safe=True)))

    outcome = process(db, run_id, settings=Settings(), executor_factory=failing.factory)

    # connect_failed is retried within max_attempts; with one attempt the run fails at once
    assert (outcome.result, outcome.reason_code) == ("failed", "connect_failed")
    api.alice.patch(f"/v1/schedules/{schedule['id']}", {"limits": {"max_attempts": 2}})
    again = trigger(api, schedule)
    assert process(db, again, settings=Settings(), executor_factory=failing.factory).result == "retry"
    assert rows(api.url, "SELECT state, max_attempts FROM runs WHERE id = %s", again) == [
        {"state": "queued", "max_attempts": 2}]


def test_a_conversation_agents_limits_apply_unless_the_schedule_sets_its_own(api: Api) -> None:
    created = api.alice.post("/v1/conversations", {"agent": {"executor": "echo", "max_steps": 3, "limits": {
        "runtime_seconds": 100, "max_attempts": 4}}})
    assert created.status == 201, created.text
    conversation_id = created.json["conversation"]["id"]
    turn = api.alice.post(f"/v1/conversations/{conversation_id}/messages", {"content": "hi"})
    schedule = api.alice.post("/v1/schedules", {"conversation_id": conversation_id, "prompt": "p", "cron": "0 * * * *",
                                                "limits": {"runtime_seconds": 200}}).json["schedule"]
    scheduled = trigger(api, schedule)
    plain = hourly(api)
    default = trigger(api, plain)

    shown = {key: api.alice.get(f"/v1/runs/{r}").json["run"]["limits"]
             for key, r in (("chat", turn.json["run_id"]), ("scheduled", scheduled), ("default", default))}

    assert shown == {"chat": {"runtime_seconds": 100, "max_attempts": 4, "max_steps": 3},
                     "scheduled": {"runtime_seconds": 200, "max_attempts": 4, "max_steps": 3},
                     "default": {"runtime_seconds": 600, "max_attempts": 3, "max_steps": 8}}


def test_the_tool_loop_takes_its_model_turns_from_the_limits(api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    fake_openai.script = [tool_call(f"c{i}", "schedules_list", {}) for i in range(6)]
    created = api.alice.post("/v1/conversations", {"agent": {**openai_agent(fake_openai), "tools": ["schedules"],
                                                             "approval": "never", "limits": {"max_steps": 3}}})
    assert created.status == 201, created.text
    turn = api.alice.post(f"/v1/conversations/{created.json['conversation']['id']}/messages", {"content": "go"})

    outcome = process(db, uuid.UUID(turn.json["run_id"]), settings=OPENAI_SETTINGS)

    assert (outcome.result, outcome.reason_code) == ("failed", "step_limit")
    assert len(fake_openai.requests) == 3
    # The cap in force bounds it when the run executes
    turn = api.alice.post(f"/v1/conversations/{created.json['conversation']['id']}/messages", {"content": "again"})
    process(db, uuid.UUID(turn.json["run_id"]), settings=replace(OPENAI_SETTINGS, max_steps=2))
    assert len(fake_openai.requests) == 5


def test_a_hooks_rate_is_its_schedules_limit_and_a_raise_takes_effect_at_once(api: Api) -> None:
    schedule, token = api.webhook_schedule(limits={"rate_per_minute": 2})
    assert schedule["limits"] == {"rate_per_minute": 2}
    accepted = [hook(api, token, {"n": i}, headers={"idempotency-key": f"k{i}"}) for i in range(2)]
    limited = hook(api, token, {"n": 2}, headers={"idempotency-key": "k2"})
    assert [a.status for a in accepted] == [202, 202] and limited.status == 429, limited.text

    api.alice.patch(f"/v1/schedules/{schedule['id']}", {"limits": {"rate_per_minute": 3}})

    assert hook(api, token, {"n": 2}, headers={"idempotency-key": "k2"}).status == 202
    assert hook(api, token, {"n": 3}, headers={"idempotency-key": "k3"}).status == 429
    over = api.alice.patch(f"/v1/schedules/{schedule['id']}", {"limits": {"rate_per_minute": 601}})
    assert over.status == 422 and problems(over) == {("limits.rate_per_minute", "server_cap")}


# --- what produced an answer ---------------------------------------------------------------------


def test_a_run_and_its_output_name_the_revision_and_the_agent_digest(api: Api, db: Database) -> None:
    reference = api.alice.secret("model-key", "sk-the-secret-value")
    agent = {"executor": "echo", "model": "m1", "system": "Grüße, \"quoted\"\n\ttab", "max_tokens": 100,
             "api_key_secret": reference, "limits": {"max_steps": 2}}
    schedule = hourly(api, mode="fresh", agent=agent)
    first = trigger(api, schedule)
    api.alice.patch(f"/v1/schedules/{schedule['id']}", {"agent": {"executor": "echo", "model": "m2"}})
    second = trigger(api, schedule)
    for run_id in (first, second):
        assert process(db, run_id, settings=Settings()).result == "succeeded"

    [one, two] = [api.alice.get(f"/v1/runs/{r}").json["run"] for r in (first, second)]
    used = {r["id"]: r["agent"] for r in rows(api.url, "SELECT id, agent FROM runs")}

    # The database's canonical digest is the documented one (sorted keys, compact, UTF-8)
    assert one["agent_digest"] == runs.agent_digest(used[first]) and len(one["agent_digest"]) == 64
    assert two["agent_digest"] == runs.agent_digest({"executor": "echo", "model": "m2"})
    assert (one["schedule_revision"], two["schedule_revision"]) == (1, 2)
    # The secret reference is part of what is digested; its value never is (no run row holds it)
    assert used[first]["api_key_secret"] == reference
    assert not rows(api.url, "SELECT 1 FROM runs WHERE runs::text LIKE '%%sk-the-secret-value%%'")
    listed = {r["id"]: r for r in api.alice.get(f"/v1/runs?schedule_id={schedule['id']}").json["runs"]}
    assert {(r["schedule_revision"], r["agent_digest"]) for r in listed.values()} == {
        (1, one["agent_digest"]), (2, two["agent_digest"])}
    output = api.alice.get(f"/v1/runs/{first}/output").json["output"]
    assert output["state"] == "available"
    assert (output["schedule_revision"], output["agent_digest"]) == (1, one["agent_digest"])

    # A chat turn has no revision; its digest is its conversation's agent's
    conversation = api.conversation()
    turn = api.alice.post(f"/v1/conversations/{conversation['id']}/messages", {"content": "hi"}).json["run_id"]
    shown = api.alice.get(f"/v1/runs/{turn}").json["run"]
    assert shown["schedule_revision"] is None
    assert shown["agent_digest"] == runs.agent_digest({"executor": "echo", "model": "echo"})


def test_kairos_runs_show_prints_the_revision_and_the_agent_digest(
        api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    schedule = hourly(api)
    run_id = trigger(api, schedule)
    digest = api.alice.get(f"/v1/runs/{run_id}").json["run"]["agent_digest"]

    assert cli.main(["runs", "show", str(run_id)]) == 0
    shown = capsys.readouterr().out
    assert cli.main(["runs", "show", str(run_id), "--json"]) == 0
    as_json = json.loads(capsys.readouterr().out)["run"]

    assert "schedule_revision  1" in shown and f"agent_digest       {digest}" in shown
    assert (as_json["schedule_revision"], as_json["agent_digest"]) == (1, digest)
