"""``observability.StructuredLogger.info`` writes, without a ``LogRecord``, the line Powertools' own
path writes (its ``Logger.info``, the standard library's record and handler, its
``LambdaPowertoolsFormatter``), byte for byte: every message kind and extra of
``test_log_formatter.py`` at every timestamp, with the keys a Lambda invocation and a thread append,
``stacklevel``s, keyword extras and an X-Ray trace id; and every call it cannot write so (arguments,
exception or stack information, a handler or filter it does not know, a root handler that would get
the record, an extra that clashes with a record's attributes, a failed write, a value JSON cannot
write) goes the library's way, with the library's result."""

from __future__ import annotations

import io
import itertools
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from aws_lambda_powertools import Logger
from aws_lambda_powertools.logging.filters import SuppressFilter
from aws_lambda_powertools.logging.formatter import LambdaPowertoolsFormatter

from kairos.observability import Formatter, StructuredLogger, _message_value, logger
from tests.support.logs import CREATED, EXTRAS, LAMBDA_KEYS, MESSAGES

SERVICE = "kairos-structured-logger-test"
_fresh = itertools.count()


class Pair:
    """One ``StructuredLogger`` writing into a buffer, with ``Formatter`` (its short way) or with
    Powertools' own formatter (which makes it take Powertools' path: the reference)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, **options: Any) -> None:
        self.logger = StructuredLogger(service=f"{SERVICE}-{next(_fresh)}",  # one of its own per test
                                       logger_formatter=Formatter(json_deserializer=_message_value, **options))
        self.base = self.logger._logger
        self.pytest_handlers = False  # pytest's capture handlers (on the root logger) are left out
        self.handler = self.base.handlers[0]
        self.buffer = io.StringIO()
        self.handler.setStream(self.buffer)
        self.fast = self.handler.formatter
        self.library = LambdaPowertoolsFormatter(json_deserializer=_message_value, **options)
        self.library.log_format = dict(self.fast.log_format)
        self.records = 0
        made = self.base.makeRecord

        def counted(*args: Any, **kwargs: Any) -> logging.LogRecord:
            self.records += 1
            return made(*args, **kwargs)

        monkeypatch.setattr(self.base, "makeRecord", counted)

    def append_keys(self, **keys: Any) -> None:
        self.logger.append_keys(**keys)
        self.library.append_keys(**keys)

    def remove_keys(self, keys: list[str]) -> None:
        self.logger.remove_keys(keys)
        self.library.remove_keys(keys)

    def lines(self, call: Callable[[], None], *, short: bool = True) -> tuple[str, str]:
        """The text ``call`` writes through the short way, then through the library's; asserts which way
        each went (the short way makes no record)."""
        written = []
        with self._alone():
            for formatter in (self.fast, self.library):
                self.handler.setFormatter(formatter)
                self.records = 0
                self.buffer.seek(0)
                self.buffer.truncate()
                call()
                assert self.records == (0 if short and formatter is self.fast else 1) \
                    or not self.base.isEnabledFor(logging.INFO)
                written.append(self.buffer.getvalue())
        self.handler.setFormatter(self.fast)
        return written[0], written[1]

    @contextmanager
    def _alone(self) -> Iterator[None]:
        """Without pytest's capture handlers (on the root logger, and on a logger that does not
        propagate), unless the test keeps them: a deployment has none."""
        if self.pytest_handlers:
            yield
            return
        kept = {item: list(item.handlers) for item in (logging.root, self.base)}
        for item, handlers in kept.items():
            item.handlers = [h for h in handlers if type(h).__module__ != "_pytest.logging"]
        try:
            yield
        finally:
            for item, handlers in kept.items():
                item.handlers = handlers

    def same(self, call: Callable[[], None], *, short: bool = True) -> str:
        fast, library = self.lines(call, short=short)
        assert fast == library
        return fast


@pytest.fixture
def pair(monkeypatch: pytest.MonkeyPatch) -> Iterator[Pair]:
    made = Pair(monkeypatch)
    _at(monkeypatch, CREATED[0])  # a test that compares lines at another time sets its own
    yield made
    made.logger.thread_safe_clear_keys()
    made.base.handlers.clear()
    made.base.filters.clear()
    made.base.setLevel(logging.NOTSET)
    del made.base.init  # Powertools' "preconfigured" mark: the next test configures the logger afresh


def _at(monkeypatch: pytest.MonkeyPatch, created: float) -> None:
    monkeypatch.setattr(time, "time", lambda: created)  # what LogRecord and the short way both read


@pytest.mark.parametrize("lambda_keys", [False, True], ids=["no invocation", "invocation keys"])
def test_every_message_and_extra_is_written_as_the_library_writes_it(
        pair: Pair, monkeypatch: pytest.MonkeyPatch, lambda_keys: bool) -> None:
    if lambda_keys:
        pair.append_keys(**LAMBDA_KEYS)
    for extra in EXTRAS:
        for message in MESSAGES:
            for created in CREATED:
                _at(monkeypatch, created)
                pair.same(lambda: pair.logger.info(message, extra=extra or None))  # noqa: B023 - called at once


def test_thread_keys_trace_id_keyword_extras_and_stacklevels_are_the_librarys(
        pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("_X_AMZN_TRACE_ID", "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8")
    pair.logger.thread_safe_append_keys(request="r-1", attempt=3, none=None)
    _at(monkeypatch, CREATED[0])

    def inner(level: int) -> None:
        pair.logger.info("run claimed", stacklevel=level, extra={"action": "a"}, run_id="r", fence=2)

    def outer(level: int) -> None:
        inner(level)

    for level in (2, 3, 4, 50):
        line = pair.same(lambda: outer(level))  # noqa: B023 - called at once
    assert '"location":"outer:' in pair.same(lambda: outer(3))
    assert '"run_id":"r","fence":2' in line and '"request":"r-1"' in line and '"xray_trace_id":"1-5759e988' in line


def test_calls_the_short_way_does_not_write_are_the_librarys(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    _at(monkeypatch, CREATED[0])
    try:
        raise ValueError("boom")
    except ValueError as error:
        failed = error
    pair.same(lambda: pair.logger.info("%s runs", "two"), short=False)
    pair.same(lambda: pair.logger.info({"a": 1}), short=False)
    pair.same(lambda: pair.logger.info("failed", exc_info=failed), short=False)
    pair.same(lambda: pair.logger.info("here", stack_info=True), short=False)
    pair.same(lambda: pair.logger.info("here", stacklevel=1), short=False)
    loop: dict[str, Any] = {}
    loop["self"] = loop  # JSON cannot write it: the library's handler reports it (handleError)
    reported: list[logging.LogRecord] = []
    monkeypatch.setattr(pair.handler, "handleError", reported.append)
    pair.same(lambda: pair.logger.info("loop", extra={"loop": loop}), short=False)
    assert len(reported) == 2
    # A key a record has: the library refuses it
    pair.records = 0
    with pair._alone():
        for clash in ("message", "asctime", "lineno", "name"):
            with pytest.raises(KeyError, match="Attempt to overwrite"):
                pair.logger.info("x", extra={clash: 1})
        assert pair.records == 4


def test_a_failed_write_is_reported_as_the_handler_reports_it(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError("no space left")

    pair.handler.setStream(Broken())
    reported: list[logging.LogRecord] = []
    monkeypatch.setattr(pair.handler, "handleError", reported.append)
    for formatter in (pair.fast, pair.library):
        pair.handler.setFormatter(formatter)
        pair.logger.info("lost", extra={"action": "a"})
    fast, library = reported
    assert (fast.getMessage(), fast.funcName, fast.lineno, fast.pathname, fast.action) == (  # type: ignore[attr-defined]
        library.getMessage(), library.funcName, library.lineno, library.pathname, library.action)  # type: ignore[attr-defined]


def test_a_handler_or_filter_the_short_way_does_not_know_gets_its_record(pair: Pair) -> None:
    seen: list[str] = []

    def note(record: logging.LogRecord) -> bool:
        seen.append(record.getMessage())
        return True

    pair.base.addFilter(note)
    pair.same(lambda: pair.logger.info("filtered"), short=False)
    assert seen == ["filtered", "filtered"]
    pair.base.removeFilter(note)
    pair.handler.addFilter(note)
    pair.same(lambda: pair.logger.info("handler filtered"), short=False)
    pair.handler.removeFilter(note)
    other = logging.StreamHandler(io.StringIO())
    pair.base.addHandler(other)
    pair.same(lambda: pair.logger.info("two handlers"), short=False)
    assert other.stream.getvalue().count("two handlers") == 2
    pair.base.removeHandler(other)
    pair.same(lambda: pair.logger.info("back to one"))


def test_a_root_handler_gets_the_record_unless_powertools_suppressed_it(
        pair: Pair, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    pair.pytest_handlers = True
    with caplog.at_level(logging.INFO):
        pair.same(lambda: pair.logger.info("to the root"), short=False)
        assert [r.getMessage() for r in caplog.records if r.name == pair.base.name] == ["to the root"] * 2
    root = logging.StreamHandler(io.StringIO())
    root.addFilter(SuppressFilter(SERVICE))  # what Powertools adds to the root handlers it finds (Lambda's)
    pair.pytest_handlers = False
    monkeypatch.setattr(logging.root, "handlers", [root])
    pair.same(lambda: pair.logger.info("suppressed at the root"))
    assert root.stream.getvalue() == ""
    root.filters.clear()
    pair.same(lambda: pair.logger.info("written at the root too"), short=False)
    assert root.stream.getvalue().count("written at the root too") == 2


def test_a_level_below_the_loggers_writes_nothing(pair: Pair) -> None:
    pair.logger.setLevel(logging.WARNING)
    assert pair.same(lambda: pair.logger.info("quiet")) == ""
    pair.handler.setLevel(logging.ERROR)
    pair.logger.setLevel(logging.INFO)
    assert pair.same(lambda: pair.logger.info("below the handler's level"), short=False) == ""


def test_the_shared_logger_takes_the_short_way_as_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process's ``logger`` as the handlers run it (no root handler, or Lambda's suppressed one) writes
    its info lines the short way."""
    assert type(logger) is StructuredLogger and type(logger._logger.handlers[0].formatter) is Formatter
    monkeypatch.setattr(logging.root, "handlers", [])
    buffer = io.StringIO()
    monkeypatch.setattr(logger._logger.handlers[0], "stream", buffer)

    def refuse(*args: Any, **kwargs: Any) -> logging.LogRecord:
        raise AssertionError("the short way makes no record")

    monkeypatch.setattr(logger._logger, "makeRecord", refuse)
    logger.info("run claimed", extra={"action": "claimed"})
    assert '"message":"run claimed"' in buffer.getvalue() and '"action":"claimed"' in buffer.getvalue()
    assert Logger.info is not StructuredLogger.info


@pytest.mark.parametrize("options", [{"serialize_stacktrace": False}, {"log_record_order": ["message", "level"]},
                                     {"log_record_order": ["timestamp", "location"]}, {"utc": True}])
def test_other_formatter_options_are_the_librarys(monkeypatch: pytest.MonkeyPatch, options: dict[str, Any]) -> None:
    pair = Pair(monkeypatch, **options)
    for extra in EXTRAS:
        for message in ("run claimed", "null", "{\"a\": 1}"):
            for created in CREATED[:3]:
                _at(monkeypatch, created)
                pair.same(lambda: pair.logger.info(message, extra=extra or None))  # noqa: B023 - called at once


def test_keys_that_change_between_lines_are_the_librarys(pair: Pair) -> None:
    """The line's fixed keys are laid out once per state of the keys: a value replaced by an equal one of
    another type, a key removed or added, a thread's key over the logger's, a reserved key given a value
    of its own (the record's way) — each line is the library's."""
    lines = []
    for change in (lambda: pair.append_keys(flag=True), lambda: pair.append_keys(flag=1),
                   lambda: pair.append_keys(flag=1.0), lambda: pair.append_keys(flag=None),
                   lambda: pair.append_keys(other="x", sampling_rate=0.1),
                   lambda: pair.remove_keys(["other"]),
                   lambda: pair.logger.thread_safe_append_keys(service="thread's", flag=[]),
                   lambda: pair.logger.thread_safe_append_keys(extra_none=None, empty=""),
                   lambda: pair.logger.thread_safe_append_keys(level=None),  # the line has no level then
                   lambda: pair.logger.thread_safe_append_keys(level="", timestamp=None),
                   lambda: pair.logger.thread_safe_clear_keys()):
        change()
        lines.append(pair.same(lambda: pair.logger.info("run claimed", extra={"flag": "extra's"})))
        lines.append(pair.same(lambda: pair.logger.info("run claimed")))
    assert '"flag":true}' in lines[1] and '"flag":1}' in lines[3] and '"flag":1.0}' in lines[5]
    assert '"service":"thread\'s"' in lines[13] and '"level"' not in lines[17] and '"level":""' in lines[19]
    pair.logger.thread_safe_append_keys(level="a reserved key's own value")
    pair.same(lambda: pair.logger.info("run claimed"), short=False)
    pair.logger.thread_safe_clear_keys()
    pair.append_keys(timestamp="%(created)f")  # a template of another attribute: the record's way
    pair.same(lambda: pair.logger.info("run claimed"), short=False)
