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
| 2xx body over 1 MiB | reply_too_large | no | no |
| 2xx not JSON, or no ``choices[0].message.content`` string | malformed_reply | no | no |
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
    READ_LIMIT,
    ExecutionRequest,
    ExecutorError,
    ModelTurn,
    PreparedCall,
    Reply,
    SecretSource,
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
        body = canonical_json(document)
        headers = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": "kairos"}
        if key_ref is not None:
            with secret_errors():
                headers["Authorization"] = f"Bearer {self._secret(key_ref, owner=request.owner, audience=base_url)}"
        return PreparedCall(kind="model_call", mutation=False, method="POST", url=recorded_target(url), body=body,
                            digest=digest(body), headers=headers, target=target)

    def send(self, prepared: PreparedCall, *, timeout: float) -> Reply:
        if prepared.target is None:
            raise ExecutorError("internal", "the call was not prepared by the openai executor")
        try:
            answer = egress.post(prepared.target, body=prepared.body, headers=prepared.headers, timeout=timeout,
                                 read_limit=self._read_limit, ca_certs=self._ca_certs,
                                 abort=prepared.abort)
        except egress.TransportFailure as failure:
            raise _transport_error(failure) from failure
        if not 200 <= answer.status < 300:
            raise _status_error(answer.status, answer.body)
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
        content = message.get("content")
    except (ValueError, UnicodeDecodeError, KeyError, IndexError, TypeError, AttributeError, RecursionError) as exc:
        raise ExecutorError("malformed_reply", "the model's reply is not a chat completion with content") from exc
    calls = _tool_calls(message)
    if calls and content is None:
        content = ""
    if not isinstance(content, str):
        raise ExecutorError("malformed_reply", "the model's reply has no text content")
    text, cut = bounded_content(content)
    usage: dict[str, int] = {}
    raw_usage = data.get("usage")
    if isinstance(raw_usage, dict):
        for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
            value = raw_usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                usage[key] = value  # storable() bounds it
    stopped_short = isinstance(choice, dict) and choice.get("finish_reason") == "length"
    return storable(Reply(content=text, usage=usage, truncated=cut or stopped_short, tool_calls=calls))
