"""Goal loops: create one (the only recurring agent loop), read it, edit its goal (``kairos.schedules.loops``).

A loop is a schedule: every answer is ``{"schedule": {...}}`` with ``loop: true``, its safe ``goal``
and its ``last_run``, the same shape ``GET /v1/schedules/{id}`` shows it in, so pause, resume (also out
of ``draft``) and ``DELETE`` are the schedule routes'. ``POST /v1/loops`` reads its body raw, so a field
that would loosen a loop's fixed policies is refused naming it (rule ``loop_policy``); the OpenAPI
document describes ``models.LoopCreate``. Another owner's loop, or a schedule that is not a loop,
answers the same 404 as a missing one.
"""

from __future__ import annotations

from typing import Annotated, Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body

from kairos.api import models
from kairos.api.resolver import Routes, principal
from kairos.api.routes import database, etag, header, idempotent, ok, parse_id
from kairos.schedules import edit, last_run, loops

router = Routes()


@router.endpoint("POST", "/v1/loops", status=201, model=models.ScheduleEnvelope, errors=(400, 403, 404, 415),
                 summary="Create a goal loop: a goal, a rule, an end and a count; catch-up off, overlap skip, "
                         "no backfill; active at once", has_body=True)
def create_loop(body: Annotated[dict[str, Any], Body(description="LoopCreate")]) -> Response[dict[str, Any]]:

    owner = principal()

    def create(conn: Any) -> Response[dict[str, Any]]:
        loop = loops.create(conn, owner=owner, raw=body)
        return ok(201, models.ScheduleEnvelope, {"schedule": last_run.one(conn, loop, owner=owner)},
                  headers=etag(loop.revision))

    with database().transaction() as conn:
        return idempotent(conn, owner, router.current_event.raw_event, body, create)


@router.endpoint("GET", "/v1/loops/<id>", status=200, model=models.ScheduleEnvelope, errors=(404,),
                 summary="One goal loop (its safe goal, status, next fire and last run)")
def get_loop(id: str) -> Response[dict[str, Any]]:

    owner = principal()
    loop_id = parse_id(id, "loop")
    with database().transaction() as conn:
        loop = loops.get(conn, loop_id, owner=owner)
        shown = last_run.one(conn, loop, owner=owner)
    return ok(200, models.ScheduleEnvelope, {"schedule": shown}, headers=etag(loop.revision))


@router.endpoint("PATCH", "/v1/loops/<id>", status=200, model=models.ScheduleEnvelope,
                 errors=(400, 404, 409, 412, 415), has_body=True,
                 summary="Edit a loop under a new revision; a new goal puts it in draft until /resume "
                         "(If-Match: the revision read)")
def edit_loop(id: str, body: Annotated[dict[str, Any], Body(description="LoopCreate fields to change "
                                                             "(not conversation_id); null resets one")],
              ) -> Response[dict[str, Any]]:

    owner = principal()
    loop_id = parse_id(id, "loop")
    if_match = edit.parse_if_match(header(router.current_event.raw_event, "If-Match"))
    with database().transaction() as conn:
        loop = loops.edit(conn, loop_id, owner=owner, patch=body, if_match=if_match)
        shown = last_run.one(conn, loop, owner=owner)
    return ok(200, models.ScheduleEnvelope, {"schedule": shown}, headers=etag(loop.revision))
