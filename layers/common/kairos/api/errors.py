"""Every error the API answers, in one shape (docs/api.md "API"): ``{"error": {"code", "message", "fields": [...]}}``.

``error_response`` turns a domain error (``kairos.errors``) into its response: the status from
``kairos.errors.http_status``, ``Retry-After`` for a rate limit and an unavailable service.
``router`` carries the exception handlers the resolver takes with ``include_router``: domain errors
as they are; Powertools' request validation errors translated to field/rule by
``kairos.errors.from_pydantic`` (the one table the library's own validation uses; ``translate``), or
400 ``malformed_json`` for a body that is not JSON; an unsupported media type as 415; an unmatched
route as 404; the database out of reach (a restart, a failover, no connection within the pool's
wait: ``kairos.db.unavailable``) as 503 with ``Retry-After``, left to ``kairos.api.app.handle`` so
that a GET is tried once more first (``database_unavailable``); a response that broke its own model,
and anything unexpected, as 500 ``internal`` with no detail — logged with the route key (and the
traceback), never the path, a header or a body.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

import psycopg
from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.event_handler.openapi.exceptions import (
    RequestUnsupportedContentType,
    RequestValidationError,
)
from pydantic import ValidationError

from kairos import db
from kairos.api.resolver import JSON, route_key
from kairos.errors import (
    INVALID,
    FieldError,
    KairosError,
    MalformedJson,
    NotFound,
    RateLimited,
    ServiceUnavailable,
    UnsupportedMediaType,
    ValidationFailed,
    from_pydantic,
    http_status,
)
from kairos.observability import logger

router = Router()  # type: ignore[no-untyped-call]  # Powertools' Router.__init__ is unannotated

F = TypeVar("F", bound=Callable[..., Any])


def _on(exc: type[Exception]) -> Callable[[F], F]:
    """``router.exception_handler`` with its type kept (Powertools' decorator is untyped)."""
    return cast("Callable[[F], F]", router.exception_handler(exc))


def internal() -> KairosError:
    """The one answer to what we did not expect: 500 ``internal``, no detail."""
    return KairosError("internal error")


def error_response(error: KairosError, headers: Mapping[str, str] | None = None) -> Response[dict[str, Any]]:
    headers = dict(headers or {})
    if isinstance(error, RateLimited | ServiceUnavailable):
        headers["Retry-After"] = str(error.retry_after)
    return Response(status_code=http_status(error), content_type=JSON, body=error.as_body(), headers=headers)


def database_unavailable(error: Exception) -> Response[dict[str, Any]]:
    """503 ``service_unavailable`` with ``Retry-After`` for the database out of reach (``kairos.db.unavailable``:
    a restart, a failover, no connection within the pool's wait). Logged by class and SQLSTATE only."""
    logger.warning("database unavailable", extra={"action": "api_database_unavailable", "route": route_key(),
                                                  "error_type": type(error).__name__,
                                                  "sqlstate": getattr(error, "sqlstate", None)})
    return error_response(ServiceUnavailable("the database is unavailable for the moment; try again shortly"))


def log_unexpected(error: Exception) -> None:
    logger.exception("unhandled error", extra={"action": "api_error", "route": route_key(),
                                               "error_type": type(error).__name__})


def translate(errors: Sequence[Mapping[str, Any]]) -> list[FieldError]:
    """Powertools' request errors as FieldErrors: dotted field (``body.``/``query.`` dropped) and the
    rule from ``kairos.errors``' one vocabulary, the same the library's own validation names."""
    stripped: list[dict[str, Any]] = []
    for e in errors:
        loc = [str(part) for part in e.get("loc", ())]
        if loc and loc[0] in ("body", "query", "path", "header"):
            loc = loc[1:]
        stripped.append({**e, "loc": loc})
    return from_pydantic(stripped) or [FieldError("body", INVALID, "the request is not valid")]


@_on(KairosError)
def _on_domain_error(error: KairosError) -> Response[dict[str, Any]]:
    return error_response(error)


@_on(RequestValidationError)
def _on_validation_error(error: RequestValidationError) -> Response[dict[str, Any]]:
    problems = list(error.errors())
    if any(p.get("type") == "json_invalid" for p in problems):
        return error_response(MalformedJson("the body is not valid JSON"))
    return error_response(ValidationFailed(translate(problems)))


@_on(ValidationError)
def _on_model_error(error: ValidationError) -> Response[dict[str, Any]]:
    # Only our own response models raise this inside a route: the response broke its schema.
    logger.error("response broke its model", extra={"action": "api_response_invalid", "route": route_key()})
    return error_response(internal())


@_on(RequestUnsupportedContentType)
def _on_media_type(_: RequestUnsupportedContentType) -> Response[dict[str, Any]]:
    return error_response(UnsupportedMediaType("send the body as application/json"))


@_on(NotFoundError)
def _on_not_found(_: NotFoundError) -> Response[dict[str, Any]]:
    return error_response(NotFound("route"))


@_on(psycopg.OperationalError)
def _on_database_error(error: psycopg.OperationalError) -> Response[dict[str, Any]]:
    if db.unavailable(error):
        raise error  # answered by kairos.api.app.handle: a GET is tried once more, else 503 (database_unavailable)
    log_unexpected(error)
    return error_response(internal())


@_on(Exception)
def _on_unexpected(error: Exception) -> Response[dict[str, Any]]:
    log_unexpected(error)
    return error_response(internal())
