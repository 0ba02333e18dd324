"""Approvals: list and read the caller's approval waits, approve or deny one (``kairos.approvals``).

Approving requeues the run; it is handed to SQS after the commit (the tick's repair sends it if that
fails). Another owner's request answers the same 404 as a missing one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Query

from kairos import approvals
from kairos.api import models
from kairos.api.resolver import Routes, principal
from kairos.api.routes import database, ok, parse_id, send_committed
from kairos.states import ApprovalState

router = Routes()

if TYPE_CHECKING:
    State = str
else:  # the ``state`` query's values: kairos.states.ApprovalState's, in its order
    State = Literal[tuple(s.value for s in ApprovalState)]


@router.endpoint("GET", "/v1/approvals", status=200, model=models.ApprovalList, errors=(),
                 summary="The caller's approval requests, newest first (optionally in one state)")
def list_approvals(state: Annotated[State | None, Query()] = None,
                   limit: Annotated[int, Query(ge=1, le=100)] = 50) -> Response[dict[str, Any]]:

    owner = principal()
    with database().transaction() as conn:
        found = approvals.list_for(conn, owner=owner, state=state, limit=limit)
    return ok(200, models.ApprovalList, {"approvals": [a.as_json() for a in found]})


@router.endpoint("GET", "/v1/approvals/<id>", status=200, model=models.ApprovalEnvelope, errors=(404,),
                 summary="One approval request: the tool, a bounded preview of its arguments, its state")
def get_approval(id: str) -> Response[dict[str, Any]]:

    owner = principal()
    approval_id = parse_id(id, "approval")
    with database().transaction() as conn:
        found = approvals.get(conn, approval_id, owner=owner)
    return ok(200, models.ApprovalEnvelope, {"approval": found.as_json()})


@router.endpoint("POST", "/v1/approvals/<id>/approve", status=200, model=models.ApprovalEnvelope, errors=(404, 409),
                 summary="Approve a pending request: its run resumes and applies exactly this call, once")
def approve(id: str) -> Response[dict[str, Any]]:

    owner = principal()
    approval_id = parse_id(id, "approval")
    with database().transaction() as conn:
        decided = approvals.approve(conn, approval_id, owner=owner)
    send_committed([decided.run_id])
    return ok(200, models.ApprovalEnvelope, {"approval": decided.as_json()})


@router.endpoint("POST", "/v1/approvals/<id>/deny", status=200, model=models.ApprovalEnvelope, errors=(404, 409),
                 summary="Deny a pending request: its run ends policy_blocked")
def deny(id: str) -> Response[dict[str, Any]]:

    owner = principal()
    approval_id = parse_id(id, "approval")
    with database().transaction() as conn:
        decided = approvals.deny(conn, approval_id, owner=owner)
    return ok(200, models.ApprovalEnvelope, {"approval": decided.as_json()})
