"""The API's resolver, its routers and the route table it matches before Powertools does.

``Resolver`` is Powertools' ``APIGatewayHttpResolver`` with its per-request state (event, Lambda
context, routing context, processed middleware frames) kept per thread, so the local stack and the
tests may resolve requests on many threads at once.

``Routes`` is a Powertools ``Router`` (the "split routes" pattern: one router per resource in
``kairos.api.routes``, joined with ``include_router``) whose ``endpoint`` decorator also records a
``RouteSpec`` and builds the route's OpenAPI responses (its success model, the one error shape for
every status it may answer, the bearer scheme unless the route is public). ``include_router`` appends
a router's specs to the resolver's table, ``routes``, in the order the routers are included.

That table is matched by ``handle`` before Powertools sees the request (``Resolver.match``): it is
what answers 405 with ``Allow`` (Powertools would say 404) and what lets a private route answer 401
before any validation or database work. A spec also names the route's integer query parameters
(``integers``), which ``screen_integers`` holds to ASCII digits before Powertools parses them: pydantic
would also read ``+10``, `` 10``, ``1_0`` and ``10.0`` as 10 (and Python's ``int()`` reads any Unicode
digits, a fullwidth ``10`` too). ``principal()`` and ``route_key()`` are the request's caller
and its route key, set by ``handle`` for the thread serving the request.

Must not: read a body, talk to the database or decide what a principal may see.
"""

from __future__ import annotations

import re
import threading
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Union, get_args, get_origin, get_type_hints

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Query
from aws_lambda_powertools.utilities.data_classes.common import BaseProxyEvent
from pydantic import BaseModel

from kairos.api import models
from kairos.errors import TYPE, FieldError, Unauthorized, ValidationFailed

JSON = "application/json"

_ERROR_TEXT = {
    400: "Malformed JSON body", 401: "No principal", 403: "Refused by policy", 404: "Not found",
    405: "Method not allowed", 409: "Conflict with the object's state",
    412: "If-Match names another revision", 413: "Body too large",
    415: "Unsupported media type", 422: "Validation failed", 429: "Rate limited", 500: "Internal error",
    503: "A service Kairos depends on is unavailable",
}


@dataclass(frozen=True)
class RouteSpec:
    method: str
    rule: str  # Powertools form: /v1/schedules/<id>
    public: bool
    has_body: bool
    page: bool = False  # a static page (the console): in the route table, not in the OpenAPI document
    integers: tuple[str, ...] = ()  # its integer query parameters, as the query names them

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


class Routes(Router):
    """A Powertools ``Router`` that records each route's ``RouteSpec`` (see the module doc)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # Powertools' Router.__init__ is unannotated
        self.specs: list[RouteSpec] = []

    def endpoint(self, method: str, rule: str, *, status: int, model: type[BaseModel], errors: Sequence[int],
                 summary: str, public: bool = False, has_body: bool = False,
                 ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """``route`` with the OpenAPI responses built: ``status`` answers ``model``; 422, 500, 503 (the
        database out of reach: ``kairos.api.app``), 401 (unless ``public``) and every code in ``errors``
        answer ``ErrorBody``."""
        codes = sorted({*errors, 422, 500, 503, *(() if public else (401,))})
        responses: dict[int, Any] = {status: {"description": "OK", "content": {JSON: {"model": model}}}}
        for code in codes:
            responses[code] = {"description": _ERROR_TEXT[code], "content": {JSON: {"model": models.ErrorBody}}}
        route: Callable[[Callable[..., Any]], Callable[..., Any]] = self.route(
            rule, method, summary=summary, responses=responses, status_code=status,
            security=None if public else [{"bearer": []}])

        def register(handler: Callable[..., Any]) -> Callable[..., Any]:
            self.specs.append(RouteSpec(method, rule, public, has_body, integers=integer_queries(handler)))
            return route(handler)

        return register


    def page(self, rule: str, *, summary: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """A public ``GET`` route that answers a static file, not JSON (the console): in the route table
        (so the template wires it) but not in the OpenAPI document, which describes the JSON API."""
        self.specs.append(RouteSpec("GET", rule, public=True, has_body=False, page=True))
        route: Callable[[Callable[..., Any]], Callable[..., Any]] = self.route(
            rule, "GET", summary=summary, include_in_schema=False)
        return route


def integer_queries(handler: Callable[..., Any]) -> tuple[str, ...]:
    """The names (aliases when given) of ``handler``'s integer query parameters: ``Annotated[int, Query(…)]``
    (or ``int | None``)."""
    names: list[str] = []
    for name, hint in get_type_hints(handler, include_extras=True).items():
        if get_origin(hint) is not Annotated:
            continue
        base, *metadata = get_args(hint)
        bases = get_args(base) if get_origin(base) in (Union, types.UnionType) else (base,)
        query = next((m for m in metadata if isinstance(m, Query)), None)
        if query is not None and int in bases:
            names.append(query.alias or name)
    return tuple(names)


_ASCII_INTEGER = re.compile(r"-?[0-9]+")  # a minus too: a negative one is then named by its bound


def screen_integers(spec: RouteSpec, event: Mapping[str, Any]) -> None:
    """``ValidationFailed`` naming each integer query parameter of ``spec`` that is not ASCII digits."""
    query = event.get("queryStringParameters") or {}
    problems = [FieldError(name, TYPE, "give a whole number in ASCII digits (0-9)") for name in spec.integers
                if isinstance(query.get(name), str) and not _ASCII_INTEGER.fullmatch(query[name])]
    if problems:
        raise ValidationFailed(problems)


class Resolver(APIGatewayHttpResolver):
    """``APIGatewayHttpResolver`` whose per-request state lives in a ``threading.local`` (concurrent
    ``resolve`` calls on several threads never see each other's request) and which keeps the table of
    its routers' ``RouteSpec``s."""

    def __init__(self, **kwargs: Any) -> None:
        self._local = threading.local()
        self.routes: list[RouteSpec] = []
        self._patterns: list[tuple[RouteSpec, re.Pattern[str]]] = []
        super().__init__(**kwargs)

    def include_router(self, router: Router, prefix: str | None = None) -> None:
        if isinstance(router, Routes):
            if prefix is not None:
                raise ValueError("Routes carry their full paths: the table would not match a prefixed route")
            self.routes.extend(router.specs)
            self._patterns.extend((spec, spec.pattern) for spec in router.specs)
        super().include_router(router, prefix)

    def match(self, method: str, path: str) -> tuple[RouteSpec | None, list[str]]:
        """The route for ``method path``, else None and the methods the path does allow."""
        allowed: list[str] = []
        for spec, pattern in self._patterns:
            if pattern.match(path):
                if spec.method == method:
                    return spec, []
                allowed.append(spec.method)
        return None, allowed

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


# ---- per-request state --------------------------------------------------------------------------

_request = threading.local()


def begin(spec: RouteSpec | None) -> None:
    """A request starts on this thread: its route key (``$default`` when no route matched), no principal."""
    _request.route_key = spec.key if spec else "$default"
    _request.principal = None


def authenticate(who: str | None) -> None:
    """The request's principal (``kairos.api.auth``), or None once the request is answered."""
    _request.principal = who


def principal() -> str:
    """The caller of the request this thread serves, or ``Unauthorized``."""
    who: str | None = getattr(_request, "principal", None)
    if not who:
        raise Unauthorized("authentication required: send a valid bearer token")
    return who


def route_key() -> str:
    """The route key of the request this thread serves (``$default`` outside a matched route)."""
    return getattr(_request, "route_key", "$default")
