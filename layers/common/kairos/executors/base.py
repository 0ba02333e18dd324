"""The executor contract between the run worker (``kairos.execution.execute``) and each executor.

An executor turns one run's input into one external call, in two phases so the worker can reserve
the effect in the ledger between them:

1. ``prepare(request)`` builds the exact call without touching the network: target, canonical body
   and its SHA-256 digest, and whether the call mutates something outside (``mutation``). It raises
   ``ExecutorError`` for configuration problems (bad agent, egress refused, missing secret) — the
   outcome is known: nothing was sent.
2. ``send(prepared, timeout=…)`` performs that one call and returns a ``Reply``; when the worker set
   ``prepared.abort`` and fires it (cancel, lost lease), an HTTP call stops at once as a dropped call.
   A model executor whose peer streams its answer tells ``prepared.on_text`` (when set) the text so
   far as it grows; the ``Reply`` is what counts, whether or not it streamed. It raises
   ``ExecutorError`` whose flags say what is known about the outcome: ``outcome_unknown`` when the
   request may have reached the peer (a timeout after sending, a dropped connection mid-response);
   ``retry_safe`` only when the evidence says nothing happened outside (connection refused, a 429 or
   5xx answered before any work, per the executor's table).

Executors never write to the database and never log prompts, completions or secrets. A model's
``Reply`` passes ``storable`` before it leaves its executor: whatever PostgreSQL could not store (a NUL,
a lone surrogate, a number that is not finite, a token count no call can have) fails the call
``unstorable_reply`` — after the one call, never retried — instead of failing a write later with the
reply in the database's error text.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, overload

from kairos import limits
from kairos.diagnosis import REASON_CODES
from kairos.executors.catalog import TOOL_EXECUTORS as TOOL_EXECUTORS
from kairos.secrets import SecretUnavailable

EffectKind = Literal["model_call", "http_call", "tool_call"]
# TOOL_EXECUTORS (imported above, from kairos.executors.catalog): the executors whose models call
# tools (a tool loop); an agent's ``tools`` need one of them.


@dataclass(frozen=True)
class Message:
    role: str  # system | user | assistant | tool
    content: str


@dataclass(frozen=True)
class ExecutionRequest:
    run_id: str
    attempt: int
    owner: str  # the run's owner: whose secret references the agent may use (kairos.secrets)
    agent: dict[str, Any]
    transcript: tuple[Message, ...]  # the target conversation before this run's prompt
    prompt: str
    payload: Any = None  # a webhook's JSON body, when the run came from a hook
    tools: tuple[ToolSpec, ...] = ()  # what the model may call (a tool loop); empty: one plain answer
    turns: tuple[ModelTurn | ToolResult, ...] = ()  # this run's earlier steps, after its user turn


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the model sees it: a name, what it does, and a JSON Schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for: the provider's id for it, the tool, and its JSON arguments."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ModelTurn:
    """A model reply inside the loop: its text (maybe empty) and the tool calls it asked for."""

    content: str
    tool_calls: tuple[ToolCall, ...]


@dataclass(frozen=True)
class ToolResult:
    """What a tool answered to one call (JSON text), and whether it is an error the model should see."""

    call_id: str
    name: str
    content: str
    is_error: bool = False


class Abort:
    """Stops one run's call in flight from another thread: the heartbeat fires it when it reads a
    cancel request or finds the lease lost, so a cancelled run does not wait out (and pay for) a call
    of up to 300 s.

    ``fire()`` shuts down every socket attached to it: a connect, send or read blocked on one returns
    at once. (``shutdown``, not ``close``: it wakes a thread blocked on the same socket, and it is the
    plain socket's, below TLS, so no TLS state is touched from this thread.) A socket attached after
    ``fire()`` is refused, so a call that had not sent yet never sends. Firing twice, or never, is safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fired = False
        self._sockets: set[socket.socket] = set()

    @property
    def fired(self) -> bool:
        return self._fired

    def fire(self) -> None:
        with self._lock:
            self._fired = True
            sockets = list(self._sockets)
        for sock in sockets:
            try:
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by its call: nothing left to stop

    def attach(self, sock: socket.socket) -> bool:
        """Registers the socket of a call about to send; False (not attached) once fired."""
        with self._lock:
            if self._fired:
                return False
            self._sockets.add(sock)
            return True

    def detach(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.discard(sock)


# The text a streaming model has answered so far (``PreparedCall.on_text``).
TextProgress = Callable[[str], None]


@dataclass(frozen=True)
class ResolvedTarget:
    """A URL whose host passed the egress check, with the addresses a connection may use."""

    url: str
    scheme: Literal["http", "https"]
    host: str  # lower case, no brackets, no trailing dot
    port: int
    path: str  # path and query, at least "/"
    addresses: tuple[str, ...]  # checked IPs, IPv4 first; never empty

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


@dataclass(frozen=True)
class PreparedCall:
    kind: EffectKind
    mutation: bool
    method: str
    url: str  # what is recorded as the effect's target: ``recorded_target`` (no userinfo, query or fragment)
    body: bytes
    digest: str  # SHA-256 hex of body
    headers: dict[str, str] = field(default_factory=dict, repr=False)  # may carry credentials: never log
    # The destination the egress check approved, with its addresses pinned: ``send`` connects only to
    # these (no second DNS resolution). None for calls that do not leave through the egress check.
    target: ResolvedTarget | None = None
    # Set by the worker before ``send``: the handle that aborts this call in flight (see ``Abort``).
    abort: Abort | None = field(default=None, compare=False, repr=False)
    # Set by the worker before ``send``: told the answer's text so far while a model streams it (an
    # executor that does not stream never calls it). Called on the sending thread; must not raise.
    on_text: TextProgress | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Reply:
    content: str
    usage: dict[str, int] = field(default_factory=dict)  # e.g. prompt_tokens, completion_tokens
    truncated: bool = False
    tool_calls: tuple[ToolCall, ...] = ()  # a tool loop's model asked for these instead of answering


class ExecutorError(Exception):
    """A failed call, classified. ``reason_code`` is one of ``kairos.diagnosis.REASON_CODES``."""

    def __init__(self, reason_code: str, message: str, *, retry_safe: bool = False,
                 outcome_unknown: bool = False, usage: Mapping[str, int] | None = None) -> None:
        if reason_code not in REASON_CODES:
            raise ValueError(f"unknown reason code {reason_code}")
        super().__init__(message)
        self.reason_code = reason_code
        self.message = message
        self.retry_safe = retry_safe and not outcome_unknown
        self.outcome_unknown = outcome_unknown
        # The counts of a call the model answered (and its provider billed) whose reply is refused all
        # the same (``storable``): the call is counted with them. None: no answer to count.
        self.usage = None if usage is None else dict(usage)


@contextmanager
def secret_errors() -> Iterator[None]:
    """Around a ``SecretSource`` call: a secret that may not be used or cannot be read fails the call
    ``secret_unavailable`` (nothing was sent), retry-safe only when the store itself failed."""
    try:
        yield
    except SecretUnavailable as error:
        raise ExecutorError("secret_unavailable", error.message, retry_safe=error.retry_safe) from None


class SecretSource(Protocol):
    """Resolves a secret reference for an owner and the URL it will travel to (``kairos.secrets.resolve``)."""

    def __call__(self, reference: str, *, owner: str, audience: str | None) -> str: ...


class Executor(Protocol):
    name: str

    def prepare(self, request: ExecutionRequest) -> PreparedCall: ...

    def send(self, prepared: PreparedCall, *, timeout: float) -> Reply: ...


def canonical_json(value: Any) -> bytes:
    """Sorted keys, compact separators, ASCII escapes: the digested form of a request body."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*://)[^/?#]*@")


def recorded_target(url: str) -> str:
    """``url`` as the effects ledger keeps it: scheme, host, port and path only.

    The query and fragment are cut at the first ``?`` or ``#`` and any ``userinfo@`` is dropped: a
    ``base_url`` may carry a key (``?api-key=…``) that the call needs but no record may keep. Plain
    text rules, not a URL parser, so a malformed URL cannot slip through, and migration
    ``0006_effect_targets_scrubbed`` applies the same two rules to rows written before.
    """
    return _USERINFO.sub(r"\1", re.split(r"[?#]", url, maxsplit=1)[0])


# Bounds shared by the executors. A model's output is capped at 8,192 tokens; a reply's content at
# 64 KiB of text (about 8,192 tokens); a reply's body at 1 MiB on the wire.
OUTPUT_TOKEN_CAP = 8192
DEFAULT_MAX_TOKENS = 1024
CONTENT_CHAR_LIMIT = 65_536
READ_LIMIT = 1 << 20


# Model input is bounded (docs/api.md "API", max_input_tokens): the system prompt, the run's user turn and as many of
# the newest transcript entries as fit the agent's ``max_input_tokens``, estimated as characters / 4.
# An entry also costs its framing (role and JSON around the content), counted as 4 tokens, so an
# empty entry is not free and a window never holds more than the budget / 16 entries.
# A model turn of a tool loop is recorded in the step log: it may ask for at most this many calls,
# each with arguments of at most this many characters of JSON (more is a malformed reply).
TOOL_CALLS_PER_TURN = 8
TOOL_ARGUMENTS_CHARS = 16_384
# A tool loop's model turns (an agent's ``max_steps``): this many when unset, never more than the cap
# (kairos.agents refuses a larger max_steps; kairos.execution.tool_loop bounds the loop).
MAX_STEPS_DEFAULT = limits.DEFAULTS["max_steps"]
MAX_STEPS_CAP = 32


def checked_tool_calls(calls: tuple[ToolCall, ...]) -> tuple[ToolCall, ...]:
    if len(calls) > TOOL_CALLS_PER_TURN:
        raise ExecutorError("malformed_reply",
                            f"the model asked for more than {TOOL_CALLS_PER_TURN} tool calls at once")
    for call in calls:
        if len(json.dumps(call.arguments)) > TOOL_ARGUMENTS_CHARS:
            raise ExecutorError("malformed_reply", f"a tool call's arguments exceed {TOOL_ARGUMENTS_CHARS} characters")
    return calls


# A reply's token counts: a count outside 0..USAGE_COUNT_MAX is no count (PostgreSQL's bigint ends at
# 2^63 - 1, and no call reads or writes a hundred million tokens). Tool arguments nest at most this deep.
USAGE_COUNT_MAX = 100_000_000
ARGUMENTS_DEPTH_MAX = 64


def storable(reply: Reply) -> Reply:
    """``reply`` when the database can store every part of it; ``ExecutorError("unstorable_reply")``
    otherwise (not retry-safe: the model answered, and asking again costs again). The error names what
    kind of part is wrong, never its text, and carries the reply's counts (``usage``): the call was made
    and billed, so it is counted — with each count that is a count, and a count that is not one (out of
    0..USAGE_COUNT_MAX: no call has it, and it is what cannot be stored) left out, i.e. counted 0."""
    problem = text_problem(reply.content)
    counts: dict[str, int] = {}
    for key, value in reply.usage.items():
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= USAGE_COUNT_MAX:
            problem = problem or f"a token count ({key[:32]}) is not a count between 0 and {USAGE_COUNT_MAX}"
        elif text_problem(key) is None:
            counts[key] = value
    for call in reply.tool_calls:
        problem = problem or text_problem(call.id) or text_problem(call.name) or json_problem(call.arguments)
    if problem is not None:
        raise ExecutorError("unstorable_reply", f"the model's reply cannot be stored: {problem}", usage=counts)
    return reply


def text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "it holds a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "it holds a lone surrogate"
    return None


def json_problem(value: Any) -> str | None:
    """The first part of a JSON value (a tool call's arguments, a corpus record) PostgreSQL's jsonb
    cannot hold, or None (iterative: a deep document cannot exhaust the stack)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > ARGUMENTS_DEPTH_MAX:
            return f"tool arguments nest deeper than {ARGUMENTS_DEPTH_MAX}"
        if isinstance(item, str):
            found = text_problem(item)
        elif isinstance(item, float):
            found = None if math.isfinite(item) else "a tool argument is a number that is not finite"
        elif isinstance(item, dict):
            found = next(filter(None, (text_problem(str(k)) for k in item)), None)
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            found = None
            stack.extend((v, depth + 1) for v in item)
        else:
            found = None
        if found is not None:
            return found
    return None


DEFAULT_MAX_INPUT_TOKENS = 16_000
INPUT_TOKEN_CAP = 100_000
CHARS_PER_TOKEN = 4
ENTRY_OVERHEAD_CHARS = 16


def max_input_tokens(agent: dict[str, Any]) -> int:
    """``min(agent.max_input_tokens or 16000, 100000)``; ``agent_invalid`` unless a positive integer."""
    value = agent.get("max_input_tokens")
    if value is None:
        return DEFAULT_MAX_INPUT_TOKENS
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ExecutorError("agent_invalid", "agent.max_input_tokens must be a positive integer")
    return min(value, INPUT_TOKEN_CAP)


def elision_marker(elided: int) -> str:
    """The text that stands in for the ``elided`` oldest entries left out of a model's input."""
    noun = "entry" if elided == 1 else "entries"
    return f"[{elided} earlier {noun} of this conversation left out to fit the input limit]"


@overload
def agent_text(agent: dict[str, Any], key: str, *, required: Literal[True]) -> str: ...
@overload
def agent_text(agent: dict[str, Any], key: str, *, required: bool) -> str | None: ...
def agent_text(agent: dict[str, Any], key: str, *, required: bool) -> str | None:
    """A string field of the agent config; ``agent_invalid`` when required and absent, or not a string."""
    value = agent.get(key)
    if value is None or value == "":
        if required:
            raise ExecutorError("agent_invalid", f"agent.{key} is required for the {agent.get('executor')} executor")
        return None
    if not isinstance(value, str):
        raise ExecutorError("agent_invalid", f"agent.{key} must be a string")
    return value


def max_tokens(agent: dict[str, Any]) -> int:
    """``min(agent.max_tokens or 1024, 8192)``; ``agent_invalid`` unless a positive integer."""
    value = agent.get("max_tokens")
    if value is None:
        return DEFAULT_MAX_TOKENS
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ExecutorError("agent_invalid", "agent.max_tokens must be a positive integer")
    return min(value, OUTPUT_TOKEN_CAP)


def user_content(prompt: str, payload: Any) -> str:
    """The run's user turn: the prompt, then the webhook payload (when present) as JSON in a delimited block.

    Every ``<`` inside the JSON is written as ``\\u003c`` (the same JSON value), so a payload cannot
    close the block early and pose as instructions outside it.
    """
    if payload is None:
        return prompt
    text = json.dumps(payload, sort_keys=True, indent=2, ensure_ascii=False).replace("<", "\\u003c")
    return f"{prompt}\n\n<webhook_payload>\n{text}\n</webhook_payload>"


def bounded_content(text: str) -> tuple[str, bool]:
    """``text`` cut to ``CONTENT_CHAR_LIMIT`` characters, and whether it was cut."""
    if len(text) > CONTENT_CHAR_LIMIT:
        return text[:CONTENT_CHAR_LIMIT], True
    return text, False
