"""RunFunction: SQS delivers batches of run ids; each record is claimed and executed alone.

Thin by design: the per-container pool and settings go to ``kairos.execution.sqs.handle_batch``, which
reports partial batch failures (``ReportBatchItemFailures`` on the event source mapping) so one bad
or failing record never sends the good records of its batch back to the queue. SnapStart hooks:
``kairos.snapstart`` (the run machinery is imported before the snapshot).
"""

from __future__ import annotations

from typing import Any

from kairos import runtime, snapstart
from kairos.execution import sqs
from kairos.observability import logger, metrics, tracer

snapstart.register("run")


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return sqs.handle_batch(event, context, db=runtime.database(), settings=runtime.settings())
