"""ApiFunction: API Gateway HTTP API (payload v2) events in, responses out. All logic is in ``kairos.api``.

The event is never logged (it carries the webhook token in its path and bodies carry prompts); the
tracer does not record responses (a created webhook schedule's response carries its token once).
Metrics are flushed under a lock: Lambda runs one invocation per container at a time, but the local
stack and the tests call this handler from several threads. SnapStart hooks: ``kairos.snapstart``
(the webhook path, which hands runs to SQS, is imported before the snapshot).
"""

from __future__ import annotations

import threading
from typing import Any

from kairos import snapstart
from kairos.api.app import handle
from kairos.observability import logger, metrics, tracer


def _warm_api() -> None:
    import kairos.api.openapi  # noqa: F401 - the API's one module loaded on first use (GET /v1/openapi.json)


snapstart.register("api", warm=(_warm_api,))

_flush_lock = threading.Lock()


@logger.inject_lambda_context(log_event=False)
@tracer.capture_lambda_handler(capture_response=False)
def _handle(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return handle(event, context)


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    try:
        response: dict[str, Any] = _handle(event, context)
        return response
    finally:
        with _flush_lock:
            try:
                if metrics.metric_set:
                    metrics.flush_metrics(raise_on_empty_metrics=False)
            except Exception:  # noqa: BLE001 - metrics must never turn an answered request into an error
                logger.warning("metrics flush failed", extra={"action": "metrics_flush_failed"})
