"""Domain exceptions, and the one table that maps them to HTTP status and error code.

Library code raises these; the API handler turns them into the error shape DESIGN.md fixes:
``{"error": {"code", "message", "fields": [{"field", "rule", "message"}]}}``. Messages are written
for the caller (a person or a model correcting one request): they never carry SQL, stack traces,
hashes or tokens. Nothing matches on message text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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


class SignatureInvalid(KairosError):
    code = "signature_invalid"


class MalformedJson(KairosError):
    """The body is not JSON at all (JSON that breaks rules is ValidationFailed)."""

    code = "malformed_json"


class MethodNotAllowed(KairosError):
    code = "method_not_allowed"


class UnsupportedMediaType(KairosError):
    code = "unsupported_media_type"


class ServiceUnavailable(KairosError):
    """A service Kairos depends on (Secrets Manager) failed; nothing was changed, the caller may retry."""

    code = "service_unavailable"


@dataclass(frozen=True)
class HttpError:
    status: int
    headers: dict[str, str] = field(default_factory=dict)


# The one mapping from domain errors to HTTP. Order matters only for subclasses (none overlap).
HTTP_STATUS: dict[type[KairosError], int] = {
    ValidationFailed: 422,
    NotFound: 404,
    Conflict: 409,
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
