"""The ``openai`` executor: one chat completion from any OpenAI-compatible server.

``prepare`` checks the agent, resolves its ``api_key_secret`` and passes ``base_url`` through the
egress check, then builds ``POST {base_url}/chat/completions`` with the body
``{"model", "messages": [system, transcript…, user, the loop's earlier turns…], "max_tokens", "tools"?}``
as canonical JSON (its SHA-256 is the effect's digest). In a tool loop the reply may carry
``tool_calls`` (function calls with JSON-object arguments) instead of, or beside, text. The user
turn is the prompt, followed by the webhook payload as JSON in a
``<webhook_payload>`` block when the run came from a hook. ``max_tokens`` is
``min(agent.max_tokens or 1024, 8192)``. Transcript entries keep their role; a ``tool`` entry (which
would need a tool-call id this transcript does not keep) is sent as a user message.

The body also asks for a streamed answer (``"stream": true, "stream_options": {"include_usage":
true}``) unless the agent says ``"stream": false``. A server that streams answers
``text/event-stream``: the chunks are assembled as they arrive (``_Stream``) and the worker is told the
text so far (``PreparedCall.on_text``), so a long answer shows while it is written. A server that does
not stream answers ``application/json`` as before, and is read as before; either way the ``Reply`` is
the same (the usage of a stream comes in its last chunk). Nothing about a call's outcome depends on
which of the two the server chose.

``send`` makes exactly one attempt to the address the check approved (no retries, no redirects) and
classifies what happened:

| outcome | reason_code | retry_safe | outcome_unknown |
|---|---|---|---|
| refused, no (allowed) address for the name, connect timeout, TLS failure | connect_failed | yes | no |
| sent, no (complete) answer in time | timeout | no | yes |
| connection dropped after sending, no status | peer_error | no | yes |
| 429 | rate_limited | yes | no |
| 5xx | peer_error | yes | no |
| other non-2xx (4xx, redirects) | peer_error | no | no |
| 2xx body over 1 MiB (streamed: its text and tool calls, or one line) | reply_too_large | no | no |
| 2xx not JSON, or no ``choices[0].message.content`` string (streamed: a bad chunk) | malformed_reply | no | no |
| streamed: an ``error`` chunk, or the stream ended without ``[DONE]`` or a ``finish_reason`` | peer_error | no | yes |
| 2xx the database cannot store (NUL, NaN or 1e999 in arguments, a bad count) | unstorable_reply | no | no |

A reply's content longer than 65,536 characters (about the 8,192-token cap) is cut there and marked
``truncated=True`` rather than refused: the model has already done the work and been paid for, and a
cut answer is more use to the conversation than a failed run. ``truncated`` is also set when the model
itself stopped at ``max_tokens`` (``finish_reason == "length"``).

The API key travels only in the ``Authorization`` header of the prepared call; it is never part of
the URL, the body, a log line or an error message. Error messages name the status and, at most, the
peer's error code (an identifier), never the peer's free text, which may echo the prompt.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from kairos import secrets
from kairos.executors import egress
from kairos.executors.base import (
    CONTENT_CHAR_LIMIT,
    READ_LIMIT,
    ExecutionRequest,
    ExecutorError,
    ModelTurn,
    PreparedCall,
    Reply,
    SecretSource,
    TextProgress,
    ToolCall,
    ToolResult,
    agent_text,
    bounded_content,
    canonical_json,
    checked_tool_calls,
    digest,
    max_tokens,
    recorded_target,
    secret_errors,
    storable,
    user_content,
)

_ROLES = frozenset({"system", "user", "assistant"})
_IDENTIFIER = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


class OpenAIExecutor:
    name = "openai"

    def __init__(self, *, allow: Sequence[str] = (), resolve: egress.Resolver = socket.getaddrinfo,
                 secret: SecretSource = secrets.resolve, ca_certs: str | None = None,
                 read_limit: int = READ_LIMIT) -> None:
        self._allow = tuple(allow)
        self._resolve = resolve
        self._secret = secret
        self._ca_certs = ca_certs
        self._read_limit = read_limit

    def prepare(self, request: ExecutionRequest) -> PreparedCall:
        agent = request.agent
        model = agent_text(agent, "model", required=True)
        system = agent_text(agent, "system", required=False)
        base_url = agent_text(agent, "base_url", required=True)
        key_ref = agent_text(agent, "api_key_secret", required=False)
        url = _endpoint(base_url)
        target = egress.check(url, allow=self._allow, resolve=self._resolve)
        messages: list[dict[str, Any]] = []
        if system:
            messages.append({"role": "system", "content": system})
        for entry in request.transcript:
            messages.append({"role": entry.role if entry.role in _ROLES else "user", "content": entry.content})
        messages.append({"role": "user", "content": user_content(request.prompt, request.payload)})
        messages.extend(_turn_messages(request.turns))
        document: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens(agent)}
        if request.tools:
            document["tools"] = [{"type": "function", "function": {
                "name": t.name, "description": t.description, "parameters": t.parameters}} for t in request.tools]
        accept = "application/json"
        if agent.get("stream") is not False:  # the answer streams when the server does (the module doc)
            document["stream"] = True
            document["stream_options"] = {"include_usage": True}
            accept = "text/event-stream, application/json"
        body = canonical_json(document)
        headers = {"Content-Type": "application/json", "Accept": accept, "User-Agent": "kairos"}
        if key_ref is not None:
            with secret_errors():
                headers["Authorization"] = f"Bearer {self._secret(key_ref, owner=request.owner, audience=base_url)}"
        return PreparedCall(kind="model_call", mutation=False, method="POST", url=recorded_target(url), body=body,
                            digest=digest(body), headers=headers, target=target)

    def send(self, prepared: PreparedCall, *, timeout: float) -> Reply:
        if prepared.target is None:
            raise ExecutorError("internal", "the call was not prepared by the openai executor")
        stream = _Stream(self._read_limit, prepared.on_text)

        def sink_for(status: int, content_type: str) -> egress.Sink | None:
            return stream.feed if content_type.split(";")[0].strip().lower() == "text/event-stream" else None

        try:
            answer = egress.post(prepared.target, body=prepared.body, headers=prepared.headers, timeout=timeout,
                                 read_limit=self._read_limit, ca_certs=self._ca_certs,
                                 abort=prepared.abort, sink_for=sink_for)
        except egress.TransportFailure as failure:
            raise _transport_error(failure) from failure
        if not 200 <= answer.status < 300:
            raise _status_error(answer.status, answer.body)
        if answer.streamed:
            return stream.reply()
        if answer.overflow:
            raise ExecutorError("reply_too_large", f"the model's reply exceeded {self._read_limit} bytes")
        return _reply(answer.body)


def _endpoint(base_url: str) -> str:
    try:
        parts = urlsplit(base_url)
    except ValueError as exc:
        raise ExecutorError("agent_invalid", "agent.base_url is not a valid URL") from exc
    return urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/chat/completions", fragment=""))


def _transport_error(failure: egress.TransportFailure) -> ExecutorError:
    if failure.stage == "connect":
        return ExecutorError("connect_failed", f"could not connect to the model server ({failure.detail})",
                             retry_safe=True)
    if failure.status is not None and not 200 <= failure.status < 300:
        return _status_error(failure.status, failure.partial)
    if failure.stage == "timeout":
        return ExecutorError("timeout", "the model server did not answer in time", outcome_unknown=True)
    return ExecutorError("peer_error", f"the connection to the model server broke after sending ({failure.detail})",
                         outcome_unknown=True)


def _status_error(status: int, body: bytes) -> ExecutorError:
    code = _peer_code(body)
    detail = f"HTTP {status}" + (f", {code}" if code else "")
    if status == 429:
        return ExecutorError("rate_limited", f"the model server is rate limiting ({detail})", retry_safe=True)
    if status >= 500:
        return ExecutorError("peer_error", f"the model server failed ({detail})", retry_safe=True)
    return ExecutorError("peer_error", f"the model server refused the request ({detail})")


def _peer_code(body: bytes) -> str | None:
    """The peer's error code or type, when it is a short identifier (never its free-text message)."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError, UnicodeDecodeError):
        return None
    if not isinstance(error, dict):
        return None
    for key in ("code", "type"):
        value = error.get(key)
        if isinstance(value, str) and _IDENTIFIER.fullmatch(value):
            return value
    return None


def _turn_messages(turns: Sequence[ModelTurn | ToolResult]) -> list[dict[str, Any]]:
    """A tool loop's earlier steps in the chat-completions form: an assistant message with its
    ``tool_calls`` (arguments as a JSON string), then one ``tool`` message per answered call."""
    messages: list[dict[str, Any]] = []
    for turn in turns:
        if isinstance(turn, ModelTurn):
            messages.append({"role": "assistant", "content": turn.content or None, "tool_calls": [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": json.dumps(c.arguments, sort_keys=True)}}
                for c in turn.tool_calls]})
        else:
            messages.append({"role": "tool", "tool_call_id": turn.call_id, "content": turn.content})
    return messages


def _tool_calls(message: Any) -> tuple[ToolCall, ...]:
    raw = message.get("tool_calls") if isinstance(message, dict) else None
    if not raw:
        return ()
    calls: list[ToolCall] = []
    try:
        for item in raw:
            function = item["function"]
            arguments = json.loads(function.get("arguments") or "{}")
            if not isinstance(arguments, dict) or not isinstance(item["id"], str):
                raise TypeError("tool call arguments are not a JSON object")
            calls.append(ToolCall(id=item["id"][:128], name=str(function["name"])[:64], arguments=arguments))
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise ExecutorError("malformed_reply", "the model asked for a tool call that cannot be read") from exc
    return checked_tool_calls(tuple(calls))


def _reply(body: bytes) -> Reply:
    try:
        data: Any = json.loads(body)
        choice = data["choices"][0]
        message = choice["message"]
        message.get("content")
    except (ValueError, UnicodeDecodeError, KeyError, IndexError, TypeError, AttributeError, RecursionError) as exc:
        raise ExecutorError("malformed_reply", "the model's reply is not a chat completion with content") from exc
    return _finished(message, data.get("usage"), choice.get("finish_reason") if isinstance(choice, dict) else None)


def _finished(message: dict[str, Any], raw_usage: Any, finish_reason: Any) -> Reply:
    """The reply of a chat completion's ``message`` (read whole, or assembled from a stream)."""
    content = message.get("content")
    calls = _tool_calls(message)
    if calls and content is None:
        content = ""
    if not isinstance(content, str):
        raise ExecutorError("malformed_reply", "the model's reply has no text content")
    text, cut = bounded_content(content)
    usage: dict[str, int] = {}
    if isinstance(raw_usage, dict):
        for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
            value = raw_usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                usage[key] = value  # storable() bounds it
    return storable(Reply(content=text, usage=usage, truncated=cut or finish_reason == "length", tool_calls=calls))


class _Stream:
    """A chat completion streamed as server-sent events, assembled as it arrives (``feed``, the sink
    the transport hands each chunk to) and read at its end (``reply``).

    Each event's ``data:`` is a chunk: ``choices[0].delta.content`` pieces make the text (``on_text`` is
    told the text so far after each piece, up to the content bound), ``delta.tool_calls`` pieces are
    joined by their ``index`` (the first id and name, the arguments' text in order), the last
    ``finish_reason`` counts, and ``usage`` comes in a chunk of its own at the end (``include_usage``).
    ``data: [DONE]`` ends it. What the reply is made of (text, tool names, ids and arguments, in
    UTF-8) is bounded by the read limit, as a whole answer's body is, and so is any one line or event
    (the stream's framing is not kept, so it does not count). The transport stops reading when
    ``feed`` answers False (past the bound, after ``[DONE]``, or at an unreadable chunk)."""

    def __init__(self, read_limit: int, on_text: TextProgress | None) -> None:
        self._limit = read_limit
        self._on_text = on_text
        self._line = b""  # the bytes of a line not yet ended
        self._data: list[bytes] = []  # the data lines of the event being read
        self._data_size = 0
        self._text = ""
        self._saw_content = False
        self._calls: dict[int, dict[str, str]] = {}
        self._finish_reason: Any = None
        self._usage: Any = None
        self._choices = False  # a chunk with a choice arrived
        self._size = 0  # bytes of what the reply is made of
        self._done = False
        self._error: ExecutorError | None = None

    def feed(self, chunk: bytes) -> bool:
        lines = (self._line + chunk).split(b"\n")
        self._line = lines.pop()
        for line in lines:
            self._take(line)
            if self._stopped():
                return False
        if len(self._line) > self._limit:
            self._overflow()
        return not self._stopped()

    def reply(self) -> Reply:
        """The assembled answer once the stream ended (or stopped); the failure it amounts to, if any."""
        if self._line and not self._stopped():
            self._take(self._line)
        if self._data and not self._stopped():
            self._dispatch()
        if self._error is not None:
            raise self._error
        if not self._choices:
            raise ExecutorError("malformed_reply", "the model's streamed reply has no chat completion chunks")
        if not self._done and self._finish_reason is None:
            raise ExecutorError("peer_error", "the model server's stream ended before the answer finished",
                                outcome_unknown=True)
        message: dict[str, Any] = {"content": self._text if self._saw_content else None}
        if self._calls:
            message["tool_calls"] = [{"id": c["id"], "function": {"name": c["name"], "arguments": c["arguments"]}}
                                     for _, c in sorted(self._calls.items())]
        return _finished(message, self._usage, self._finish_reason)

    def _stopped(self) -> bool:
        return self._done or self._error is not None

    def _overflow(self) -> None:
        self._error = ExecutorError("reply_too_large", f"the model's reply exceeded {self._limit} bytes")

    def _take(self, line: bytes) -> None:
        line = line.removesuffix(b"\r")
        if not line:
            if self._data:
                self._dispatch()
            return
        if line.startswith(b":"):  # a comment (a keep-alive)
            return
        name, _, value = line.partition(b":")
        if name == b"data":
            value = value.removeprefix(b" ")
            self._data.append(value)
            self._data_size += len(value)
            if self._data_size > self._limit:
                self._overflow()

    def _dispatch(self) -> None:
        data = b"\n".join(self._data)
        self._data, self._data_size = [], 0
        if data.strip() == b"[DONE]":
            self._done = True
            return
        try:
            chunk: Any = json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError):
            self._error = ExecutorError("malformed_reply", "the model's streamed reply has a chunk that is not JSON")
            return
        if not isinstance(chunk, dict):
            self._error = ExecutorError("malformed_reply", "the model's streamed reply has a chunk that is not JSON")
            return
        if chunk.get("error") is not None and not chunk.get("choices"):
            code = _peer_code(data)
            self._error = ExecutorError("peer_error", "the model server failed while answering"
                                        + (f" ({code})" if code else ""), outcome_unknown=True)
            return
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        choices = chunk.get("choices")
        if not choices:
            return
        try:
            self._choice(choices[0])
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            self._error = ExecutorError("malformed_reply", "the model's streamed reply has a chunk that cannot be read")
            self._error.__cause__ = exc

    def _choice(self, choice: Any) -> None:
        self._choices = True
        if choice.get("finish_reason") is not None:
            self._finish_reason = choice["finish_reason"]
        delta = choice.get("delta") or {}
        content = delta.get("content")
        if content is not None:
            if not isinstance(content, str):
                raise TypeError("delta content is not text")
            self._saw_content = True
            if content:
                self._grow(len(content.encode("utf-8", errors="surrogatepass")))
                if len(self._text) <= CONTENT_CHAR_LIMIT:
                    self._text += content
                    if self._on_text is not None:
                        self._on_text(self._text)
        for position, item in enumerate(delta.get("tool_calls") or ()):
            index = item.get("index", position)
            if isinstance(index, bool) or not isinstance(index, int):
                raise TypeError("a tool call delta has no index")
            call = self._calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
            function = item.get("function") or {}
            for key, value in (("id", item.get("id")), ("name", function.get("name"))):
                if isinstance(value, str) and not call[key]:
                    call[key] = value
                    self._grow(len(value))
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                call["arguments"] += arguments
                self._grow(len(arguments))

    def _grow(self, size: int) -> None:
        self._size += size
        if self._size > self._limit:
            self._overflow()
