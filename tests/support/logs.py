"""What the Powertools logger writes, captured."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from contextlib import contextmanager

from kairos.observability import logger


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
