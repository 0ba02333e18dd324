"""Editing a schedule: ``PATCH /v1/schedules/{id}`` as a new revision of its definition.

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

Must not: build SQL from strings or log the prompt, the agent or the signing secret reference.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import psycopg

from kairos import conversations, db
from kairos.errors import Conflict, FieldError, NotFound, PreconditionFailed, ValidationFailed
from kairos.observability import logger
from kairos.schedules import Schedule, definition_columns, next_fire_at
from kairos.schedules.request import TIMED_KINDS, ScheduleRequest, parse_request, rule_of
from kairos.states import Mode, ScheduleKind, ScheduleStatus

_EDITABLE = frozenset(ScheduleRequest.model_fields) - {"conversation_id"}
_IF_MATCH = re.compile(r'^(?:W/)?"?(\d{1,9})"?$')


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
         if_match: int | None = None, now: datetime | None = None) -> Schedule:
    """Applies ``patch`` as the next revision; see the module doc for the rules and errors."""
    if not isinstance(patch, Mapping):
        raise ValidationFailed([FieldError("body", "type", "give the changes as a JSON object")])
    with db.atomic(conn):
        row = db.fetch_one(conn, "schedules_lock_owned", {"schedule_id": schedule_id, "owner": owner, "now": now})
        if row is None:
            raise NotFound("schedule")
        current = Schedule.from_row(row)
        if current.loop:
            from kairos.schedules.loop_policy import loop_refusal

            raise loop_refusal("edited")
        clock: datetime = row["db_now"].astimezone(UTC)
        if if_match is not None and if_match != current.revision:
            raise PreconditionFailed(
                f"the schedule is at revision {current.revision}, not {if_match}; read it again, then edit",
                fields=[FieldError("If-Match", "current_revision", f"the current revision is {current.revision}")])
        if current.status not in (ScheduleStatus.ACTIVE, ScheduleStatus.PAUSED):
            raise Conflict(f"a {current.status.value} schedule cannot be edited",
                           fields=[FieldError("status", "editable", "only active and paused schedules can be edited")])
        request = parse_request(_merged(current, patch), owner=owner, now=clock)
        first = _next_fire(current, request, clock)
        conversation = conversations.get(conn, current.conversation_id, owner=owner)
        stored = db.fetch_one(conn, "schedules_edit", {
            **definition_columns(request, conversation_agent=conversation.agent),
            "schedule_id": schedule_id, "owner": owner, "revision": current.revision,
            "next_fire_at": first, "now": clock})
        if stored is None:  # unreachable under the row lock; refuse rather than guess
            raise Conflict("the schedule changed meanwhile; read it again, then edit")
    edited = Schedule.from_row(stored)
    logger.info("schedule edited", extra={
        "action": "schedule_edited", "schedule_id": str(edited.id), "revision": edited.revision,
        "fields": sorted(str(k) for k in patch)})
    return edited


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
    body = _as_body(current)
    for name, value in patch.items():
        if value is None:
            body.pop(name, None)
        else:
            body[name] = value
    body["conversation_id"] = str(current.conversation_id)
    return body


def _as_body(current: Schedule) -> dict[str, Any]:
    """The fields a create body would carry to define ``current`` (defaults left out)."""
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
    return body


def _next_fire(current: Schedule, request: ScheduleRequest, clock: datetime) -> datetime | None:
    if request.kind not in TIMED_KINDS:
        return None
    if request.max_occurrences is not None and current.fire_count >= request.max_occurrences:
        raise ValidationFailed([FieldError(
            "max_occurrences", "above_fire_count",
            f"this schedule already made {current.fire_count} runs; max_occurrences must be larger")])
    first = next_fire_at(rule_of(request), clock)
    if first is None:  # parse_request refused rules with no future fire; keep the database's invariant anyway
        raise ValidationFailed([FieldError("kind", "no_future_fire", "this rule never fires after now")])
    return first

