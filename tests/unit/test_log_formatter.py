"""``observability.Formatter`` writes the lines Powertools' ``LambdaPowertoolsFormatter`` writes, byte
for byte, for every kind of record: plain messages (the run path's), messages that are JSON, extra
keys of every type, the keys a Lambda invocation and a thread append, exception information (also as
``DatabaseErrorFilter`` leaves it), ``%`` arguments, a dict message, timestamps across seconds, an
X-Ray trace id, and the other time formats Powertools offers."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from aws_lambda_powertools.logging.formatter import LambdaPowertoolsFormatter

from kairos.observability import SERVICE, DatabaseErrorFilter, Formatter, _message_value, logger
from tests.support.logs import CREATED, EXTRAS, LAMBDA_KEYS, MESSAGES, SECRET, THING


def _pair(**options: Any) -> tuple[LambdaPowertoolsFormatter, Formatter]:
    made = []
    for kind in (LambdaPowertoolsFormatter, Formatter):
        formatter = kind(json_deserializer=_message_value, **options)
        formatter.append_keys(service=SERVICE, sampling_rate=None)  # as Logger(service=...) appends them
        made.append(formatter)
    return made[0], made[1]


def _record(message: Any, extra: dict[str, Any], created: float, *, args: Any = None,
            exc_info: Any = None) -> logging.LogRecord:
    record = logging.getLogger("kairos-formatter-test").makeRecord(
        "kairos", logging.INFO, __file__, 12, message, args, exc_info, func="handle", extra=extra or None)
    record.created, record.msecs = created, (created - int(created)) * 1000
    return record


def _same(default: LambdaPowertoolsFormatter, fast: Formatter, record: logging.LogRecord) -> str:
    line = fast.format(record)
    assert line == default.format(record)
    return line


@pytest.fixture
def thread_keys() -> Iterator[None]:
    yield
    LambdaPowertoolsFormatter().thread_safe_clear_keys()


@pytest.mark.parametrize("extra", EXTRAS, ids=range(len(EXTRAS)))
def test_every_message_and_extra_is_written_as_powertools_writes_it(extra: dict[str, Any]) -> None:
    default, fast = _pair()
    for formatter in (default, fast):
        formatter.append_keys(**LAMBDA_KEYS)
    for message in MESSAGES:
        for created in CREATED:
            _same(default, fast, _record(message, extra, created))


def test_the_timestamps_of_consecutive_records_across_seconds_are_powertools(monkeypatch: pytest.MonkeyPatch) -> None:
    default, fast = _pair()
    lines = [_same(default, fast, _record("tick", {}, 1767592800 + n / 7)) for n in range(30)]
    assert len({line for line in lines}) == len(lines)
    for created in reversed(CREATED):  # back in time too (another thread's older record)
        _same(default, fast, _record("tick", {}, created))


def test_records_powertools_formats_itself_are_its_lines(thread_keys: None, monkeypatch: pytest.MonkeyPatch) -> None:
    default, fast = _pair()
    monkeypatch.setenv("_X_AMZN_TRACE_ID", "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8")
    fast.thread_safe_append_keys(request="r-1", attempt=3, none=None)
    try:
        raise ValueError("boom")
    except ValueError:
        failed = sys.exc_info()
    records = [_record("%s runs of %d", {"action": "a"}, CREATED[0], args=("two", 2)),
               _record({"a": 1, "b": [THING]}, {"action": "a"}, CREATED[0]),
               _record(42, {}, CREATED[0]),
               _record("run failed", {"action": "run_failed"}, CREATED[0], exc_info=failed),
               _record("plain", {"action": "thread keys"}, CREATED[2])]
    for record in records:
        _same(default, fast, record)
    # A database error's record as DatabaseErrorFilter rewrites it: no exception information left

    try:
        try:
            raise psycopg.errors.UniqueViolation("duplicate key value " + "(" + SECRET + ")")
        except psycopg.Error as error:
            raise RuntimeError("wrapped") from error
    except RuntimeError:
        wrapped = sys.exc_info()
    record = _record("record failed", {"action": "record_failed"}, CREATED[1], exc_info=wrapped)
    assert DatabaseErrorFilter().filter(record)
    line = _same(default, fast, record)
    assert SECRET not in line


@pytest.mark.parametrize("options", [{"utc": True}, {"use_rfc3339": True}, {"datefmt": "%H:%M:%S.%F"},
                                     {"datefmt": "%d/%m %H:%M:%S.%F", "use_datetime_directive": True},
                                     {"serialize_stacktrace": False}, {"log_record_order": ["message", "level"]}])
def test_other_formatter_options_write_powertools_lines(options: dict[str, Any]) -> None:
    default, fast = _pair(**options)
    for extra in EXTRAS:
        for created in CREATED:
            _same(default, fast, _record("run claimed", extra, created))


def test_the_logger_uses_the_formatter_with_powertools_keys_and_serializer() -> None:
    formatter = logger.registered_formatter
    assert type(formatter) is Formatter
    reference = LambdaPowertoolsFormatter(json_deserializer=_message_value, service=SERVICE, sampling_rate=None)
    # The handlers' inject_lambda_context appends the invocation's keys (cold_start, function_name, ...) to
    # the shared logger, so a test that ran a handler before this one leaves them after Powertools' own.
    base = list(reference.log_format.items())
    assert list(formatter.log_format.items())[:len(base)] == base
    # Powertools' json.dumps options, in an encoder built once
    options = reference.json_serializer.keywords  # type: ignore[attr-defined]
    encoder = formatter.json_serializer.__self__  # type: ignore[attr-defined]
    assert (encoder.default, encoder.indent, encoder.ensure_ascii, (encoder.item_separator, encoder.key_separator),
            encoder.skipkeys, encoder.check_circular, encoder.allow_nan, encoder.sort_keys) == (
        options["default"], options["indent"], options["ensure_ascii"], options["separators"], False, True, True, False)
    for extra in EXTRAS:
        assert formatter.json_serializer(extra) == reference.json_serializer(extra)
    assert formatter.json_deserializer is _message_value
    assert (formatter.utc, formatter.datefmt, formatter.use_rfc3339_iso8601, formatter.serialize_stacktrace) == (
        reference.utc, reference.datefmt, reference.use_rfc3339_iso8601, reference.serialize_stacktrace)
