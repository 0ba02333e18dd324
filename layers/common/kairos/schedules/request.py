"""Schedule requests: the ``POST /v1/schedules`` body, its canonical forms, limits and validation.

Role: turn raw JSON into a checked ``ScheduleRequest`` (``parse_request``), or refuse it naming field
and rule; ``kairos.schedules`` stores what this module accepts. Pure: no database, no clock of its own
(callers pass ``now``), no logging.

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

Limits (the module constants; the API's models take them from here): nothing that fires more often
than every ``MIN_SPACING`` over its real sequence (``calendar.min_spacing``, so ``0,1 * * * *`` is
caught as well as ``*/1``); prompt, name, cron, interval, occurrence, delay, preview and token-overlap
bounds. Credentials: an ``agent`` and a ``signing`` secret must be the owner's own
(``agents.validate``, ``validate_signing``), and so must a ``notify`` webhook's
(``kairos.notify.validate_notify``).

Must not: re-implement the calendar (``kairos.calendar`` judges rules, imported by the functions that
evaluate them, not at import), or depend on the schedule record (``rule_of`` takes anything shaped
like a rule).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol

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

from kairos import agents, calendar, limits, runtime
from kairos import secrets as kairos_secrets
from kairos.errors import (
    MAX,
    MIN,
    TIMEZONE_AWARE,
    TYPE,
    FieldError,
    LimitExceeded,
    ValidationFailed,
    from_validation_error,
)
from kairos.instants import out_of_range, rfc3339
from kairos.notify import NOTIFY_ON_DEFAULT, validate_notify
from kairos.schedules.corpus_spec import validate as validate_corpus
from kairos.schedules.flow_spec import validate as validate_flow
from kairos.states import DstFold, DstGap, Mode, Overlap, ScheduleKind

if TYPE_CHECKING:
    from kairos import calendar

MIN_SPACING = timedelta(minutes=5)
PROMPT_MAX_BYTES = 16 * 1024
NAME_MAX = 200
PAUSE_REASON_MAX = 500  # characters of a pause's reason (kairos.schedules.paused)
CRON_MAX = 200
INTERVAL_MAX_SECONDS = 366 * 86_400
MAX_OCCURRENCES_MAX = 1_000_000
# How late a scheduled run without catch-up may still start, from its fire instant (docs/api.md "API").
MAX_DELAY_DEFAULT_SECONDS = 600
MAX_DELAY_MIN_SECONDS = 60
MAX_DELAY_MAX_SECONDS = 86_400
PREVIEW_MAX = 100
JITTER_MAX_SECONDS = 3_600  # and at most half the rule's shortest period (docs/api.md, "Jitter")
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


class ScheduleLimits(agents.RunLimits):
    """A schedule's ``limits`` (docs/api.md "Limits"): a run's, and a webhook schedule's delivery rate."""

    rate_per_minute: StrictInt | None = Field(default=None, ge=1,
                                              description="webhook deliveries accepted per minute; default 60")


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
    jitter_seconds: StrictInt = Field(default=0, ge=0, le=JITTER_MAX_SECONDS)
    agent: dict[str, Any] | None = None
    signing: dict[str, Any] | None = None
    # {"on": [terminal run states], "webhook"?: {"url", "secret"}}, checked by ``kairos.notify.validate_notify``;
    # ``parse_request`` always fills it in (the default when absent).
    notify: dict[str, Any] | None = None
    # A corpus run's spec (docs/api.md "Corpus runs"), checked by ``kairos.schedules.corpus_spec.validate``.
    corpus: dict[str, Any] | None = None
    # A webhook schedule's flow control (docs/api.md "Webhook flow"), checked by
    # ``kairos.schedules.flow_spec.validate``: debounce_seconds | batch, concurrency, over_rate.
    flow: dict[str, Any] | None = Field(default=None, description=(
        'webhook only: {"debounce_seconds"?: 1..3600, "batch"?: {"max_events": 2..100, "max_wait_seconds": '
        '1..300}, "concurrency"?: {"key": "<JSON pointer>", "limit"?: 1..100}, "over_rate"?: "reject" | "defer"}; '
        'debounce_seconds and batch exclude each other'))
    # What each run may use, and a hook's rate (kairos.limits); unset ones are the agent's, else the defaults.
    limits: ScheduleLimits | None = None

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
    secret: agents.SecretReference
    tolerance_seconds: StrictInt = Field(default=300, ge=1, le=3_600)



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
        raise ValidationFailed(from_validation_error(error, prefix="signing")) from None
    try:
        kairos_secrets.check(config.secret, owner=owner, audience=None)
    except kairos_secrets.Refused as refused:
        raise ValidationFailed([kairos_secrets.field_error(refused, "signing.secret")]) from None
    return config.model_dump()


# ASCII only: without re.ASCII, \d and \s also match fullwidth digits and Unicode spaces, and int()
# reads those digits, so "\uff10 7 * * *" became a daily interval while the cron evaluator refuses it.
_DAILY = re.compile(r"(\d{1,2})\s+(\d{1,2})\s+\*\s+\*\s+\*", re.ASCII)
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
    The result carries the normalized ``agent``, ``signing`` and ``notify`` (the default when absent)
    and, for an interval, its anchor.
    """
    if not isinstance(raw, Mapping):
        raise ValidationFailed([FieldError("body", "type", "give the schedule as a JSON object")])
    now = (now or datetime.now(UTC)).astimezone(UTC)
    body = canonicalize(raw)
    problems: list[FieldError] = []

    # Nested objects are checked on their own, so their problems are reported with the others.
    agent: dict[str, Any] | None = None
    signing: dict[str, Any] | None = None
    notify: dict[str, Any] = {"on": [s.value for s in NOTIFY_ON_DEFAULT]}
    if body.get("agent") is not None:
        try:
            agent = agents.validate(body["agent"], owner=owner)
        except ValidationFailed as error:
            problems.extend(error.fields)
    if body.get("signing") is not None:
        try:
            signing = validate_signing(body["signing"], owner=owner)
        except ValidationFailed as error:
            problems.extend(error.fields)
    if body.get("notify") is not None:
        try:
            notify = validate_notify(body["notify"], owner=owner)
        except ValidationFailed as error:
            problems.extend(error.fields)
    corpus = _corpus(body.get("corpus"), problems, owner=owner)
    flow: dict[str, Any] | None = None
    if body.get("flow") is not None:
        try:
            flow = validate_flow(body["flow"])
        except ValidationFailed as error:
            problems.extend(error.fields)

    try:
        request = ScheduleRequest.model_validate(body)
    except ValidationError as error:
        problems.extend(from_validation_error(error))
        problems.extend(_standalone_problems(body, {p.field for p in problems}))
        raise ValidationFailed(problems) from None

    if request.kind is ScheduleKind.INTERVAL and request.starts_at is None:
        request = request.model_copy(update={"starts_at": now})  # an interval's anchor defaults to now
    problems.extend(_check_semantics(request, now))
    if problems:
        raise ValidationFailed(problems)

    request = request.model_copy(update={"agent": agent, "signing": signing, "notify": notify, "corpus": corpus,
                                         "flow": flow})
    if request.kind in TIMED_KINDS:
        _check_frequency(request, now)
    return request


def _corpus(raw: object, problems: list[FieldError], *, owner: str) -> dict[str, Any] | None:
    """The checked ``corpus`` (``kairos.schedules.corpus_spec``), its problems added to ``problems``."""
    if raw is None:
        return None

    try:
        return validate_corpus(raw, buckets=runtime.settings().readable_corpus_buckets, owner=owner)
    except ValidationFailed as error:
        problems.extend(error.fields)
        return None


def _standalone_problems(body: Mapping[str, Any], reported: set[str]) -> list[FieldError]:
    """When the body's shape is already refused, the checks that need no other field still run, so one
    answer names a bad ``mode``, a bad ``cron`` and a bad ``timezone`` together (not one per round trip).
    The checks that depend on the kind or on several fields wait for a well-shaped body."""

    problems: list[FieldError] = []
    cron = body.get("cron")
    if "cron" not in reported and isinstance(cron, str) and cron:
        problems.extend(calendar.cron_problems(cron))
    zone = body.get("timezone")
    if "timezone" not in reported and isinstance(zone, str):
        problems.extend(calendar.zone_problems(zone))
    return problems


# The fields only some kinds take, by the kind that refuses them (and how the refusal names the others).
_NOT_FOR_KIND: dict[ScheduleKind, tuple[tuple[str, ...], str]] = {
    ScheduleKind.WEBHOOK: (("cron", "interval_seconds", "starts_at", "ends_at", "max_occurrences", "max_delay_seconds"),
                           "timed kinds (cron, interval, once)"),
    ScheduleKind.ONCE: (("ends_at", "max_occurrences", "jitter_seconds"), "kinds cron and interval"),
}


def _check_semantics(request: ScheduleRequest, now: datetime) -> list[FieldError]:
    """Rules beyond the shape. Rule words match the calendar's (``not_for_kind``, ``known_zone``…)."""

    problems = _fields_not_for_kind(request) + _times_not_future(request, now) + limits.schedule_problems(
        None if request.limits is None else request.limits.model_dump(exclude_none=True),
        webhook=request.kind is ScheduleKind.WEBHOOK)
    if request.kind is ScheduleKind.WEBHOOK:  # the same zone list the calendar uses
        return problems + _calendar_errors(lambda: calendar.describe(now, request.timezone))
    # The calendar judges what it owns: required rule fields, the expression, the zone, the window.
    problems += _calendar_errors(lambda: calendar.check_rule(rule_of(request)))
    if not problems and calendar.next_fire(rule_of(request), now) is None:
        name = "ends_at" if request.ends_at is not None else _rule_field(request.kind)
        problems.append(FieldError(name, "no_future_fire", "this rule never fires after now"))
    return problems


def _fields_not_for_kind(request: ScheduleRequest) -> list[FieldError]:
    def refused(name: str, applies: str) -> FieldError:
        return FieldError(name, "not_for_kind", f"{name} applies only to {applies}; remove it")

    names, applies = _NOT_FOR_KIND.get(request.kind, ((), ""))
    problems = [refused(name, applies) for name in names if _given(request, name)]
    if request.kind is ScheduleKind.WEBHOOK and request.jitter_seconds:  # spreads timed fires only
        problems.append(refused("jitter_seconds", "kinds cron and interval"))
    if request.kind is not ScheduleKind.WEBHOOK and request.signing is not None:
        problems.append(refused("signing", "kind webhook"))
    if request.kind is not ScheduleKind.WEBHOOK and request.flow is not None:
        problems.append(refused("flow", "kind webhook"))
    if request.agent is not None and request.mode is not Mode.FRESH:
        problems.append(refused("agent", "mode fresh (fork and append use the conversation's agent)"))
    return problems


def _given(request: ScheduleRequest, name: str) -> bool:
    """The caller gave the field: a value other than its default, or its default written out."""
    value = getattr(request, name)
    default = ScheduleRequest.model_fields[name].default
    return value is not None and (value != default or name in request.model_fields_set)


def _times_not_future(request: ScheduleRequest, now: datetime) -> list[FieldError]:
    starts_at, ends_at = request.starts_at, request.ends_at
    if request.kind is ScheduleKind.ONCE and starts_at is not None and starts_at <= now:
        return [FieldError("starts_at", "not_future", "starts_at must be in the future")]
    if (request.kind in (ScheduleKind.CRON, ScheduleKind.INTERVAL) and ends_at is not None and ends_at <= now
            and (starts_at is None or ends_at > starts_at)):  # else the calendar says the window is empty
        return [FieldError("ends_at", "not_future", "ends_at must be in the future")]
    return []


def _calendar_errors(check: Callable[[], object]) -> list[FieldError]:
    """What a calendar check refuses, as field errors (the same zone list and rule words)."""
    try:
        check()
    except ValidationFailed as error:
        return list(error.fields)
    return []


def _check_frequency(request: ScheduleRequest, now: datetime) -> None:
    """The shortest period (``calendar.min_spacing``) against ``MIN_SPACING`` and twice ``jitter_seconds``."""

    spacing = calendar.min_spacing(rule_of(request), now)
    if spacing is not None and spacing < MIN_SPACING:
        name = _rule_field(request.kind)
        raise LimitExceeded(
            f"{name}: fires every {_human(spacing)}; the minimum is every {_human(MIN_SPACING)}",
            fields=[FieldError(name, "min_interval", f"fires every {_human(spacing)}; schedules may fire at most "
                               f"every {_human(MIN_SPACING)}")],
        )
    if spacing is not None and request.jitter_seconds and timedelta(seconds=2 * request.jitter_seconds) > spacing:
        half = int(spacing.total_seconds()) // 2
        raise ValidationFailed([FieldError(
            "jitter_seconds", "max_half_period",
            f"the rule fires {_human(spacing)} apart at its closest ({_rule_field(request.kind)}); "
            f"jitter_seconds may be at most half of that: {half}")])


def _rule_field(kind: ScheduleKind) -> str:
    return {ScheduleKind.CRON: "cron", ScheduleKind.INTERVAL: "interval_seconds"}.get(kind, "starts_at")


def _human(span: timedelta) -> str:
    seconds = int(span.total_seconds())
    if seconds % 60 == 0:
        minutes = seconds // 60
        return f"{minutes} minute{'s' if minutes != 1 else ''}"
    return f"{seconds} second{'s' if seconds != 1 else ''}"


class Timed(Protocol):
    """What ``rule_of`` reads: a ``ScheduleRequest`` or a stored ``kairos.schedules.Schedule``."""

    @property
    def kind(self) -> ScheduleKind: ...
    @property
    def cron(self) -> str | None: ...
    @property
    def interval_seconds(self) -> int | None: ...
    @property
    def starts_at(self) -> datetime | None: ...
    @property
    def ends_at(self) -> datetime | None: ...
    @property
    def timezone(self) -> str: ...
    @property
    def dst_gap(self) -> DstGap: ...
    @property
    def dst_fold(self) -> DstFold: ...


def rule_of(source: Timed) -> calendar.Rule:
    """The calendar rule of a timed request or schedule (``ValueError`` for a webhook)."""

    if source.kind not in TIMED_KINDS:
        raise ValueError("a webhook schedule has no calendar rule")
    return calendar.Rule.of(source)


# --- Preview arguments -------------------------------------------------------------------------


def count_problems(count: object) -> list[FieldError]:
    if isinstance(count, bool) or not isinstance(count, int):
        return [FieldError("count", TYPE, f"count must be a whole number from 1 to {PREVIEW_MAX}")]
    if not 1 <= count <= PREVIEW_MAX:
        return [FieldError("count", MIN if count < 1 else MAX, f"count must be between 1 and {PREVIEW_MAX}")]
    return []


def after_problems(after: object) -> list[FieldError]:
    if not isinstance(after, datetime):
        return [FieldError("after", TYPE, _INSTANT_HINT)]
    if after.tzinfo is None or after.utcoffset() is None:
        return [FieldError("after", TIMEZONE_AWARE, _INSTANT_HINT)]
    bound = out_of_range(after, "after")
    return [] if bound is None else [bound]

