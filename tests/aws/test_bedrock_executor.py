"""The ``bedrock`` executor on a real ``bedrock-runtime`` client: botocore's ``Stubber`` checks the exact
Converse arguments against the service model and plays the answers (success, throttling, validation,
server error); a local HTTP server stands in for the endpoint where a real socket is the point (read
timeout, connection refused)."""

from __future__ import annotations

import binascii
import dataclasses
import hashlib
import json
import struct
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.stub import Stubber

from kairos.executors import registry as executors
from kairos.executors.base import ExecutionRequest, ExecutorError, Message, Reply, canonical_json
from kairos.executors.bedrock import BedrockExecutor
from kairos.settings import Settings
from tests.support.peer import Peer, closed_port, hang

MODEL = "anthropic.claude-3-haiku-20240307-v1:0"


@pytest.fixture(autouse=True)
def no_endpoint_override(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    yield


def client(**kwargs: Any) -> Any:
    return boto3.client("bedrock-runtime", region_name="eu-central-1", aws_access_key_id="testing",
                        aws_secret_access_key="testing", **kwargs)


def request(**agent: Any) -> ExecutionRequest:
    return ExecutionRequest(
        owner="alice", run_id="run-1",
        attempt=1,
        agent={"executor": "bedrock", "model": MODEL, "system": "Be brief.", **agent},
        transcript=(Message("user", "Hi"), Message("user", "Are you there?"), Message("assistant", "Yes."),
                    Message("system", "Answer in German.")),
        prompt="What is new?",
        payload={"ref": "main"},
    )


def answer(text: str = "Nichts Neues.", stop: str = "end_turn") -> dict[str, Any]:
    return {
        "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
        "stopReason": stop,
        "usage": {"inputTokens": 40, "outputTokens": 4, "totalTokens": 44},
        "metrics": {"latencyMs": 120},
    }


def test_success_sends_exactly_the_digested_request_and_maps_usage() -> None:
    bedrock = client()
    executor = BedrockExecutor(bedrock)
    prepared = executor.prepare(request(max_tokens=100000))
    expected = {
        "modelId": MODEL,
        "system": [{"text": "Be brief."}, {"text": "Answer in German."}],
        "messages": [
            {"role": "user", "content": [{"text": "Hi"}, {"text": "Are you there?"}]},  # merged: turns alternate
            {"role": "assistant", "content": [{"text": "Yes."}]},
            {"role": "user", "content": [{"text": 'What is new?\n\n<webhook_payload>\n{\n  "ref": "main"\n}\n'
                                                  "</webhook_payload>"}]},
        ],
        "inferenceConfig": {"maxTokens": 8192},
    }
    assert prepared.body == canonical_json(expected)
    assert prepared.digest == hashlib.sha256(canonical_json(expected)).hexdigest()
    assert (prepared.kind, prepared.mutation) == ("model_call", False)
    assert prepared.url == f"https://bedrock-runtime.eu-central-1.amazonaws.com/model/{MODEL}/converse"

    with Stubber(bedrock) as stub:
        stub.add_response("converse", answer(), expected)
        reply = executor.send(prepared, timeout=5)
        stub.assert_no_pending_responses()
    assert reply == Reply(content="Nichts Neues.",
                          usage={"prompt_tokens": 40, "completion_tokens": 4, "total_tokens": 44})


def test_a_reply_stopped_at_max_tokens_is_marked_truncated() -> None:
    bedrock = client()
    executor = BedrockExecutor(bedrock)
    prepared = executor.prepare(request())
    assert json.loads(prepared.body)["inferenceConfig"] == {"maxTokens": 1024}
    with Stubber(bedrock) as stub:
        stub.add_response("converse", answer("Nichts", stop="max_tokens"))
        reply = executor.send(prepared, timeout=5)
    assert reply.truncated is True


@pytest.mark.parametrize(
    ("code", "status", "reason", "retry_safe", "outcome_unknown"),
    [
        ("ThrottlingException", 429, "rate_limited", True, False),
        ("ValidationException", 400, "agent_invalid", False, False),
        ("ResourceNotFoundException", 404, "agent_invalid", False, False),
        ("InternalServerException", 500, "peer_error", True, False),
        ("ModelTimeoutException", 408, "timeout", False, True),
        ("ModelErrorException", 424, "peer_error", False, False),
    ],
)
def test_service_errors_are_classified(code: str, status: int, reason: str, retry_safe: bool,
                                       outcome_unknown: bool) -> None:
    bedrock = client()
    executor = BedrockExecutor(bedrock)
    prepared = executor.prepare(request())
    with Stubber(bedrock) as stub:
        stub.add_client_error("converse", service_error_code=code, service_message="details", http_status_code=status)
        with pytest.raises(ExecutorError) as info:
            executor.send(prepared, timeout=5)
    assert (info.value.reason_code, info.value.retry_safe, info.value.outcome_unknown) == (
        reason, retry_safe, outcome_unknown)
    assert code in info.value.message


def test_a_reply_without_text_is_malformed() -> None:
    bedrock = client()
    executor = BedrockExecutor(bedrock)
    prepared = executor.prepare(request())
    empty = answer()
    empty["output"]["message"]["content"] = []
    with Stubber(bedrock) as stub:
        stub.add_response("converse", empty)
        with pytest.raises(ExecutorError) as info:
            executor.send(prepared, timeout=5)
    assert info.value.reason_code == "malformed_reply"


@pytest.mark.parametrize("case", ["nul_in_text", "infinity_in_tool_input", "nul_in_tool_input", "usage_at_2_63"])
def test_a_reply_the_database_cannot_store_fails_unstorable_and_names_none_of_it(case: str) -> None:
    bedrock = client()
    executor = BedrockExecutor(bedrock)
    prepared = executor.prepare(request(tools=["schedules"]))
    reply = answer("LEAKMARK" + ("\x00" if case == "nul_in_text" else ""))
    if case.endswith("tool_input"):
        value: Any = float("inf") if case.startswith("infinity") else "LEAKMARK\x00"
        reply["output"]["message"]["content"].append(
            {"toolUse": {"toolUseId": "tu-1", "name": "schedules_list", "input": {"n": value}}})
    if case == "usage_at_2_63":
        reply["usage"]["inputTokens"] = 2**63
    with Stubber(bedrock) as stub:
        stub.add_response("converse", reply)
        with pytest.raises(ExecutorError) as info:
            executor.send(prepared, timeout=5)
    assert (info.value.reason_code, info.value.retry_safe) == ("unstorable_reply", False)
    assert "LEAKMARK" not in info.value.message and str(2**63) not in info.value.message


def test_a_read_timeout_leaves_the_outcome_unknown() -> None:
    with Peer(hang) as peer:
        bedrock = client(endpoint_url=peer.url(""),
                         config=Config(read_timeout=0.2, connect_timeout=1, retries={"total_max_attempts": 1}))
        executor = BedrockExecutor(bedrock)
        with pytest.raises(ExecutorError) as info:
            executor.send(executor.prepare(request()), timeout=0.2)
        peer.release.set()
    assert (info.value.reason_code, info.value.retry_safe, info.value.outcome_unknown) == ("timeout", False, True)
    assert len(peer.received) == 1
    assert peer.received[0].path.endswith("/converse")


def test_an_unreachable_endpoint_is_a_retry_safe_connect_failure() -> None:
    bedrock = client(endpoint_url=f"http://127.0.0.1:{closed_port()}",
                     config=Config(connect_timeout=1, retries={"total_max_attempts": 1}))
    executor = BedrockExecutor(bedrock)
    with pytest.raises(ExecutorError) as info:
        executor.send(executor.prepare(request()), timeout=1)
    assert (info.value.reason_code, info.value.retry_safe, info.value.outcome_unknown) == ("connect_failed", True,
                                                                                             False)


def test_a_base_url_is_refused_so_signed_calls_stay_on_aws() -> None:
    with pytest.raises(ExecutorError) as info:
        BedrockExecutor(client()).prepare(request(base_url="http://attacker.example/"))
    assert info.value.reason_code == "agent_invalid"


def test_the_registry_builds_a_bedrock_executor_without_a_client_until_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    prepared = executors.get("bedrock", settings=Settings()).prepare(request())
    assert prepared.url == f"https://bedrock-runtime.us-west-2.amazonaws.com/model/{MODEL}/converse"


def test_a_tool_loop_turn_sends_tool_config_and_earlier_turns_and_reads_tool_use() -> None:
    from kairos.executors.base import ModelTurn, ToolCall, ToolResult, ToolSpec

    bedrock = client()
    executor = BedrockExecutor(bedrock)
    spec = ToolSpec("schedules_list", "List schedules.", {"type": "object", "properties": {}})
    turns = (ModelTurn("Let me look.", (ToolCall("tu-1", "schedules_list", {}),)),
             ToolResult("tu-1", "schedules_list", '{"schedules": []}'))
    prepared = executor.prepare(ExecutionRequest(owner="alice", run_id="r", attempt=1,
                                                 agent={"executor": "bedrock", "model": MODEL}, transcript=(),
                                                 prompt="What runs?", tools=(spec,), turns=turns))
    sent = json.loads(prepared.body)
    assert sent["toolConfig"] == {"tools": [{"toolSpec": {"name": "schedules_list", "description": "List schedules.",
                                                          "inputSchema": {"json": spec.parameters}}}]}
    assert sent["messages"][1:] == [
        {"role": "assistant", "content": [{"text": "Let me look."},
                                          {"toolUse": {"toolUseId": "tu-1", "name": "schedules_list", "input": {}}}]},
        {"role": "user", "content": [{"toolResult": {"toolUseId": "tu-1", "content": [{"text": '{"schedules": []}'}],
                                                     "status": "success"}}]},
    ]
    asks = {"output": {"message": {"role": "assistant", "content": [
                {"toolUse": {"toolUseId": "tu-2", "name": "schedules_create", "input": {"prompt": "p"}}}]}},
            "stopReason": "tool_use", "usage": {"inputTokens": 9, "outputTokens": 3, "totalTokens": 12},
            "metrics": {"latencyMs": 5}}
    with Stubber(bedrock) as stub:  # the stubber checks our request against the Converse service model
        stub.add_response("converse", asks, sent)
        reply = executor.send(prepared, timeout=5)
    assert reply.content == "" and reply.tool_calls == (ToolCall("tu-2", "schedules_create", {"prompt": "p"}),)


# --- ConverseStream: a local endpoint speaking AWS's event-stream encoding (moto has no bedrock-runtime
# Converse, and a Stubber cannot play an event stream), so botocore parses real frames off a socket.


def _frame(headers: dict[str, str], payload: dict[str, Any]) -> bytes:
    data = json.dumps(payload).encode()
    head = b"".join(bytes([len(k)]) + k.encode() + b"\x07" + struct.pack(">H", len(v)) + v.encode()
                    for k, v in headers.items())
    prelude = struct.pack(">II", 16 + len(head) + len(data), len(head))
    message = prelude + struct.pack(">I", binascii.crc32(prelude)) + head + data
    return message + struct.pack(">I", binascii.crc32(message))


def stream_event(kind: str, payload: dict[str, Any]) -> bytes:
    return _frame({":event-type": kind, ":message-type": "event", ":content-type": "application/json"}, payload)


def stream_exception(kind: str) -> bytes:
    return _frame({":exception-type": kind, ":message-type": "exception", ":content-type": "application/json"},
                  {"message": "slow down"})


def event_stream(frames: list[bytes]) -> Any:
    def behaviour(handler: Any, peer: Peer) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/vnd.amazon.eventstream")
        handler.send_header("Content-Length", str(sum(len(f) for f in frames)))
        handler.end_headers()
        for frame in frames:
            handler.wfile.write(frame)
            handler.wfile.flush()

    return behaviour


def streamed(*texts: str, stop: str = "end_turn", extra: tuple[bytes, ...] = ()) -> list[bytes]:
    return [stream_event("messageStart", {"role": "assistant"}),
            *(stream_event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": t}}) for t in texts),
            stream_event("contentBlockStop", {"contentBlockIndex": 0}), *extra,
            stream_event("messageStop", {"stopReason": stop}),
            stream_event("metadata", {"usage": {"inputTokens": 40, "outputTokens": 4, "totalTokens": 44},
                                      "metrics": {"latencyMs": 120}})]


def send_streamed(peer: Peer, texts: list[str], **agent: Any) -> tuple[Any, Reply]:
    executor = BedrockExecutor(client(endpoint_url=peer.url(""), config=Config(retries={"total_max_attempts": 1})))
    prepared = dataclasses.replace(executor.prepare(request(**agent)), on_text=texts.append)
    return prepared, executor.send(prepared, timeout=5)


def test_a_followed_call_uses_converse_stream_and_reports_the_text_as_it_grows() -> None:
    with Peer(event_stream(streamed("Nichts ", "Neues", "."))) as peer:
        texts: list[str] = []
        prepared, reply = send_streamed(peer, texts)
    assert reply == Reply(content="Nichts Neues.",
                          usage={"prompt_tokens": 40, "completion_tokens": 4, "total_tokens": 44})
    assert texts == ["Nichts ", "Nichts Neues", "Nichts Neues."]
    [got] = peer.received
    assert got.path == f"/model/{MODEL.replace(':', '%3A')}/converse-stream"
    assert json.loads(got.body) == {k: v for k, v in json.loads(prepared.body).items() if k != "modelId"}


def test_a_streamed_tool_use_is_joined_from_its_input_pieces() -> None:
    tool = (stream_event("contentBlockStart", {"contentBlockIndex": 1, "start": {
                "toolUse": {"toolUseId": "tu-1", "name": "http_post"}}}),
            stream_event("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"toolUse": {"input": '{"url": "h'}}}),
            stream_event("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"toolUse": {"input": 'ttps://x.test/"}'}}}))
    with Peer(event_stream(streamed("Posting.", stop="tool_use", extra=tool))) as peer:
        _, reply = send_streamed(peer, [], tools=["http"])
    assert reply.content == "Posting."
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [("tu-1", "http_post", {"url": "https://x.test/"})]


def test_an_error_event_mid_stream_is_classified_as_the_same_error_answered_whole() -> None:
    frames = [stream_event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Nic"}}),
              stream_exception("throttlingException")]
    with Peer(event_stream(frames)) as peer:
        with pytest.raises(ExecutorError) as info:
            send_streamed(peer, [])
    assert (info.value.reason_code, info.value.retry_safe) == ("rate_limited", True)


def test_a_stream_that_ends_before_message_stop_leaves_the_outcome_unknown() -> None:
    frames = [stream_event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Nic"}})]
    with Peer(event_stream(frames)) as peer:
        with pytest.raises(ExecutorError) as info:
            send_streamed(peer, [])
    assert (info.value.reason_code, info.value.retry_safe, info.value.outcome_unknown) == ("peer_error", False, True)
