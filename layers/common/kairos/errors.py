"""Domain exceptions, and the one table that maps them to HTTP status and error code.

Library code raises these; the API handler turns them into the one error shape (docs/api.md "API"):
``{"error": {"code", "message", "fields": [{"field", "rule", "message"}]}}``. Messages are written
for the caller (a person or a model correcting one request): they never carry SQL, stack traces,
hashes or tokens. Nothing matches on message text. Field errors name their rule from one vocabulary
(below), whichever layer found them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import ValidationError

# ---- the rule vocabulary ------------------------------------------------------------------------
#
# One word per kind of problem, whichever layer finds it: the API's request validation (Powertools and
# pydantic), the library's models (schedules, agents, signing) and the library's own checks. A caller,
# or a model correcting its request, sees the same rule for the same mistake on every path.

REQUIRED = "required"  # the field is missing
UNKNOWN_FIELD = "unknown_field"  # the body names a field the route does not declare
TYPE = "type"  # wrong JSON type, or text that does not parse as the declared kind (uuid, instant)
ENUM = "enum"  # not one of the allowed words
MIN = "min"  # a number or an instant below its lower bound
MAX = "max"  # a number or an instant above its upper bound
MIN_LENGTH = "min_length"
MAX_LENGTH = "max_length"
PATTERN = "pattern"  # text outside the characters or shape the field allows
TIMEZONE_AWARE = "timezone_aware"  # an instant without a UTC offset
INVALID = "invalid"  # a value our own validator refused without a rule of its own
MAX_DEPTH = "max_depth"  # JSON nested deeper than a body may be
INVALID_CHARACTER = "invalid_character"  # NUL or a lone surrogate: PostgreSQL cannot store it
NO_BODY = "no_body"  # a body sent to a route that takes none (it would be ignored)
CURSOR = "cursor"  # a page cursor (``before``) this API did not hand out for that list (kairos.pages)

# pydantic error type -> rule. Errors raised by our own validators (``PydanticCustomError``) carry
# their rule as their type and pass through unchanged (``secret_reference``, ``url``, ``empty``...).
PYDANTIC_RULES: dict[str, str] = {
    "missing": REQUIRED,
    "extra_forbidden": UNKNOWN_FIELD,
    "enum": ENUM,
    "literal_error": ENUM,
    "greater_than": MIN,
    "greater_than_equal": MIN,
    "less_than": MAX,
    "less_than_equal": MAX,
    "string_too_short": MIN_LENGTH,
    "too_short": MIN_LENGTH,
    "string_too_long": MAX_LENGTH,
    "too_long": MAX_LENGTH,
    "string_pattern_mismatch": PATTERN,
    "timezone_aware": TIMEZONE_AWARE,
    "value_error": INVALID,
    "assertion_error": INVALID,
}
_TYPE_ERRORS = ("_type", "_parsing", "_from_datetime_inexact", "_from_float", "_from_date_parsing")
_MESSAGES = {
    UNKNOWN_FIELD: "unknown field; remove it (only the declared fields are accepted)",
    REQUIRED: "this field is required",
}


def rule_for(pydantic_type: str) -> str:
    """The rule word of a pydantic error type (see ``PYDANTIC_RULES``)."""
    if pydantic_type in PYDANTIC_RULES:
        return PYDANTIC_RULES[pydantic_type]
    if pydantic_type.endswith(_TYPE_ERRORS):
        return TYPE
    return pydantic_type  # one of our own custom rules


def from_pydantic(details: Iterable[Mapping[str, Any]], *, prefix: str = "") -> list[FieldError]:
    """pydantic error dicts (``ValidationError.errors()``, or Powertools' request errors with their
    location already stripped) as FieldErrors: dotted field, rule from ``rule_for``.

    Messages are pydantic's, which never repeat the input value (it may be a secret the caller should
    not have sent), except for the two rules whose fix is always the same.
    """
    out: list[FieldError] = []
    for detail in details:
        path = ".".join(str(part) for part in detail.get("loc", ()))
        name = ".".join(p for p in (prefix, path) if p) or "body"
        rule = rule_for(str(detail.get("type", INVALID)))
        message = _MESSAGES.get(rule) or str(detail.get("msg") or rule.replace("_", " "))
        out.append(FieldError(name, rule, message))
    return out


def from_validation_error(error: ValidationError, *, prefix: str = "") -> list[FieldError]:
    """A pydantic ``ValidationError`` as FieldErrors (``from_pydantic``), its input values left out."""
    return from_pydantic(error.errors(include_url=False, include_input=False), prefix=prefix)


@dataclass(frozen=True)
class FieldError:
    field: str
    rule: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"field": self.field, "rule": self.rule, "message": self.message}


class KairosError(Exception):
    """Base of every error the API may show. ``code`` is stable; ``message`` is for people."""

    code = "internal"

    def __init__(self, message: str, *, fields: list[FieldError] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fields: list[FieldError] = fields or []

    def as_body(self) -> dict[str, Any]:
        return {
            "error": {
                "code": self.code,
                "message": self.message,
                "fields": [f.as_dict() for f in self.fields],
            }
        }


class ValidationFailed(KairosError):
    """The request is well-formed JSON but breaks one or more rules; ``fields`` names each."""

    code = "validation_failed"

    def __init__(self, fields: list[FieldError], message: str | None = None) -> None:
        if not fields:
            raise ValueError("ValidationFailed needs at least one field error")
        # One entry per (field, rule), in order: several checks may find the same problem.
        unique: list[FieldError] = []
        for f in fields:
            if all((f.field, f.rule) != (u.field, u.rule) for u in unique):
                unique.append(f)
        super().__init__(message or _summary(unique), fields=unique)


def _summary(fields: list[FieldError]) -> str:
    first = fields[0]
    more = f" (and {len(fields) - 1} more)" if len(fields) > 1 else ""
    return f"{first.field}: {first.message}{more}"


class NotFound(KairosError):
    """Missing, or owned by someone else: the two are indistinguishable by design."""

    code = "not_found"

    def __init__(self, what: str = "resource") -> None:
        super().__init__(f"{what} not found")


class Conflict(KairosError):
    """The object is in a state that does not allow the request (e.g. resume a cancelled schedule)."""

    code = "conflict"


class LimitExceeded(KairosError):
    """A server-side limit a caller cannot talk past (schedules per conversation, frequency)."""

    code = "limit_exceeded"

    def __init__(self, message: str, *, fields: list[FieldError] | None = None) -> None:
        super().__init__(message, fields=fields)


class Forbidden(KairosError):
    """Policy refuses the request whoever asks (e.g. scheduling from inside a scheduled run)."""

    code = "forbidden"


class OverlapConflict(Conflict):
    """A run now would overlap a run of the same schedule its overlap policy does not allow."""

    code = "overlap"


class NotRetryable(Conflict):
    """The run cannot be retried: its state, or an external change it may have made."""

    code = "not_retryable"


class AmbiguousEffect(Conflict):
    """A retry from the last step would have to repeat a step whose external change may or may not have
    happened (its effect is ambiguous): the error names the step."""

    code = "ambiguous_effect"


class LoopPolicy(Conflict):
    """A goal loop's fixed policies cannot be loosened through a schedule route (trigger, retry,
    backfill, PATCH /v1/schedules): a loop is edited only through PATCH /v1/loops."""

    code = "loop_policy"


class NotPending(Conflict):
    """An input request that is no longer pending (answered, cancelled or expired) cannot be answered."""

    code = "not_pending"


class NotCorpusRun(Conflict):
    """Pause and resume apply to a corpus run that is queued or running (pause) or paused (resume)."""

    code = "not_corpus_run"


class NotPaused(Conflict):
    """Resume of a corpus run that is not paused (nor asked to pause)."""

    code = "not_paused"


class PreconditionFailed(KairosError):
    """``If-Match`` named a revision that is no longer the current one: re-read, then edit again."""

    code = "precondition_failed"


class Unauthorized(KairosError):
    code = "unauthorized"


class IdempotencyMismatch(KairosError):
    """The same idempotency key arrived with a different body."""

    code = "idempotency_key_reused"


class PayloadTooLarge(KairosError):
    code = "payload_too_large"


class RateLimited(KairosError):
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class QueueFull(RateLimited):
    """A trigger, retry, webhook delivery or backfill would queue more runs than the owner's cap
    (``KAIROS_OWNER_QUEUE_MAX``); nothing was recorded, and the same request may be sent again later
    (``Retry-After``: a minute, about the time a few queued runs take to start)."""

    code = "queue_full"

    def __init__(self, queue_max: int) -> None:
        super().__init__(
            f"the owner already has {queue_max} runs queued (the most allowed); try again when some have run",
            retry_after=60)
        self.fields = [FieldError("owner", "queue_max", f"at most {queue_max} queued runs per owner")]
        self.queue_max = queue_max


class SignatureInvalid(KairosError):
    code = "signature_invalid"


class MalformedJson(KairosError):
    """The body is not JSON at all (JSON that breaks rules is ValidationFailed)."""

    code = "malformed_json"


class MethodNotAllowed(KairosError):
    code = "method_not_allowed"


class UnsupportedMediaType(KairosError):
    code = "unsupported_media_type"


# ``Retry-After`` of a 503: the database pool recovers as soon as the database does (a failover takes
# seconds to half a minute), and a caller retrying sooner only meets the same answer.
RETRY_AFTER_SECONDS = 5


class ServiceUnavailable(KairosError):
    """A service Kairos depends on (the database, Secrets Manager) failed or could not be reached; the
    caller may retry after ``retry_after`` seconds (``Retry-After``)."""

    code = "service_unavailable"

    def __init__(self, message: str, *, retry_after: int = RETRY_AFTER_SECONDS) -> None:
        super().__init__(message)
        self.retry_after = retry_after


# The one mapping from domain errors to HTTP. Order matters only for subclasses (none overlap).
HTTP_STATUS: dict[type[KairosError], int] = {
    ValidationFailed: 422,
    NotFound: 404,
    Conflict: 409,
    PreconditionFailed: 412,
    LimitExceeded: 422,
    Forbidden: 403,
    Unauthorized: 401,
    IdempotencyMismatch: 422,
    PayloadTooLarge: 413,
    RateLimited: 429,
    SignatureInvalid: 401,
    MalformedJson: 400,
    MethodNotAllowed: 405,
    UnsupportedMediaType: 415,
    ServiceUnavailable: 503,
}


def http_status(error: KairosError) -> int:
    for cls in type(error).__mro__:
        if issubclass(cls, KairosError) and cls in HTTP_STATUS:
            return HTTP_STATUS[cls]
    return 500
