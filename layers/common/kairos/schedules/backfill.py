"""Backfill: runs for a schedule's instants in a past window, each under the revision then in force.

Role: ``POST /v1/schedules/{id}/backfill`` with ``{"from", "until", "max"?}``. The instants are the
fires in ``[from, until)`` of the revision in force at each instant (``schedule_revisions.valid_from``;
the first revision also covers the time since the schedule was created, never before it), so a
backfill across an edit uses the old rule before the edit and the new one after — with that
revision's prompt and agent, since a run executes its occurrence's revision.

Rules (422 naming the field and the rule, nothing recorded): ``from`` < ``until`` <= now, a window
of at most ``MAX_WINDOW`` (31 days), at most ``max`` (default and cap ``MAX_INSTANTS``, 100)
instants; a timed, active schedule (``Conflict`` otherwise). ``max_occurrences`` counts scheduled
fires only: a backfill neither counts against it nor is bounded by it. A backfill that would queue
more runs than the owner's cap (``KAIROS_OWNER_QUEUE_MAX``) is refused whole: 429 ``queue_full``,
nothing recorded (a partial one would leave its skipped instants recorded, so no later backfill
could make them).

Guarantees: an instant that already has a dispatched or queued-behind scheduled occurrence is left
alone (an instant inside a ``skipped_late`` range is eligible); each backfill occurrence's identity is
``uuid5(schedule, "backfill", fire_at)``, so a repeated request, or two at once (they serialize on the
schedule row), makes each instant once. The schedule's backfill runs run one at a time, oldest first:
each new one waits (``queued_behind``) for the one before, the first for the newest unfinished
backfill run of an earlier request.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from kairos import calendar, db, identity, occurrences
from kairos.errors import Conflict, FieldError, NotFound, ValidationFailed, from_validation_error
from kairos.instants import RFC3339Instant, rfc3339
from kairos.observability import logger
from kairos.schedules import Schedule
from kairos.schedules.loop_policy import loop_refusal
from kairos.schedules.request import TIMED_KINDS, rule_of
from kairos.states import Decision, ScheduleStatus, Source

MAX_WINDOW = timedelta(days=31)
MAX_INSTANTS = 100
_RUN_DECISIONS = (Decision.DISPATCHED, Decision.QUEUED_BEHIND)


class BackfillRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    from_: RFC3339Instant = Field(alias="from", description="first instant considered (inclusive), RFC 3339")
    until: RFC3339Instant = Field(description="end of the window (exclusive), at most now")
    max: StrictInt = Field(default=MAX_INSTANTS, ge=1, le=MAX_INSTANTS,
                           description="refuse the request when the window holds more instants than this")


@dataclass(frozen=True)
class Backfilled:
    occurrences: list[dict[str, Any]]
    sendable: list[uuid.UUID]


def backfill(conn: psycopg.Connection[db.Row], schedule_id: uuid.UUID, *, owner: str, raw: object,
             now: datetime | None = None) -> Backfilled:
    """Records the window's eligible instants (see the module doc)."""
    request = _parse(raw)
    with db.atomic(conn):
        row = db.fetch_one(conn, "schedules_lock_owned", {"schedule_id": schedule_id, "owner": owner, "now": now})
        if row is None:
            raise NotFound("schedule")
        if row["loop"]:
            raise loop_refusal("backfilled")
        schedule = Schedule.from_row(row)
        _check(request, schedule, row["db_now"])
        start, until = request.from_.astimezone(UTC), request.until.astimezone(UTC)
        instants = _instants(conn, schedule, start, until, request.max)
        present = db.fetch_all(conn, "occurrences_in_window", {"schedule_id": schedule_id, "from": start,
                                                               "until": until})
        done = {o["fire_at"] for o in present if o["source"] == "scheduled" and o["decision"] in _RUN_DECISIONS}
        mine = {o["fire_at"]: o for o in present if o["source"] == "backfill"}
        planned, sendable = _plan(conn, schedule_id, [i for i in instants if i[1].fire_at not in done], mine)
        occurrences.refuse_over_cap(occurrences.record(conn, planned, now=now))  # 429 queue_full, nothing kept
    answer = [_as_json(o) for o in db.fetch_all(conn, "occurrences_in_window", {
        "schedule_id": schedule_id, "from": start, "until": until}) if o["source"] == "backfill"]
    logger.info("schedule backfilled", extra={"action": "schedule_backfilled", "schedule_id": str(schedule_id),
                                              "instants": len(instants), "recorded": len(planned),
                                              "left_alone": len(done)})
    return Backfilled(answer, sendable)


def _parse(raw: object) -> BackfillRequest:
    if not isinstance(raw, dict):
        raise ValidationFailed([FieldError("body", "type", 'give {"from", "until"} as a JSON object')])
    try:
        return BackfillRequest.model_validate(raw)
    except ValidationError as error:
        raise ValidationFailed(from_validation_error(error)) from None


def _check(request: BackfillRequest, schedule: Schedule, db_now: datetime) -> None:
    if schedule.kind not in TIMED_KINDS:
        raise ValidationFailed([FieldError("kind", "timed_only", "a webhook schedule has no instants to backfill")])
    if schedule.status is not ScheduleStatus.ACTIVE:
        raise Conflict(f"the schedule is {schedule.status.value}; only an active schedule is backfilled",
                       fields=[FieldError("status", "active", "resume the schedule first")])
    problems: list[FieldError] = []
    if request.until <= request.from_:
        problems.append(FieldError("until", "after_from", "until must be later than from"))
    elif request.until - request.from_ > MAX_WINDOW:
        problems.append(FieldError("until", "max_window", f"a backfill window is at most {MAX_WINDOW.days} days"))
    if request.until > db_now:
        problems.append(FieldError("until", "not_future", "a backfill covers the past; until must be at most now"))
    if problems:
        raise ValidationFailed(problems)


def _instants(conn: psycopg.Connection[db.Row], schedule: Schedule, start: datetime, until: datetime,
              limit: int) -> list[tuple[int, calendar.Fire]]:
    """(revision, fire) for each instant in [start, until), from the revision in force at it."""
    revisions = db.fetch_all(conn, "schedule_revisions_list", {"schedule_id": schedule.id})
    found: list[tuple[int, calendar.Fire]] = []
    for i, revision in enumerate(revisions):
        begins = schedule.created_at if i == 0 and schedule.created_at is not None else revision["valid_from"]
        ends = revisions[i + 1]["valid_from"] if i + 1 < len(revisions) else until
        lower, upper = max(start, begins), min(until, ends)
        if lower >= upper:
            continue
        rule = _rule(schedule, revision["definition"])
        for fire in calendar.fires_between(rule, lower - timedelta(microseconds=1), upper):
            if fire.fire_at >= upper:
                break
            found.append((int(revision["revision"]), fire))
            if len(found) > limit:
                raise ValidationFailed([FieldError(
                    "until", "max_instants",
                    f"the window holds more than {limit} instants; narrow it or raise max (at most {MAX_INSTANTS})")])
    return found


def _rule(schedule: Schedule, definition: dict[str, Any]) -> calendar.Rule:
    values = {**definition, "id": schedule.id, "owner": schedule.owner, "conversation_id": schedule.conversation_id,
              "status": schedule.status.value, "revision": 0, "next_fire_at": None, "last_fire_at": None,
              "fire_count": 0, "consecutive_failures": 0}
    for name in ("starts_at", "ends_at"):
        if values.get(name) is not None:
            values[name] = datetime.fromisoformat(values[name])
    return rule_of(Schedule.from_row(values))


def _plan(conn: psycopg.Connection[db.Row], schedule_id: uuid.UUID, eligible: list[tuple[int, calendar.Fire]],
          mine: dict[datetime, db.Row]) -> tuple[list[dict[str, Any]], list[uuid.UUID]]:
    """The new backfill occurrences, oldest first, each run waiting for the one before."""
    last = db.fetch_one(conn, "runs_last_backfill", {"schedule_id": schedule_id})
    blocker: uuid.UUID | None = None if last is None else last["id"]
    planned: list[dict[str, Any]] = []
    sendable: list[uuid.UUID] = []
    for revision, fire in eligible:
        if fire.fire_at in mine:
            continue  # an earlier request made this instant
        occurrence_id = identity.occurrence_id(schedule_id, Source.BACKFILL, fire_at=fire.fire_at)
        run_id = identity.run_id(occurrence_id)
        decision = Decision.DISPATCHED if blocker is None else Decision.QUEUED_BEHIND
        planned.append(occurrences.planned(
            occurrence_id=occurrence_id, schedule_id=schedule_id, source=Source.BACKFILL, fire=fire,
            revision=revision, decision=decision, run_id=run_id, blocked_by=blocker))
        if blocker is None:
            sendable.append(run_id)
        blocker = run_id
    return planned, sendable


def _as_json(row: db.Row) -> dict[str, Any]:
    offset = int(row["utc_offset"].total_seconds())
    sign, offset = ("-" if offset < 0 else "+"), abs(offset)
    return {"id": str(row["id"]), "fire_at": rfc3339(row["fire_at"]), "local_time": row["local_time"].isoformat(),
            "utc_offset": f"{sign}{offset // 3600:02d}:{offset % 3600 // 60:02d}", "fold": row["fold"],
            "schedule_revision": row["schedule_revision"], "decision": row["decision"],
            "run_id": None if row["run_id"] is None else str(row["run_id"])}
