"""Runs: list them, read one, page through its trace and its steps, read its output, cancel it.

``kairos.runs`` (the run record, its reads and cancel; never the worker, which the API does not load)
is imported by these routes when they are first called, so importing the API (or warming its
SnapStart snapshot) does not load it; a schedule's trigger or retry loads it too
(``kairos.schedules.manual`` imports ``kairos.overlap``, which imports ``kairos.runs.moves``). The trace
is read only after ``runs.get`` has checked ownership (the trace has no owner column).
"""

from __future__ import annotations

from typing import Annotated, Any
from uuid import UUID

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body, Query

from kairos import pages, runs, trace
from kairos.api import models
from kairos.api.resolver import Routes, principal
from kairos.api.routes import BEFORE, LIMIT, database, jsonable, ok, parse_id, send_committed
from kairos.runs import steps
from kairos.schedules import manual
from kairos.states import RunState, Source

router = Routes()

SEQ_MAX = 2_147_483_647  # run_events.seq is an integer column


@router.endpoint("GET", "/v1/runs", status=200, model=models.RunList, errors=(),
                 summary="The caller's runs, newest first, in keyset pages (pass next_before as before)")
def list_runs(
    schedule_id: Annotated[UUID | None, Query(description="only this schedule's runs")] = None,
    conversation_id: Annotated[UUID | None, Query(
        description="runs that wrote to this conversation or were scheduled from it")] = None,
    state: Annotated[RunState | None, Query()] = None,
    source: Annotated[Source | None, Query()] = None,
    before: BEFORE = None,
    limit: LIMIT = pages.LIMIT_DEFAULT,
) -> Response[dict[str, Any]]:

    owner = principal()
    with database().transaction() as conn:
        found, next_before = runs.page(conn, owner=owner, schedule_id=schedule_id, conversation_id=conversation_id,
                                       state=state, source=source, before=before, limit=limit)
    return ok(200, models.RunList, {"runs": [r.as_json() for r in found], "next_before": next_before})


@router.endpoint("GET", "/v1/runs/<id>", status=200, model=models.RunEnvelope, errors=(404,), summary="One run")
def get_run(id: str) -> Response[dict[str, Any]]:

    owner = principal()
    run_id = parse_id(id, "run")
    with database().transaction() as conn:
        run = runs.get(conn, run_id, owner=owner)
    return ok(200, models.RunEnvelope, {"run": run.as_json()})


@router.endpoint("GET", "/v1/runs/<id>/events", status=200, model=models.EventPage, errors=(404,),
                 summary="The run's trace after a sequence number (step.progress folded into its step)")
def get_run_events(
    id: str,
    after: Annotated[int, Query(ge=0, le=SEQ_MAX)] = 0,
    limit: Annotated[int, Query(ge=1, le=SEQ_MAX, description=f"capped at {trace.MAX_PAGE}")] = 100,
) -> Response[dict[str, Any]]:

    owner = principal()
    run_id = parse_id(id, "run")
    with database().transaction() as conn:
        runs.get(conn, run_id, owner=owner)  # ownership first: the trace has no owner column
        events, next_after = trace.page(conn, run_id, after=after, limit=limit)
    return ok(200, models.EventPage, {"events": [jsonable(e) for e in events], "next_after": next_after})


@router.endpoint("GET", "/v1/runs/<id>/steps", status=200, model=models.StepPage, errors=(404,),
                 summary="The run's steps (model turns and tool calls) after a step number, with redacted, "
                         "bounded previews")
def get_run_steps(
    id: str,
    after: Annotated[int, Query(ge=0, le=SEQ_MAX)] = 0,
    limit: Annotated[int, Query(ge=1, le=pages.LIMIT_MAX)] = pages.LIMIT_DEFAULT,
) -> Response[dict[str, Any]]:

    owner = principal()
    run_id = parse_id(id, "run")
    with database().transaction() as conn:
        runs.get(conn, run_id, owner=owner)  # ownership first: the steps have no owner column
        found, next_after = steps.page(conn, run_id, after=after, limit=limit)
    return ok(200, models.StepPage, {"steps": [s.as_json() for s in found], "next_after": next_after})


@router.endpoint("GET", "/v1/runs/<id>/output", status=200, model=models.OutputEnvelope, errors=(404,),
                 summary="The run's output projection: available, empty (with why) or unavailable")
def get_run_output(id: str) -> Response[dict[str, Any]]:

    owner = principal()
    run_id = parse_id(id, "run")
    with database().transaction() as conn:
        output = runs.output(conn, run_id, owner=owner)
    return ok(200, models.OutputEnvelope, {"output": jsonable(output)})


@router.endpoint("POST", "/v1/runs/<id>/cancel", status=200, model=models.RunEnvelope, errors=(404, 409),
                 summary="Cancel a run (queued: at once; running: at its next heartbeat or step)")
def cancel_run(id: str) -> Response[dict[str, Any]]:

    owner = principal()
    run_id = parse_id(id, "run")
    with database().transaction() as conn:
        run = runs.cancel(conn, run_id, owner=owner)
    # A queued run that held its slot freed it in the cancel's statement, releasing the next waiting run.
    send_committed([], ended=[run_id] if run.state == RunState.CANCELLED else None)
    return ok(200, models.RunEnvelope, {"run": run.as_json()})


@router.endpoint("POST", "/v1/runs/<id>/retry", status=202, model=models.HookAccepted,
                 errors=(400, 404, 409, 415, 429), has_body=True,
                 summary="A new run of the same revision (retry_of the old one) of a failed, abandoned, expired or "
                         "cancelled run: from the start with no external change made, or {\"from\": \"last_step\"} "
                         "taking over its completed steps (409 ambiguous_effect naming a step that may have acted)")
def retry_run(id: str, body: Annotated[models.RetryRequest | None, Body()] = None) -> Response[dict[str, Any]]:

    owner = principal()
    run_id = parse_id(id, "run")
    from_last_step = body is not None and body.from_ == "last_step"
    with database().transaction() as conn:
        retried = manual.retry(conn, run_id, owner=owner, from_last_step=from_last_step)
    send_committed([retried.run_id] if retried.sendable else [])
    return ok(202, models.HookAccepted, retried.as_json())
