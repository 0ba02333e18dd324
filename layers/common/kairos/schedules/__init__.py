"""Schedules: the definition of when a conversation's prompt runs, and the API's moves on it.

Role: turn a ``POST /v1/schedules`` body into one ``schedules`` row, and serve get / list / pause /
resume / cancel / preview. The tick and the run worker read the row; this package never fires.

Layout: this module holds the record (``Schedule``), reads, the guarded status moves and ``create``;
``kairos.schedules.request`` holds the request model, its canonical forms, the limits and validation
(``parse_request``, ``validate_signing``). The request's public names are re-exported here, so callers
import ``kairos.schedules`` alone.

Limits a caller cannot talk past: at most ``MAX_PER_CONVERSATION`` open (active or paused)
schedules per conversation, counted under the conversation row lock so concurrent creates cannot
overshoot; the request's own limits (``kairos.schedules.request``); no schedule created from inside a
run or for a conversation that descends from one.

Guarantees: a refused request writes no row. A webhook token (``kairos.tokens``) is returned once in
``Created.token``; only its SHA-256 hex is stored, and neither appears in ``as_json``, ``repr`` or
logs. Every edit is one guarded UPDATE that bumps ``revision`` and ``updated_at``; the wrong state is
``Conflict``, a missing or foreign schedule ``NotFound("schedule")`` (the same error either way).
"Now" is the database clock unless a test injects ``now``.

Must not: build SQL from strings, log prompts, tokens or secrets, or re-implement the calendar
(``kairos.calendar`` is the one evaluator for preview and dispatch).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from enum import Enum
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.types.json import Jsonb

from kairos import calendar, conversations, db, identity, input_requests
from kairos.errors import (
    Conflict,
    FieldError,
    Forbidden,
    KairosError,
    LimitExceeded,
    NotFound,
    ValidationFailed,
)
from kairos.instants import rfc3339
from kairos.notify import NOTIFY_ON_DEFAULT
from kairos.observability import logger
from kairos.schedules import loop_policy, paused
from kairos.schedules.request import (
    CRON_MAX,
    DAY,
    INTERVAL_MAX_SECONDS,
    JITTER_MAX_SECONDS,
    MAX_DELAY_DEFAULT_SECONDS,
    MAX_DELAY_MAX_SECONDS,
    MAX_DELAY_MIN_SECONDS,
    MAX_OCCURRENCES_MAX,
    MIN_SPACING,
    NAME_MAX,
    PREVIEW_MAX,
    PROMPT_MAX_BYTES,
    TIMED_KINDS,
    TOKEN_OVERLAP_DEFAULT_SECONDS,
    TOKEN_OVERLAP_MAX_SECONDS,
    ScheduleRequest,
    SigningConfig,
    after_problems,
    canonicalize,
    count_problems,
    parse_request,
    rule_of,
    validate_signing,
)
from kairos.states import DstFold, DstGap, Mode, Overlap, ScheduleKind, ScheduleStatus
from kairos.tokens import hash_token, new_token

if TYPE_CHECKING:
    from kairos import calendar

__all__ = [
    "CRON_MAX", "DAY", "INTERVAL_MAX_SECONDS", "JITTER_MAX_SECONDS", "MAX_DELAY_DEFAULT_SECONDS",
    "MAX_DELAY_MAX_SECONDS",
    "MAX_DELAY_MIN_SECONDS", "MAX_OCCURRENCES_MAX", "MAX_PER_CONVERSATION", "MIN_SPACING", "NAME_MAX",
    "PREVIEW_MAX", "PROMPT_MAX_BYTES", "TIMED_KINDS", "TOKEN_OVERLAP_DEFAULT_SECONDS", "TOKEN_OVERLAP_MAX_SECONDS",
    "Created", "Schedule", "ScheduleRequest", "SigningConfig", "cancel", "canonicalize", "create", "get",
    "hash_token", "list_for", "next_fire_at", "parse_request", "pause", "preview", "preview_dispatch", "preview_owned",
    "resume", "rule_of", "validate_signing",
]

MAX_PER_CONVERSATION = 10

# --- The record --------------------------------------------------------------------------------

# Columns the API never shows: the principal (the caller knows it), token material, internals.
_HIDDEN = frozenset({"owner", "token_hash", "previous_token_hash", "previous_token_expires_at",
                     "created_by_run_id", "rate_limit_per_minute"})
# A loop's own fields: a schedule that is not a loop shows none of them.
_LOOP_ONLY = frozenset({"loop", "goal", "goal_revision", "input_run_id"})
_ENUMS: dict[str, type[Any]] = {"kind": ScheduleKind, "status": ScheduleStatus, "mode": Mode, "overlap": Overlap,
                                "dst_gap": DstGap, "dst_fold": DstFold}


@dataclass(frozen=True)
class Schedule:
    """One ``schedules`` row. Token hashes are kept for the webhook path but never shown."""

    id: uuid.UUID
    owner: str
    conversation_id: uuid.UUID
    name: str
    prompt: str
    kind: ScheduleKind
    cron: str | None
    interval_seconds: int | None
    starts_at: datetime | None
    ends_at: datetime | None
    max_occurrences: int | None
    timezone: str
    dst_gap: DstGap
    dst_fold: DstFold
    mode: Mode
    catch_up: bool
    overlap: Overlap
    agent: dict[str, Any] | None
    signing: dict[str, Any] | None
    status: ScheduleStatus
    revision: int
    next_fire_at: datetime | None
    last_fire_at: datetime | None
    fire_count: int
    consecutive_failures: int
    token_hash: str | None = field(default=None, repr=False)
    previous_token_hash: str | None = field(default=None, repr=False)
    previous_token_expires_at: datetime | None = None
    rate_limit_per_minute: int | None = None
    created_by_run_id: uuid.UUID | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    max_delay_seconds: int = MAX_DELAY_DEFAULT_SECONDS
    # A cron or interval schedule's jitter: each fire is dispatched at its nominal instant plus a stable
    # offset in [0, jitter_seconds] (kairos.identity.dispatch_offset); next_dispatch_at is the cursor's.
    jitter_seconds: int = 0
    next_dispatch_at: datetime | None = None
    notify: dict[str, Any] | None = None  # {"on", "webhook"?: {"url", "secret"}}: the secret is a reference
    corpus: dict[str, Any] | None = None  # a corpus run's checked spec (kairos.schedules.corpus_spec)
    flow: dict[str, Any] | None = None  # a webhook's checked flow control (kairos.schedules.flow_spec)
    loop: bool = False  # a goal loop (kairos.schedules.loops): made by POST /v1/loops only
    goal: dict[str, Any] | None = None  # a loop's private goal envelope; as_json shows its safe projection
    goal_revision: int | None = None  # the revision whose goal is in force
    input_run_id: uuid.UUID | None = None  # the run a paused loop waits on (its question to the owner)
    paused_at: datetime | None = None  # when the current pause began; None unless paused
    paused_reason: str | None = None  # why: the owner's words, or the tick's or the loop's reason
    limits: dict[str, Any] | None = None  # what each run may use, a hook's rate (kairos.limits); None: defaults

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Schedule:
        """From a ``SELECT *`` row; columns other engineers add later are ignored."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in row:
                value = row[f.name]
                enum = _ENUMS.get(f.name)
                values[f.name] = enum(value) if enum is not None and value is not None else value
        return cls(**values)

    def as_json(self) -> dict[str, Any]:
        """The API shape: RFC 3339 UTC times, ids as strings, no token hashes or internal fields."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name in _HIDDEN or (f.name in _LOOP_ONLY and not self.loop):
                continue
            value = getattr(self, f.name)
            if f.name == "goal":
                value = loop_policy.safe(value)
            elif isinstance(value, datetime):
                value = rfc3339(value)
            elif isinstance(value, uuid.UUID):
                value = str(value)
            elif isinstance(value, Enum):
                value = value.value
            out[f.name] = value
        return out

    def rule(self) -> calendar.Rule:
        return rule_of(self)


@dataclass(frozen=True)
class Created:
    schedule: Schedule
    token: str | None = field(default=None, repr=False)  # webhook only, shown once


# --- Operations --------------------------------------------------------------------------------


def next_fire_at(target: Schedule | calendar.Rule, after: datetime) -> datetime | None:
    """The cursor value: the first fire strictly after ``after``, or None when nothing is left
    (a webhook, a rule past its end, or a schedule that used up ``max_occurrences``)."""
    if isinstance(target, Schedule):
        if target.kind not in TIMED_KINDS:
            return None
        if target.max_occurrences is not None and target.fire_count >= target.max_occurrences:
            return None
        rule = rule_of(target)
    else:
        rule = target

    fire = calendar.next_fire(rule, after)
    return None if fire is None else fire.fire_at


def preview(schedule: Schedule, *, after: datetime, count: int) -> list[calendar.Fire]:
    """The next ``count`` (1..100) fires strictly after ``after`` (an instant in ``kairos.instants``'
    range), honouring ``max_occurrences``. A webhook has no timed fires."""
    problems = [*count_problems(count), *after_problems(after)]
    if problems:
        raise ValidationFailed(problems)
    return _fires(schedule, after, count)


def preview_owned(conn: psycopg.Connection[db.Row], schedule_id: uuid.UUID, *, owner: str, count: int,
                  after: datetime | None = None, now: datetime | None = None) -> list[calendar.Fire]:
    """``preview`` of ``owner``'s schedule: after ``after``, or after the database clock (``now`` in
    tests) when it is None. The arguments are checked before the schedule is read, so a bad one is
    ``ValidationFailed`` whether or not the id names a schedule; a missing or foreign one is
    ``NotFound("schedule")``."""
    return [fire for fire, _ in preview_dispatch(conn, schedule_id, owner=owner, count=count, after=after, now=now)]


def preview_dispatch(conn: psycopg.Connection[db.Row], schedule_id: uuid.UUID, *, owner: str, count: int,
                     after: datetime | None = None,
                     now: datetime | None = None) -> list[tuple[calendar.Fire, datetime]]:
    """``preview_owned`` with each fire's dispatch instant (its ``fire_at`` plus its jitter offset,
    ``kairos.identity.dispatch_at``), as the tick will dispatch it. ``after`` bounds the nominal instants."""
    problems = [*count_problems(count), *([] if after is None else after_problems(after))]
    if problems:
        raise ValidationFailed(problems)
    schedule = get(conn, schedule_id, owner=owner)
    fires = _fires(schedule, database_now(conn, now) if after is None else after, count)
    return [(f, identity.dispatch_at(schedule.id, f.fire_at, schedule.jitter_seconds)) for f in fires]

def _fires(schedule: Schedule, after: datetime, count: int) -> list[calendar.Fire]:
    if schedule.kind not in TIMED_KINDS:
        return []
    if schedule.max_occurrences is not None:
        count = min(count, max(schedule.max_occurrences - schedule.fire_count, 0))
        if count == 0:
            return []

    return calendar.fires(rule_of(schedule), after, count)


def database_now(conn: psycopg.Connection[db.Row], now: datetime | None) -> datetime:
    """The database's now in UTC, or ``now`` when a caller (a test, a replay) gives one."""
    row = db.fetch_row(conn, "schedules_clock", {"now": now})
    instant: datetime = row["now"]
    return instant.astimezone(UTC)


def create(
    conn: psycopg.Connection[db.Row],
    *,
    owner: str,
    raw: object,
    now: datetime | None = None,
    context_run_id: uuid.UUID | None = None,
) -> Created:
    """Validates ``raw`` and stores one schedule; a refusal writes nothing.

    Raises ``Forbidden`` (``no_schedule_from_run``) from inside a run or for a conversation that
    descends from one, ``ValidationFailed`` / ``LimitExceeded`` naming field and rule,
    ``NotFound("conversation")`` for a missing or foreign conversation. The per-conversation count
    is taken under the conversation's row lock, in a statement after the lock, so concurrent creates
    cannot overshoot it; this relies on READ COMMITTED (the default), where that statement sees what
    the previous lock holder committed.
    """
    try:
        with db.atomic(conn):
            created = _create(conn, owner=owner, raw=raw, now=now, context_run_id=context_run_id)
    except KairosError as error:
        logger.info("schedule refused", extra={"action": "schedule_refused", "code": error.code,
                                                "rules": [f"{f.field}:{f.rule}" for f in error.fields]})
        raise
    s = created.schedule
    logger.info("schedule created", extra={
        "action": "schedule_created", "schedule_id": str(s.id), "conversation_id": str(s.conversation_id),
        "kind": s.kind.value, "next_fire_at": None if s.next_fire_at is None else rfc3339(s.next_fire_at)})
    return created


def _create(conn: psycopg.Connection[db.Row], *, owner: str, raw: object, now: datetime | None,
            context_run_id: uuid.UUID | None) -> Created:
    if context_run_id is not None:
        raise _from_run()
    clock = database_now(conn, now)
    request = parse_request(raw, owner=owner, now=clock)

    conversation = conversations.lock(conn, request.conversation_id, owner=owner)
    if conversations.lineage_has_run(conn, conversation.id):
        raise _from_run()
    row = db.fetch_one(conn, "schedules_count_open", {"conversation_id": conversation.id})
    if row is not None and int(row["open"]) >= MAX_PER_CONVERSATION:
        raise LimitExceeded(
            f"this conversation already has {MAX_PER_CONVERSATION} schedules; cancel one first",
            fields=[FieldError("conversation_id", "max_per_conversation",
                               f"at most {MAX_PER_CONVERSATION} active or paused schedules per conversation")],
        )

    token: str | None = None
    first: datetime | None = None
    if request.kind is ScheduleKind.WEBHOOK:
        token = new_token()
    else:
        first = next_fire_at(rule_of(request), clock)
        if first is None:  # parse_request refused rules with no future fire
            raise RuntimeError("a checked schedule rule has no future fire")
    stored = _insert(conn, request, owner=owner, conversation=conversation, first=first,
                     token_hash=None if token is None else hash_token(token), context_run_id=context_run_id,
                     clock=clock)
    return Created(stored, token)


def _insert(conn: psycopg.Connection[db.Row], request: ScheduleRequest, *, owner: str,
            conversation: conversations.Conversation, first: datetime | None, token_hash: str | None,
            context_run_id: uuid.UUID | None, clock: datetime) -> Schedule:
    """The one ``schedules_insert`` of a checked request (``create`` has done every check)."""
    stored = db.fetch_row(conn, "schedules_insert", {
        **definition_columns(request, conversation_agent=conversation.agent),
        "id": uuid.uuid4(),
        "owner": owner,
        "conversation_id": conversation.id,
        "next_fire_at": first,
        "token_hash": token_hash,
        "created_by_run_id": context_run_id,
        "now": clock,
    })
    return Schedule.from_row(stored)


def definition_columns(request: ScheduleRequest, *, conversation_agent: Mapping[str, Any]) -> dict[str, Any]:
    """The ``schedules`` columns a checked request defines (the create's and an edit's statement)."""
    return {
        "name": request.name,
        "prompt": request.prompt,
        "kind": request.kind.value,
        "cron": request.cron,
        "interval_seconds": request.interval_seconds,
        "starts_at": request.starts_at,
        "ends_at": request.ends_at,
        "max_occurrences": request.max_occurrences,
        "timezone": request.timezone,
        "dst_gap": request.dst_gap.value,
        "dst_fold": request.dst_fold.value,
        "mode": request.mode.value,
        "catch_up": request.catch_up,
        "max_delay_seconds": request.max_delay_seconds,
        "overlap": request.overlap.value,
        "jitter_seconds": request.jitter_seconds,
        # The snapshot a fresh run starts from; fork and append read the conversation's agent.
        "agent": Jsonb(dict(request.agent if request.agent is not None else conversation_agent)),
        "signing": None if request.signing is None else Jsonb(request.signing),
        "notify": Jsonb(request.notify or {"on": [s.value for s in NOTIFY_ON_DEFAULT]}),
        "corpus": None if request.corpus is None else Jsonb(request.corpus),
        "flow": None if request.flow is None else Jsonb(request.flow),
        "limits": _limits_column(request),
    }


def _limits_column(request: ScheduleRequest) -> Jsonb | None:
    """The limits a request sets (None when it sets none: every run gets the agent's or the defaults)."""
    given = {} if request.limits is None else request.limits.model_dump(exclude_none=True)
    return Jsonb(given) if given else None


def _from_run() -> Forbidden:
    return Forbidden(
        "schedules cannot be created from inside a run or for a conversation a run created",
        fields=[FieldError("conversation_id", "no_schedule_from_run",
                           "a run may not schedule more runs; ask a person to create the schedule")],
    )


def get(conn: psycopg.Connection[db.Row], schedule_id: uuid.UUID, *, owner: str) -> Schedule:
    """One schedule of ``owner``; ``NotFound("schedule")`` for a missing or foreign one."""
    row = db.fetch_one(conn, "schedules_get", {"schedule_id": schedule_id, "owner": owner})
    if row is None:
        raise NotFound("schedule")
    return Schedule.from_row(row)


def list_for(conn: psycopg.Connection[db.Row], *, owner: str,
             conversation_id: uuid.UUID | None = None) -> list[Schedule]:
    """The owner's schedules that are not cancelled (of one conversation when given), oldest first."""
    rows = db.fetch_all(conn, "schedules_list", {"owner": owner, "conversation_id": conversation_id})
    return [Schedule.from_row(r) for r in rows]


def pause(conn: psycopg.Connection[db.Row], schedule_id: uuid.UUID, *, owner: str, reason: str | None = None,
          now: datetime | None = None) -> Schedule:
    """active -> paused, with the owner's ``reason`` (at most 500 characters) and when; anything else is
    ``Conflict``."""

    problems = paused.reason_problems(reason)
    if problems:
        raise ValidationFailed(problems)
    row = db.fetch_one(conn, "schedules_pause", {"schedule_id": schedule_id, "owner": owner, "reason": reason,
                                                 "now": now})
    if row is None:
        raise _refused_move(conn, schedule_id, owner, "paused", "only an active schedule can be paused")
    return _moved(row, "schedule.paused")


def resume(conn: psycopg.Connection[db.Row], schedule_id: uuid.UUID, *, owner: str,
           now: datetime | None = None) -> Schedule:
    """paused -> active: clears ``consecutive_failures`` and the pause's reason, and computes the next
    fire from now. The fires that fell in the pause are recorded as one ``skipped_paused`` occurrence
    (``kairos.schedules.paused``).

    A schedule with nothing left to fire (a ``once`` whose instant passed, a rule past ``ends_at``,
    ``max_occurrences`` used up) cannot be resumed: ``Conflict``. The update is guarded by the
    revision read, so a concurrent edit makes this call answer ``Conflict`` rather than apply a
    cursor computed from a stale definition.
    """
    with db.atomic(conn):
        clock = database_now(conn, now)
        current = get(conn, schedule_id, owner=owner)
        if current.status not in (ScheduleStatus.PAUSED, ScheduleStatus.DRAFT):
            raise _conflict(current, "resumed", "only a paused schedule (or a loop in draft) can be resumed")
        first: datetime | None = None
        if current.kind in TIMED_KINDS:
            first = next_fire_at(current, clock)
            if first is None:
                raise Conflict("this schedule has nothing left to fire; cancel it and create a new one",
                               fields=[FieldError("status", "no_future_fire", "the rule has no fire after now")])

            paused.record_at_resume(conn, current.id, revision=current.revision, paused_at=current.paused_at,
                                    rule=rule_of(current), now=clock)
        row = db.fetch_one(conn, "schedules_resume", {
            "schedule_id": schedule_id, "owner": owner, "revision": current.revision,
            "next_fire_at": first, "now": clock})
        if row is None:
            raise _refused_move(conn, schedule_id, owner, "resumed", "the schedule changed meanwhile; try again")
    return _moved(row, "schedule.resumed")


def cancel(conn: psycopg.Connection[db.Row], schedule_id: uuid.UUID, *, owner: str,
           now: datetime | None = None) -> Schedule:
    """active, paused or draft -> cancelled (final); runs already claimed still finish. A loop's pending
    questions are cancelled with it, and the runs that wait on them (``kairos.input_requests``)."""

    with db.atomic(conn):
        # The runs waiting on a loop's questions first, then the loop: a run's worker takes them in that order.
        input_requests.lock_waiting_runs(conn, schedule_id, owner=owner)
        row = db.fetch_one(conn, "schedules_cancel", {"schedule_id": schedule_id, "owner": owner, "now": now})
        if row is None:
            raise _refused_move(conn, schedule_id, owner, "cancelled", "it is already cancelled or completed")
        if row["loop"]:
            input_requests.cancel_for_schedule(conn, schedule_id, reason="schedule_cancelled", now=now)
    return _moved(row, "schedule.cancelled")


def _moved(row: db.Row, action: str) -> Schedule:
    schedule = Schedule.from_row(row)
    logger.info(action.split(".")[1], extra={"action": action, "schedule_id": str(schedule.id),
                                              "revision": schedule.revision, "status": schedule.status.value})
    return schedule


def _refused_move(conn: psycopg.Connection[db.Row], schedule_id: uuid.UUID, owner: str, verb: str,
                  why: str) -> KairosError:
    """Why a guarded move matched no row: NotFound for missing or foreign, else Conflict."""
    return _conflict(get(conn, schedule_id, owner=owner), verb, why)


def _conflict(current: Schedule, verb: str, why: str) -> Conflict:
    return Conflict(
        f"schedule is {current.status.value} and cannot be {verb}: {why}",
        fields=[FieldError("status", "invalid_state", f"the schedule is {current.status.value}")],
    )
