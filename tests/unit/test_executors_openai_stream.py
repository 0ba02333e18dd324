"""The ``openai`` executor against a real local server that streams (server-sent events): the answer
assembled from its chunks, the text reported as it grows, and every limit and failure classified as
for a whole answer."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from kairos.executors import registry as executors
from kairos.executors.base import Abort, ExecutionRequest, ExecutorError, PreparedCall, Reply, canonical_json
from kairos.executors.openai import OpenAIExecutor
from kairos.settings import Settings
from tests.support.peer import Peer, respond
from tests.support.streaming import USAGE, chunk, chunks, event, sse

KEY = "sk-test-0123456789"
SETTINGS = Settings(egress_allow=("127.0.0.1",))


@pytest.fixture(autouse=True)
def api_key(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("KAIROS_TEST_OPENAI_KEY", KEY)
    monkeypatch.setenv("KAIROS_SHARED_SECRETS", "env:KAIROS_TEST_OPENAI_KEY@http://127.0.0.1:*")
    yield


def request_for(peer: Peer, **agent: Any) -> ExecutionRequest:
    config = {"executor": "openai", "model": "gpt-test", "base_url": peer.url("/v1"),
              "api_key_secret": "env:KAIROS_TEST_OPENAI_KEY", **agent}
    return ExecutionRequest(owner="alice", run_id="r", attempt=1, agent=config, transcript=(), prompt="Hi")


def call(peer: Peer, *, timeout: float = 5.0, executor: OpenAIExecutor | None = None,
         texts: list[str] | None = None, abort: Abort | None = None, **agent: Any) -> tuple[PreparedCall, Reply]:
    executor = executor or OpenAIExecutor(allow=["127.0.0.1"])
    prepared = executor.prepare(request_for(peer, **agent))
    if texts is not None:
        prepared = dataclasses.replace(prepared, on_text=texts.append)
    if abort is not None:
        prepared = dataclasses.replace(prepared, abort=abort)
    return prepared, executor.send(prepared, timeout=timeout)


def failure(peer: Peer, **kwargs: Any) -> ExecutorError:
    with pytest.raises(ExecutorError) as info:
        call(peer, **kwargs)
    return info.value


def test_a_streamed_answer_is_assembled_and_reported_as_it_grows() -> None:
    with Peer(sse(chunks(["Good ", "morning", ", Ada."]))) as peer:
        texts: list[str] = []
        prepared, reply = call(peer, texts=texts)
    assert reply == Reply(content="Good morning, Ada.", usage=USAGE)  # the usage of the last chunk counted
    assert texts == ["Good ", "Good morning", "Good morning, Ada."]
    body = json.loads(peer.received[0].body)
    assert (body["stream"], body["stream_options"]) == (True, {"include_usage": True})
    assert peer.received[0].body == prepared.body
    assert peer.received[0].headers["accept"] == "text/event-stream, application/json"


def test_an_agent_that_says_stream_false_sends_the_body_of_a_whole_answer() -> None:
    with Peer(respond(200, json.dumps({"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]}))) as peer:
        texts: list[str] = []
        prepared, reply = call(peer, texts=texts, stream=False)
    assert prepared.body == canonical_json({"model": "gpt-test", "max_tokens": 1024,
                                            "messages": [{"role": "user", "content": "Hi"}]})
    assert peer.received[0].headers["accept"] == "application/json"
    assert reply.content == "ok" and texts == []


def test_a_server_that_answers_json_is_read_whole_and_reports_no_progress() -> None:
    whole = {"choices": [{"message": {"content": "whole"}, "finish_reason": "stop"}], "usage": USAGE}
    with Peer(respond(200, json.dumps(whole), content_type="application/json; charset=utf-8")) as peer:
        texts: list[str] = []
        _, reply = call(peer, texts=texts)
    assert reply == Reply(content="whole", usage=USAGE) and texts == []


def test_tool_calls_are_joined_by_index_across_chunks() -> None:
    pieces = [
        {"index": 0, "id": "call_a", "type": "function", "function": {"name": "http_post", "arguments": ""}},
        {"index": 1, "id": "call_b", "type": "function", "function": {"name": "schedules_list", "arguments": "{}"}},
        {"index": 0, "function": {"arguments": '{"url": "https://x.test/'}},
        {"index": 0, "function": {"arguments": '", "body": {"n": 1}}'}},
    ]
    with Peer(sse(chunks([], tool_calls=pieces, finish_reason="tool_calls"))) as peer:
        _, reply = call(peer)
    assert reply.content == ""
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("call_a", "http_post", {"url": "https://x.test/", "body": {"n": 1}}),
        ("call_b", "schedules_list", {}),
    ]


def test_events_split_across_reads_with_crlf_comments_and_other_fields_are_read() -> None:
    frames: list[dict[str, Any] | str | bytes] = [
        b": keep-alive\r\n\r\n",
        b"event: message\r\nid: 1\r\ndata: " + json.dumps(chunk({"content": "Hel"})).encode()[:20],
        json.dumps(chunk({"content": "Hel"})).encode()[20:] + b"\r\n\r\n",
        b"data:" + json.dumps(chunk({"content": "lo"}, finish_reason="stop")).encode() + b"\n\n",
    ]
    with Peer(sse(frames)) as peer:
        _, reply = call(peer)
    assert (reply.content, reply.usage, reply.truncated) == ("Hello", {}, False)


def test_a_model_stopped_at_max_tokens_is_marked_truncated() -> None:
    with Peer(sse(chunks(["partial"], finish_reason="length"))) as peer:
        _, reply = call(peer)
    assert reply.truncated is True and reply.content == "partial"


def test_streamed_content_over_the_bound_is_cut_and_marked() -> None:
    with Peer(sse(chunks(["y" * 30_000] * 3))) as peer:
        texts: list[str] = []
        _, reply = call(peer, texts=texts)
    assert reply.truncated is True and reply.content == "y" * 65_536
    assert max(len(t) for t in texts) <= 90_000  # the text stops growing past the bound


def test_a_streamed_reply_over_the_read_limit_is_too_large() -> None:
    with Peer(sse(chunks(["z" * 400] * 4))) as peer:
        error = failure(peer, executor=OpenAIExecutor(allow=["127.0.0.1"], read_limit=1_000))
    assert (error.reason_code, error.retry_safe, error.outcome_unknown) == ("reply_too_large", False, False)


def test_a_line_over_the_read_limit_is_too_large_without_being_kept() -> None:
    with Peer(sse([b"data: " + b"x" * 5_000])) as peer:
        error = failure(peer, executor=OpenAIExecutor(allow=["127.0.0.1"], read_limit=1_000))
    assert error.reason_code == "reply_too_large"


def test_the_stream_framing_does_not_count_toward_the_read_limit() -> None:
    # 200 chunks of ~150 bytes of framing each (30 kB on the wire) for 200 characters of text.
    with Peer(sse(chunks(["a"] * 200))) as peer:
        _, reply = call(peer, executor=OpenAIExecutor(allow=["127.0.0.1"], read_limit=1_000))
    assert reply.content == "a" * 200


@pytest.mark.parametrize("frames", [
    [b"data: {not json\n\n"],
    [b"data: [1, 2]\n\n"],
    [event(chunk({"content": 5}))],
    [event(chunk(usage=USAGE, choices=False))],  # no choice at all
])
def test_a_malformed_stream_is_not_retry_safe(frames: list[bytes]) -> None:
    with Peer(sse(frames)) as peer:
        error = failure(peer)
    assert (error.reason_code, error.retry_safe, error.outcome_unknown) == ("malformed_reply", False, False)


def test_an_error_chunk_mid_stream_is_a_peer_error_with_an_unknown_outcome() -> None:
    frames = [chunk({"content": "Hel"}), {"error": {"code": "server_overloaded", "message": "Hi was too much"}}]
    with Peer(sse(frames)) as peer:
        error = failure(peer)
    assert (error.reason_code, error.retry_safe, error.outcome_unknown) == ("peer_error", False, True)
    assert "server_overloaded" in error.message and "Hi was" not in error.message


def test_a_stream_that_ends_before_the_answer_finished_is_a_peer_error() -> None:
    with Peer(sse([chunk({"content": "Hel"})], done=False)) as peer:
        error = failure(peer)
    assert (error.reason_code, error.retry_safe, error.outcome_unknown) == ("peer_error", False, True)


def test_a_stream_that_stalls_midway_is_a_timeout() -> None:
    gate = threading.Event()
    with Peer(sse(chunks(["Hel", "lo"]), gate_after=2, gate=gate)) as peer:
        texts: list[str] = []
        error = failure(peer, timeout=0.3, texts=texts)
        gate.set()
    assert (error.reason_code, error.retry_safe, error.outcome_unknown) == ("timeout", False, True)
    assert texts == ["Hel"]  # what had arrived was reported before the stall


def test_an_abort_stops_a_stream_in_flight_as_a_dropped_call() -> None:
    gate = threading.Event()
    abort = Abort()
    with Peer(sse(chunks(["Hel", "lo"]), gate_after=2, gate=gate)) as peer:
        error = failure(peer, timeout=20, abort=abort, texts=_firing(abort))
        gate.set()
    assert (error.reason_code, error.retry_safe, error.outcome_unknown) == ("peer_error", False, True)


def _firing(abort: Abort) -> list[str]:
    class Firing(list[str]):
        def append(self, text: str) -> None:
            super().append(text)
            abort.fire()  # the heartbeat's cancel, arriving while the model streams

    return Firing()


def test_the_registry_executor_streams_too() -> None:
    with Peer(sse(chunks(["ok"]))) as peer:
        executor = executors.get("openai", settings=SETTINGS)
        prepared = executor.prepare(request_for(peer))
        assert executor.send(prepared, timeout=5).content == "ok"
