"""The HTTP API: every route of docs/api.md on one Powertools resolver, and ``handle``, its entry point.

``app`` is a ``kairos.api.resolver.Resolver`` that joins the routers of ``kairos.api.routes``
(conversations, schedules, secrets, hooks, runs, corpus, approvals, input requests, loops, usage, status,
console) and of this module (the OpenAPI document) with ``include_router``, and the exception handlers of
``kairos.api.errors``. ``handle(event, context)`` takes one API Gateway HTTP API (payload v2) event
and returns its response:

1. the route is matched against the resolver's route table (``ROUTES``): no path → 404, a path
   under another method → 405 with ``Allow``;
2. every route except the webhook trigger, the OpenAPI document and the console's static files
   needs a principal (``kairos.api.auth``): none → 401, before any validation or database work;
3. bodies of the routes that take one are screened (``kairos.api.bodies``): another media type →
   415, not UTF-8 or not JSON → 400, nesting deeper than 64 levels or text PostgreSQL cannot store → 422;
   a private route that takes none and is not a GET refuses a body → 422 ``no_body``; an integer
   query parameter that is not ASCII digits → 422 naming it (``kairos.api.resolver.screen_integers``);
4. the resolver validates parameters and bodies against ``kairos.api.models`` (``enable_validation``)
   and calls the route, which calls the library with the principal;
5. every error leaves in one shape, ``{"error": {"code", "message", "fields": [...]}}``
   (``kairos.api.errors``), anything unexpected as 500 ``internal`` with no detail (logged).

The database out of reach (``kairos.db.unavailable``: a restart or failover, no connection within the
pool's wait) answers 503 ``service_unavailable`` with ``Retry-After``, well inside API Gateway's
timeout. A GET whose connection failed in use (``kairos.db.lost``) is first tried once more: the pool
has discarded that connection, so the second try runs on a fresh one. Writes are not tried again —
the connection may have failed after the commit — and their caller gets the 503.

Logging: one access line per request with ``action="api_request"``, the route *key* (``POST
/v1/hooks/{token}``, never the raw path), the status and the duration. Paths, path parameters,
headers and bodies are never logged (the webhook token is in the path; bodies carry prompts).

Thread safety: the resolver and the request state (``kairos.api.resolver``) are per thread, so the
local stack and the tests may call ``handle`` from many threads at once; database connections come
from the per-process pool.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import psycopg
from aws_lambda_powertools.event_handler import Response

from kairos import db, runtime
from kairos.api import auth, bodies, errors, models, resolver
from kairos.api.resolver import JSON, Resolver, Routes, RouteSpec
from kairos.api.routes import (
    approvals,
    console,
    conversations,
    corpus,
    hooks,
    input_requests,
    loops,
    runs,
    schedules,
    secrets,
    status,
    usage,
)
from kairos.errors import KairosError, MethodNotAllowed, NotFound
from kairos.observability import logger

# Powertools' own debug lines include route arguments (the webhook token): never let them through.
logging.getLogger("aws_lambda_powertools.event_handler").setLevel(logging.INFO)

docs = Routes()


@docs.endpoint("GET", "/v1/openapi.json", status=200, model=models.OpenApiDocument, errors=(),
               summary="This document", public=True)
def get_openapi() -> Response[dict[str, Any]]:
    return Response(status_code=200, content_type=JSON, body=openapi_document())


app = Resolver(enable_validation=True)
# The order of inclusion is the order of the route table (and of ``Allow``) and of the document's paths.
app.include_router(conversations.router)
app.include_router(schedules.router)
app.include_router(secrets.router)
app.include_router(hooks.router)
app.include_router(runs.router)
app.include_router(corpus.router)
app.include_router(approvals.router)
app.include_router(input_requests.router)
app.include_router(loops.router)
app.include_router(usage.router)
app.include_router(status.router)
app.include_router(console.router)
app.include_router(docs)
app.include_router(errors.router)

ROUTES = app.routes


@lru_cache(maxsize=1)
def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document, generated from the routes and models (built once per process)."""
    from kairos.api import openapi

    return openapi.document(app)


def _method_path(event: Mapping[str, Any]) -> tuple[str, str]:
    context = event.get("requestContext") or {}
    http = context.get("http") or {}
    method = str(http.get("method") or event.get("httpMethod") or "GET").upper()
    path = str(event.get("rawPath") or http.get("path") or "/")
    stage = context.get("stage")
    if stage and stage != "$default" and path.startswith(f"/{stage}/"):
        path = path[len(stage) + 1:]
    return method, path


def _to_lambda(response: Response[dict[str, Any]]) -> dict[str, Any]:
    body = response.body if isinstance(response.body, str) else json.dumps(response.body, separators=(",", ":"))
    headers = {"Content-Type": JSON, **{k: str(v) for k, v in (response.headers or {}).items()}}
    return {"statusCode": response.status_code, "headers": headers, "body": body, "isBase64Encoded": False}


def _unmatched(method: str, path: str, allowed: list[str]) -> dict[str, Any]:
    """Step 1 for a request no route takes: 405 with ``Allow`` when the path has other methods, else 404."""
    if allowed:
        return _to_lambda(errors.error_response(
            MethodNotAllowed(f"{method} is not allowed here; use {', '.join(allowed)}"),
            {"Allow": ", ".join(allowed)}))
    # An empty or many-segment token is just another unknown hook: the same 404, byte for byte.
    raise NotFound("hook" if method == "POST" and path.startswith("/v1/hooks/") else "route")


def _resolve(spec: RouteSpec, event: Mapping[str, Any], context: Any) -> dict[str, Any]:
    """Steps 2-4 of the module doc; a refusal before the resolver raises its ``KairosError``."""
    if not spec.public:
        resolver.authenticate(auth.principal(event, runtime.settings()))
    if spec.has_body:
        bodies.screen(event)
    elif spec.method != "GET" and not spec.public:  # the webhook trigger (public) takes any body
        bodies.refuse(event)
    resolver.screen_integers(spec, event)
    result = app.resolve(dict(event), context)
    if result.get("statusCode") == 204:  # No Content: no body (Powertools would write "null")
        result["body"] = ""
        for headers in (result.get("headers") or {}, result.get("multiValueHeaders") or {}):
            headers.pop("Content-Type", None)
    return result


def _resolve_once_more_if_lost(spec: RouteSpec, event: Mapping[str, Any], context: Any) -> dict[str, Any]:
    """``_resolve``, and a GET whose database connection failed in use once more (see the module doc)."""
    try:
        return _resolve(spec, event, context)
    except psycopg.OperationalError as error:
        if spec.method != "GET" or not db.lost(error):
            raise
        logger.info("database connection lost; the read is tried once more", extra={
            "action": "api_read_retried", "route": spec.key, "error_type": type(error).__name__})
    return _resolve(spec, event, context)


def handle(event: Mapping[str, Any], context: Any = None) -> dict[str, Any]:
    """One HTTP API v2 event in, its response out (see the module doc)."""
    started = time.perf_counter()
    method, path = _method_path(event)
    spec, allowed = app.match(method, path)
    resolver.begin(spec)
    try:
        result = (_unmatched(method, path, allowed) if spec is None
                  else _resolve_once_more_if_lost(spec, event, context))
    except KairosError as error:
        result = _to_lambda(errors.error_response(error))
    except psycopg.OperationalError as error:
        if not db.unavailable(error):
            errors.log_unexpected(error)
            result = _to_lambda(errors.error_response(errors.internal()))
        else:
            result = _to_lambda(errors.database_unavailable(error))
    except Exception as error:  # noqa: BLE001 - outside the resolver (settings, auth): same 500, logged
        errors.log_unexpected(error)
        result = _to_lambda(errors.error_response(errors.internal()))
    finally:
        resolver.authenticate(None)
    status = int(result.get("statusCode", 500))
    logger.info("api request", extra={
        "action": "api_request", "route": resolver.route_key(), "status": status,
        "duration_ms": round((time.perf_counter() - started) * 1000, 2),
    })
    return result
