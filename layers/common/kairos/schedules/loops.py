"""Goal loops: create, read and edit (``POST /v1/loops``, ``GET`` / ``PATCH /v1/loops/{id}``).

Role: ``create`` checks a loop body (``kairos.schedules.loop_policy``: fixed policies, caps, goal; then the same
``parse_request`` as a schedule for the rule) and stores one schedule row marked ``loop``, active, with
the goal envelope at revision 1, under the same per-conversation limit and "not from a run" rule as a
schedule. ``edit`` is a JSON merge patch of the loop fields under a new revision (``If-Match`` as for
schedules): a new goal moves the goal to that revision and the loop to ``draft`` — nothing fires, a run
still queued from an older revision is refused at claim (``goal_revised``), the pending question of a
run of the old goal is cancelled with its run — until the owner resumes it (``/v1/schedules/{id}/resume``
or ``kairos schedules resume``). Pause, resume and cancel are the schedule routes'; cancel also cancels the
loop's pending questions and the runs that wait on them (``kairos.input_requests``). What a loop run's
``goal_report`` does to its loop (``kairos.execution.goal_report``) is the moves at the end of this module:
``continue_``, ``complete``, ``block``, ``release``, ``wait`` — with the owner's moves in
``kairos.schedules`` and the tick's in ``kairos.tick``, the only writers of a schedule's status.

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

from kairos import conversations, db
from kairos.errors import (
    FieldError,
    Forbidden,
    KairosError,
    LimitExceeded,
    NotFound,
    ValidationFailed,
)
from kairos.executors.base import TOOL_EXECUTORS
from kairos.observability import logger
from kairos.schedules import MAX_PER_CONVERSATION, Schedule, database_now, definition_columns, loop_policy, next_fire_at
from kairos.schedules import edit as schedule_edit
from kairos.schedules.request import parse_request, rule_of


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
    clock = database_now(conn, now)
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
    """Applies ``patch`` as the loop's next revision (see the module doc): the loop branch of
    ``kairos.schedules.edit.edit``."""
    return schedule_edit.edit(conn, schedule_id, owner=owner, patch=patch, if_match=if_match, now=now, loop=True)


# The loop's moves after one of its runs reports (``kairos.execution.goal_report``), each in the run's
# transaction, the loop row locked (``lock``) after the run's. Each returns the loop's status after it, or
# None when its guard matched nothing (the loop was not in a state the move starts from).


def lock(conn: psycopg.Connection[db.Row], schedule_id: uuid.UUID, *, now: Any) -> db.Row | None:
    """The loop's row locked for its run's report (any owner: the worker acts for the run's owner), with
    the database's ``db_now``; None when it is not a loop."""
    return db.fetch_one(conn, "schedules_lock_loop", {"schedule_id": schedule_id, "now": now})


def continue_(conn: psycopg.Connection[db.Row], loop: db.Row, *, run_id: uuid.UUID, now: Any) -> str | None:
    """``continue``: a loop paused for this run's question resumes at its next future occurrence
    (``completed`` when nothing is left to fire); a loop not waiting on this run does not move (None)."""
    if loop["input_run_id"] != run_id:
        return None
    after = loop["db_now"].astimezone(UTC)
    return _status(db.fetch_one(conn, "schedules_loop_continue", {
        "schedule_id": loop["id"], "run_id": run_id, "now": now,
        "next_fire_at": next_fire_at(Schedule.from_row(loop), after)}))


def complete(conn: psycopg.Connection[db.Row], schedule_id: uuid.UUID, *, run_id: uuid.UUID, now: Any) -> str | None:
    """``complete``: active or paused -> completed, no more fires."""
    return _status(db.fetch_one(conn, "schedules_loop_complete", _ids(schedule_id, run_id, now)))


def block(conn: psycopg.Connection[db.Row], schedule_id: uuid.UUID, *, run_id: uuid.UUID, now: Any) -> str | None:
    """``blocked``: active -> paused until its owner resumes it; a loop already paused for this run's
    question stays paused and stops waiting on it (``release``)."""
    moved = _status(db.fetch_one(conn, "schedules_loop_block", _ids(schedule_id, run_id, now)))
    return moved if moved is not None else release(conn, schedule_id, run_id=run_id, now=now)


def release(conn: psycopg.Connection[db.Row], schedule_id: uuid.UUID, *, run_id: uuid.UUID, now: Any) -> str | None:
    """The loop no longer waits on this run; its status stays."""
    return _status(db.fetch_one(conn, "schedules_loop_release", _ids(schedule_id, run_id, now)))


def wait(conn: psycopg.Connection[db.Row], schedule_id: uuid.UUID, *, run_id: uuid.UUID, now: Any) -> str | None:
    """``needs_input``: active -> paused, waiting on this run until its owner answers."""
    return _status(db.fetch_one(conn, "schedules_loop_wait", _ids(schedule_id, run_id, now)))


def _ids(schedule_id: uuid.UUID, run_id: uuid.UUID, now: Any) -> dict[str, Any]:
    return {"schedule_id": schedule_id, "run_id": run_id, "now": now}


def _status(row: db.Row | None) -> str | None:
    return None if row is None else str(row["status"])
