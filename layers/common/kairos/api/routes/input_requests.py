"""Input requests: the questions goal loops ask their owner, and the answer (``kairos.input_requests``).

Answering requeues the run that asked; it is handed to SQS after the commit (the tick's repair sends it
if that fails). A second answer, or an answer after a cancel, is 409 ``not_pending``; another owner's
request answers the same 404 as a missing one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body, Query

from kairos import input_requests
from kairos.api import models
from kairos.api.resolver import Routes, principal
from kairos.api.routes import database, ok, parse_id, send_committed
from kairos.states import InputRequestState

router = Routes()

if TYPE_CHECKING:
    State = str
else:  # the ``state`` query's values: kairos.states.InputRequestState's, in its order
    State = Literal[tuple(s.value for s in InputRequestState)]


@router.endpoint("GET", "/v1/input-requests", status=200, model=models.InputRequestList, errors=(),
                 summary="The caller's input requests, newest first (optionally in one state)")
def list_input_requests(state: Annotated[State | None, Query()] = None,
                        limit: Annotated[int, Query(ge=1, le=100)] = 50) -> Response[dict[str, Any]]:

    owner = principal()
    with database().transaction() as conn:
        found = input_requests.list_for(conn, owner=owner, state=state, limit=limit)
    return ok(200, models.InputRequestList, {"input_requests": [r.as_json() for r in found]})


@router.endpoint("POST", "/v1/input-requests/<id>/answer", status=200, model=models.InputRequestAnswered,
                 errors=(400, 404, 409, 415), has_body=True,
                 summary="Answer a pending question, once: the answer joins the run's thread and the same run resumes")
def answer_input_request(id: str, body: Annotated[models.InputAnswer, Body()]) -> Response[dict[str, Any]]:

    owner = principal()
    request_id = parse_id(id, "input_request")
    with database().transaction() as conn:
        answered = input_requests.answer(conn, request_id, owner=owner, text=body.answer)
    send_committed([answered.run_id])
    return ok(200, models.InputRequestAnswered, {"input_request": answered.as_json(),
                                                 "run_id": str(answered.run_id)})
