"""The run path's log lines are written as Powertools writes them: ``observability.logger`` hands its
formatter a message decoder that skips ``json.loads`` (and its raised error) for a message that cannot
be JSON, and the lines are the ones the default decoder gives, for every kind of message."""

from __future__ import annotations

import logging

import pytest
from aws_lambda_powertools.logging.formatter import LambdaPowertoolsFormatter

from kairos.observability import _message_value

MESSAGES = ["run claimed", "", "   ", " {\"a\": 1}", "{\"a\": [1, 2]}", "[1, 2]", "\n[3]", "42", "-1.5", "true",
            "false", "null", "NaN", "Infinity", "-Infinity", "{not json", "nope", "tomorrow", "\"quoted\"",
            "\t\"tab quoted\"", "Idle", "12 runs"]


@pytest.mark.parametrize("message", MESSAGES)
def test_a_message_is_written_as_the_default_decoder_writes_it(message: str) -> None:
    record = logging.LogRecord("kairos", logging.INFO, __file__, 1, message, None, None, func="f")
    record.created, record.msecs = 1767592801.5, 500.0
    fast = LambdaPowertoolsFormatter(json_deserializer=_message_value).format(record)
    default = LambdaPowertoolsFormatter().format(record)
    assert fast == default
