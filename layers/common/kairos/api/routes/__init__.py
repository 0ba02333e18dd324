"""The API's routes, one Powertools router per resource, and what every route shares.

``conversations``, ``schedules``, ``secrets``, ``hooks`` and ``runs`` each hold a ``router``
(``kairos.api.resolver.Routes``) that ``kairos.api.app`` joins with ``include_router``. A route takes
its caller from ``kairos.api.resolver.principal()``, parses its ids (``parse_id``), calls one library
function inside one transaction with that principal — every query is scoped to it, so another
principal's object answers the same ``NotFound``, byte for byte, as a missing one — and shapes the
answer with ``ok`` (validated against its response model in ``kairos.api.models``). Creates go
through ``idempotent`` (``Idempotency-Key``, ``kairos.idempotency``).

Every route's library imports sit at the module's top: importing ``kairos.api.app`` loads the whole
request path, and the deployed ApiFunction's before-snapshot step loads the one lazy module
(``kairos.api.openapi``), so a restored copy imports nothing on its first request
(``tests/unit/test_api_imports.py``).

Must not: hold a domain rule, echo an id or a token in an error, or log a path, a header or a body.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Annotated, Any, TypeVar
from uuid import UUID

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Query
from pydantic import BaseModel

from kairos import db, handoff, idempotency, pages, runtime
from kairos.api.resolver import JSON, route_key
from kairos.errors import NotFound
from kairos.instants import rfc3339
from kairos.observability import logger

M = TypeVar("M", bound=BaseModel)

# The two query parameters of every keyset list (kairos.pages): the cursor and the page size.
BEFORE = Annotated[str | None, Query(description="next_before of the previous page; omit for the first")]
LIMIT = Annotated[int, Query(ge=1, le=pages.LIMIT_MAX, description="rows a page")]


def database() -> db.Database:
    return runtime.database()


def ok(status: int, model: type[M], payload: Mapping[str, Any], headers: Mapping[str, str] | None = None,
       ) -> Response[dict[str, Any]]:
    """A success response, validated against its model (a mismatch is our bug: 500, logged)."""
    body = model.model_validate(payload).model_dump(mode="json", exclude_unset=True)
    return Response(status_code=status, content_type=JSON, body=body, headers=dict(headers or {}))


def handoff_committed(database: db.Database, run_ids: list[UUID], *, delay_seconds: int = 0,
                      ended: list[UUID] | None = None) -> object:
    """Sends committed run ids to SQS (``delay_seconds`` later: a held webhook run's timer) and stamps
    ``handoff_at`` (``kairos.handoff``, shared with the tick); raises what SQS raises
    (``kairos.webhooks`` counts that, ``send_committed`` logs it)."""

    settings = runtime.settings()
    if not settings.run_queue_url:
        logger.warning("no run queue configured", extra={"action": "api_handoff_skipped"})
        return None
    return handoff.send(database, runtime.sqs(), settings.run_queue_url, run_ids, delay_seconds=delay_seconds,
                        ended=ended or ())


def send_committed(run_ids: list[UUID], *, ended: list[UUID] | None = None) -> None:
    """``handoff_committed`` after a route's commit: a failure is logged, never answered — the runs
    exist and the tick's repair sends what SQS did not take. ``ended``: runs the route's transaction
    ended (a cancel), whose statements released the next waiting runs into their slots."""
    if not run_ids and not ended:
        return
    try:
        handoff_committed(database(), run_ids, ended=ended)
    except Exception:  # noqa: BLE001 - committed and queued: the repair resends
        logger.exception("handoff failed", extra={"action": "api_handoff_failed",
                                                  "run_ids": [str(r) for r in run_ids]})


def parse_id(raw: str, kind: str) -> UUID:
    """Ids are UUIDs; anything else names no object and answers the same NotFound as a missing one."""
    try:
        return UUID(raw)
    except ValueError:
        raise NotFound(kind) from None


def jsonable(value: Any) -> Any:
    """Library read models as JSON: dataclasses through ``as_json()``, datetimes as RFC 3339 UTC."""
    if hasattr(value, "as_json"):
        return value.as_json()
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime):
        return rfc3339(value) if value.tzinfo else value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    return value


def etag(revision: int) -> dict[str, str]:
    """A schedule's (or loop's) revision as a strong ETag: what ``PATCH`` takes back in ``If-Match``."""
    return {"ETag": f'"{revision}"'}


def header(event: Mapping[str, Any], name: str) -> str | None:
    """One request header of a v2 event (names are case-insensitive), or None."""
    wanted = name.lower()
    for key, value in (event.get("headers") or {}).items():
        if str(key).lower() == wanted:
            return str(value)
    return None


def idempotent(conn: Any, owner: str, event: Mapping[str, Any], body: Any,
               create: Callable[[Any], Response[dict[str, Any]]]) -> Response[dict[str, Any]]:
    """``create(conn)`` at most once per owner and ``Idempotency-Key`` in 24 h (``kairos.idempotency``):
    a retry with the same body (the route's parsed body) answers the first response again, another
    body 422. No key: a plain create."""

    key = idempotency.check_key("Idempotency-Key", header(event, "Idempotency-Key"))
    if key is None:
        return create(conn)
    claim = idempotency.begin(conn, owner=owner, key=key, route=route_key(), body=body)
    if isinstance(claim, idempotency.Replay):
        return Response(status_code=claim.status, content_type=JSON, body=claim.body,
                        headers={"Idempotent-Replayed": "true"})
    response = create(conn)
    idempotency.remember(conn, claim, status=response.status_code, body=response.body)
    return response
