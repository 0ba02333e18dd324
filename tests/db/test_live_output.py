"""Live output on real PostgreSQL: a model step's preview grows while the model streams its answer.

Through the run handler with a real local server that streams (and holds the stream open until the
test has read the partial preview through ``GET /v1/runs/{id}/steps``), then the whole answer; a
server that answers JSON as before; and, with a scripted executor on a controlled clock, the rates
(a preview at most every 2 s, ``step.progress`` with the character count at most every 10 s) and a
worker that lost its fence writing nothing."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from kairos import runtime
from kairos.db import Database
from kairos.execution import live
from kairos.execution.execute import process
from kairos.executors.base import PreparedCall, Reply
from kairos.local.stack import load_function
from kairos.settings import Settings
from tests.support.api import Api
from tests.support.aws import LambdaContext, run_body, sqs_event
from tests.support.executors import OPENAI_SETTINGS, FakeOpenAI, ScriptedExecutor, openai_agent, tool_call
from tests.support.peer import Peer, respond
from tests.support.streaming import USAGE, chunks, sse

RUN = load_function("run")


def rows(url: str, query: str, *args: Any) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        return conn.execute(query, args).fetchall()


def until(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """``check()``'s first truthy answer, polled until ``timeout`` (a condition, not a fixed wait)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def allowed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("KAIROS_EGRESS_ALLOW", "127.0.0.1")
    runtime.reset()
    yield


def chat(api: Api, base_url: str, prompt: str = "greet Ada") -> uuid.UUID:
    created = api.alice.post("/v1/conversations", {"agent": {"executor": "openai", "model": "gpt-live",
                                                             "base_url": base_url}})
    assert created.status == 201, created.text
    turn = api.alice.post(f"/v1/conversations/{created.json['conversation']['id']}/messages", {"content": prompt})
    assert turn.status == 202, turn.text
    api.messages()
    return uuid.UUID(turn.json["run_id"])


def handle(run_id: uuid.UUID) -> threading.Thread:
    """The run handler working one SQS record, on its own thread (as Lambda would, while the test reads)."""
    thread = threading.Thread(target=RUN.handler, args=(sqs_event(run_body(run_id)), LambdaContext()), daemon=True)
    thread.start()
    return thread


def step_one(api: Api, run_id: uuid.UUID) -> dict[str, Any] | None:
    steps = api.alice.get(f"/v1/runs/{run_id}/steps").json["steps"]
    return steps[0] if steps else None


def output_is(api: Api, run_id: uuid.UUID, content: str) -> Callable[[], dict[str, Any] | None]:
    def check() -> dict[str, Any] | None:
        step = step_one(api, run_id)
        return step if step is not None and (step["output"] or {}).get("content") == content else None

    return check


def test_a_streamed_answer_is_seen_growing_while_the_call_is_in_flight_then_whole(
        api: Api, allowed: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "PREVIEW_SECONDS", 0.0)  # every piece written: each stop below is seen
    first, second = threading.Event(), threading.Event()
    events = chunks(["Good ", "morning", ", Ada."])  # role, 3 pieces, finish, usage
    with Peer(sse(events, gates={2: first, 3: second})) as model:
        run_id = chat(api, model.url("/v1"))
        worker = handle(run_id)
        try:
            # While the model holds its stream open, a reader sees the answer so far, growing.
            partial = until(output_is(api, run_id, "Good "), "the first piece")
            assert (partial["step"], partial["kind"], partial["name"], partial["state"]) == (
                1, "model", "gpt-live", "running")
            assert partial["input"]["messages"][-1] == {"role": "user", "content": "greet Ada"}
            assert partial["finished_at"] is None and partial["usage"] is None
            assert api.alice.get(f"/v1/runs/{run_id}").json["run"]["state"] == "running"
            first.set()
            until(output_is(api, run_id, "Good morning"), "the second piece")
        finally:
            first.set()
            second.set()
        worker.join(30)
    assert not worker.is_alive()

    # Then the step holds the whole answer, the run's output is the same text, and the usage of the
    # stream's last chunk is what was counted.
    [step] = api.alice.get(f"/v1/runs/{run_id}/steps").json["steps"]
    assert (step["state"], step["output"]) == ("succeeded", {"content": "Good morning, Ada.", "tool_calls": []})
    assert (step["usage"]["input_tokens"], step["usage"]["output_tokens"]) == (
        USAGE["prompt_tokens"], USAGE["completion_tokens"])
    run = api.alice.get(f"/v1/runs/{run_id}").json["run"]
    assert run["state"] == "succeeded"
    [entry] = rows(api.url, "SELECT content FROM conversation_entries WHERE run_id = %s AND role = 'assistant'",
                   run_id)
    assert entry["content"] == "Good morning, Ada."
    [effect] = rows(api.url, "SELECT usage FROM effects WHERE run_id = %s", run_id)
    assert (effect["usage"]["input_tokens"], effect["usage"]["output_tokens"]) == (11, 4)
    sent = json.loads(model.received[0].body)
    assert (sent["stream"], sent["stream_options"]) == (True, {"include_usage": True})


def test_a_server_that_does_not_stream_works_as_before(api: Api, allowed: None) -> None:
    whole = {"choices": [{"message": {"role": "assistant", "content": "Whole answer."}, "finish_reason": "stop"}],
             "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}}
    with Peer(respond(200, json.dumps(whole))) as model:
        run_id = chat(api, model.url("/v1"))
        handle(run_id).join(30)

    [step] = api.alice.get(f"/v1/runs/{run_id}/steps").json["steps"]
    assert (step["state"], step["output"]) == ("succeeded", {"content": "Whole answer.", "tool_calls": []})
    assert (step["usage"]["input_tokens"], step["usage"]["output_tokens"]) == (9, 3)
    assert api.alice.get(f"/v1/runs/{run_id}").json["run"]["state"] == "succeeded"
    assert rows(api.url, "SELECT 1 FROM run_events WHERE run_id = %s AND type = 'step.progress'", run_id) == []


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def scripted_run(api: Api) -> uuid.UUID:
    created = api.alice.post("/v1/conversations", {"agent": {"executor": "openai", "model": "gpt-live",
                                                             "base_url": "http://127.0.0.1:9/v1"}})
    turn = api.alice.post(f"/v1/conversations/{created.json['conversation']['id']}/messages", {"content": "hi"})
    api.messages()
    return uuid.UUID(turn.json["run_id"])


def preview_of(api: Api, run_id: uuid.UUID) -> Any:
    found = rows(api.url, "SELECT output FROM run_steps WHERE run_id = %s AND n = 1", run_id)
    return found[0]["output"] if found else None


def test_the_preview_is_written_at_most_every_2_s_and_progress_at_most_every_10_s(api: Api, db: Database) -> None:
    run_id = scripted_run(api)
    clock = Clock()
    seen: list[tuple[float, Any]] = []

    def stream(prepared: PreparedCall, timeout: float) -> Reply:
        assert prepared.on_text is not None
        text = ""
        for step in (0.0, 1.0, 1.5, 0.5, 7.6, 1.0, 1.0, 9.0):  # at t+0, 1, 2.5, 3, 10.6, 11.6, 12.6, 21.6
            clock.t += step
            text += "x"
            prepared.on_text(text)
            seen.append((round(clock.t - 1000.0, 1), (preview_of(api, run_id) or {}).get("content")))
        return Reply(content=text + "!", usage={"prompt_tokens": 1, "completion_tokens": 2})

    outcome = process(db, run_id, settings=Settings(), executor_factory=ScriptedExecutor(on_send=stream).factory,
                      clock=clock)

    assert outcome.result == "succeeded"
    assert seen == [(0.0, "x"), (1.0, "x"), (2.5, "xxx"), (3.0, "xxx"), (10.6, "xxxxx"), (11.6, "xxxxx"),
                    (12.6, "xxxxxxx"), (21.6, "xxxxxxxx")]
    progress = rows(api.url, "SELECT data FROM run_events WHERE run_id = %s AND type = 'step.progress' ORDER BY seq",
                    run_id)
    assert [p["data"] for p in progress] == [{"chars": 5}, {"chars": 8}]  # no content, ever
    assert preview_of(api, run_id) == {"content": "xxxxxxxx!", "tool_calls": []}  # the end wrote the whole
    events = api.alice.get(f"/v1/runs/{run_id}/events").json["events"]
    [started] = [e for e in events if e["type"] == "step.started"]
    assert started["progress_count"] == 2


def test_a_worker_that_lost_its_fence_grows_no_preview(api: Api, db: Database) -> None:
    run_id = scripted_run(api)
    clock = Clock()
    written: list[Any] = []

    def stream(prepared: PreparedCall, timeout: float) -> Reply:
        assert prepared.on_text is not None
        prepared.on_text("Hel")
        written.append(preview_of(api, run_id))
        with psycopg.connect(api.url, autocommit=True) as conn:  # a rescue and a new claim took the run
            conn.execute("UPDATE runs SET fence = fence + 1 WHERE id = %s", (run_id,))
        for text in ("Hello", "Hello, wor", "Hello, world"):
            clock.t += 5.0
            prepared.on_text(text)
            written.append(preview_of(api, run_id))
        return Reply(content="Hello, world.")

    outcome = process(db, run_id, settings=Settings(), executor_factory=ScriptedExecutor(on_send=stream).factory,
                      clock=clock)

    assert outcome.result == "lease_lost"
    assert written == [{"content": "Hel", "tool_calls": []}] * 4
    [step] = rows(api.url, "SELECT state, output, record FROM run_steps WHERE run_id = %s", run_id)
    assert (step["state"], step["output"], step["record"]) == ("running", {"content": "Hel", "tool_calls": []}, None)
    assert rows(api.url, "SELECT 1 FROM run_events WHERE run_id = %s AND type = 'step.progress'", run_id) == []


def test_a_tool_loop_that_streams_records_the_same_steps_as_one_answered_whole(
        api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    # Given a model server that streams each turn: a tool call, then (with its result) the answer
    fake_openai.streams = True
    with Peer(respond(200, '{"ok": true}')) as target:
        fake_openai.script = [tool_call("post-1", "http_post", {"url": target.url("/hook"), "body": {"order": 42}}),
                              {"content": "Posted order 42."}]
        created = api.alice.post("/v1/conversations", {"agent": {**openai_agent(fake_openai), "tools": ["http"],
                                                                 "approval": "never"}})
        turn = api.alice.post(f"/v1/conversations/{created.json['conversation']['id']}/messages",
                              {"content": "post the order"})
        api.messages()
        run_id = uuid.UUID(turn.json["run_id"])

        outcome = process(db, run_id, settings=OPENAI_SETTINGS)

    # Then the call assembled from the stream was made, and the steps read as for whole answers
    assert outcome.result == "succeeded"
    assert json.loads(target.received[0].body) == {"order": 42}
    steps = api.alice.get(f"/v1/runs/{run_id}/steps").json["steps"]
    assert [(s["step"], s["kind"], s["state"]) for s in steps] == [
        (1, "model", "succeeded"), (2, "tool", "succeeded"), (3, "model", "succeeded")]
    assert steps[0]["output"]["tool_calls"] == [
        {"id": "post-1", "name": "http_post", "arguments": {"url": target.url("/hook"), "body": {"order": 42}}}]
    assert steps[2]["output"] == {"content": "Posted order 42.", "tool_calls": []}
    assert [(s["usage"]["input_tokens"], s["usage"]["output_tokens"]) for s in (steps[0], steps[2])] == [(21, 7)] * 2
    assert all(b["stream"] is True for b in fake_openai.bodies())
