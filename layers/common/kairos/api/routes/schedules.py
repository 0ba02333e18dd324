"""Schedules: create (with a webhook's URL and token, shown once), list, read, preview, list occurrences,
pause, resume, cancel, rotate a webhook's token, and test-run.

Every schedule answered carries its ``last_run``: routes shape schedules with
``kairos.schedules.last_run.shown`` / ``one`` (never ``Schedule.as_json`` alone), in the route's
transaction.

``POST /v1/schedules`` reads its body raw so ``kairos.schedules`` can canonicalize the chat-style
shorthand before its strict validation; the OpenAPI document describes the strict
``schedules.ScheduleRequest``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any
from uuid import UUID

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body, Query

from kairos import occurrences, pages, runs, runtime, schedules, webhooks
from kairos.api import models
from kairos.api.resolver import Routes, principal
from kairos.api.routes import BEFORE, LIMIT, database, etag, header, idempotent, ok, parse_id, send_committed
from kairos.instants import RFC3339Instant, offset_text, rfc3339
from kairos.schedules import backfill, edit, last_run, manual

router = Routes()


def _webhook(token: str) -> dict[str, str]:
    """The URL to paste into GitHub or Stripe: ``KAIROS_PUBLIC_URL`` when set (a custom domain), else
    the host this request came to — API Gateway's own domain, which the template cannot pass to its
    function without a dependency cycle."""

    base = runtime.settings().public_url
    if base is None:
        domain = (router.current_event.raw_event.get("requestContext") or {}).get("domainName") or "localhost"
        base = f"https://{domain}"
    return {"url": webhooks.webhook_url(base, token), "token": token}


@router.endpoint("POST", "/v1/schedules", status=201, model=models.ScheduleCreated, errors=(400, 403, 404, 415),
                 summary="Create a schedule (the webhook URL and token are returned once, for kind: webhook)",
                 has_body=True)
def create_schedule(body: Annotated[dict[str, Any], Body(description="ScheduleRequest")]) -> Response[dict[str, Any]]:
    owner = principal()

    def create(conn: Any) -> Response[dict[str, Any]]:
        created = schedules.create(conn, owner=owner, raw=body)
        payload: dict[str, Any] = {"schedule": last_run.one(conn, created.schedule, owner=owner)}
        if created.token is not None:
            payload["webhook"] = _webhook(created.token)
        return ok(201, models.ScheduleCreated, payload)

    with database().transaction() as conn:
        return idempotent(conn, owner, router.current_event.raw_event, body, create)


@router.endpoint("GET", "/v1/schedules", status=200, model=models.ScheduleList, errors=(),
                 summary="The caller's schedules that are not cancelled, oldest first")
def list_schedules(conversation_id: Annotated[UUID | None, Query()] = None) -> Response[dict[str, Any]]:
    owner = principal()
    with database().transaction() as conn:
        found = schedules.list_for(conn, owner=owner, conversation_id=conversation_id)
        shown = last_run.shown(conn, found, owner=owner)
    return ok(200, models.ScheduleList, {"schedules": shown})


@router.endpoint("GET", "/v1/schedules/<id>", status=200, model=models.ScheduleEnvelope, errors=(404,),
                 summary="One schedule")
def get_schedule(id: str) -> Response[dict[str, Any]]:
    owner = principal()
    schedule_id = parse_id(id, "schedule")
    with database().transaction() as conn:
        schedule = schedules.get(conn, schedule_id, owner=owner)
        shown = last_run.one(conn, schedule, owner=owner)
    return ok(200, models.ScheduleEnvelope, {"schedule": shown}, headers=etag(schedule.revision))


@router.endpoint("PATCH", "/v1/schedules/<id>", status=200, model=models.ScheduleEnvelope,
                 errors=(400, 404, 409, 412, 415), has_body=True,
                 summary="Edit a schedule under a new revision (JSON merge patch of the create fields; "
                         "If-Match: the revision read)")
def edit_schedule(id: str, body: Annotated[dict[str, Any], Body(description="ScheduleRequest fields to change; "
                                                                "null resets one to its default")],
                  ) -> Response[dict[str, Any]]:

    owner = principal()
    schedule_id = parse_id(id, "schedule")
    if_match = edit.parse_if_match(header(router.current_event.raw_event, "If-Match"))
    with database().transaction() as conn:
        schedule = edit.edit(conn, schedule_id, owner=owner, patch=body, if_match=if_match)
        shown = last_run.one(conn, schedule, owner=owner)
    return ok(200, models.ScheduleEnvelope, {"schedule": shown}, headers=etag(schedule.revision))


@router.endpoint("GET", "/v1/schedules/<id>/preview", status=200, model=models.FireList, errors=(404,),
                 summary="The next fires strictly after `after` (default: now), with dispatch instant (jitter), "
                         "local time, offset and fold")
def preview_schedule(
    id: str,
    count: Annotated[int, Query(ge=1, le=schedules.PREVIEW_MAX)] = 10,
    after: Annotated[RFC3339Instant | None, Query(description="RFC 3339 instant with offset")] = None,
) -> Response[dict[str, Any]]:
    owner = principal()
    schedule_id = parse_id(id, "schedule")
    with database().transaction() as conn:
        fires = schedules.preview_dispatch(conn, schedule_id, owner=owner, after=after, count=count)
    return ok(200, models.FireList, {"fires": [
        {"fire_at": rfc3339(f.fire_at), "dispatch_at": rfc3339(dispatch_at), "local_time": f.local_time.isoformat(),
         "utc_offset": offset_text(f.utc_offset), "fold": f.fold}
        for f, dispatch_at in fires
    ]})


@router.endpoint("GET", "/v1/schedules/<id>/occurrences", status=200, model=models.OccurrenceList, errors=(404,),
                 summary="The schedule's occurrences, newest first, with decision, source, revision, covered "
                         "range and run id, in keyset pages (pass next_before as before)")
def list_occurrences(id: str, before: BEFORE = None, limit: LIMIT = pages.LIMIT_DEFAULT) -> Response[dict[str, Any]]:
    owner = principal()
    schedule_id = parse_id(id, "schedule")
    with database().transaction() as conn:
        found, next_before = occurrences.page(conn, schedule_id, owner=owner, before=before, limit=limit)
    return ok(200, models.OccurrenceList, {"occurrences": [o.as_json() for o in found], "next_before": next_before})


def _moved(id: str, move: Callable[..., schedules.Schedule]) -> Response[dict[str, Any]]:
    """One guarded status move of the caller's schedule (pause, resume, cancel), answered with its last run."""
    owner = principal()
    schedule_id = parse_id(id, "schedule")
    with database().transaction() as conn:
        shown = last_run.one(conn, move(conn, schedule_id, owner=owner), owner=owner)
    return ok(200, models.ScheduleEnvelope, {"schedule": shown})


@router.endpoint("POST", "/v1/schedules/<id>/pause", status=200, model=models.ScheduleEnvelope,
                 errors=(400, 404, 409, 415), has_body=True,
                 summary="Pause a schedule, with an optional reason shown with it (paused_reason); the fires that "
                         "fall in the pause are recorded at resume as one skipped_paused occurrence")
def pause_schedule(id: str, body: Annotated[models.PauseRequest | None, Body()] = None) -> Response[dict[str, Any]]:
    reason = (body or models.PauseRequest()).reason
    return _moved(id, lambda conn, schedule_id, owner: schedules.pause(conn, schedule_id, owner=owner, reason=reason))


@router.endpoint("POST", "/v1/schedules/<id>/resume", status=200, model=models.ScheduleEnvelope, errors=(404, 409),
                 summary="Resume a paused schedule (clears failures and the reason, records the fires that fell "
                         "in the pause as one skipped_paused occurrence, computes the next fire)")
def resume_schedule(id: str) -> Response[dict[str, Any]]:
    return _moved(id, schedules.resume)


@router.endpoint("DELETE", "/v1/schedules/<id>", status=200, model=models.ScheduleEnvelope, errors=(404, 409),
                 summary="Cancel a schedule")
def cancel_schedule(id: str) -> Response[dict[str, Any]]:
    return _moved(id, schedules.cancel)


@router.endpoint("POST", "/v1/schedules/<id>/token", status=200, model=models.TokenRotated,
                 errors=(400, 404, 409, 415),
                 summary="Rotate a webhook token; the previous one stays valid for overlap_seconds", has_body=True)
def rotate_token(
    id: str,
    body: Annotated[models.TokenRotate | None, Body()] = None,
) -> Response[dict[str, Any]]:

    owner = principal()
    schedule_id = parse_id(id, "schedule")
    overlap = (body or models.TokenRotate()).overlap_seconds
    with database().transaction() as conn:
        rotated = webhooks.rotate(conn, schedule_id, owner=owner, overlap_seconds=overlap)
        shown = last_run.one(conn, rotated.schedule, owner=owner)
    return ok(200, models.TokenRotated, {"schedule": shown, "webhook": _webhook(rotated.token)})


@router.endpoint("POST", "/v1/schedules/<id>/trigger", status=202, model=models.HookAccepted, errors=(404, 409, 429),
                 summary="Run now: a manual occurrence of the current revision (overlap applies; a skip is 409)")
def trigger_schedule(id: str) -> Response[dict[str, Any]]:

    owner = principal()
    schedule_id = parse_id(id, "schedule")
    sendable: list[UUID] = []
    replaced: list[UUID] = []

    def create(conn: Any) -> Response[dict[str, Any]]:
        triggered = manual.trigger(conn, schedule_id, owner=owner)
        if triggered.sendable:
            sendable.append(triggered.run_id)
        if triggered.replaced is not None:
            replaced.append(triggered.replaced)
        return ok(202, models.HookAccepted, triggered.as_json())

    with database().transaction() as conn:
        # The key is per route and schedule: the same key on another schedule is another request.
        response = idempotent(conn, owner, router.current_event.raw_event, {"schedule_id": str(schedule_id)}, create)
    send_committed(sendable, ended=replaced)
    return response


@router.endpoint("POST", "/v1/schedules/<id>/test", status=202, model=models.TestRunAccepted,
                 errors=(400, 404, 409, 415, 429), has_body=True,
                 summary="A test run of the current revision: real model calls, mutations recorded not_sent_test "
                         "and never sent; never counted toward failures, never notified, never last_run")
def test_schedule(id: str, body: Annotated[models.TestRunRequest | None, Body()] = None) -> Response[dict[str, Any]]:

    owner = principal()
    schedule_id = parse_id(id, "schedule")
    payload = (body or models.TestRunRequest()).payload
    sendable: list[UUID] = []

    def create(conn: Any) -> Response[dict[str, Any]]:
        tested = manual.test(conn, schedule_id, owner=owner, payload=payload)
        if tested.sendable:
            sendable.append(tested.run_id)
        return ok(202, models.TestRunAccepted, {**tested.as_json(),
                                                "run": runs.get(conn, tested.run_id, owner=owner).as_json()})

    with database().transaction() as conn:
        response = idempotent(conn, owner, router.current_event.raw_event,
                              {"schedule_id": str(schedule_id), "payload": payload}, create)
    send_committed(sendable)
    return response


@router.endpoint("POST", "/v1/schedules/<id>/backfill", status=202, model=models.BackfillAccepted,
                 errors=(400, 404, 409, 415, 429), has_body=True,
                 summary="Runs for the past instants in [from, until), each under the revision then in force")
def backfill_schedule(id: str, body: Annotated[dict[str, Any], Body(
        description='{"from": RFC 3339, "until": RFC 3339 (at most now, at most 31 days after from), '
                    '"max"?: 1..100}')]) -> Response[dict[str, Any]]:

    owner = principal()
    schedule_id = parse_id(id, "schedule")
    with database().transaction() as conn:
        done = backfill.backfill(conn, schedule_id, owner=owner, raw=body)
    send_committed(done.sendable)
    return ok(202, models.BackfillAccepted, {"occurrences": done.occurrences})
