"""Operator status for the console: ``GET /v1/status``.

The caller's due backlog and fire lag (their active schedules whose next fire has passed), their runs
in flight, and the run queue's dead-letter depth (``RUN_DLQ_URL``; SQS ``GetQueueAttributes``; null when
it is not set or cannot be read — a status page must answer even when SQS does not). ``kairos.operations``
(which loads ``kairos.runs``) is imported on the first request, as the other routes' libraries are. Rows are scoped
to the caller like every other route; the DLQ depth is a number about the deployment, never its messages.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.event_handler import Response

from kairos import operations, runtime
from kairos.api import models
from kairos.api.resolver import Routes, principal
from kairos.api.routes import database, ok
from kairos.observability import logger

router = Routes()


def _dlq_depth() -> int | None:

    url = runtime.settings().run_dlq_url
    if not url:
        return None
    try:
        return operations.dlq_messages(runtime.sqs(), url)
    except Exception:  # noqa: BLE001 - the status answers without the number
        logger.warning("dlq depth unavailable", exc_info=True, extra={"action": "status_dlq_unavailable"})
        return None


@router.endpoint("GET", "/v1/status", status=200, model=models.StatusEnvelope, errors=(),
                 summary="Your due backlog, fire lag and runs in flight, and the run queue's DLQ depth")
def get_status() -> Response[dict[str, Any]]:

    owner = principal()
    depth = _dlq_depth()
    with database().transaction() as conn:
        found = operations.owner_status(conn, owner=owner, dlq_depth=depth)
    return ok(200, models.StatusEnvelope, {"status": found.as_json()})
