"""A database error's text never reaches a log: PostgreSQL's message, DETAIL and CONTEXT quote the
values a statement carried (a model's output, a payload), so the worker's and the SQS handler's
exception logs (and every other exception log of ``kairos.observability.logger``) write such an error
as its class and SQLSTATE only, with the traceback's frames kept.

A real server-side error on the embedded PostgreSQL: a jsonb value holding ``\\u0000``, which
PostgreSQL refuses with ``DETAIL: \\u0000 cannot be converted to text`` and ``CONTEXT: JSON data, line
1: {"note": "<the text>…``, raised inside a run's call and carried out of the worker and the handler."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

import psycopg
import pytest
from aws_lambda_powertools.logging.formatter import LambdaPowertoolsFormatter

from kairos.db import Database
from kairos.execution import sqs
from kairos.executors.base import PreparedCall, Reply
from kairos.observability import logger
from kairos.settings import Settings
from tests import factories
from tests.support.aws import run_body, sqs_event
from tests.support.executors import ScriptedExecutor

MARK = "LEAKMARK5b1e"  # in the statement's value: it must appear in no log line


def test_a_database_error_is_logged_by_class_and_sqlstate_never_by_its_detail_or_context(
        db: Database, db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    seen: list[psycopg.Error] = []

    def send(prepared: PreparedCall, timeout: float) -> Reply:
        with psycopg.connect(db_url) as conn:
            try:
                conn.execute("SELECT %s::jsonb", (json.dumps({"note": f"{MARK} model output"})[:-2] + '\\u0000"}',))
            except psycopg.Error as error:
                seen.append(error)
                raise
        raise AssertionError("the statement must fail")

    run = factories.run(db_url)
    event = sqs_event(run_body(uuid.UUID(str(run["id"]))))

    response = sqs.handle_batch(event, None, db=db, settings=Settings(),
                                executor_factory=ScriptedExecutor(on_send=send).factory)

    # The record is delivered again, and the error really carried the text (the premise)
    assert response == {"batchItemFailures": [{"itemIdentifier": event["Records"][0]["messageId"]}]}
    [error] = seen
    assert error.sqlstate == "22P05"
    assert MARK in f"{error} {error.diag.message_detail} {error.diag.context}"
    # Then the worker's and the handler's exception lines were written ...
    logged = {getattr(r, "action", None): r for r in caplog.records}
    assert {"run_db_error", "record_failed"} <= set(logged)
    for action in ("run_db_error", "record_failed"):
        record = logged[action]
        # ... as Lambda writes them (Powertools JSON) and as a plain handler would
        written: dict[str, Any] = json.loads(LambdaPowertoolsFormatter().format(record))
        assert "UntranslatableCharacter: SQLSTATE 22P05" in written["exception"], written
        assert "Traceback (most recent call last)" in written["exception"]
        assert written["exception_name"] == "UntranslatableCharacter"
        assert "SQLSTATE 22P05" in logging.Formatter().format(record)
    # ... and nothing of the statement's text is in any record, however it is formatted
    for record in caplog.records:
        for text in (LambdaPowertoolsFormatter().format(record), logging.Formatter().format(record),
                     f"{record.getMessage()} {record.__dict__}"):
            assert MARK not in text and "converted to text" not in text and "JSON data" not in text, text


def test_an_exception_without_a_database_error_is_logged_as_python_writes_it(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    try:
        raise ValueError("an ordinary message")
    except ValueError:
        logger.exception("plain failure", extra={"action": "plain_failure"})
    [record] = [r for r in caplog.records if getattr(r, "action", None) == "plain_failure"]
    assert record.exc_info is not None
    assert "ValueError: an ordinary message" in LambdaPowertoolsFormatter().format(record)
