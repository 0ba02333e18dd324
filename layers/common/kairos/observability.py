"""Logger, Metrics and Tracer: one of each per process, shared by the handlers and the library.

Logs are JSON with a stable ``action`` key and the ids involved; never a token, secret, prompt or
completion. They are Powertools' lines, written in less time: ``Formatter`` formats a record, and
``StructuredLogger.info`` writes the common line (a plain message with its extra keys) without making a
record at all; tests hold both to Powertools' own output byte for byte. A logged exception whose chain
holds a database (psycopg) error is written without that error's text: PostgreSQL's message, DETAIL and
CONTEXT quote the values a statement carried (a model's output, a payload), so such an error is logged
as its class and SQLSTATE only (``DatabaseErrorFilter``, installed on ``logger``; every exception log of
the worker, the SQS handler and the API goes through it).
Metrics are CloudWatch EMF in the ``Kairos`` namespace; ``METRIC_NAMES`` lists every
name the code emits (the template's alarms and docs/operations.md's table refer to these;
``tests/unit/test_metric_names.py`` scans the code for emitted names and holds the three together).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import sys
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Mapping
from math import isfinite as _isfinite
from types import FrameType
from typing import Any, TypeVar, cast

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.logging.filters import SuppressFilter
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
# Powertools' default templates of its reserved keys (``level``, ``location``, ``timestamp``).
_LEVEL_TEMPLATE, _LOCATION_TEMPLATE, _TIME_TEMPLATE = "%(levelname)s", "%(funcName)s:%(lineno)d", "%(asctime)s"


class Formatter(LambdaPowertoolsFormatter):
    """Powertools' formatter, writing the same lines in less time (``tests/unit/test_log_formatter.py``
    holds the two side by side). A record with exception information, ``%`` arguments or a message
    that is not a string is Powertools' own; any other — every line of the run path — goes through
    the same steps in one pass: the reserved keys looked up in a set rather than a tuple, the
    timestamp's date and time formatted once per second (the milliseconds put between them), and
    none of the exception and stack-trace steps, which for such a record only add keys the last
    step strips."""

    _second: tuple[int, str, str] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if kwargs.get("json_serializer") is None and not args:
            # Powertools' default serializer is ``json.dumps`` with these options, which builds an encoder
            # for every line; one built once writes the same text.
            self.json_serializer = json.JSONEncoder(default=self.json_default, separators=(",", ":"),
                                                    indent=self.json_indent, ensure_ascii=False).encode

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
        return self._finish(log, fields, message)

    def _finish(self, log: dict[str, Any], fields: Mapping[str, Any] | None, message: str) -> str:
        """The line from the reserved keys in ``log``: the fields that are not reserved, the message
        (JSON-decoded when it is JSON), the stack trace and the X-Ray id, the keys without a value left out."""
        if fields:
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
        if datefmt is not None or not self._default_time():
            return super().formatTime(record, datefmt)
        return self._asctime(record.created, record.msecs)

    def _default_time(self) -> bool:
        return not (self.use_rfc3339_iso8601 or self.datefmt is not None
                    or self.default_time_format != _DEFAULT_TIME_FORMAT)

    def _asctime(self, created: float, msecs: float) -> str:
        second = int(created)
        kept = self._second
        if kept is None or kept[0] != second:
            when = self.converter(created)
            kept = self._second = (second, time.strftime("%Y-%m-%d %H:%M:%S,", when), time.strftime("%z", when))
        return f"{kept[1]}{'%03d' % msecs}{kept[2]}"  # noqa: UP031 - Powertools' own formatting

    def line(self, levelname: str, func: str, lineno: int, created: float, msecs: float, message: str,
             extra: Mapping[str, Any] | None) -> str | None:
        """The line ``format`` writes for a record of a plain ``str`` message without arguments or
        exception information, made of these values and ``extra`` (keys a ``LogRecord`` does not have):
        ``StructuredLogger`` writes it without making the record. None when the formatter's keys hold
        templates other than Powertools' defaults, or its time format is not the default: the record's way."""
        if not self._default_time():
            return None
        asctime = self._asctime(created, msecs)
        log: dict[str, Any] = {}
        for keys in (self.log_format, _get_context().get()):
            for key, value in keys.items():
                if value and key in _RESERVED:
                    if value == _LEVEL_TEMPLATE:
                        log[key] = levelname
                    elif value == _LOCATION_TEMPLATE:
                        log[key] = f"{func}:{lineno}"
                    elif value == _TIME_TEMPLATE:
                        log[key] = asctime
                    else:
                        return None
                else:
                    log[key] = value
        return self._finish(log, extra, message)


# A record's own attributes and the two a formatter adds: an ``extra`` key among them makes the standard
# library raise (``makeRecord``), so such a call goes its way. The short way needs every attribute a
# record carries to be a key Powertools leaves out of the line (true of Python 3.11's records).
_RECORD_KEYS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}
_SHORT_WAY = _RECORD_KEYS - {"message"} <= _RESERVED


def _suppresses(handler: logging.Handler, name: str) -> bool:
    """Whether ``handler``'s first filter is the Powertools ``SuppressFilter`` that drops the records of
    the logger ``name`` (Powertools puts one on each root handler; Lambda's runtime has one)."""
    filters = handler.filters
    return bool(filters) and type(filters[0]) is SuppressFilter and filters[0].logger in name


class StructuredLogger(Logger):
    """Powertools' ``Logger``, whose ``info`` writes the same line without the standard library's record
    (``tests/unit/test_structured_logger.py`` holds the two side by side): for a plain ``str`` message
    without arguments, exception or stack information, when the line has one place to go — the
    logger's own ``StreamHandler`` with ``Formatter`` and no filters, the logger's filters only
    ``DatabaseErrorFilter`` (which changes only records with exception information), every handler
    the record would propagate to dropping it at its first filter (``SuppressFilter``) or below its
    level — the caller's function and line are found as the library finds them, the timestamp taken
    as a ``LogRecord`` takes it, and ``Formatter.line`` writes the line under the handler's lock. Every
    other call (and any of these whose line cannot be made: a value JSON cannot write) is Powertools'
    own. The record and its handling were some 60 % of a line's CPU, and the run path writes two lines
    a run."""

    def info(self, msg: object, *args: object, exc_info: Any = None, stack_info: bool = False,
             stacklevel: int = 2, extra: Mapping[str, object] | None = None, **kwargs: object) -> None:
        if kwargs:
            extra = {**(extra or {}), **kwargs}  # as Powertools merges them
        if not args and exc_info is None and not stack_info and stacklevel >= 2 and type(msg) is str \
                and self._write(logging.INFO, msg, extra, stacklevel):
            return
        super().info(msg, *args, exc_info=exc_info, stack_info=stack_info, stacklevel=stacklevel + 1, extra=extra)

    def _write(self, levelno: int, msg: str, extra: Mapping[str, object] | None, stacklevel: int) -> bool:
        """Writes the line the library would for this call and answers True, or answers False at once
        (nothing done) when the call is not one the short way writes identically."""
        base = self._logger
        if self._buffer_config or not _SHORT_WAY:
            return False
        if not base.isEnabledFor(levelno):
            return True  # what the library does: nothing
        handler = self._only_handler(levelno, extra)
        if handler is None:
            return False
        formatter = cast(Formatter, handler.formatter)
        frame = _caller(sys._getframe(1), stacklevel)
        func, lineno = frame.f_code.co_name, frame.f_lineno
        created = time.time()  # as LogRecord takes it
        try:
            line = formatter.line(logging.getLevelName(levelno), func, lineno, created,
                                  int((created - int(created)) * 1000) + 0.0, msg, extra)
        except Exception:  # noqa: BLE001 - the library's way writes its error (handleError)
            return False
        if line is None:
            return False
        handler.acquire()
        try:
            handler.stream.write(line + handler.terminator)
            handler.flush()
        except RecursionError:
            raise
        except Exception:  # noqa: BLE001 - as StreamHandler.emit reports a failed write
            handler.handleError(base.makeRecord(base.name, levelno, frame.f_code.co_filename, lineno, msg, (),
                                                None, func, extra, None))
        finally:
            handler.release()
        return True

    def _only_handler(self, levelno: int, extra: Mapping[str, object] | None) -> logging.StreamHandler[Any] | None:
        """The logger's one ``StreamHandler`` with ``Formatter`` when a record of this call would go
        nowhere else and meet no filter but ``DatabaseErrorFilter`` (a no-op without exception
        information); None otherwise."""
        base = self._logger
        if type(base) is not logging.Logger or not logging._srcfile \
                or logging.getLogRecordFactory() is not logging.LogRecord:
            return None
        handlers = base.handlers
        if len(handlers) != 1:
            return None
        handler = handlers[0]
        if type(handler) is not logging.StreamHandler or handler.filters or levelno < handler.level \
                or type(handler.formatter) is not Formatter:
            return None
        for item in base.filters:
            if type(item) is not DatabaseErrorFilter:
                return None
        if extra and not _RECORD_KEYS.isdisjoint(extra):
            return None  # the library raises
        above: logging.Logger | None = base
        while above is not None and above.propagate:
            above = above.parent
            if above is not None:
                for other in above.handlers:
                    if levelno >= other.level and not _suppresses(other, base.name):
                        return None
        return handler


def _caller(frame: FrameType, stacklevel: int) -> FrameType:
    """The caller's frame as ``Logger.findCaller`` finds it, from the frame of ``StructuredLogger.info``
    (which stands where Powertools' ``info`` stands: the first frame not of the logging module):
    ``stacklevel - 1`` frames not of the logging module above it, or the outermost."""
    level = stacklevel - 1
    while level > 0:
        above = frame.f_back
        if above is None:
            break
        frame = above
        if not logging._is_internal_frame(frame):  # type: ignore[attr-defined]
            level -= 1
    return frame


logger = StructuredLogger(service=SERVICE, logger_formatter=Formatter(json_deserializer=_message_value))


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
_text = json.encoder.encode_basestring_ascii  # a str as that encoder writes it (ensure_ascii)


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
        print(self._line() or _COMPACT(self.serialize_metric_set()))
        self.clear_metrics()

    def _line(self) -> str | None:
        """The line ``serialize_metric_set`` and the encoder make, written as text, for the common set: float
        values (finite: JSON's ``NaN`` is not Python's ``nan``), string units, names and dimensions, one
        dimension set, no metadata, an ``int`` timestamp, and no metric named like a dimension or the EMF
        key (whose place a merged dict would keep); None for any other (the encoder's way), with
        Powertools' one side effect done either way (the ``service`` dimension added). The JSON encoder
        cost the run path's flush some 40 % of its instructions."""
        if self.service and not self.dimension_set.get("service"):
            self.add_dimension(name="service", value=self.service)
        dimensions, metric_set = self.dimension_set, self.metric_set
        if self.metadata_set or self.dimension_sets or type(self.namespace) is not str or "_aws" in metric_set:
            return None
        stamp = self.timestamp or int(dt.datetime.now().timestamp() * 1000)
        if type(stamp) is not int:
            return None
        definitions, values = [], []
        for name, metric in metric_set.items():
            unit, points = metric.get("Unit", ""), metric.get("Value", 0)
            if type(name) is not str or type(unit) is not str or type(points) is not list or name in dimensions \
                    or not all(type(v) is float and _isfinite(v) for v in points):
                return None
            definitions.append(f'{{"Name":{_text(name)},"Unit":{_text(unit)}'
                               + (',"StorageResolution":1}' if metric.get("StorageResolution", 60) == 1 else "}"))
            values.append(f"{_text(name)}:[{','.join(map(float.__repr__, points))}]")
        pairs = []
        for name, value in dimensions.items():
            if type(name) is not str or type(value) is not str:
                return None
            pairs.append(f"{_text(name)}:{_text(value)}")
        return (f'{{"_aws":{{"Timestamp":{stamp},"CloudWatchMetrics":[{{"Namespace":{_text(self.namespace)},'
                f'"Dimensions":[[{",".join(map(_text, dimensions))}]],"Metrics":[{",".join(definitions)}]}}]}}'
                + "".join("," + item for item in (*pairs, *values)) + "}")


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
