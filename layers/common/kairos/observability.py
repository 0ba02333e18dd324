"""Logger, Metrics and Tracer: one of each per process, shared by the handlers and the library.

Logs are JSON with a stable ``action`` key and the ids involved; never a token, secret, prompt or
completion. Metrics are CloudWatch EMF in the ``Kairos`` namespace; ``METRIC_NAMES`` lists every
name the code emits (the template's alarms and docs/operations.md's table refer to these;
``tests/unit/test_metric_names.py`` scans the code for emitted names and holds the three together).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

from aws_lambda_powertools import Logger, Metrics, Tracer

SERVICE = os.environ.get("POWERTOOLS_SERVICE_NAME", "kairos")
NAMESPACE = os.environ.get("POWERTOOLS_METRICS_NAMESPACE", "Kairos")

logger = Logger(service=SERVICE)
metrics = Metrics(namespace=NAMESPACE, service=SERVICE)

F = TypeVar("F", bound=Callable[..., Any])


class _Untraced:
    """Stands in for Powertools' Tracer when the X-Ray SDK is off: same decorators, no work.

    Building a Tracer imports the X-Ray SDK (about 0.4 s of every cold start, even when disabled),
    so it is built only when SDK tracing is on. Lambda's active tracing still records each
    invocation without the SDK; the SDK adds subsegments for AWS calls.
    """

    def capture_lambda_handler(self, fn: F | None = None, **options: Any) -> Any:
        return fn if fn is not None else (lambda f: f)

    def capture_method(self, fn: F | None = None, **options: Any) -> Any:
        return fn if fn is not None else (lambda f: f)


def sdk_tracing_enabled(env: dict[str, str] | None = None) -> bool:
    """On in Lambda unless POWERTOOLS_TRACE_DISABLED is true (the template's default)."""
    env = dict(os.environ if env is None else env)
    disabled = env.get("POWERTOOLS_TRACE_DISABLED", "").lower() in ("1", "true")
    return "AWS_LAMBDA_FUNCTION_NAME" in env and not disabled


tracer: Tracer | _Untraced = Tracer(service=SERVICE) if sdk_tracing_enabled() else _Untraced()

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
        "RunsPruned",  # retention (kairos.tick.prune)
        "EntriesPruned",
        # run
        "Claims",
        "ClaimConflicts",
        "ClaimsDeferred",  # the owner's running slots were full (kairos.budgets)
        "LeasesLost",
        "RunSucceeded",
        "RunFailed",
        "RunCancelled",
        "RunAbandoned",
        "RunExpired",
        # api
        "WebhooksAccepted",
        "WebhooksRejected",
        "WebhooksFailed",  # the database refused to record a delivery (503)
    }
)
