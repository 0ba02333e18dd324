"""The HTTP API: every route of DESIGN.md "API" on a Powertools ``APIGatewayHttpResolver``.

``handle(event, context)`` takes one API Gateway HTTP API (payload v2) event and returns its response:

1. the route is matched against the route table (``ROUTES``): no path → 404, a path under another
   method → 405 with ``Allow``;
2. every route except the webhook trigger and the OpenAPI document needs a principal
   (``kairos.api.auth``): none → 401, before any validation or database work;
3. bodies of the routes that take one are screened: another media type → 415, not UTF-8 or not JSON
   → 400 ``malformed_json``, arrays and objects nested deeper than 64 levels → 422 ``max_depth``
   (checked before parsing, without recursion; hook bodies too), NUL characters or lone surrogates
   (PostgreSQL cannot store them) → 422 ``invalid_character``;
4. the resolver validates parameters and bodies against ``kairos.api.models`` (``enable_validation``)
   and calls the route, which calls the library with the principal: every query is scoped to it, so
   another principal's object answers the same ``NotFound`` — byte for byte — as a missing one;
5. every error leaves in one shape, ``{"error": {"code", "message", "fields": [...]}}``: domain
   errors through ``kairos.errors.http_status``, Powertools' validation errors translated to
   field/rule, anything unexpected as 500 ``internal`` with no detail (logged with its traceback).

Logging: one access line per request with ``action="api_request"``, the route *key* (``POST
/v1/hooks/{token}``, never the raw path), the status and the duration. Paths, path parameters,
headers and bodies are never logged (the webhook token is in the path; bodies carry prompts).

Must not: hold logic (a route parses, calls one library function inside one transaction and shapes
the answer), echo ids or tokens in errors, or log a path, a header or a body.

Thread safety: Powertools keeps the current event and routing context on the resolver (and the event
on a class attribute). The resolver here keeps them per thread, so the local stack and the tests may
call ``handle`` from many threads at once; database connections come from the per-process pool.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Annotated, Any, TypeVar, cast
from uuid import UUID

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.event_handler.openapi.exceptions import (
    RequestUnsupportedContentType,
    RequestValidationError,
)
from aws_lambda_powertools.event_handler.openapi.params import Body, Query
from aws_lambda_powertools.utilities.data_classes.common import BaseProxyEvent
from pydantic import AwareDatetime, BaseModel, ValidationError

from kairos import conversations, db, runtime, schedules, trace
from kairos.api import auth, models
from kairos.errors import (
    INVALID,
    MAX_DEPTH,
    FieldError,
    KairosError,
    MalformedJson,
    MethodNotAllowed,
    NotFound,
    RateLimited,
    Unauthorized,
    UnsupportedMediaType,
    ValidationFailed,
    from_pydantic,
    http_status,
)
from kairos.observability import logger

# Powertools' own debug lines include route arguments (the webhook token): never let them through.
logging.getLogger("aws_lambda_powertools.event_handler").setLevel(logging.INFO)

JSON = "application/json"
SEQ_MAX = 2_147_483_647  # run_events.seq is an integer column

M = TypeVar("M", bound=BaseModel)


class ThreadLocalResolver(APIGatewayHttpResolver):
    """``APIGatewayHttpResolver`` whose per-request state (event, Lambda context, routing context,
    processed middleware frames) lives in a ``threading.local``: concurrent ``resolve`` calls on
    several threads never see each other's request."""

    def __init__(self, **kwargs: Any) -> None:
        self._local = threading.local()
        super().__init__(**kwargs)

    @property
    def current_event(self) -> Any:
        return self._local.event

    @current_event.setter
    def current_event(self, value: Any) -> None:
        self._local.event = value

    @property
    def lambda_context(self) -> Any:
        return getattr(self._local, "lambda_context", None)

    @lambda_context.setter
    def lambda_context(self, value: Any) -> None:
        self._local.lambda_context = value

    @property
    def context(self) -> dict[str, Any]:
        ctx: dict[str, Any] | None = getattr(self._local, "context", None)
        if ctx is None:
            ctx = self._local.context = {}
        return ctx

    @context.setter
    def context(self, value: dict[str, Any]) -> None:
        self._local.context = value

    @property
    def processed_stack_frames(self) -> list[str]:
        frames: list[str] | None = getattr(self._local, "frames", None)
        if frames is None:
            frames = self._local.frames = []
        return frames

    @processed_stack_frames.setter
    def processed_stack_frames(self, value: list[str]) -> None:
        self._local.frames = value

    def _to_proxy_event(self, event: dict[str, Any]) -> BaseProxyEvent:
        proxy = super()._to_proxy_event(event)
        self._local.event = proxy  # resolve() also sets a class attribute; this instance reads its own
        return proxy

    def resolve(self, event: Mapping[str, Any], context: Any) -> dict[str, Any]:
        self._local.lambda_context = context
        return super().resolve(event, context)


app = ThreadLocalResolver(enable_validation=True)


# ---- the route table ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RouteSpec:
    method: str
    rule: str  # Powertools form: /v1/schedules/<id>
    public: bool
    has_body: bool

    @property
    def path(self) -> str:
        """OpenAPI form: /v1/schedules/{id}."""
        return re.sub(r"<(\w+)>", r"{\1}", self.rule)

    @property
    def key(self) -> str:
        """The route key API Gateway would report (``POST /v1/hooks/{token}``): safe to log."""
        return f"{self.method} {self.path}"

    @property
    def pattern(self) -> re.Pattern[str]:
        return re.compile("^" + re.sub(r"<(\w+)>", r"[^/]+", self.rule) + "$")


ROUTES: list[RouteSpec] = []
_PATTERNS: list[tuple[RouteSpec, re.Pattern[str]]] = []

_ERROR_TEXT = {
    400: "Malformed JSON body", 401: "No principal", 403: "Refused by policy", 404: "Not found",
    405: "Method not allowed", 409: "Conflict with the object's state", 413: "Body too large",
    415: "Unsupported media type", 422: "Validation failed", 429: "Rate limited", 500: "Internal error",
    503: "A service Kairos depends on is unavailable",
}


def _route(method: str, rule: str, *, status: int, model: type[BaseModel], errors: Sequence[int],
           summary: str, public: bool = False, has_body: bool = False,
           ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    spec = RouteSpec(method, rule, public, has_body)
    ROUTES.append(spec)
    _PATTERNS.append((spec, spec.pattern))
    codes = sorted({*errors, 422, 500, *(() if public else (401,))})
    responses: dict[int, Any] = {status: {"description": "OK", "content": {JSON: {"model": model}}}}
    for code in codes:
        responses[code] = {"description": _ERROR_TEXT[code], "content": {JSON: {"model": models.ErrorBody}}}
    return app.route(rule, method, summary=summary, responses=responses, status_code=status,
                     security=None if public else [{"bearer": []}])


def match(method: str, path: str) -> tuple[RouteSpec | None, list[str]]:
    """The route for ``method path``, else None and the methods the path does allow."""
    allowed: list[str] = []
    for spec, pattern in _PATTERNS:
        if pattern.match(path):
            if spec.method == method:
                return spec, []
            allowed.append(spec.method)
    return None, allowed


# ---- per-request state --------------------------------------------------------------------------

_request = threading.local()


def _principal() -> str:
    who: str | None = getattr(_request, "principal", None)
    if not who:
        raise Unauthorized("authentication required: send a valid bearer token")
    return who


def _database() -> db.Database:
    return runtime.database()


def _ok(status: int, model: type[M], payload: Mapping[str, Any], headers: Mapping[str, str] | None = None,
        ) -> Response[dict[str, Any]]:
    """A success response, validated against its model (a mismatch is our bug: 500, logged)."""
    body = model.model_validate(payload).model_dump(mode="json", exclude_unset=True)
    return Response(status_code=status, content_type=JSON, body=body, headers=dict(headers or {}))


def _parse_id(raw: str, kind: str) -> UUID:
    """Ids are UUIDs; anything else names no object and answers the same NotFound as a missing one."""
    try:
        return UUID(raw)
    except ValueError:
        raise NotFound(kind) from None


def _rfc3339(instant: datetime) -> str:
    return instant.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _offset(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    sign = "-" if seconds < 0 else "+"
    seconds = abs(seconds)
    text = f"{sign}{seconds // 3600:02d}:{seconds % 3600 // 60:02d}"
    return text + (f":{seconds % 60:02d}" if seconds % 60 else "")


# ---- conversations ------------------------------------------------------------------------------


def _conversation_json(conversation: conversations.Conversation,
                       entries: Sequence[conversations.Entry]) -> dict[str, Any]:
    return {**conversation.as_json(), "entries": [e.as_json() for e in entries]}


@_route("POST", "/v1/conversations", status=201, model=models.ConversationEnvelope, errors=(400, 415),
        summary="Create a conversation with an agent", has_body=True)
def create_conversation(
    body: Annotated[dict[str, Any], Body(description="ConversationCreate")],
) -> Response[dict[str, Any]]:
    # The body is judged whole by the library (undeclared fields, the title and every agent problem in
    # one answer); the OpenAPI document describes it from models.ConversationCreate.
    owner = _principal()

    def create(conn: Any) -> Response[dict[str, Any]]:
        conversation = conversations.create_from_body(conn, owner=owner, raw=body)
        entries = conversations.entries(conn, conversation.id)
        return _ok(201, models.ConversationEnvelope, {"conversation": _conversation_json(conversation, entries)})

    with _database().transaction() as conn:
        return _idempotent(conn, owner, create)


@_route("GET", "/v1/conversations/<id>", status=200, model=models.ConversationEnvelope, errors=(404,),
        summary="A conversation with its transcript")
def get_conversation(id: str) -> Response[dict[str, Any]]:
    owner = _principal()
    conversation_id = _parse_id(id, "conversation")
    with _database().transaction() as conn:
        conversation = conversations.get(conn, conversation_id, owner=owner)
        entries = conversations.entries(conn, conversation.id)
    return _ok(200, models.ConversationEnvelope, {"conversation": _conversation_json(conversation, entries)})


@_route("GET", "/v1/conversations/<id>/inbox", status=200, model=models.Inbox, errors=(404,),
        summary="The conversation's inbox notes, newest first")
def get_inbox(id: str) -> Response[dict[str, Any]]:
    owner = _principal()
    conversation_id = _parse_id(id, "conversation")
    with _database().transaction() as conn:
        notes = conversations.inbox(conn, conversation_id, owner=owner)
    return _ok(200, models.Inbox, {"notes": [n.as_json() for n in notes]})


# ---- idempotent creates -------------------------------------------------------------------------


def _idempotent(conn: Any, owner: str, create: Callable[[Any], Response[dict[str, Any]]]) -> Response[dict[str, Any]]:
    """``create(conn)`` at most once per owner and ``Idempotency-Key`` in 24 h (``kairos.idempotency``):
    a retry with the same body answers the first response again, another body 422. No key: a plain create."""
    from kairos import idempotency

    raw = app.current_event.raw_event
    headers = {str(k).lower(): str(v) for k, v in (raw.get("headers") or {}).items()}
    key = idempotency.check_key("Idempotency-Key", headers.get("idempotency-key"))
    if key is None:
        return create(conn)
    body = _raw_body(raw)
    claim = idempotency.begin(conn, owner=owner, key=key, route=_route_key(),
                              body=json.loads(body) if body else None)
    if isinstance(claim, idempotency.Replay):
        return Response(status_code=claim.status, content_type=JSON, body=claim.body,
                        headers={"Idempotent-Replayed": "true"})
    response = create(conn)
    idempotency.remember(conn, claim, status=response.status_code, body=response.body)
    return response


# ---- schedules ----------------------------------------------------------------------------------


def _webhook(token: str) -> dict[str, str]:
    """The URL to paste into GitHub or Stripe: ``KAIROS_PUBLIC_URL`` when set (a custom domain), else
    the host this request came to — API Gateway's own domain, which the template cannot pass to its
    function without a dependency cycle."""
    from kairos import webhooks

    base = runtime.settings().public_url
    if base is None:
        domain = (app.current_event.raw_event.get("requestContext") or {}).get("domainName") or "localhost"
        base = f"https://{domain}"
    return {"url": webhooks.webhook_url(base, token), "token": token}


@_route("POST", "/v1/schedules", status=201, model=models.ScheduleCreated, errors=(400, 403, 404, 415),
        summary="Create a schedule (the webhook URL and token are returned once, for kind: webhook)",
        has_body=True)
def create_schedule(body: Annotated[dict[str, Any], Body(description="ScheduleRequest")]) -> Response[dict[str, Any]]:
    owner = _principal()

    def create(conn: Any) -> Response[dict[str, Any]]:
        created = schedules.create(conn, owner=owner, raw=body)
        payload: dict[str, Any] = {"schedule": created.schedule.as_json()}
        if created.token is not None:
            payload["webhook"] = _webhook(created.token)
        return _ok(201, models.ScheduleCreated, payload)

    with _database().transaction() as conn:
        return _idempotent(conn, owner, create)


@_route("GET", "/v1/schedules", status=200, model=models.ScheduleList, errors=(),
        summary="The caller's schedules that are not cancelled, oldest first")
def list_schedules(conversation_id: Annotated[UUID | None, Query()] = None) -> Response[dict[str, Any]]:
    owner = _principal()
    with _database().transaction() as conn:
        found = schedules.list_for(conn, owner=owner, conversation_id=conversation_id)
    return _ok(200, models.ScheduleList, {"schedules": [s.as_json() for s in found]})


@_route("GET", "/v1/schedules/<id>", status=200, model=models.ScheduleEnvelope, errors=(404,),
        summary="One schedule")
def get_schedule(id: str) -> Response[dict[str, Any]]:
    owner = _principal()
    schedule_id = _parse_id(id, "schedule")
    with _database().transaction() as conn:
        schedule = schedules.get(conn, schedule_id, owner=owner)
    return _ok(200, models.ScheduleEnvelope, {"schedule": schedule.as_json()})


@_route("GET", "/v1/schedules/<id>/preview", status=200, model=models.FireList, errors=(404,),
        summary="The next fires strictly after `after` (default: now), with local time, offset and fold")
def preview_schedule(
    id: str,
    count: Annotated[int, Query(ge=1, le=schedules.PREVIEW_MAX)] = 10,
    after: Annotated[AwareDatetime | None, Query(description="RFC 3339 instant with offset")] = None,
) -> Response[dict[str, Any]]:
    owner = _principal()
    schedule_id = _parse_id(id, "schedule")
    with _database().transaction() as conn:
        fires = schedules.preview_owned(conn, schedule_id, owner=owner, after=after, count=count)
    return _ok(200, models.FireList, {"fires": [
        {"fire_at": _rfc3339(f.fire_at), "local_time": f.local_time.isoformat(),
         "utc_offset": _offset(f.utc_offset), "fold": f.fold}
        for f in fires
    ]})


@_route("POST", "/v1/schedules/<id>/pause", status=200, model=models.ScheduleEnvelope, errors=(404, 409),
        summary="Pause a schedule")
def pause_schedule(id: str) -> Response[dict[str, Any]]:
    owner = _principal()
    schedule_id = _parse_id(id, "schedule")
    with _database().transaction() as conn:
        schedule = schedules.pause(conn, schedule_id, owner=owner)
    return _ok(200, models.ScheduleEnvelope, {"schedule": schedule.as_json()})


@_route("POST", "/v1/schedules/<id>/resume", status=200, model=models.ScheduleEnvelope, errors=(404, 409),
        summary="Resume a paused schedule (clears failures, computes the next fire)")
def resume_schedule(id: str) -> Response[dict[str, Any]]:
    owner = _principal()
    schedule_id = _parse_id(id, "schedule")
    with _database().transaction() as conn:
        schedule = schedules.resume(conn, schedule_id, owner=owner)
    return _ok(200, models.ScheduleEnvelope, {"schedule": schedule.as_json()})


@_route("DELETE", "/v1/schedules/<id>", status=200, model=models.ScheduleEnvelope, errors=(404, 409),
        summary="Cancel a schedule")
def cancel_schedule(id: str) -> Response[dict[str, Any]]:
    owner = _principal()
    schedule_id = _parse_id(id, "schedule")
    with _database().transaction() as conn:
        schedule = schedules.cancel(conn, schedule_id, owner=owner)
    return _ok(200, models.ScheduleEnvelope, {"schedule": schedule.as_json()})


@_route("POST", "/v1/schedules/<id>/token", status=200, model=models.TokenRotated, errors=(400, 404, 409, 415),
        summary="Rotate a webhook token; the previous one stays valid for overlap_seconds", has_body=True)
def rotate_token(
    id: str,
    body: Annotated[models.TokenRotate | None, Body()] = None,
) -> Response[dict[str, Any]]:
    from kairos import webhooks

    owner = _principal()
    schedule_id = _parse_id(id, "schedule")
    overlap = (body or models.TokenRotate()).overlap_seconds
    with _database().transaction() as conn:
        rotated = webhooks.rotate(conn, schedule_id, owner=owner, overlap_seconds=overlap)
    return _ok(200, models.TokenRotated, {"schedule": rotated.schedule.as_json(), "webhook": _webhook(rotated.token)})


# ---- owners' secrets ----------------------------------------------------------------------------
# Values go to Secrets Manager under the caller's namespace and never come back; ``kairos.secrets``
# (and boto3) is imported only by these routes.


@_route("PUT", "/v1/secrets/<name>", status=200, model=models.SecretEnvelope, errors=(400, 415, 503),
        summary="Store or replace one of your keys; answers the reference to give as api_key_secret",
        has_body=True)
def put_secret(name: str, body: Annotated[models.SecretPut, Body()]) -> Response[dict[str, Any]]:
    from kairos import secrets

    stored, _ = secrets.store(_principal(), name, body.value)
    return _ok(200, models.SecretEnvelope, {"secret": stored.as_json()})


@_route("GET", "/v1/secrets", status=200, model=models.SecretList, errors=(503,),
        summary="Your keys' names and references (never their values)")
def list_secrets() -> Response[dict[str, Any]]:
    from kairos import secrets

    return _ok(200, models.SecretList, {"secrets": [s.as_json() for s in secrets.list_owned(_principal())]})


@_route("DELETE", "/v1/secrets/<name>", status=204, model=models.Empty, errors=(404, 503),
        summary="Delete one of your keys at once (runs that name it then fail secret_unavailable)")
def delete_secret(name: str) -> Response[None]:
    from kairos import secrets

    secrets.delete(_principal(), name)
    return Response(status_code=204, content_type=JSON, body=None)


# ---- webhooks -----------------------------------------------------------------------------------
# ``kairos.webhooks`` (with the calendar, the trace and the identities it needs) is imported by the
# routes that use it, like ``kairos.runs`` below: listing or reading schedules never loads them.


def _handoff(database: db.Database, run_ids: list[UUID]) -> object:
    """Sends committed run ids to SQS and stamps ``handoff_at`` (``kairos.handoff``, shared with the tick)."""
    from kairos import handoff

    settings = runtime.settings()
    if not settings.run_queue_url:
        logger.warning("no run queue configured", extra={"action": "webhook_handoff_skipped"})
        return None
    return handoff.send(database, runtime.sqs(), settings.run_queue_url, run_ids)


@_route("POST", "/v1/hooks/<token>", status=202, model=models.HookAccepted, errors=(401, 404, 413, 429, 503),
        summary="Trigger a webhook schedule (no bearer; the token is the credential)", public=True)
def post_hook(token: str) -> Response[dict[str, Any]]:
    from kairos import webhooks

    event = app.current_event
    body = _raw_body(event.raw_event)
    if len(body) <= webhooks.MAX_BODY_BYTES:  # a larger body answers 413 from the library
        _check_depth(body.decode("utf-8", errors="replace"))
    delivery = webhooks.Delivery(token=token, body=body,
                                 headers={k.lower(): v for k, v in (event.headers or {}).items()})
    accepted = webhooks.receive(_database(), delivery, handoff=_handoff)
    return _ok(202, models.HookAccepted, accepted.as_json())


def _raw_body(event: Mapping[str, Any]) -> bytes:
    body = event.get("body")
    if not body:
        return b""
    if event.get("isBase64Encoded"):
        try:
            return base64.b64decode(body)
        except ValueError:
            raise MalformedJson("the body is not valid base64") from None
    return str(body).encode("utf-8", errors="surrogatepass")


# ---- runs ---------------------------------------------------------------------------------------
# ``kairos.runs`` (with the executors' types, effects and the trace) is imported by these routes when
# they are first called: a container that serves only schedules, conversations or webhooks never loads it.


@_route("GET", "/v1/runs/<id>", status=200, model=models.RunEnvelope, errors=(404,), summary="One run")
def get_run(id: str) -> Response[dict[str, Any]]:
    from kairos import runs

    owner = _principal()
    run_id = _parse_id(id, "run")
    with _database().transaction() as conn:
        run = runs.get(conn, run_id, owner=owner)
    return _ok(200, models.RunEnvelope, {"run": run.as_json()})


@_route("GET", "/v1/runs/<id>/events", status=200, model=models.EventPage, errors=(404,),
        summary="The run's trace after a sequence number (step.progress folded into its step)")
def get_run_events(
    id: str,
    after: Annotated[int, Query(ge=0, le=SEQ_MAX)] = 0,
    limit: Annotated[int, Query(ge=1, le=SEQ_MAX, description=f"capped at {trace.MAX_PAGE}")] = 100,
) -> Response[dict[str, Any]]:
    from kairos import runs

    owner = _principal()
    run_id = _parse_id(id, "run")
    with _database().transaction() as conn:
        runs.get(conn, run_id, owner=owner)  # ownership first: the trace has no owner column
        events, next_after = trace.page(conn, run_id, after=after, limit=limit)
    return _ok(200, models.EventPage, {"events": [_jsonable(e) for e in events], "next_after": next_after})


@_route("GET", "/v1/runs/<id>/output", status=200, model=models.OutputEnvelope, errors=(404,),
        summary="The run's output projection: available, empty (with why) or unavailable")
def get_run_output(id: str) -> Response[dict[str, Any]]:
    from kairos import runs

    owner = _principal()
    run_id = _parse_id(id, "run")
    with _database().transaction() as conn:
        output = runs.output(conn, run_id, owner=owner)
    return _ok(200, models.OutputEnvelope, {"output": _jsonable(output)})


@_route("POST", "/v1/runs/<id>/cancel", status=200, model=models.RunEnvelope, errors=(404, 409),
        summary="Cancel a run (queued: at once; running: at its next heartbeat or step)")
def cancel_run(id: str) -> Response[dict[str, Any]]:
    from kairos import runs

    owner = _principal()
    run_id = _parse_id(id, "run")
    with _database().transaction() as conn:
        run = runs.cancel(conn, run_id, owner=owner)
    return _ok(200, models.RunEnvelope, {"run": run.as_json()})


def _jsonable(value: Any) -> Any:
    """Library read models as JSON: dataclasses through ``as_json()``, datetimes as RFC 3339 UTC."""
    if hasattr(value, "as_json"):
        return value.as_json()
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return _rfc3339(value) if value.tzinfo else value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    return value


# ---- the OpenAPI document -----------------------------------------------------------------------


@_route("GET", "/v1/openapi.json", status=200, model=models.OpenApiDocument, errors=(),
        summary="This document", public=True)
def get_openapi() -> Response[dict[str, Any]]:
    return Response(status_code=200, content_type=JSON, body=openapi_document())


@lru_cache(maxsize=1)
def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document, generated from the routes and models above (built once per process)."""
    from kairos.api import openapi

    return openapi.document(app)


# ---- errors -------------------------------------------------------------------------------------


F = TypeVar("F", bound=Callable[..., Any])


def _on(exc: type[Exception]) -> Callable[[F], F]:
    """``app.exception_handler`` with its type kept (Powertools' decorator is untyped)."""
    return cast("Callable[[F], F]", app.exception_handler(exc))


def error_response(error: KairosError, headers: Mapping[str, str] | None = None) -> Response[dict[str, Any]]:
    headers = dict(headers or {})
    if isinstance(error, RateLimited):
        headers["Retry-After"] = str(error.retry_after)
    return Response(status_code=http_status(error), content_type=JSON, body=error.as_body(), headers=headers)


@_on(KairosError)
def _on_domain_error(error: KairosError) -> Response[dict[str, Any]]:
    return error_response(error)


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


@_on(RequestValidationError)
def _on_validation_error(error: RequestValidationError) -> Response[dict[str, Any]]:
    problems = list(error.errors())
    if any(p.get("type") == "json_invalid" for p in problems):
        return error_response(MalformedJson("the body is not valid JSON"))
    return error_response(ValidationFailed(translate(problems)))


@_on(ValidationError)
def _on_model_error(error: ValidationError) -> Response[dict[str, Any]]:
    # Only our own response models raise this inside a route: the response broke its schema.
    logger.error("response broke its model", extra={"action": "api_response_invalid", "route": _route_key()})
    return error_response(_Internal())


@_on(RequestUnsupportedContentType)
def _on_media_type(_: RequestUnsupportedContentType) -> Response[dict[str, Any]]:
    return error_response(UnsupportedMediaType("send the body as application/json"))


@_on(NotFoundError)
def _on_not_found(_: NotFoundError) -> Response[dict[str, Any]]:
    return error_response(NotFound("route"))


class _Internal(KairosError):
    code = "internal"

    def __init__(self) -> None:
        super().__init__("internal error")


@_on(Exception)
def _on_unexpected(error: Exception) -> Response[dict[str, Any]]:
    logger.exception("unhandled error", extra={"action": "api_error", "route": _route_key(),
                                               "error_type": type(error).__name__})
    return error_response(_Internal())


# ---- the entry point ----------------------------------------------------------------------------


def _route_key() -> str:
    return getattr(_request, "route_key", "$default")


def _method_path(event: Mapping[str, Any]) -> tuple[str, str]:
    context = event.get("requestContext") or {}
    http = context.get("http") or {}
    method = str(http.get("method") or event.get("httpMethod") or "GET").upper()
    path = str(event.get("rawPath") or http.get("path") or "/")
    stage = context.get("stage")
    if stage and stage != "$default" and path.startswith(f"/{stage}/"):
        path = path[len(stage) + 1:]
    return method, path


def _screen_body(event: Mapping[str, Any]) -> None:
    """JSON only (else 415), parseable (else 400), storable by PostgreSQL (else 422), before validation."""
    headers = {str(k).lower(): str(v) for k, v in (event.get("headers") or {}).items()}
    media_type = headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type and media_type != JSON and not media_type.endswith("+json"):
        raise UnsupportedMediaType("send the body as application/json")
    raw = event.get("body")
    if not raw:
        return
    try:
        text = base64.b64decode(raw).decode("utf-8") if event.get("isBase64Encoded") else str(raw)
    except ValueError:
        raise MalformedJson("the body is not valid JSON") from None
    _check_depth(text)
    try:
        value = json.loads(text)
    except ValueError:
        raise MalformedJson("the body is not valid JSON") from None
    bad = _unstorable(value, "")
    if bad is not None:
        raise ValidationFailed([FieldError(bad or "body", "invalid_character",
                                           "text must not contain NUL characters or unpaired surrogates")])


# Deeper JSON is refused before it is parsed: every reader after the parser (this screen, pydantic,
# psycopg's JSON dump) recurses, and ~1,000 levels exhaust Python's stack (a RecursionError was a 500).
MAX_JSON_DEPTH = 64
_JSON_STRUCTURE = re.compile(r'[\[\]{}"\\]')


def _check_depth(text: str) -> None:
    """``ValidationFailed`` (``body`` / ``max_depth``) when arrays and objects nest deeper than
    ``MAX_JSON_DEPTH``. One pass over the structural characters, no recursion, strings skipped."""
    depth = 0
    in_string = False
    skip_to = -1
    for token in _JSON_STRUCTURE.finditer(text):
        at = token.start()
        if at < skip_to:
            continue
        char = token.group()
        if in_string:
            if char == "\\":
                skip_to = at + 2  # the escaped character
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise ValidationFailed([FieldError("body", MAX_DEPTH, f"arrays and objects may nest at most "
                                                                       f"{MAX_JSON_DEPTH} levels deep")])
        elif char in "]}":
            depth -= 1


def _unstorable(value: Any, path: str) -> str | None:
    """The dotted path of the first string PostgreSQL cannot store (NUL, lone surrogate), or None."""
    if isinstance(value, str):
        return path if ("\x00" in value or _has_surrogate(value)) else None
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if "\x00" in key or _has_surrogate(key):
                return where
            found = _unstorable(item, where)
            if found is not None:
                return found
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = _unstorable(item, f"{path}.{i}" if path else str(i))
            if found is not None:
                return found
    return None


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _to_lambda(response: Response[dict[str, Any]]) -> dict[str, Any]:
    body = response.body if isinstance(response.body, str) else json.dumps(response.body, separators=(",", ":"))
    headers = {"Content-Type": JSON, **{k: str(v) for k, v in (response.headers or {}).items()}}
    return {"statusCode": response.status_code, "headers": headers, "body": body, "isBase64Encoded": False}


def handle(event: Mapping[str, Any], context: Any = None) -> dict[str, Any]:
    """One HTTP API v2 event in, its response out (see the module doc)."""
    started = time.perf_counter()
    method, path = _method_path(event)
    spec, allowed = match(method, path)
    _request.route_key = spec.key if spec else "$default"
    _request.principal = None
    try:
        if spec is None and allowed:
            result = _to_lambda(error_response(
                MethodNotAllowed(f"{method} is not allowed here; use {', '.join(allowed)}"),
                {"Allow": ", ".join(allowed)}))
        elif spec is None:
            # An empty or many-segment token is just another unknown hook: the same 404, byte for byte.
            raise NotFound("hook" if method == "POST" and path.startswith("/v1/hooks/") else "route")
        else:
            if not spec.public:
                _request.principal = auth.principal(event, runtime.settings())
            if spec.has_body:
                _screen_body(event)
            result = app.resolve(dict(event), context)
            if result.get("statusCode") == 204:  # No Content: no body (Powertools would write "null")
                result["body"] = ""
                for headers in (result.get("headers") or {}, result.get("multiValueHeaders") or {}):
                    headers.pop("Content-Type", None)
    except KairosError as error:
        result = _to_lambda(error_response(error))
    except Exception as error:  # noqa: BLE001 - outside the resolver (settings, auth): same 500, logged
        logger.exception("unhandled error", extra={"action": "api_error", "route": _route_key(),
                                                   "error_type": type(error).__name__})
        result = _to_lambda(error_response(_Internal()))
    finally:
        _request.principal = None
    status = int(result.get("statusCode", 500))
    logger.info("api request", extra={
        "action": "api_request", "route": _request.route_key, "status": status,
        "duration_ms": round((time.perf_counter() - started) * 1000, 2),
    })
    return result
