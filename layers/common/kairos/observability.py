"""Logger, Metrics and Tracer: one of each per process, shared by the handlers and the library.

Logs are JSON with a stable ``action`` key and the ids involved; never a token, secret, prompt or
completion. Metrics are CloudWatch EMF in the ``Kairos`` namespace; ``METRIC_NAMES`` lists every
name the code emits (the template's alarms and the README refer to these, and a test holds them
together).
"""

from __future__ import annotations

import os

from aws_lambda_powertools import Logger, Metrics, Tracer

SERVICE = os.environ.get("POWERTOOLS_SERVICE_NAME", "kairos")
NAMESPACE = os.environ.get("POWERTOOLS_METRICS_NAMESPACE", "Kairos")

logger = Logger(service=SERVICE)
metrics = Metrics(namespace=NAMESPACE, service=SERVICE)
# Tracing is a no-op outside Lambda unless POWERTOOLS_TRACE_DISABLED is false.
tracer = Tracer(service=SERVICE, disabled=os.environ.get("AWS_LAMBDA_FUNCTION_NAME") is None)

METRIC_NAMES: frozenset[str] = frozenset(
    {
        # tick
        "FiresDispatched",
        "FiresSkipped",
        "HandoffFailures",
        "Rescues",
        "FireLagSeconds",
        "TickDurationMs",
        "RunsSettled",
        "SchedulesPaused",
        # run
        "Claims",
        "ClaimConflicts",
        "LeasesLost",
        "RunSucceeded",
        "RunFailed",
        "RunCancelled",
        "RunAbandoned",
        # api
        "WebhooksAccepted",
        "WebhooksRejected",
    }
)
