"""Editing a schedule or a goal loop: ``PATCH /v1/schedules/{id}`` and ``PATCH /v1/loops/{id}`` as a new
revision of its definition.

Role: merge a JSON merge patch (RFC 7396: a field given replaces, ``null`` resets it to its
default, an absent one is kept) over the schedule's current definition, check the result exactly as
a create is checked (``parse_request``: the same rules, limits and rule words), and store it as the
next revision. The database records every revision in ``schedule_revisions`` (a trigger on
``schedules``), so a run always executes the revision its occurrence recorded — a fire that happened
before the edit keeps the old prompt and agent even if it is claimed after.

Rules:
* ``If-Match: <revision>`` (``"3"``, ``W/"3"`` or ``3``; ``*`` for any) must name the current
  revision, else ``PreconditionFailed`` (412) and nothing changes. Without it the edit applies to
  whatever revision it finds (last writer wins, like a create).
* ``conversation_id`` cannot change, nor can a webhook schedule become timed or the reverse (its token
  and its cursor mean different things): ``immutable``.
* Only an active or paused schedule can be edited (``Conflict`` otherwise); it keeps its status. The
  next fire is recomputed from now; ``max_occurrences`` must stay above the fires already made.
* A loop is edited only as a loop (``loop=True``; the schedules route gets ``loop_policy``): its patch
  is checked as a loop body (``kairos.schedules.loop_policy``: fixed policies, caps, goal) over the
  same definition-as-body, a draft loop can be edited too, and a new goal is the goal's next revision:
  the loop goes back to ``draft`` and the old goal's pending question is cancelled with its run
  (``kairos.schedules.loops`` says why).

Must not: build SQL from strings or log the prompt, the agent or the signing secret reference.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from kairos import conversations, db, input_requests
from kairos.errors import Conflict, FieldError, NotFound, PreconditionFailed, ValidationFailed
from kairos.observability import logger
from kairos.schedules import Schedule, definition_columns, loop_policy, next_fire_at
from kairos.schedules.request import TIMED_KINDS, ScheduleRequest, parse_request, rule_of
from kairos.states import Mode, ScheduleKind, ScheduleStatus

_EDITABLE = frozenset(ScheduleRequest.model_fields) - {"conversation_id"}
_IF_MATCH = re.compile(r'^(?:W/)?"?(\d{1,9})"?$')
# The statuses an edit finds its schedule in, for a schedule and for a loop (by ``loop``).
_EDITABLE_STATUSES = {False: (ScheduleStatus.ACTIVE, ScheduleStatus.PAUSED),
                      True: (ScheduleStatus.DRAFT, ScheduleStatus.ACTIVE, ScheduleStatus.PAUSED)}


def parse_if_match(value: str | None) -> int | None:
    """The revision an ``If-Match`` header names; None for no header or ``*``."""
    if value is None or value.strip() == "*":
        return None
    match = _IF_MATCH.match(value.strip())
    if match is None:
        raise ValidationFailed([FieldError("If-Match", "revision",
                                           'give the revision the schedule was read at, e.g. "3" (its ETag)')])
    return int(match.group(1))


def edit(conn: psycopg.Connection[db.Row], schedule_id: uuid.UUID, *, owner: str, patch: object,
         if_match: int | None = None, now: datetime | None = None, loop: bool = False) -> Schedule:
    """Applies ``patch`` as the next revision; see the module doc for the rules and errors. ``loop``:
    the schedule is a goal loop (``PATCH /v1/loops/{id}``, ``kairos.schedules.loops``)."""
    if not isinstance(patch, Mapping):
        raise ValidationFailed([FieldError("body", "type", "give the changes as a JSON object")])
    noun = "loop" if loop else "schedule"
    revised = False
    with db.atomic(conn):
        if loop:
            # The runs waiting on the loop's questions first, then the loop (a goal edit cancels them): the
            # order a run's worker takes them in.
            input_requests.lock_waiting_runs(conn, schedule_id, owner=owner)
        row = db.fetch_one(conn, "schedules_lock_owned", {"schedule_id": schedule_id, "owner": owner, "now": now})
        if row is None or (loop and not row["loop"]):
            raise NotFound(noun)
        current = Schedule.from_row(row)
        if current.loop and not loop:
            raise loop_policy.loop_refusal("edited")
        clock: datetime = row["db_now"].astimezone(UTC)
        if if_match is not None and if_match != current.revision:
            raise PreconditionFailed(
                f"the {noun} is at revision {current.revision}, not {if_match}; read it again, then edit",
                fields=[FieldError("If-Match", "current_revision", f"the current revision is {current.revision}")])
        _check_editable(current, loop=loop)
        goal: loop_policy.Goal | None = None
        if loop:
            goal, request = _loop_request(current, patch, owner=owner, clock=clock)
        else:
            request = parse_request(_merged(current, patch), owner=owner, now=clock)
        first = _next_fire(current, request, clock, noun=noun)
        conversation = conversations.get(conn, current.conversation_id, owner=owner)
        columns = {**definition_columns(request, conversation_agent=conversation.agent),
                   "schedule_id": schedule_id, "owner": owner, "revision": current.revision,
                   "next_fire_at": first, "now": clock}
        if loop:
            revised = goal is not None and not loop_policy.same_goal(current.goal, goal)
            envelope = None if not revised or goal is None else loop_policy.envelope(
                goal, schedule_id=current.id, revision=current.revision + 1, agent=conversation.agent)
            stored = db.fetch_one(conn, "schedules_edit_loop",
                                  {**columns, "goal": None if envelope is None else Jsonb(envelope)})
        else:
            stored = db.fetch_one(conn, "schedules_edit", columns)
        if stored is None:  # unreachable under the row lock; refuse rather than guess
            raise Conflict(f"the {noun} changed meanwhile; read it again, then edit")
        if revised:
            drafted = db.fetch_one(conn, "schedules_loop_draft", {"schedule_id": schedule_id, "owner": owner})
            stored = drafted or stored
            # The old goal's question can no longer be answered usefully: its run is cancelled with it.
            input_requests.cancel_for_schedule(conn, schedule_id, reason="goal_revised", now=now)
    edited = Schedule.from_row(stored)
    fields = sorted(str(k) for k in patch)
    if loop:
        logger.info("loop edited", extra={"action": "loop_edited", "schedule_id": str(edited.id),
                                           "revision": edited.revision, "goal_revised": revised, "fields": fields})
    else:
        logger.info("schedule edited", extra={
            "action": "schedule_edited", "schedule_id": str(edited.id), "revision": edited.revision, "fields": fields})
    return edited


def _check_editable(current: Schedule, *, loop: bool) -> None:
    noun, editable = ("loop" if loop else "schedule"), _EDITABLE_STATUSES[loop]
    if current.status not in editable:
        words = [s.value for s in editable]
        raise Conflict(f"a {current.status.value} {noun} cannot be edited",
                       fields=[FieldError("status", "editable",
                                          f"only {', '.join(words[:-1])} and {words[-1]} {noun}s can be edited")])


def _merged(current: Schedule, patch: Mapping[str, Any]) -> dict[str, Any]:
    """The current definition as a create body, with the patch applied (merge-patch semantics)."""
    problems = [FieldError(str(name), "unknown_field", f"{name} is not a schedule field")
                for name in patch if name not in _EDITABLE and name != "conversation_id"]
    if "conversation_id" in patch and str(patch["conversation_id"]) != str(current.conversation_id):
        problems.append(FieldError("conversation_id", "immutable",
                                   "a schedule stays in its conversation; create a new one elsewhere"))
    kind = patch.get("kind", current.kind.value)
    if kind is not None and (kind == ScheduleKind.WEBHOOK.value) != (current.kind is ScheduleKind.WEBHOOK):
        problems.append(FieldError("kind", "immutable", "a webhook schedule cannot become timed or the reverse"))
    if problems:
        raise ValidationFailed(problems)
    return {**as_body(current, patch), "conversation_id": str(current.conversation_id)}


def _loop_request(current: Schedule, patch: Mapping[str, Any], *, owner: str,
                  clock: datetime) -> tuple[loop_policy.Goal | None, ScheduleRequest]:
    """A loop's patch checked as a loop body (policies, caps, goal), then its rule as a schedule's: the
    new goal (None when the patch leaves it) and the request."""
    problems = loop_policy.policy_problems(patch, allowed=loop_policy.FIELDS)
    if "conversation_id" in patch and str(patch["conversation_id"]) != str(current.conversation_id):
        problems.append(FieldError("conversation_id", "immutable", "a loop stays in its conversation"))
    if problems:
        raise ValidationFailed(problems)
    # Only the loop's own fields: its fixed policies are parse_loop's to add, and the rest (a notify
    # default, say) are not a loop's to give.
    merged = {k: v for k, v in as_body(current, patch).items() if k in loop_policy.FIELDS}
    if "kind" not in patch and ("cron" in patch or "interval_seconds" in patch):
        # A loop's rule changes with its field alone: giving interval_seconds makes it an interval loop.
        merged["kind"] = "interval" if merged.get("interval_seconds") is not None and "cron" not in patch else "cron"
        merged.pop("interval_seconds" if merged["kind"] == "cron" else "cron", None)
    body = loop_policy.parse_loop(merged, now=clock, creating=False)
    request = parse_request({**body.schedule_body, "conversation_id": str(current.conversation_id)},
                            owner=owner, now=clock)
    return body.goal, request


def as_body(current: Schedule, patch: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The fields a create body would carry to define ``current`` (defaults left out; never its
    conversation, which an edit cannot change), with a JSON merge ``patch`` applied: a field given
    replaces, ``null`` removes it (back to its default)."""
    body: dict[str, Any] = {"prompt": current.prompt, "name": current.name, "kind": current.kind.value,
                            "timezone": current.timezone, "mode": current.mode.value, "overlap": current.overlap.value,
                            "catch_up": current.catch_up}
    optional = {"cron": current.cron, "interval_seconds": current.interval_seconds,
                "starts_at": None if current.starts_at is None else current.starts_at.isoformat(),
                "ends_at": None if current.ends_at is None else current.ends_at.isoformat(),
                "max_occurrences": current.max_occurrences}
    body.update({k: v for k, v in optional.items() if v is not None})
    if current.kind in TIMED_KINDS:
        body.update(dst_gap=current.dst_gap.value, dst_fold=current.dst_fold.value,
                    max_delay_seconds=current.max_delay_seconds)
    if current.jitter_seconds:  # checked again against the merged rule (at most half its shortest period)
        body["jitter_seconds"] = current.jitter_seconds
    if current.mode is Mode.FRESH and current.agent is not None:
        body["agent"] = current.agent
    if current.signing is not None:
        body["signing"] = {k: v for k, v in current.signing.items() if v is not None}
    if current.notify is not None:  # checked again like the rest (a secret reference must still be the owner's)
        body["notify"] = current.notify
    if current.corpus is not None:  # checked again like the rest (its bucket must still be allowed)
        body["corpus"] = current.corpus
    if current.flow is not None:
        body["flow"] = current.flow
    if current.limits:  # checked again like the rest (a lowered cap refuses an edit that keeps a higher limit)
        body["limits"] = current.limits
    for name, value in (patch or {}).items():
        if name == "conversation_id":
            continue
        if value is None:
            body.pop(name, None)
        elif name == "limits" and isinstance(value, Mapping):
            # RFC 7396 inside the object too: {"limits": {"runtime_seconds": 900}} keeps the other limits.
            merged = {**(body.get("limits") or {}), **value}
            body["limits"] = {k: v for k, v in merged.items() if v is not None}
        else:
            body[name] = value
    return body


def _next_fire(current: Schedule, request: ScheduleRequest, clock: datetime, *, noun: str) -> datetime | None:
    if request.kind not in TIMED_KINDS:
        return None
    if request.max_occurrences is not None and current.fire_count >= request.max_occurrences:
        count = current.fire_count
        made = f"already fired {count} times" if noun == "loop" else f"already made {count} runs"
        raise ValidationFailed([FieldError(
            "max_occurrences", "above_fire_count", f"this {noun} {made}; max_occurrences must be larger")])
    first = next_fire_at(rule_of(request), clock)
    if first is None:  # parse_request refused rules with no future fire; keep the database's invariant anyway
        raise ValidationFailed([FieldError("kind", "no_future_fire", "this rule never fires after now")])
    return first
