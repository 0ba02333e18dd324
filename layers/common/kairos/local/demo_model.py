"""The demo model: deterministic chat completions driven by plain directives, for ``kairos dev``.

Role: every agent feature (tools and approvals, goal loops, corpus runs, retries) can be tried on one
machine without a key or a real model. This module is the model: what a ``/v1/chat/completions``
request body gets (``DemoModel.answer``) and how an answer streams (``stream_chunks``);
``kairos.local.demo_server`` serves it over HTTP for the local stack. ``docs/try.md`` walks through it.

An answer is driven by *directives*: lines of the latest user message that start with ``demo:`` (in a
corpus partition, only the lines before its first item count, so an item cannot steer it):

* ``demo: call <tool> <JSON object>`` — calls that tool with those arguments (each ``call`` line is one
  turn, in order);
* ``demo: goal <disposition> ["<text>"]`` — calls ``goal_report``; the text (a JSON string) is the
  question of ``needs_input``, else the summary;
* ``demo: records`` — answers a corpus partition as JSON Lines, one record per item (``kind`` ``item``,
  ``id`` the item's key);
* ``demo: slow <seconds>`` — takes that long to answer (streamed: the chunks spread over it); at most 300;
* ``demo: fail <status> [<times>]`` — answers HTTP ``<status>`` (400-599) with an OpenAI error body; with
  ``<times>``, only the first ``<times>`` requests of this message;
* otherwise — answers ``demo: <the message without its directive lines>``.

Once every ``call`` and ``goal`` line has been made (the tool results come back as ``tool`` messages
after the user message), the model answers a text naming each tool and what it answered. After an
answered ``needs_input`` question the answer's own directives come next, or else ``goal continue``.
A line it cannot read is answered as a text saying which line and why (no tool call). Usage is
deterministic: ``prompt_tokens`` is the characters of every message over 4, ``completion_tokens`` the
characters of the answer (text and tool arguments) over 4, each at least 1.

Guarantees: the same request gets the same answer, byte for byte, except through ``fail <status>
<times>`` (its counters live in the ``DemoModel``); a malformed request answers 400 in the OpenAI
error shape. Must not: touch the network or the database; log prompts or answers.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MODEL = "kairos-demo"
SLOW_MAX_SECONDS = 300.0
SUMMARY_RESULT_CHARS = 1_000
ECHO_CHARS = 4_000
DISPOSITIONS = ("continue", "complete", "blocked", "needs_input")
_DIRECTIVE = re.compile(r"^\s*demo:\s*(\S+)\s*(.*?)\s*$")
_ITEM = re.compile(r"^--- item (\d+): (.*)$")
_TOOL_NAME = re.compile(r"[A-Za-z0-9_\-]{1,64}")


class DirectiveError(ValueError):
    """A ``demo:`` line that cannot be read: answered as text naming the line."""

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(f"line {line}: {problem}")
        self.line = line
        self.problem = problem


@dataclass(frozen=True)
class Call:
    """One tool call the model makes (a ``call`` or ``goal`` line)."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Plan:
    """What the directives of one message ask for."""

    calls: tuple[Call, ...] = ()
    records: bool = False
    slow: float = 0.0
    fail: tuple[int, int | None] | None = None  # (status, times or None for always)


@dataclass(frozen=True)
class Answer:
    """What one request gets: an HTTP status and body, after ``delay`` seconds."""

    status: int
    body: dict[str, Any]
    delay: float = 0.0

    @property
    def completion(self) -> bool:
        return self.status == 200


def parse(text: str) -> Plan:
    """The directives of ``text`` (see the module doc); ``DirectiveError`` for a line it cannot read."""
    calls: list[Call] = []
    records = False
    slow = 0.0
    fail: tuple[int, int | None] | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if _ITEM.match(line):
            break  # a corpus partition's items: directives come from its instructions only
        match = _DIRECTIVE.match(line)
        if match is None:
            continue
        verb, rest = match.group(1).lower(), match.group(2)
        if verb == "call":
            calls.append(_call(number, rest))
        elif verb == "goal":
            calls.append(_goal(number, rest))
        elif verb == "records":
            if rest:
                raise DirectiveError(number, "records takes nothing after it")
            records = True
        elif verb == "slow":
            slow = _seconds(number, rest)
        elif verb == "fail":
            fail = _fail(number, rest)
        else:
            raise DirectiveError(number, f"{verb[:32]!r} is not a directive (call, goal, records, slow, fail)")
    return Plan(tuple(calls), records, slow, fail)


def _call(number: int, rest: str) -> Call:
    name, _, arguments = rest.partition(" ")
    if not _TOOL_NAME.fullmatch(name):
        raise DirectiveError(number, "call names a tool: demo: call <tool> <JSON object>")
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        raise DirectiveError(number, f"the arguments of {name} are not JSON") from None
    if not isinstance(value, dict):
        raise DirectiveError(number, f"the arguments of {name} are not a JSON object")
    return Call(name, value)


def _goal(number: int, rest: str) -> Call:
    disposition, _, text = rest.partition(" ")
    if disposition not in DISPOSITIONS:
        raise DirectiveError(number, f"goal takes one of {', '.join(DISPOSITIONS)}")
    given: str | None = None
    if text.strip():
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if not isinstance(value, str):
            raise DirectiveError(number, 'the goal\'s text is one JSON string: demo: goal needs_input "Which one?"')
        given = value
    if disposition == "needs_input":
        if not given:
            raise DirectiveError(number, 'needs_input asks a question: demo: goal needs_input "Which one?"')
        return Call("goal_report", {"disposition": disposition, "summary": f"Asking: {given}", "question": given})
    return Call("goal_report", {"disposition": disposition, "summary": given or f"demo: {disposition}"})


def _seconds(number: int, rest: str) -> float:
    try:
        seconds = float(rest)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= SLOW_MAX_SECONDS:
        raise DirectiveError(number, f"slow takes seconds from 0 to {SLOW_MAX_SECONDS:g}")
    return seconds


def _fail(number: int, rest: str) -> tuple[int, int | None]:
    words = rest.split()
    if not 1 <= len(words) <= 2 or not all(w.isdigit() for w in words) or not 400 <= int(words[0]) <= 599:
        raise DirectiveError(number, "fail takes an HTTP status from 400 to 599 and, optionally, how many times")
    times = int(words[1]) if len(words) == 2 else None
    if times is not None and times < 1:
        raise DirectiveError(number, "fail's count is at least 1")
    return int(words[0]), times


class DemoModel:
    """The answers (``answer``); holds only the ``fail ... <times>`` counters."""

    def __init__(self) -> None:
        self._failures: dict[str, int] = {}
        self._lock = threading.Lock()

    def answer(self, request: Any) -> Answer:
        """The answer to one ``/v1/chat/completions`` request body (already parsed from JSON)."""
        problem = _request_problem(request)
        if problem is not None:
            return error_answer(400, problem, "invalid_request_error")
        messages: list[dict[str, Any]] = request["messages"]
        latest = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
        message = _text(messages[latest].get("content")) if latest >= 0 else ""
        try:
            plan = parse(message)
        except DirectiveError as bad:
            return self._completion(request, messages, f"demo: cannot read the directive on {bad}", ())
        if plan.fail is not None and self._fails(message, plan.fail[1]):
            return error_answer(plan.fail[0], f"demo: fail {plan.fail[0]}", "demo_failure", delay=plan.slow)
        turns = messages[latest + 1:] if latest >= 0 else []
        try:
            steps, results = _progress(plan, turns)
        except DirectiveError as bad:
            return self._completion(request, messages, f"demo: cannot read the directive in the answer on {bad}", ())
        done = sum(1 for m in turns if m.get("role") == "assistant" and m.get("tool_calls"))
        if done < len(steps):
            call = steps[done]
            return self._completion(request, messages, "", (call,), call_number=done + 1, delay=plan.slow)
        if results:
            content = "\n".join(f"demo: {name} answered {text[:SUMMARY_RESULT_CHARS]}" for name, text in results)
        elif plan.records:
            content = records(message)
        else:
            content = f"demo: {_without_directives(message)[:ECHO_CHARS] or 'done'}"
        return self._completion(request, messages, content, (), delay=plan.slow)

    def _fails(self, message: str, times: int | None) -> bool:
        if times is None:
            return True
        key = hashlib.sha256(message.encode("utf-8")).hexdigest()
        with self._lock:
            seen = self._failures.get(key, 0)
            if seen >= times:
                return False
            self._failures[key] = seen + 1
            return True

    def _completion(self, request: dict[str, Any], messages: Sequence[dict[str, Any]], content: str,
                    calls: Sequence[Call], *, call_number: int = 0, delay: float = 0.0) -> Answer:
        finish = "tool_calls" if calls else "stop"
        limit = request.get("max_tokens")
        if not calls and isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 \
                and len(content) > limit * 4:
            content, finish = content[: limit * 4], "length"
        arguments = [json.dumps(c.arguments, sort_keys=True) for c in calls]
        tool_calls = [{"id": f"call_demo_{call_number}", "type": "function",
                       "function": {"name": c.name, "arguments": a}} for c, a in zip(calls, arguments, strict=True)]
        message: dict[str, Any] = {"role": "assistant", "content": None if calls else content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        prompt_chars = sum(_chars(m) for m in messages)
        output_chars = len(content) + sum(len(a) for a in arguments)
        usage = {"prompt_tokens": max(1, -(-prompt_chars // 4)), "completion_tokens": max(1, -(-output_chars // 4))}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        canonical = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        body = {"id": "chatcmpl-demo-" + hashlib.sha256(canonical.encode()).hexdigest()[:24],
                "object": "chat.completion", "created": 0, "model": str(request.get("model") or MODEL),
                "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage}
        return Answer(200, body, delay)


def _without_directives(message: str) -> str:
    return "\n".join(line for line in message.splitlines() if not _DIRECTIVE.match(line)).strip()


def _chars(message: dict[str, Any]) -> int:
    """A message's size for usage: its text, and its tool calls as JSON."""
    calls = message.get("tool_calls")
    return len(_text(message.get("content"))) + (len(json.dumps(calls, sort_keys=True)) if calls else 0)


def _request_problem(request: Any) -> str | None:
    if not isinstance(request, dict):
        return "the body is not a JSON object"
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages must be a non-empty array"
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        return "every message is an object with a role"
    if not all(isinstance(m.get("tool_calls"), list | None) for m in messages):
        return "a message's tool_calls is an array"
    if "stream" in request and not isinstance(request["stream"], bool):
        return "stream must be true or false"
    return None


def error_answer(status: int, message: str, kind: str, *, delay: float = 0.0) -> Answer:
    """An OpenAI-shaped error (``code`` is an identifier Kairos may show; the message is not shown)."""
    code = {400: "invalid_request", 404: "not_found", 413: "request_too_large"}.get(status, f"demo_{status}")
    return Answer(status, {"error": {"message": message, "type": kind, "param": None, "code": code}}, delay)


def _text(content: Any) -> str:
    """A message's text: a string, or the text parts of a content array."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _progress(plan: Plan, turns: Sequence[dict[str, Any]]) -> tuple[list[Call], list[tuple[str, str]]]:
    """The calls to make in order (an answered question adds its answer's directives, or ``goal
    continue``, right after itself) and the tool results so far as (tool, text)."""
    steps = list(plan.calls)
    names: dict[str, str] = {}
    results: list[tuple[str, str]] = []
    made = 0
    for turn in turns:
        if turn.get("role") == "assistant" and turn.get("tool_calls"):
            made += 1
            for call in turn["tool_calls"]:
                if isinstance(call, dict) and isinstance(call.get("function"), dict):
                    names[str(call.get("id"))] = str(call["function"].get("name"))
        elif turn.get("role") == "tool":
            name = names.get(str(turn.get("tool_call_id")), "tool")
            text = _text(turn.get("content"))
            results.append((name, text))
            answer = _answered(name, text)
            if answer is not None:
                more = list(parse(answer).calls) or [Call("goal_report", {
                    "disposition": "continue", "summary": f"The owner answered: {answer[:500]}"})]
                steps[made:made] = more
    return steps, results


def _answered(name: str, text: str) -> str | None:
    """The owner's answer when ``text`` is the result of an answered ``goal_report`` question."""
    if name != "goal_report":
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if isinstance(value, dict) and value.get("status") == "answered" and isinstance(value.get("answer"), str):
        return str(value["answer"])
    return None


def records(message: str) -> str:
    """A corpus partition's items (``--- item <ordinal>: <key>`` then its text) as JSON Lines."""
    lines: list[str] = []
    current: tuple[int, str] | None = None
    body: list[str] = []

    def flush() -> None:
        if current is None:
            return
        text = "\n".join(body).strip("\n")
        first = next((line.strip() for line in text.splitlines() if line.strip()), "")
        lines.append(json.dumps({"id": current[1], "kind": "item", "ordinal": current[0], "chars": len(text),
                                 "words": len(text.split()), "first_line": first[:200]},
                                sort_keys=True, ensure_ascii=False))

    for line in message.splitlines():
        match = _ITEM.match(line)
        if match:
            flush()
            current, body = (int(match.group(1)), match.group(2)), []
        elif current is not None:
            body.append(line)
    flush()
    return "\n".join(lines)


def stream_chunks(answer: Answer, *, include_usage: bool = False) -> list[dict[str, Any]]:
    """A completion as the ``chat.completion.chunk`` objects a streamed answer sends, in order."""
    body = answer.body
    choice = body["choices"][0]
    message = choice["message"]
    base = {"id": body["id"], "object": "chat.completion.chunk", "created": body["created"], "model": body["model"]}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    for piece in re.findall(r"\S+\s*|\s+", message.get("content") or ""):
        chunks.append(chunk({"content": piece}))
    for index, call in enumerate(message.get("tool_calls") or ()):
        chunks.append(chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                             "function": {"name": call["function"]["name"], "arguments": ""}}]}))
        arguments = call["function"]["arguments"]
        for start in range(0, len(arguments), 16):
            chunks.append(chunk({"tool_calls": [{"index": index,
                                                 "function": {"arguments": arguments[start:start + 16]}}]}))
    chunks.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        chunks.append({**base, "choices": [], "usage": body["usage"]})
    return chunks
