"""Agent tools: what a model in a tool loop may call (docs/api.md "Agents that act").

Role: an agent lists ``tools``; ``specs`` turns that into what the model sees. Two families:

* ``schedules`` — ``schedules_create``, ``schedules_list``, ``schedules_cancel`` on the run's own
  conversation, through the same library calls and limits as the API (``kairos.schedules``). Only a
  ``chat`` run may use them, and not in a conversation descending from a run: anywhere else the model
  gets the tool error ``scheduling_not_allowed``. They run inside the worker's transaction that also
  records the step (``run_local``), so a step is applied and recorded together or not at all.
* ``http`` — ``http_post``: POST a JSON body to a URL that passes the egress check; a mutation, sent
  like an executor's call (``prepare_http``), its answer classified by ``http_result``.

A refused call (a limit, a validation error, an unknown tool, a URL the egress check refuses) is
answered to the model as a tool error it can act on — ``{"error": {"code", "message", "fields"}}`` —
never a failed run. A tool takes exactly its declared schema (``allowed``): an argument the schema
does not offer (``mode``, ``agent``, ``corpus``, ``catch_up``, a ``webhook`` kind …), a missing one or
one of the wrong type is refused (``validation_failed`` naming the field and rule) before any approval
is asked or anything is done, so the model cannot reach what the API offers a person but the tool does
not.

``preview`` is what an approver sees. For ``http_post`` the target (method and whole URL) comes first
and is never cut; only the body is cut (at ``PREVIEW_BODY_CHARS``), with its size and the SHA-256 of
the bytes that will be sent. ``needs_approval`` applies the agent's ``approval`` policy (``mutations`` by
default): every call but ``schedules_list`` is a mutation. A test run sends no mutation: the model is
answered ``not_sent_test`` instead.

Must not: let a tool reach another owner's rows or another conversation's schedules; put arguments,
bodies or answers in logs (the step log keeps them, bounded).
"""

from __future__ import annotations

import hashlib
import json
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from kairos import conversations, db, schedules
from kairos.errors import KairosError
from kairos.executors import egress
from kairos.executors.base import (
    CONTENT_CHAR_LIMIT,
    READ_LIMIT,
    ExecutorError,
    PreparedCall,
    ToolCall,
    ToolResult,
    ToolSpec,
    canonical_json,
    digest,
    recorded_target,
)
from kairos.states import ScheduleKind, Source

RESULT_CHAR_LIMIT = 8_192  # what a tool answers the model (and the step log keeps), at most
PREVIEW_CHARS = 2_000  # an approval preview's arguments, at most (http_post: its body, the URL is whole)
PREVIEW_BODY_CHARS = PREVIEW_CHARS
URL_MAX = 2_048  # an http_post URL, at most: an approver always sees it whole

_SCHEDULE_FIELDS = {
    "prompt": {"type": "string"}, "name": {"type": "string"},
    "kind": {"type": "string", "enum": [ScheduleKind.CRON.value, ScheduleKind.INTERVAL.value,
                                                     ScheduleKind.ONCE.value]}, "cron": {"type": "string"},
    "interval_seconds": {"type": "integer"}, "starts_at": {"type": "string", "format": "date-time"},
    "ends_at": {"type": "string", "format": "date-time"}, "timezone": {"type": "string"},
    "max_occurrences": {"type": "integer"},
}
SPECS: dict[str, ToolSpec] = {
    "schedules_create": ToolSpec(
        "schedules_create", "Schedule this conversation's prompt to run later or repeatedly (cron in the given "
        "timezone, an interval, or once). At most 10 schedules per conversation, at most every 5 minutes.",
        {"type": "object", "properties": _SCHEDULE_FIELDS, "required": ["prompt"], "additionalProperties": False}),
    "schedules_list": ToolSpec(
        "schedules_list", "List this conversation's schedules that are not cancelled.",
        {"type": "object", "properties": {}, "additionalProperties": False}),
    "schedules_cancel": ToolSpec(
        "schedules_cancel", "Cancel one of this conversation's schedules by its id.",
        {"type": "object", "properties": {"schedule_id": {"type": "string"}}, "required": ["schedule_id"],
         "additionalProperties": False}),
    "http_post": ToolSpec(
        "http_post", "POST a JSON body to an HTTPS URL and read the answer.",
        {"type": "object", "properties": {"url": {"type": "string", "maxLength": URL_MAX},
                                          "body": {"type": "object"}},
         "required": ["url", "body"], "additionalProperties": False}),
}
FAMILIES: dict[str, tuple[str, ...]] = {
    "schedules": ("schedules_create", "schedules_list", "schedules_cancel"),
    "http": ("http_post",),
}
MUTATIONS = frozenset({"schedules_create", "schedules_cancel", "http_post"})
LOCAL = frozenset(FAMILIES["schedules"])


@dataclass(frozen=True)
class Context:
    """Who a tool acts for: the run's owner, its source, and the conversation it was posted to."""

    run_id: uuid.UUID
    owner: str
    source: str
    conversation_id: uuid.UUID


def specs(agent: dict[str, Any]) -> tuple[ToolSpec, ...]:
    return tuple(SPECS[name] for family in agent.get("tools") or () for name in FAMILIES.get(family, ()))


def needs_approval(agent: dict[str, Any], name: str) -> bool:
    policy = agent.get("approval") or "mutations"
    return policy == "always" or (policy == "mutations" and name in MUTATIONS)


def args_digest(call: ToolCall) -> str:
    """SHA-256 hex of the tool and its arguments as canonical JSON: what an approval is bound to."""
    return digest(canonical_json({"tool": call.name, "arguments": call.arguments}))


def preview(call: ToolCall) -> dict[str, Any]:
    """What an approver sees: the tool and its arguments, bounded (see the module doc)."""
    url, body = call.arguments.get("url"), call.arguments.get("body")
    if call.name == "http_post" and isinstance(url, str) and isinstance(body, dict):
        sent = canonical_json(body)  # the bytes prepare_http sends
        text = json.dumps(body, sort_keys=True, ensure_ascii=False)
        cut = len(text) > PREVIEW_BODY_CHARS
        arguments = (f'{{"url": {json.dumps(url, ensure_ascii=False)}, "body": '
                     f'{text[:PREVIEW_BODY_CHARS]}{"…" if cut else ""}}}')
        return {"tool": call.name, "target": {"method": "POST", "url": url}, "arguments": arguments,
                "truncated": cut, "body": {"bytes": len(sent), "sha256": digest(sent), "truncated": cut}}
    text = json.dumps(call.arguments, sort_keys=True, ensure_ascii=False)
    return {"tool": call.name, "arguments": text[:PREVIEW_CHARS], "truncated": len(text) > PREVIEW_CHARS}


def error(call: ToolCall, code: str, message: str, fields: Sequence[dict[str, str]] = ()) -> ToolResult:
    body = json.dumps({"error": {"code": code, "message": message, "fields": list(fields)}}, ensure_ascii=False)
    return ToolResult(call.id, call.name, body[:RESULT_CHAR_LIMIT], is_error=True)


def not_sent_test(call: ToolCall) -> ToolResult:
    """What a test run's model is answered for a mutation it asked for: recorded, not sent."""
    return _answer(call, {"status": "not_sent_test",
                          "message": "not sent (test run): this call was recorded with its arguments but not "
                                     "performed; nothing outside changed"})


def _answer(call: ToolCall, value: Any) -> ToolResult:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    return ToolResult(call.id, call.name, text[:RESULT_CHAR_LIMIT])


def allowed(call: ToolCall, agent: dict[str, Any]) -> ToolResult | None:
    """A tool error when the agent does not offer ``call.name`` or the arguments are not exactly its
    declared schema; None when it may be called."""
    if call.name not in {s.name for s in specs(agent)}:
        return error(call, "unknown_tool", f"{call.name} is not one of this agent's tools")
    problems = schema_problems(SPECS[call.name].parameters, call.arguments)
    if problems:
        return error(call, "validation_failed", f"the arguments do not match {call.name}'s parameters", problems)
    return None


_JSON_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,), "object": (dict,)}


def schema_problems(schema: dict[str, Any], arguments: Any) -> list[dict[str, str]]:
    """Where ``arguments`` leaves the tool's declared schema (the subset ``SPECS`` uses: an object of
    typed properties, ``required``, ``enum``, ``maxLength``, no other property), as tool-error fields."""
    if not isinstance(arguments, dict):
        return [{"field": "arguments", "rule": "type", "message": "the arguments are a JSON object"}]
    offered: dict[str, Any] = schema.get("properties", {})
    problems = [{"field": name, "rule": "unknown_field", "message": "this tool does not take this argument"}
                for name in sorted(set(arguments) - set(offered))]
    problems += [{"field": name, "rule": "required", "message": "this argument is required"}
                 for name in schema.get("required", ()) if name not in arguments]
    for name, rule in offered.items():
        if name not in arguments:
            continue
        value, kind = arguments[name], rule.get("type")
        if kind in _JSON_TYPES and (not isinstance(value, _JSON_TYPES[kind]) or isinstance(value, bool)):
            problems.append({"field": name, "rule": "type", "message": f"give a JSON {kind}"})
        elif "enum" in rule and value not in rule["enum"]:
            problems.append({"field": name, "rule": "enum", "message": f"one of {', '.join(rule['enum'])}"})
        elif "maxLength" in rule and len(value) > rule["maxLength"]:
            problems.append({"field": name, "rule": "max_length", "message": f"at most {rule['maxLength']} characters"})
    return problems


def run_local(conn: psycopg.Connection[db.Row], call: ToolCall, context: Context) -> ToolResult:
    """A ``schedules_*`` call inside the caller's transaction (see the module doc)."""

    if context.source != Source.CHAT.value or conversations.lineage_has_run(conn, context.conversation_id):
        return error(call, "scheduling_not_allowed",
                     "schedules can only be made from a person's chat turn, not from scheduled or triggered work")
    try:
        with db.atomic(conn):
            return _schedules(conn, call, context, schedules)
    except KairosError as refused:
        return error(call, refused.code, refused.message,
                     [{"field": f.field, "rule": f.rule, "message": f.message} for f in refused.fields])


def _schedules(conn: psycopg.Connection[db.Row], call: ToolCall, context: Context, schedules: Any) -> ToolResult:
    if call.name == "schedules_list":
        found = schedules.list_for(conn, owner=context.owner, conversation_id=context.conversation_id)
        return _answer(call, {"schedules": [_brief(s) for s in found]})
    if call.name == "schedules_create":
        raw = {**call.arguments, "conversation_id": str(context.conversation_id)}
        created = schedules.create(conn, owner=context.owner, raw=raw)
        return _answer(call, {"schedule": _brief(created.schedule)})
    try:
        schedule_id = uuid.UUID(str(call.arguments.get("schedule_id")))
    except ValueError:
        return error(call, "not_found", "no schedule of this conversation has that id")
    current = schedules.get(conn, schedule_id, owner=context.owner)
    if current.conversation_id != context.conversation_id:
        return error(call, "not_found", "no schedule of this conversation has that id")
    return _answer(call, {"schedule": _brief(schedules.cancel(conn, schedule_id, owner=context.owner))})


def _brief(schedule: Any) -> dict[str, Any]:
    data = schedule.as_json()
    keep = ("id", "name", "kind", "cron", "interval_seconds", "starts_at", "timezone", "status", "next_fire_at")
    return {k: data.get(k) for k in keep}


def prepare_http(call: ToolCall, *, allow: Sequence[str] = (), resolve: egress.Resolver = socket.getaddrinfo,
                 ) -> PreparedCall | ToolResult:
    """The ``http_post`` call through the egress check, or the tool error the model gets instead."""
    url, body = call.arguments.get("url"), call.arguments.get("body")
    if not isinstance(url, str) or not url.startswith(("https://", "http://")) or not isinstance(body, dict):
        return error(call, "validation_failed", "give url (an http(s) URL) and body (a JSON object)")
    try:
        target = egress.check(url, allow=allow, resolve=resolve)
    except ExecutorError as refused:
        return error(call, refused.reason_code, "this URL is not an allowed destination")
    payload = canonical_json(body)
    return PreparedCall(kind="http_call", mutation=True, method="POST", url=recorded_target(url), body=payload,
                        digest=digest(payload), headers={"Content-Type": "application/json",
                                                         "User-Agent": "kairos"}, target=target)


def send_http(prepared: PreparedCall, *, timeout: float, ca_certs: str | None = None) -> tuple[int, bytes]:
    """Sends a prepared ``http_post`` once; ``ExecutorError`` classified like the http executor."""
    if prepared.target is None:  # prepare_http always resolves the target of an http_post
        raise RuntimeError("an http_post was prepared without its resolved target")
    try:
        answer = egress.post(prepared.target, body=prepared.body, headers=prepared.headers, timeout=timeout,
                             read_limit=READ_LIMIT, ca_certs=ca_certs, abort=prepared.abort)
    except egress.TransportFailure as failure:
        if failure.stage == "connect":
            raise ExecutorError("connect_failed", "could not connect to the tool's URL", retry_safe=True) from None
        if failure.status is not None:
            return failure.status, failure.partial
        raise ExecutorError("timeout" if failure.stage == "timeout" else "peer_error",
                            "the tool's URL did not answer completely after the request was sent",
                            outcome_unknown=True) from None
    return answer.status, answer.body


def http_result(call: ToolCall, status: int, body: bytes) -> ToolResult:
    text = body.decode("utf-8", errors="replace")[:CONTENT_CHAR_LIMIT]
    result = {"status": status, "body": text[:RESULT_CHAR_LIMIT - 64]}
    return ToolResult(call.id, call.name, json.dumps(result, ensure_ascii=False), is_error=not 200 <= status < 300)


def digest_of(result: ToolResult) -> str:
    return hashlib.sha256(result.content.encode("utf-8")).hexdigest()
