"""Logger, Metrics and Tracer: one of each per process, shared by the handlers and the library.

Logs are JSON with a stable ``action`` key and the ids involved; never a token, secret, prompt or
completion. A logged exception whose chain holds a database (psycopg) error is written without that
error's text: PostgreSQL's message, DETAIL and CONTEXT quote the values a statement carried (a model's
output, a payload), so such an error is logged as its class and SQLSTATE only (``DatabaseErrorFilter``,
installed on ``logger``; every exception log of the worker, the SQS handler and the API goes through it).
Metrics are CloudWatch EMF in the ``Kairos`` namespace; ``METRIC_NAMES`` lists every
name the code emits (the template's alarms and docs/operations.md's table refer to these;
``tests/unit/test_metric_names.py`` scans the code for emitted names and holds the three together).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback
from collections import defaultdict
from collections.abc import Callable
from typing import Any, TypeVar

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.logging.formatter import RESERVED_LOG_ATTRS, LambdaPowertoolsFormatter, _get_context
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.metrics.functions import is_metrics_disabled
from aws_lambda_powertools.metrics.provider.cloudwatch_emf import cloudwatch as _emf
from aws_lambda_powertools.metrics.provider.cloudwatch_emf.cloudwatch import AmazonCloudWatchEMFProvider
from aws_lambda_powertools.metrics.provider.cloudwatch_emf.constants import MAX_METRIC_NAME_LENGTH, MAX_METRICS

SERVICE = os.environ.get("POWERTOOLS_SERVICE_NAME", "kairos")
NAMESPACE = os.environ.get("POWERTOOLS_METRICS_NAMESPACE", "Kairos")

# What a JSON text may start with, after its leading whitespace (``json.loads`` accepts NaN and Infinity).
_JSON_STARTS = frozenset('{["-0123456789tfnNI')


def _message_value(message: Any) -> Any:
    """Powertools' formatter decodes every ``str`` message that is JSON (and keeps any other as it is):
    ``json.loads`` for a message that can start a JSON value; any other is returned as it is at once,
    which is what the formatter keeps when ``json.loads`` fails — without raising and catching its
    error for each line (every message Kairos writes is plain text)."""
    if isinstance(message, str) and message.lstrip(" \t\n\r")[:1] not in _JSON_STARTS:
        return message
    return json.loads(message)


_RESERVED = frozenset(RESERVED_LOG_ATTRS)
_DECODE_FAILED = (json.decoder.JSONDecodeError, TypeError, ValueError)
_DEFAULT_TIME_FORMAT = "%Y-%m-%d %H:%M:%S,%F%z"


class Formatter(LambdaPowertoolsFormatter):
    """Powertools' formatter, writing the same lines in less time (``tests/unit/test_log_formatter.py``
    holds the two side by side). A record with exception information, ``%`` arguments or a message
    that is not a string is Powertools' own; any other — every line of the run path — goes through
    the same steps in one pass: the reserved keys looked up in a set rather than a tuple, the
    timestamp's date and time formatted once per second (the milliseconds put between them), and
    none of the exception and stack-trace steps, which for such a record only add keys the last
    step strips."""

    _second: tuple[int, str, str] | None = None

    def format(self, record: logging.LogRecord) -> str:
        message = record.msg
        if record.exc_info or record.args or not isinstance(message, str):
            return super().format(record)
        fields = record.__dict__.copy()
        fields["asctime"] = self.formatTime(record)
        log: dict[str, Any] = {}
        for keys in (self.log_format, _get_context().get()):
            for key, value in keys.items():
                if value and key in _RESERVED:
                    if not isinstance(value, str):
                        return super().format(record)  # Powertools raises its error
                    log[key] = value % fields
                else:
                    log[key] = value
        for key, value in fields.items():
            if key not in _RESERVED:
                log[key] = value
        try:
            log["message"] = self.json_deserializer(message)
        except _DECODE_FAILED:
            log["message"] = message
        if self.serialize_stacktrace:
            log["stack_trace"] = None  # what Powertools' step answers for a record without exception information
        log["xray_trace_id"] = self._get_latest_trace_id()
        return self.serialize(log={k: v for k, v in log.items() if v is not None})

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """Powertools' default timestamp (``2021-05-03 10:20:19,650+0200``), its date, time and zone
        formatted once per second; any other format is Powertools' own."""
        if self.use_rfc3339_iso8601 or datefmt is not None or self.datefmt is not None \
                or self.default_time_format != _DEFAULT_TIME_FORMAT:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        kept = self._second
        if kept is None or kept[0] != second:
            when = self.converter(record.created)
            kept = self._second = (second, time.strftime("%Y-%m-%d %H:%M:%S,", when), time.strftime("%z", when))
        return f"{kept[1]}{'%03d' % record.msecs}{kept[2]}"  # noqa: UP031 - Powertools' own formatting


logger = Logger(service=SERVICE, logger_formatter=Formatter(json_deserializer=_message_value))


def database_error(error: BaseException) -> bool:
    """Whether ``error`` is a psycopg error (none can exist before psycopg is imported)."""
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(error, psycopg.Error)


def withheld(error: BaseException) -> str:
    """``error``'s one-line description as a log may carry it: a database error's class and SQLSTATE
    only (never its message, DETAIL, CONTEXT or the statement's parameters); any other as Python
    writes it."""
    if database_error(error):
        kind = type(error)
        sqlstate = getattr(error, "sqlstate", None) or "none"
        return f"{kind.__module__}.{kind.__qualname__}: SQLSTATE {sqlstate} (its text is not logged)\n"
    return "".join(traceback.format_exception_only(type(error), error))


def safe_traceback(error: BaseException) -> str:
    """``error``'s traceback with its chain (causes and contexts, oldest first), as Python writes it,
    except that each database error in it is described by ``withheld``. Frames name files, lines and
    functions, never values."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    parts: list[str] = []
    for n, item in enumerate(reversed(chain)):
        if n:
            parts.append("\nThe above exception was followed by:\n\n")
        if item.__traceback__ is not None:
            parts.append("Traceback (most recent call last):\n")
            parts.extend(traceback.format_tb(item.__traceback__))
        parts.append(withheld(item))
    return "".join(parts).rstrip("\n")


def _chain_holds_database_error(error: BaseException) -> bool:
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not s for s in seen):
        if database_error(current):
            return True
        seen.append(current)
        current = current.__cause__ or current.__context__
    return False


class DatabaseErrorFilter(logging.Filter):
    """Rewrites a record whose exception chain holds a database error: the traceback is formatted now
    by ``safe_traceback`` (``exc_text``, and Powertools' ``exception`` and ``exception_name`` keys) and
    the exception itself is dropped from the record, so no handler or formatter can write its text."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if isinstance(record.exc_info, tuple) else None
        if error is not None and _chain_holds_database_error(error):
            text = safe_traceback(error)
            record.exc_info = None
            record.exc_text = text
            record.exception = text
            record.exception_name = type(error).__name__
        return True


logger.addFilter(DatabaseErrorFilter())

_COMPACT = json.JSONEncoder(separators=(",", ":")).encode  # json.dumps(..., separators=(",", ":")), built once


class EmfProvider(AmazonCloudWatchEMFProvider):
    """Powertools' CloudWatch EMF provider, writing the same metrics in less time
    (``tests/unit/test_emf_provider.py`` holds the two side by side). ``add_metric`` of a ``MetricUnit``
    at the standard resolution with an int or float value and a trimmed name of a valid length — every
    metric Kairos adds but the webhook's — records it as Powertools does without its checks of the
    unit and resolution and without formatting its debug line while debug logging is off; any other
    call is Powertools' own. ``flush_metrics`` writes the line with an encoder built once."""

    def add_metric(self, name: str, unit: MetricUnit | str, value: float, resolution: Any = 60) -> None:
        if type(unit) is not MetricUnit or type(resolution) is not int or resolution != 60 \
                or type(value) not in (int, float) or not 0 < len(name) <= MAX_METRIC_NAME_LENGTH \
                or name != name.strip() or _emf.logger.isEnabledFor(logging.DEBUG):
            super().add_metric(name=name, unit=unit, value=value, resolution=resolution)
            return
        metric: dict[str, Any] = self.metric_set.get(name, defaultdict(list))
        metric["Unit"] = unit.value
        metric["StorageResolution"] = 60
        metric["Value"].append(float(value))
        self.metric_set[name] = metric
        if len(self.metric_set) == MAX_METRICS or len(metric["Value"]) == MAX_METRICS:
            print(json.dumps(self.serialize_metric_set()))  # a full set is written at once, as Powertools does
            self.metric_set.clear()

    def flush_metrics(self, raise_on_empty_metrics: bool = False) -> None:
        if not self.metric_set or is_metrics_disabled() or _emf.logger.isEnabledFor(logging.DEBUG):
            super().flush_metrics(raise_on_empty_metrics=raise_on_empty_metrics)
            return
        print(_COMPACT(self.serialize_metric_set()))
        self.clear_metrics()


metrics = Metrics(namespace=NAMESPACE, service=SERVICE)
metrics.provider = EmfProvider(namespace=NAMESPACE, service=SERVICE, metric_set=metrics.metric_set,
                               dimension_set=metrics.dimension_set, metadata_set=metrics.metadata_set,
                               default_dimensions=metrics.default_dimensions)

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
