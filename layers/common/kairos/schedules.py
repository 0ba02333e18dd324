"""Schedules: the definition of when a conversation's prompt runs, and the API's moves on it.

Role: turn a ``POST /v1/schedules`` body into one ``schedules`` row, and serve get / list / pause /
resume / cancel / preview. The tick and the run worker read the row; this module never fires.

Chat adapts intent; the service stays strict. ``canonicalize`` accepts a small, explicit set of
shorthand *before* strict validation, and nothing else:

* ``{"every_seconds": N}`` (kind absent or ``interval``, no ``interval_seconds``) -> ``kind:
  interval``, ``interval_seconds: N``;
* ``{"starts_at": t}`` with no ``kind``, ``cron``, ``interval_seconds`` or ``every_seconds`` ->
  ``kind: once`` at ``t``;
* ``{"cron": …}`` with ``kind`` absent -> ``kind: cron``;
* a daily cron in UTC (``M H * * *`` with plain numbers, timezone absent or ``UTC``, no
  ``starts_at``) -> ``kind: interval``, ``interval_seconds: 86400``, ``starts_at`` = H:M on
  1970-01-01 UTC. The anchor is fixed (a past occurrence), so every "every day at H:M UTC"
  request converges on one identical representation whenever it is made.

Everything else goes to the strict model (``ScheduleRequest``): unknown fields — including server
fields such as ``owner``, ``status``, ``revision``, ``fence`` or token hashes — are refused with
``rule="unknown_field"``, never ignored, and fields that do not apply to the kind are refused with
``rule="not_for_kind"`` rather than silently dropped. ``parse_request`` collects every problem and
raises one ``ValidationFailed`` naming field and rule for each, so a model can correct one request.

Limits a caller cannot talk past: at most ``MAX_PER_CONVERSATION`` open (active or paused)
schedules per conversation, counted under the conversation row lock so concurrent creates cannot
overshoot; nothing that fires more often than every ``MIN_SPACING`` over its real sequence
(``calendar.min_spacing``, so ``0,1 * * * *`` is caught as well as ``*/1``); no schedule created from
inside a run or for a conversation that descends from one.

Guarantees: a refused request writes no row. A webhook token (32 random bytes) is returned once in
``Created.token``; only its SHA-256 hex is stored, and neither appears in ``as_json``, ``repr`` or
logs. Every edit is one guarded UPDATE that bumps ``revision`` and ``updated_at``; the wrong state is
``Conflict``, a missing or foreign schedule ``NotFound("schedule")`` (the same error either way).
"Now" is the database clock unless a test injects ``now``.

Must not: build SQL from strings, log prompts, tokens or secrets, or re-implement the calendar
(``kairos.calendar`` is the one evaluator for preview and dispatch). The calendar is imported by the
functions that evaluate rules, not at import: reading and listing schedules never loads it.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any, Literal

import psycopg
from psycopg.types.json import Jsonb
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)
from pydantic_core import PydanticCustomError

from kairos import conversations, db
from kairos import secrets as kairos_secrets
from kairos.conversations import field_errors
from kairos.errors import (
    MAX,
    MIN,
    TIMEZONE_AWARE,
    TYPE,
    Conflict,
    FieldError,
    Forbidden,
    KairosError,
    LimitExceeded,
    NotFound,
    ValidationFailed,
)
from kairos.instants import out_of_range, rfc3339
from kairos.observability import logger
from kairos.states import DstFold, DstGap, Mode, Overlap, ScheduleKind, ScheduleStatus

if TYPE_CHECKING:
    from kairos import calendar

MAX_PER_CONVERSATION = 10
MIN_SPACING = timedelta(minutes=5)
PROMPT_MAX_BYTES = 16 * 1024
NAME_MAX = 200
CRON_MAX = 200
INTERVAL_MAX_SECONDS = 366 * 86_400
MAX_OCCURRENCES_MAX = 1_000_000
# How late a scheduled run without catch-up may still start, from its fire instant (DESIGN.md "The run").
MAX_DELAY_DEFAULT_SECONDS = 600
MAX_DELAY_MIN_SECONDS = 60
MAX_DELAY_MAX_SECONDS = 86_400
PREVIEW_MAX = 100
# A webhook token's rotation (``kairos.webhooks.rotate``): how long the previous token keeps working.
TOKEN_OVERLAP_DEFAULT_SECONDS = 86_400
TOKEN_OVERLAP_MAX_SECONDS = 604_800
DAY = 86_400

TIMED_KINDS = frozenset({ScheduleKind.CRON, ScheduleKind.INTERVAL, ScheduleKind.ONCE})


# --- The request -------------------------------------------------------------------------------

_INSTANT_HINT = "give an RFC 3339 time with an offset, e.g. 2030-01-01T07:00:00Z"


def _instant(value: object) -> datetime:
    """RFC 3339 strings (or aware datetimes from Python callers) only, within ``kairos.instants``'
    range (rules ``min`` / ``max``); the result is UTC."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise PydanticCustomError(TYPE, _INSTANT_HINT) from None
    if not isinstance(value, datetime):
        raise PydanticCustomError(TYPE, _INSTANT_HINT)
    if value.tzinfo is None or value.utcoffset() is None:
        raise PydanticCustomError(TIMEZONE_AWARE, _INSTANT_HINT)
    # Checked before converting: far instants overflow in UTC. (pydantic names the field by its location.)
    bound = out_of_range(value, "starts_at")
    if bound is not None:
        raise PydanticCustomError(bound.rule, bound.message)
    return value.astimezone(UTC)


Instant = Annotated[datetime, BeforeValidator(_instant)]


class ScheduleRequest(BaseModel):
    """The ``POST /v1/schedules`` body, strict: declared fields only, no type coercion of numbers,
    booleans or strings, times with an offset."""

    # Built at its first use (defer_build): API cold starts that create no schedule never pay for it.
    # (A comment, not the docstring: the docstring is the OpenAPI document's description.)
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    conversation_id: uuid.UUID
    prompt: StrictStr
    name: StrictStr = Field(default="", max_length=NAME_MAX)
    kind: ScheduleKind = ScheduleKind.CRON
    cron: StrictStr | None = Field(default=None, max_length=CRON_MAX)
    interval_seconds: StrictInt | None = Field(default=None, ge=1, le=INTERVAL_MAX_SECONDS)
    starts_at: Instant | None = None
    ends_at: Instant | None = None
    max_occurrences: StrictInt | None = Field(default=None, ge=1, le=MAX_OCCURRENCES_MAX)
    timezone: StrictStr = Field(default="UTC", min_length=1, max_length=64)
    dst_gap: DstGap = DstGap.AUTO
    dst_fold: DstFold = DstFold.AUTO
    mode: Mode = Mode.FORK
    catch_up: StrictBool = False
    max_delay_seconds: StrictInt = Field(default=MAX_DELAY_DEFAULT_SECONDS, ge=MAX_DELAY_MIN_SECONDS,
                                         le=MAX_DELAY_MAX_SECONDS)
    overlap: Overlap = Overlap.ALLOW
    agent: dict[str, Any] | None = None
    signing: dict[str, Any] | None = None

    @field_validator("prompt")
    @classmethod
    def _bounded_prompt(cls, value: str) -> str:
        if not value.strip():
            raise PydanticCustomError("empty", "give the prompt the agent should run")
        if len(value.encode("utf-8")) > PROMPT_MAX_BYTES:
            raise PydanticCustomError("max_length", f"at most {PROMPT_MAX_BYTES} bytes (UTF-8)")
        return value


class SigningConfig(BaseModel):
    """A webhook's signature requirement; the secret is a reference, never the secret itself."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    scheme: Literal["standard", "github"]
    secret: StrictStr = Field(max_length=2_048)
    tolerance_seconds: StrictInt = Field(default=300, ge=1, le=3_600)

    @field_validator("secret")
    @classmethod
    def _reference(cls, value: str) -> str:
        if not kairos_secrets.is_reference(value):
            raise PydanticCustomError("secret_reference", kairos_secrets.HINT)
        return value


def validate_signing(raw: object, *, owner: str) -> dict[str, Any]:
    """The signing JSON, normalized; ``ValidationFailed`` naming ``signing.<name>``.

    The secret must be one of the owner's own (a signing secret has no model host, so no shared
    ``env:`` key qualifies): otherwise the hook would verify against, and so reveal, a key that is
    not theirs.
    """
    if not isinstance(raw, Mapping):
        raise ValidationFailed([FieldError("signing", "type", "give signing as a JSON object")])
    try:
        config = SigningConfig.model_validate(dict(raw))
    except ValidationError as error:
        raise ValidationFailed(field_errors(error, prefix="signing")) from None
    try:
        kairos_secrets.check(config.secret, owner=owner, audience=None)
    except kairos_secrets.Refused as refused:
        raise ValidationFailed([kairos_secrets.field_error(refused, "signing.secret")]) from None
    return config.model_dump()


_DAILY = re.compile(r"(\d{1,2})\s+(\d{1,2})\s+\*\s+\*\s+\*")
_DAILY_ANCHOR_DAY = datetime(1970, 1, 1, tzinfo=UTC)


def canonicalize(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Chat-style shorthand -> the canonical shape (see the module doc). Pure; ``raw`` is not changed.

    Anything this does not recognise is left as it is, for the strict model to refuse.
    """
    body = dict(raw)
    if "every_seconds" in body and "interval_seconds" not in body and body.get("kind", "interval") == "interval":
        body["interval_seconds"] = body.pop("every_seconds")
        body["kind"] = ScheduleKind.INTERVAL.value
    elif "starts_at" in body and not any(k in body for k in ("kind", "cron", "interval_seconds", "every_seconds")):
        body["kind"] = ScheduleKind.ONCE.value
    elif "cron" in body and "kind" not in body:
        body["kind"] = ScheduleKind.CRON.value

    cron = body.get("cron")
    if (
        body.get("kind") == ScheduleKind.CRON.value
        and isinstance(cron, str)
        and body.get("timezone", "UTC") == "UTC"
        and "starts_at" not in body
        and "interval_seconds" not in body
    ):
        match = _DAILY.fullmatch(cron.strip())
        if match and int(match.group(1)) <= 59 and int(match.group(2)) <= 23:
            minute, hour = int(match.group(1)), int(match.group(2))
            del body["cron"]
            body["kind"] = ScheduleKind.INTERVAL.value
            body["interval_seconds"] = DAY
            body["starts_at"] = rfc3339(_DAILY_ANCHOR_DAY.replace(hour=hour, minute=minute))
    return body


def parse_request(raw: object, *, owner: str, now: datetime | None = None) -> ScheduleRequest:
    """Canonicalize, validate strictly, check the kind's rules, the calendar and the frequency.

    Raises ``ValidationFailed`` listing every problem (field + rule), or ``LimitExceeded`` for a
    rule that would fire more often than ``MIN_SPACING``. ``now`` decides "in the future" and the
    default interval anchor; it defaults to this process's clock (``create`` passes the database's).
    The result carries the normalized ``agent`` and ``signing`` and, for an interval, its anchor.
    """
    if not isinstance(raw, Mapping):
        raise ValidationFailed([FieldError("body", "type", "give the schedule as a JSON object")])
    now = (now or datetime.now(UTC)).astimezone(UTC)
    body = canonicalize(raw)
    problems: list[FieldError] = []

    # Nested objects are checked on their own, so their problems are reported with the others.
    agent: dict[str, Any] | None = None
    signing: dict[str, Any] | None = None
    if body.get("agent") is not None:
        try:
            agent = conversations.validate_agent(body["agent"], owner=owner)
        except ValidationFailed as error:
            problems.extend(error.fields)
    if body.get("signing") is not None:
        try:
            signing = validate_signing(body["signing"], owner=owner)
        except ValidationFailed as error:
            problems.extend(error.fields)

    try:
        request = ScheduleRequest.model_validate(body)
    except ValidationError as error:
        problems.extend(field_errors(error))
        problems.extend(_standalone_problems(body, {p.field for p in problems}))
        raise ValidationFailed(problems) from None

    if request.kind is ScheduleKind.INTERVAL and request.starts_at is None:
        request = request.model_copy(update={"starts_at": now})  # DESIGN: the anchor defaults to now
    problems.extend(_check_semantics(request, now))
    if problems:
        raise ValidationFailed(problems)

    request = request.model_copy(update={"agent": agent, "signing": signing})
    if request.kind in TIMED_KINDS:
        _check_frequency(request, now)
    return request


def _standalone_problems(body: Mapping[str, Any], reported: set[str]) -> list[FieldError]:
    """When the body's shape is already refused, the checks that need no other field still run, so one
    answer names a bad ``mode``, a bad ``cron`` and a bad ``timezone`` together (not one per round trip).
    The checks that depend on the kind or on several fields wait for a well-shaped body."""
    from kairos import calendar

    problems: list[FieldError] = []
    cron = body.get("cron")
    if "cron" not in reported and isinstance(cron, str) and cron:
        problems.extend(calendar.cron_problems(cron))
    zone = body.get("timezone")
    if "timezone" not in reported and isinstance(zone, str):
        problems.extend(calendar.zone_problems(zone))
    return problems


def _check_semantics(request: ScheduleRequest, now: datetime) -> list[FieldError]:
    """Rules beyond the shape. Rule words match the calendar's (``not_for_kind``, ``known_zone``…)."""
    from kairos import calendar

    problems: list[FieldError] = []
    kind = request.kind

    def not_for_kind(name: str, applies: str) -> None:
        problems.append(FieldError(name, "not_for_kind", f"{name} applies only to {applies}; remove it"))

    if kind is ScheduleKind.WEBHOOK:
        for name in ("cron", "interval_seconds", "starts_at", "ends_at", "max_occurrences"):
            if getattr(request, name) is not None:
                not_for_kind(name, "timed kinds (cron, interval, once)")
        if "max_delay_seconds" in request.model_fields_set:
            not_for_kind("max_delay_seconds", "timed kinds (cron, interval, once)")
    if kind is ScheduleKind.ONCE:
        for name in ("ends_at", "max_occurrences"):
            if getattr(request, name) is not None:
                not_for_kind(name, "kinds cron and interval")
        if request.starts_at is not None and request.starts_at <= now:
            problems.append(FieldError("starts_at", "not_future", "starts_at must be in the future"))
    if kind is not ScheduleKind.WEBHOOK and request.signing is not None:
        not_for_kind("signing", "kind webhook")
    if request.agent is not None and request.mode is not Mode.FRESH:
        not_for_kind("agent", "mode fresh (fork and append use the conversation's agent)")
    if (
        kind in (ScheduleKind.CRON, ScheduleKind.INTERVAL)
        and request.ends_at is not None
        and request.ends_at <= now
        and (request.starts_at is None or request.ends_at > request.starts_at)  # else the calendar says so
    ):
        problems.append(FieldError("ends_at", "not_future", "ends_at must be in the future"))

    if kind is ScheduleKind.WEBHOOK:
        try:
            calendar.describe(now, request.timezone)  # the same zone list the calendar uses
        except ValidationFailed as error:
            problems.extend(error.fields)
        return problems

    # The calendar judges what it owns: required rule fields, the expression, the zone, the window.
    try:
        calendar.check_rule(rule_of(request))
    except ValidationFailed as error:
        problems.extend(error.fields)
    if not problems and calendar.next_fire(rule_of(request), now) is None:
        name = "ends_at" if request.ends_at is not None else _rule_field(kind)
        problems.append(FieldError(name, "no_future_fire", "this rule never fires after now"))
    return problems


def _check_frequency(request: ScheduleRequest, now: datetime) -> None:
    from kairos import calendar

    spacing = calendar.min_spacing(rule_of(request), now)
    if spacing is not None and spacing < MIN_SPACING:
        name = _rule_field(request.kind)
        raise LimitExceeded(
            f"{name}: fires every {_human(spacing)}; the minimum is every {_human(MIN_SPACING)}",
            fields=[FieldError(name, "min_interval", f"fires every {_human(spacing)}; schedules may fire at most "
                               f"every {_human(MIN_SPACING)}")],
        )


def _rule_field(kind: ScheduleKind) -> str:
    return {ScheduleKind.CRON: "cron", ScheduleKind.INTERVAL: "interval_seconds"}.get(kind, "starts_at")


def _human(span: timedelta) -> str:
    seconds = int(span.total_seconds())
    if seconds % 60 == 0:
        minutes = seconds // 60
        return f"{minutes} minute{'s' if minutes != 1 else ''}"
    return f"{seconds} second{'s' if seconds != 1 else ''}"


def rule_of(source: ScheduleRequest | Schedule) -> calendar.Rule:
    """The calendar rule of a timed request or schedule (``ValueError`` for a webhook)."""
    from kairos import calendar

    if source.kind not in TIMED_KINDS:
        raise ValueError("a webhook schedule has no calendar rule")
    return calendar.Rule(
        kind=ScheduleKind(source.kind),
        cron=source.cron,
        interval_seconds=source.interval_seconds,
        starts_at=source.starts_at,
        ends_at=source.ends_at,
        timezone=source.timezone,
        dst_gap=DstGap(source.dst_gap),
        dst_fold=DstFold(source.dst_fold),
    )


# --- The record --------------------------------------------------------------------------------

# Columns the API never shows: the principal (the caller knows it), token material, internals.
_HIDDEN = frozenset({"owner", "token_hash", "previous_token_hash", "previous_token_expires_at",
                     "created_by_run_id", "rate_limit_per_minute"})
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
            if f.name in _HIDDEN:
                continue
            value = getattr(self, f.name)
            if isinstance(value, datetime):
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


def hash_token(token: str) -> str:
    """SHA-256 hex of a webhook token: the only form that is stored."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


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
    from kairos import calendar

    fire = calendar.next_fire(rule, after)
    return None if fire is None else fire.fire_at


def preview(schedule: Schedule, *, after: datetime, count: int) -> list[calendar.Fire]:
    """The next ``count`` (1..100) fires strictly after ``after`` (an instant in ``kairos.instants``'
    range), honouring ``max_occurrences``. A webhook has no timed fires."""
    problems = [*_count_problems(count), *_after_problems(after)]
    if problems:
        raise ValidationFailed(problems)
    return _fires(schedule, after, count)


def preview_owned(conn: psycopg.Connection[db.Row], schedule_id: uuid.UUID, *, owner: str, count: int,
                  after: datetime | None = None, now: datetime | None = None) -> list[calendar.Fire]:
    """``preview`` of ``owner``'s schedule: after ``after``, or after the database clock (``now`` in
    tests) when it is None. The arguments are checked before the schedule is read, so a bad one is
    ``ValidationFailed`` whether or not the id names a schedule; a missing or foreign one is
    ``NotFound("schedule")``."""
    problems = [*_count_problems(count), *([] if after is None else _after_problems(after))]
    if problems:
        raise ValidationFailed(problems)
    schedule = get(conn, schedule_id, owner=owner)
    return _fires(schedule, _clock(conn, now) if after is None else after, count)


def _count_problems(count: object) -> list[FieldError]:
    if isinstance(count, bool) or not isinstance(count, int):
        return [FieldError("count", TYPE, f"count must be a whole number from 1 to {PREVIEW_MAX}")]
    if not 1 <= count <= PREVIEW_MAX:
        return [FieldError("count", MIN if count < 1 else MAX, f"count must be between 1 and {PREVIEW_MAX}")]
    return []


def _after_problems(after: object) -> list[FieldError]:
    if not isinstance(after, datetime):
        return [FieldError("after", TYPE, _INSTANT_HINT)]
    if after.tzinfo is None or after.utcoffset() is None:
        return [FieldError("after", TIMEZONE_AWARE, _INSTANT_HINT)]
    bound = out_of_range(after, "after")
    return [] if bound is None else [bound]


def _fires(schedule: Schedule, after: datetime, count: int) -> list[calendar.Fire]:
    if schedule.kind not in TIMED_KINDS:
        return []
    if schedule.max_occurrences is not None:
        count = min(count, max(schedule.max_occurrences - schedule.fire_count, 0))
        if count == 0:
            return []
    from kairos import calendar

    return calendar.fires(rule_of(schedule), after, count)



def _clock(conn: psycopg.Connection[db.Row], now: datetime | None) -> datetime:
    row = db.fetch_one(conn, "schedules_clock", {"now": now})
    assert row is not None
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
        logger.info("schedule refused", extra={"action": "schedule.refused", "code": error.code,
                                                "rules": [f"{f.field}:{f.rule}" for f in error.fields]})
        raise
    s = created.schedule
    logger.info("schedule created", extra={
        "action": "schedule.created", "schedule_id": str(s.id), "conversation_id": str(s.conversation_id),
        "kind": s.kind.value, "next_fire_at": None if s.next_fire_at is None else rfc3339(s.next_fire_at)})
    return created


def _create(conn: psycopg.Connection[db.Row], *, owner: str, raw: object, now: datetime | None,
            context_run_id: uuid.UUID | None) -> Created:
    if context_run_id is not None:
        raise _from_run()
    clock = _clock(conn, now)
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
    token_hash: str | None = None
    first: datetime | None = None
    if request.kind is ScheduleKind.WEBHOOK:
        token = secrets.token_urlsafe(32)
        token_hash = hash_token(token)
    else:
        first = next_fire_at(rule_of(request), clock)
        assert first is not None  # parse_request refused rules with no future fire

    stored = db.fetch_one(
        conn,
        "schedules_insert",
        {
            "id": uuid.uuid4(),
            "owner": owner,
            "conversation_id": conversation.id,
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
            # The snapshot a fresh run starts from; fork and append read the conversation's agent.
            "agent": Jsonb(request.agent if request.agent is not None else conversation.agent),
            "signing": None if request.signing is None else Jsonb(request.signing),
            "next_fire_at": first,
            "token_hash": token_hash,
            "created_by_run_id": context_run_id,
            "now": clock,
        },
    )
    assert stored is not None
    return Created(Schedule.from_row(stored), token)


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


def pause(conn: psycopg.Connection[db.Row], schedule_id: uuid.UUID, *, owner: str,
          now: datetime | None = None) -> Schedule:
    """active -> paused; anything else is ``Conflict``."""
    row = db.fetch_one(conn, "schedules_pause", {"schedule_id": schedule_id, "owner": owner, "now": now})
    if row is None:
        raise _refused_move(conn, schedule_id, owner, "paused", "only an active schedule can be paused")
    return _moved(row, "schedule.paused")


def resume(conn: psycopg.Connection[db.Row], schedule_id: uuid.UUID, *, owner: str,
           now: datetime | None = None) -> Schedule:
    """paused -> active: clears ``consecutive_failures`` and computes the next fire from now.

    A schedule with nothing left to fire (a ``once`` whose instant passed, a rule past ``ends_at``,
    ``max_occurrences`` used up) cannot be resumed: ``Conflict``. The update is guarded by the
    revision read, so a concurrent edit makes this call answer ``Conflict`` rather than apply a
    cursor computed from a stale definition.
    """
    with db.atomic(conn):
        clock = _clock(conn, now)
        current = get(conn, schedule_id, owner=owner)
        if current.status is not ScheduleStatus.PAUSED:
            raise _conflict(current, "resumed", "only a paused schedule can be resumed")
        first: datetime | None = None
        if current.kind in TIMED_KINDS:
            first = next_fire_at(current, clock)
            if first is None:
                raise Conflict("this schedule has nothing left to fire; cancel it and create a new one",
                               fields=[FieldError("status", "no_future_fire", "the rule has no fire after now")])
        row = db.fetch_one(conn, "schedules_resume", {
            "schedule_id": schedule_id, "owner": owner, "revision": current.revision,
            "next_fire_at": first, "now": clock})
        if row is None:
            raise _refused_move(conn, schedule_id, owner, "resumed", "the schedule changed meanwhile; try again")
    return _moved(row, "schedule.resumed")


def cancel(conn: psycopg.Connection[db.Row], schedule_id: uuid.UUID, *, owner: str,
           now: datetime | None = None) -> Schedule:
    """active or paused -> cancelled (final); runs already claimed still finish."""
    row = db.fetch_one(conn, "schedules_cancel", {"schedule_id": schedule_id, "owner": owner, "now": now})
    if row is None:
        raise _refused_move(conn, schedule_id, owner, "cancelled", "it is already cancelled or completed")
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
