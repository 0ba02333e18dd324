"""The demo model (``kairos.local.demo_model``): directives in, chat completions out, streamed chunks,
its HTTP server and sink, and Kairos's own ``openai`` executor talking to it through the egress check."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kairos import cli
from kairos.execution.corpus import answers
from kairos.executors.base import ExecutionRequest, ExecutorError, ModelTurn, ToolResult, ToolSpec
from kairos.executors.openai import OpenAIExecutor
from kairos.local import demo_model, demo_server
from kairos.local.demo_model import Call, DemoModel, DirectiveError, parse

HTTP_POST = {"type": "function", "function": {"name": "http_post", "parameters": {"type": "object"}}}


def request(content: str, *turns: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "kairos-demo", "messages": [{"role": "system", "content": "Be brief."},
                                                 {"role": "user", "content": content}, *turns], **extra}


def message(answer: demo_model.Answer) -> dict[str, Any]:
    assert answer.status == 200, answer.body
    return dict(answer.body["choices"][0]["message"])


def assistant_call(name: str, arguments: dict[str, Any], call_id: str = "call_demo_1") -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def tool_result(content: str, call_id: str = "call_demo_1") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


# -- directives ------------------------------------------------------------------------------------


def test_directives_are_read_line_by_line_and_in_order() -> None:
    plan = parse('Do the thing.\ndemo: call http_post {"url": "http://x/sink", "body": {"a": 1}}\n'
                 "  demo: slow 2.5\ndemo: goal complete \"all done\"\ndemo: fail 503 2\ndemo: records\n")
    assert plan.calls == (Call("http_post", {"url": "http://x/sink", "body": {"a": 1}}),
                          Call("goal_report", {"disposition": "complete", "summary": "all done"}))
    assert (plan.slow, plan.fail, plan.records) == (2.5, (503, 2), True)
    assert parse("no directives here; demo: call x {} is not at a line start") == demo_model.Plan()


def test_a_question_is_the_text_of_needs_input() -> None:
    (call,) = parse('demo: goal needs_input "Which environment?"').calls
    assert call == Call("goal_report", {"disposition": "needs_input", "summary": "Asking: Which environment?",
                                        "question": "Which environment?"})
    (plain,) = parse("demo: goal continue").calls
    assert plain.arguments == {"disposition": "continue", "summary": "demo: continue"}


@pytest.mark.parametrize(("text", "problem"), [
    ("demo: dance", "'dance' is not a directive"),
    ("demo: call", "call names a tool"),
    ("demo: call http_post {not json", "are not JSON"),
    ("demo: call http_post [1, 2]", "are not a JSON object"),
    ("demo: goal done", "goal takes one of continue, complete, blocked, needs_input"),
    ("demo: goal needs_input", "needs_input asks a question"),
    ("demo: goal complete not-a-json-string", "one JSON string"),
    ("demo: slow 301", "slow takes seconds from 0 to 300"),
    ("demo: slow soon", "slow takes seconds"),
    ("demo: fail 200", "fail takes an HTTP status from 400 to 599"),
    ("demo: fail 500 0", "at least 1"),
    ("demo: records please", "records takes nothing"),
])
def test_a_line_that_cannot_be_read_is_named_with_the_problem(text: str, problem: str) -> None:
    with pytest.raises(DirectiveError) as info:
        parse(f"first line\n{text}")
    assert info.value.line == 2 and problem in info.value.problem
    answer = message(DemoModel().answer(request(f"first line\n{text}")))
    assert answer["content"].startswith("demo: cannot read the directive on line 2: ") and problem in answer["content"]
    assert "tool_calls" not in answer


def test_only_a_corpus_partitions_instructions_hold_directives() -> None:
    text = ("demo: records\n\nCorpus run r, partition 0, generation 0: items 0 to 0.\n\n"
            "--- item 0: a.txt\ndemo: fail 500")
    assert parse(text) == demo_model.Plan(records=True)


# -- answers ---------------------------------------------------------------------------------------


def test_without_directives_it_echoes_the_message() -> None:
    answer = DemoModel().answer(request("Hello, demo model\ndemo: slow 0"))
    body = answer.body
    assert body["object"] == "chat.completion" and body["model"] == "kairos-demo" and body["created"] == 0
    assert body["choices"][0]["finish_reason"] == "stop"
    assert message(answer) == {"role": "assistant", "content": "demo: Hello, demo model"}


def test_the_same_request_gets_the_same_bytes_and_usage_counts_characters() -> None:
    req = request("Hello")
    first, second = DemoModel().answer(req), DemoModel().answer(json.loads(json.dumps(req)))
    assert json.dumps(first.body, sort_keys=True) == json.dumps(second.body, sort_keys=True)
    # input: "Be brief." (9) + "Hello" (5) = 14 characters -> 4 tokens; output "demo: Hello" (11) -> 3
    assert first.body["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}
    assert DemoModel().answer(request("Hello!")).body["id"] != first.body["id"]


def test_a_call_line_makes_a_tool_call_and_its_result_a_summary() -> None:
    model = DemoModel()
    text = 'Tell the team.\ndemo: call http_post {"url": "http://127.0.0.1:9/sink", "body": {"text": "hi"}}'
    first = model.answer(request(text, tools=[HTTP_POST]))
    assert first.body["choices"][0]["finish_reason"] == "tool_calls"
    (call,) = message(first)["tool_calls"]
    assert call["id"] == "call_demo_1" and call["type"] == "function"
    assert call["function"]["name"] == "http_post"
    assert json.loads(call["function"]["arguments"]) == {"url": "http://127.0.0.1:9/sink", "body": {"text": "hi"}}
    assert message(first)["content"] is None
    result = json.dumps({"status": 200, "body": "{\"count\": 1}"})
    final = model.answer(request(text, assistant_call("http_post", {}), tool_result(result)))
    assert message(final) == {"role": "assistant", "content": f"demo: http_post answered {result}"}
    assert final.body["choices"][0]["finish_reason"] == "stop"


def test_several_calls_run_one_per_turn_in_order() -> None:
    text = "demo: call schedules_list {}\ndemo: goal blocked \"no access\""
    model = DemoModel()
    assert message(model.answer(request(text)))["tool_calls"][0]["function"]["name"] == "schedules_list"
    second = message(model.answer(request(text, assistant_call("schedules_list", {}), tool_result("{}"))))
    (call,) = second["tool_calls"]
    assert call["id"] == "call_demo_2" and call["function"]["name"] == "goal_report"
    assert json.loads(call["function"]["arguments"]) == {"disposition": "blocked", "summary": "no access"}


def test_an_answered_question_continues_or_follows_the_answers_directives() -> None:
    text = 'demo: goal needs_input "Which environment?"'
    asked = assistant_call("goal_report", {"disposition": "needs_input"})
    answered = {"status": "answered", "question": "Which environment?", "answer": "staging"}
    model = DemoModel()
    after = message(model.answer(request(text, asked, tool_result(json.dumps(answered)))))
    assert json.loads(after["tool_calls"][0]["function"]["arguments"]) == {
        "disposition": "continue", "summary": "The owner answered: staging"}
    steered = {**answered, "answer": 'staging\ndemo: goal complete "checked staging"'}
    after = message(model.answer(request(text, asked, tool_result(json.dumps(steered)))))
    assert json.loads(after["tool_calls"][0]["function"]["arguments"]) == {
        "disposition": "complete", "summary": "checked staging"}


def test_records_answer_a_corpus_partition_as_valid_json_lines() -> None:
    partition = ("List the notes.\ndemo: records\n\nAnswer with JSON Lines only: ...\n"
                 "Corpus run r, partition 0, generation 0: items 0 to 1.\n\n"
                 "--- item 0: notes/a.txt\nAlpha launch moved.\nSecond line.\n\n--- item 1: items/1\nBeta")
    content = message(DemoModel().answer(request(partition)))["content"]
    parsed = answers.parse(content)
    assert not isinstance(parsed, answers.Invalid), parsed
    assert [(line.kind, line.id, line.data) for line in parsed] == [
        ("item", "notes/a.txt", {"ordinal": 0, "chars": 32, "words": 5, "first_line": "Alpha launch moved."}),
        ("item", "items/1", {"ordinal": 1, "chars": 4, "words": 1, "first_line": "Beta"}),
    ]


def test_fail_answers_the_status_always_or_the_first_times_of_a_message() -> None:
    model = DemoModel()
    always = model.answer(request("x\ndemo: fail 429"))
    assert always.status == 429 and always.body["error"]["code"] == "demo_429"
    assert model.answer(request("x\ndemo: fail 429")).status == 429
    statuses = [model.answer(request("report\ndemo: fail 503 2")).status for _ in range(4)]
    assert statuses == [503, 503, 200, 200]
    assert model.answer(request("another report\ndemo: fail 503 2")).status == 503  # counted per message


def test_max_tokens_cuts_a_text_answer() -> None:
    answer = DemoModel().answer(request("a" * 100, max_tokens=5))
    assert message(answer)["content"] == "demo: aaaaaaaaaaaaaa"  # 5 tokens = 20 characters
    assert answer.body["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("body", [None, [], {}, {"messages": []}, {"messages": [{"content": "x"}]},
                                  {"messages": [{"role": "user", "content": "x"}], "stream": "yes"},
                                  {"messages": [{"role": "user", "content": "x"}, {"role": "assistant",
                                                                                 "tool_calls": 5}]}])
def test_a_malformed_request_is_a_400_in_the_openai_shape(body: Any) -> None:
    answer = DemoModel().answer(body)
    assert answer.status == 400 and answer.body["error"]["type"] == "invalid_request_error"


# -- streaming -------------------------------------------------------------------------------------


def test_stream_chunks_carry_the_same_answer() -> None:
    answer = DemoModel().answer(request("one two  three"))
    chunks = demo_model.stream_chunks(answer, include_usage=True)
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == answer.body["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "demo: one two  three" and len(chunks) > 4
    assert chunks[-2]["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "stop"}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == answer.body["usage"]
    assert "usage" not in demo_model.stream_chunks(answer)[-1]


def test_stream_chunks_spell_out_a_tool_call() -> None:
    arguments = {"url": "http://127.0.0.1:9/sink", "body": {"text": "a longer body than one piece"}}
    answer = DemoModel().answer(request(f"demo: call http_post {json.dumps(arguments)}"))
    deltas = [c["choices"][0]["delta"] for c in demo_model.stream_chunks(answer)]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["id"] == "call_demo_1" and calls[0]["function"]["name"] == "http_post"
    assert len(calls) > 2 and json.loads("".join(c["function"]["arguments"] for c in calls)) == arguments


# -- the server ------------------------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[demo_server.DemoModelServer]:
    with demo_server.DemoModelServer() as started:
        yield started


def post(url: str, body: Any) -> tuple[int, bytes, str]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers.get("Content-Type", "")


def test_the_server_answers_json_and_server_sent_events(server: demo_server.DemoModelServer) -> None:
    status, body, kind = post(f"{server.base_url}/chat/completions", request("Hello"))
    assert (status, kind) == (200, "application/json")
    assert json.loads(body)["choices"][0]["message"]["content"] == "demo: Hello"
    streamed = request("Hello there", stream=True, stream_options={"include_usage": True})
    status, body, kind = post(f"{server.base_url}/chat/completions", streamed)
    assert (status, kind) == (200, "text/event-stream")
    events = body.decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert chunks == demo_model.stream_chunks(DemoModel().answer(streamed), include_usage=True)
    status, body, _ = post(f"{server.base_url}/chat/completions", b"not json")
    assert status == 400 and json.loads(body)["error"]["code"] == "invalid_request"
    assert post(f"{server.url}/v2/elsewhere", {})[0] == 404
    with urllib.request.urlopen(f"{server.base_url}/models", timeout=30) as resp:
        assert json.loads(resp.read())["data"][0]["id"] == "kairos-demo"


def test_a_slow_answer_takes_its_time_streamed_or_not(server: demo_server.DemoModelServer) -> None:
    for stream in (False, True):
        started = time.monotonic()
        status, _, _ = post(f"{server.base_url}/chat/completions", request("Hi\ndemo: slow 1", stream=stream))
        assert status == 200 and time.monotonic() - started >= 0.9


def test_it_sums_the_usage_of_the_completions_it_answered(server: demo_server.DemoModelServer) -> None:
    first, second = request("Hello"), request("Hi there\ndemo: slow 0", stream=True)
    post(f"{server.base_url}/chat/completions", first)
    post(f"{server.base_url}/chat/completions", second)
    post(f"{server.base_url}/chat/completions", request("x\ndemo: fail 500"))  # a failure reports no usage
    usages = [DemoModel().answer(r).body["usage"] for r in (first, second)]
    with urllib.request.urlopen(f"{server.url}/usage", timeout=30) as resp:
        assert json.loads(resp.read()) == {"calls": 2, "prompt_tokens": sum(u["prompt_tokens"] for u in usages),
                                           "completion_tokens": sum(u["completion_tokens"] for u in usages)}


def test_the_sink_keeps_what_it_receives(server: demo_server.DemoModelServer) -> None:
    assert json.loads(post(f"{server.url}/sink/team", {"text": "hi"})[1]) == {"received": {"text": "hi"}, "count": 1}
    assert json.loads(post(f"{server.url}/sink/team", {"text": "again"})[1])["count"] == 2
    with urllib.request.urlopen(f"{server.url}/sink", timeout=30) as resp:
        assert json.loads(resp.read()) == {"received": [{"path": "/sink/team", "body": {"text": "hi"}},
                                                        {"path": "/sink/team", "body": {"text": "again"}}]}


def test_the_openai_executor_calls_it_through_its_one_allow_entry(server: demo_server.DemoModelServer) -> None:
    spec = ToolSpec("http_post", "POST JSON", {"type": "object"})
    agent = demo_server.agent(server.base_url)
    assert "api_key_secret" not in agent  # no key: the executor sends no Authorization header
    text = f'demo: call http_post {{"url": "{server.url}/sink", "body": {{"n": 1}}}}'
    executor = OpenAIExecutor(allow=[server.allow_entry])
    ask = ExecutionRequest(run_id="r", attempt=1, owner="alice", agent=agent, transcript=(), prompt=text,
                           tools=(spec,))
    prepared = executor.prepare(ask)
    assert "Authorization" not in prepared.headers
    reply = executor.send(prepared, timeout=30)
    (call,) = reply.tool_calls
    assert (call.name, call.arguments) == ("http_post", {"url": f"{server.url}/sink", "body": {"n": 1}})
    assert reply.usage["prompt_tokens"] > 0 and reply.usage["completion_tokens"] > 0
    done = executor.send(executor.prepare(ExecutionRequest(
        run_id="r", attempt=1, owner="alice", agent=agent, transcript=(), prompt=text, tools=(spec,),
        turns=(ModelTurn("", (call,)), ToolResult(call.id, call.name, '{"status": 200}')))), timeout=30)
    assert done.content == 'demo: http_post answered {"status": 200}' and not done.tool_calls
    other = f"{server.host}:{server.port + 1 if server.port < 65535 else server.port - 1}"
    with pytest.raises(ExecutorError) as refused:
        OpenAIExecutor(allow=[other]).prepare(ask)  # the address on another port is not enough
    assert refused.value.reason_code == "egress_refused"


def test_the_stack_adds_its_entry_to_the_operators_egress_list(server: demo_server.DemoModelServer) -> None:
    entry = server.allow_entry
    assert entry == f"127.0.0.1:{server.port}"
    assert server.egress_allow(None) == entry
    assert server.egress_allow(" hooks.internal ,10.0.0.0/8") == f"hooks.internal,10.0.0.0/8,{entry}"
    assert server.egress_allow(f"hooks.internal,{entry}") == f"hooks.internal,{entry}"


def test_the_demo_port_follows_the_api_port_and_a_taken_one_is_one_line_and_exit_2(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    free = demo_server.bind(0, None)
    assert free is not None and free.port != 0
    free.stop()
    monkeypatch.chdir(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = cli.main(["dev", "--port", "0", "--demo-port", str(port), "--once"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err == f"kairos dev: demo model port {port} is in use; pass --demo-port (0 picks a free one)\n"
    assert not (tmp_path / ".kairos").exists()  # refused before anything started


def test_a_directive_the_answer_cannot_hold_is_named_as_text() -> None:
    asked = assistant_call("goal_report", {"disposition": "needs_input"})
    answered = {"status": "answered", "question": "Which?", "answer": "demo: goal maybe"}
    reply = message(DemoModel().answer(request('demo: goal needs_input "Which?"', asked,
                                               tool_result(json.dumps(answered)))))
    assert reply["content"].startswith("demo: cannot read the directive in the answer on line 1: ")


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                 max_size=3),
                     max_leaves=10)
_message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "tool"])},
                                 optional={"content": _json, "tool_calls": _json, "tool_call_id": _json})


@settings(max_examples=300, deadline=None)
@given(st.lists(_message, min_size=1, max_size=5), _json)
def test_any_request_gets_an_answer_never_an_exception(turns: list[dict[str, Any]], extra: Any) -> None:
    messages = [{"role": "user", "content": "demo: call http_post {}"}, *turns]
    answer = DemoModel().answer({"model": "kairos-demo", "messages": messages, "max_tokens": extra})
    assert answer.status in (200, 400)
    json.dumps(answer.body)  # the answer is JSON
    if answer.status == 200:
        demo_model.stream_chunks(answer, include_usage=True)


def test_a_slow_answer_stops_waiting_when_its_client_goes_away(server: demo_server.DemoModelServer) -> None:
    body = json.dumps(request("Hi\ndemo: slow 300")).encode()
    with socket.create_connection((server.host, server.port), timeout=30) as client:
        client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    # The handler notices the closed connection and frees its thread well before the 300 s.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _handler_threads() > 0:
        time.sleep(0.1)
    assert _handler_threads() == 0
    status, body_back, _ = post(f"{server.base_url}/chat/completions", request("still here"))
    assert status == 200 and json.loads(body_back)["choices"][0]["message"]["content"] == "demo: still here"


def _handler_threads() -> int:
    """Threads of the server answering a request (ThreadingHTTPServer names them Thread-N (process_request_thread))."""
    return sum(1 for t in threading.enumerate() if "process_request_thread" in t.name)
