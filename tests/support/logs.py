"""What the Powertools logger writes, captured."""

from __future__ import annotations

import io
import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from kairos.observability import logger

# Log cases the formatter and logger tests share: the message kinds of tests/unit/test_log_message_value.py,
# and a dict-looking one with a key order.
MESSAGES = ["run claimed", "", "   ", " {\"a\": 1}", "{\"a\": [1, 2]}", "[1, 2]", "\n[3]", "42", "-1.5", "true",
            "false", "null", "NaN", "Infinity", "-Infinity", "{not json", "nope", "tomorrow", "\"quoted\"",
            "\t\"tab quoted\"", "Idle", "12 runs", "{\"z\": 1, \"a\": {\"é\": \"☃\"}}"]
LAMBDA_KEYS = {"cold_start": False, "function_name": "kairos-run", "function_memory_size": 512,
               "function_arn": "arn:aws:lambda:us-east-1:123456789012:function:kairos-run",
               "function_request_id": "c746766c-67f1-48ed-bbfb-9ff119bcc802"}
THING = uuid.UUID("88fe0cc5-63f0-4bff-a98d-e8636327d0f8")
EXTRAS: list[dict[str, Any]] = [
    {},
    {"action": "run_claimed", "run_id": str(THING), "fence": 1, "attempt": 2},
    {"action": "x", "id": THING, "at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "amount": Decimal("1.50"),
     "nested": {"a": [1, 2.5, None, True], "b": {"c": "é ☃"}}, "none": None, "flag": False, "zero": 0, "empty": ""},
    {"stack_trace": "an extra key the stack-trace step overwrites", "xray_trace_id": "overwritten too"},
    {"exception": "Traceback ...", "exception_name": "OperationalError"},  # as DatabaseErrorFilter leaves it
    {"level": "an extra named like a format key", "service": "other", "location": "here"},
    {"exception_notes": ["a note"], "sampling_rate": 0.5},
]
SECRET = "a-payload-" + "value"
CREATED = [1767592801.5, 1767592801.0, 1767592801.9996, 1767592802.0004, 1767592802.25, 1767592801.5, 0.0]


@contextmanager
def powertools_output() -> Iterator[io.StringIO]:
    """Everything the Powertools logger writes (its handler holds the stdout of import time, which
    neither capsys nor capfd sees once pytest's global capture is active), as JSON lines."""
    handler = logger.registered_handler
    assert isinstance(handler, logging.StreamHandler)
    buffer = io.StringIO()
    previous = handler.setStream(buffer)
    try:
        yield buffer
    finally:
        handler.setStream(previous)
