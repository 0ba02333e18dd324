"""Goal loops: create, read and edit (``POST /v1/loops``, ``GET`` / ``PATCH /v1/loops/{id}``).

Role: ``create`` checks a loop body (``kairos.schedules.loop_policy``: fixed policies, caps, goal; then the same
``parse_request`` as a schedule for the rule) and stores one schedule row marked ``loop``, active, with
the goal envelope at revision 1, under the same per-conversation limit and "not from a run" rule as a
schedule. ``edit`` is a JSON merge patch of the loop fields under a new revision (``If-Match`` as for
schedules): a new goal moves the goal to that revision and the loop to ``draft`` — nothing fires, a run
still queued from an older revision is refused at claim (``goal_revised``), the pending question of a
run of the old goal is cancelled with its run — until the owner resumes it (``/v1/schedules/{id}/resume``
or ``kairos loops resume``). Pause, resume and cancel are the schedule routes'; cancel also cancels the
loop's pending questions and the runs that wait on them (``kairos.input_requests``).

Guarantees: a refused body writes nothing and names every field with its rule; a loop's policies are
not columns an edit writes, and the schema refuses a loop row that would loosen them
(``schedules_loop_policies``). Another owner's loop, and a schedule that is not a loop, are the same
``NotFound("loop")`` as a missing one.

Must not: log the goal, the prompt or the verification.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from kairos import conversations, db, input_requests
from kairos.errors import (
    Conflict,
    FieldError,
    Forbidden,
    KairosError,
    LimitExceeded,
    NotFound,
    PreconditionFailed,
    ValidationFailed,
)
from kairos.executors.base import TOOL_EXECUTORS
from kairos.observability import logger
from kairos.schedules import MAX_PER_CONVERSATION, Schedule, definition_columns, loop_policy, next_fire_at
from kairos.schedules.request import ScheduleRequest, parse_request, rule_of
from kairos.states import ScheduleStatus


def create(conn: psycopg.Connection[db.Row], *, owner: str, raw: object, now: datetime | None = None) -> Schedule:
    """Validates ``raw`` and stores one active loop; a refusal writes nothing (see the module doc)."""
    try:
        with db.atomic(conn):
            loop = _create(conn, owner=owner, raw=raw, now=now)
    except KairosError as error:
        logger.info("loop refused", extra={"action": "loop_refused", "code": error.code,
                                            "rules": [f"{f.field}:{f.rule}" for f in error.fields]})
        raise
    logger.info("loop created", extra={"action": "loop_created", "schedule_id": str(loop.id),
                                        "conversation_id": str(loop.conversation_id),
                                        "max_occurrences": loop.max_occurrences})
    return loop


def _create(conn: psycopg.Connection[db.Row], *, owner: str, raw: object, now: datetime | None) -> Schedule:
    clock = _clock(conn, now)
    body = loop_policy.parse_loop(raw, now=clock)
    request = parse_request(body.schedule_body, owner=owner, now=clock)
    if body.goal is None:  # parse_loop refuses a loop body without a goal
        raise RuntimeError("a checked loop body has no goal")
    conversation = conversations.lock(conn, request.conversation_id, owner=owner)
    if conversations.lineage_has_run(conn, conversation.id):
        raise Forbidden("loops cannot be created for a conversation a run created",
                        fields=[FieldError("conversation_id", "no_schedule_from_run",
                                           "a run may not schedule more runs; ask a person to create the loop")])
    _check_agent(conversation.agent)
    row = db.fetch_one(conn, "schedules_count_open", {"conversation_id": conversation.id})
    if row is not None and int(row["open"]) >= MAX_PER_CONVERSATION:
        raise LimitExceeded(
            f"this conversation already has {MAX_PER_CONVERSATION} schedules; cancel one first",
            fields=[FieldError("conversation_id", "max_per_conversation",
                               f"at most {MAX_PER_CONVERSATION} active, paused or draft schedules per conversation")])
    first = next_fire_at(rule_of(request), clock)
    if first is None:  # parse_request refused rules with no future fire
        raise RuntimeError("a checked loop rule has no future fire")
    schedule_id = uuid.uuid4()
    columns = definition_columns(request, conversation_agent=conversation.agent)
    goal = loop_policy.envelope(body.goal, schedule_id=schedule_id, revision=1, agent=conversation.agent)
    stored = db.fetch_row(conn, "schedules_insert_loop", {
        **columns, "id": schedule_id, "owner": owner, "conversation_id": conversation.id, "next_fire_at": first,
        "goal": Jsonb(goal), "now": clock})
    return Schedule.from_row(stored)


def _check_agent(agent: Mapping[str, Any]) -> None:
    if str(agent.get("executor", "")) not in TOOL_EXECUTORS:
        raise ValidationFailed([FieldError(
            "conversation_id", "loop_agent",
            f"a loop needs a conversation whose agent can call tools ({', '.join(sorted(TOOL_EXECUTORS))})")])


def get(conn: psycopg.Connection[db.Row], schedule_id: uuid.UUID, *, owner: str) -> Schedule:
    """One loop of ``owner``; ``NotFound("loop")`` for a missing, foreign or non-loop schedule alike."""
    row = db.fetch_one(conn, "schedules_get", {"schedule_id": schedule_id, "owner": owner})
    if row is None or not row["loop"]:
        raise NotFound("loop")
    return Schedule.from_row(row)


def edit(conn: psycopg.Connection[db.Row], schedule_id: uuid.UUID, *, owner: str, patch: object,
         if_match: int | None = None, now: datetime | None = None) -> Schedule:
    """Applies ``patch`` as the loop's next revision (see the module doc)."""
    if not isinstance(patch, Mapping):
        raise ValidationFailed([FieldError("body", "type", "give the changes as a JSON object")])
    with db.atomic(conn):
        # The runs waiting on the loop's questions first, then the loop (a goal edit cancels them): the
        # order a run's worker takes them in.
        input_requests.lock_waiting_runs(conn, schedule_id, owner=owner)
        row = db.fetch_one(conn, "schedules_lock_owned", {"schedule_id": schedule_id, "owner": owner, "now": now})
        if row is None or not row["loop"]:
            raise NotFound("loop")
        current = Schedule.from_row(row)
        clock: datetime = row["db_now"].astimezone(UTC)
        if if_match is not None and if_match != current.revision:
            raise PreconditionFailed(
                f"the loop is at revision {current.revision}, not {if_match}; read it again, then edit",
                fields=[FieldError("If-Match", "current_revision", f"the current revision is {current.revision}")])
        if current.status not in (ScheduleStatus.DRAFT, ScheduleStatus.ACTIVE, ScheduleStatus.PAUSED):
            raise Conflict(f"a {current.status.value} loop cannot be edited",
                           fields=[FieldError("status", "editable",
                                              "only draft, active and paused loops can be edited")])
        problems = loop_policy.policy_problems(patch, allowed=loop_policy.FIELDS)
        if "conversation_id" in patch and str(patch["conversation_id"]) != str(current.conversation_id):
            problems.append(FieldError("conversation_id", "immutable", "a loop stays in its conversation"))
        if problems:
            raise ValidationFailed(problems)
        merged = _merged(current, patch)
        body = loop_policy.parse_loop(merged, now=clock, creating=False)
        request = parse_request({**body.schedule_body, "conversation_id": str(current.conversation_id)},
                                owner=owner, now=clock)
        first = _next_fire(current, request, clock)
        conversation = conversations.get(conn, current.conversation_id, owner=owner)
        revised = body.goal is not None and not loop_policy.same_goal(current.goal, body.goal)
        goal = None if not revised or body.goal is None else loop_policy.envelope(
            body.goal, schedule_id=current.id, revision=current.revision + 1, agent=conversation.agent)
        stored = db.fetch_one(conn, "schedules_edit_loop", {
            **definition_columns(request, conversation_agent=conversation.agent),
            "schedule_id": schedule_id, "owner": owner, "revision": current.revision, "next_fire_at": first,
            "goal": None if goal is None else Jsonb(goal), "now": clock})
        if stored is None:  # unreachable under the row lock; refuse rather than guess
            raise Conflict("the loop changed meanwhile; read it again, then edit")
        if revised:
            drafted = db.fetch_one(conn, "schedules_loop_draft", {"schedule_id": schedule_id, "owner": owner})
            stored = drafted or stored
            # The old goal's question can no longer be answered usefully: its run is cancelled with it.
            input_requests.cancel_for_schedule(conn, schedule_id, reason="goal_revised", now=now)
    edited = Schedule.from_row(stored)
    logger.info("loop edited", extra={"action": "loop_edited", "schedule_id": str(edited.id),
                                       "revision": edited.revision, "goal_revised": revised,
                                       "fields": sorted(str(k) for k in patch)})
    return edited


def _merged(current: Schedule, patch: Mapping[str, Any]) -> dict[str, Any]:
    """The current loop as a loop body, with the merge patch applied (``goal`` only when patched)."""
    body: dict[str, Any] = {"prompt": current.prompt, "name": current.name, "kind": current.kind.value,
                            "timezone": current.timezone, "dst_gap": current.dst_gap.value,
                            "dst_fold": current.dst_fold.value, "max_delay_seconds": current.max_delay_seconds}
    optional = {"cron": current.cron, "interval_seconds": current.interval_seconds,
                "starts_at": None if current.starts_at is None else current.starts_at.isoformat(),
                "ends_at": None if current.ends_at is None else current.ends_at.isoformat(),
                "max_occurrences": current.max_occurrences}
    body.update({k: v for k, v in optional.items() if v is not None})
    for name, value in patch.items():
        if name == "conversation_id" or name in loop_policy.FIXED:
            continue
        if value is None:
            body.pop(name, None)
        else:
            body[name] = value
    if "kind" not in patch and ("cron" in patch or "interval_seconds" in patch):
        body["kind"] = "interval" if body.get("interval_seconds") is not None and "cron" not in patch else "cron"
        body.pop("interval_seconds" if body["kind"] == "cron" else "cron", None)
    return body


def _next_fire(current: Schedule, request: ScheduleRequest, clock: datetime) -> datetime:
    if request.max_occurrences is not None and current.fire_count >= request.max_occurrences:
        raise ValidationFailed([FieldError(
            "max_occurrences", "above_fire_count",
            f"this loop already fired {current.fire_count} times; max_occurrences must be larger")])
    first = next_fire_at(rule_of(request), clock)
    if first is None:
        raise ValidationFailed([FieldError("ends_at", "no_future_fire", "this rule never fires after now")])
    return first


def _clock(conn: psycopg.Connection[db.Row], now: datetime | None) -> datetime:
    row = db.fetch_row(conn, "schedules_clock", {"now": now})
    instant: datetime = row["now"]
    return instant.astimezone(UTC)
