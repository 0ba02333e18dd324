"""Reading a subprocess's output line by line while it runs (``kairos dev`` in the end-to-end tests)."""

from __future__ import annotations

import queue
import re
import time
from typing import Any


def reader(stream: Any, lines: queue.Queue[str], log: list[str]) -> None:
    """Thread target: every line of ``stream`` into ``lines`` (to wait on) and ``log`` (to report)."""
    for line in iter(stream.readline, ""):
        log.append(line)
        lines.put(line)


def wait_for(lines: queue.Queue[str], pattern: str, log: list[str], timeout: float = 120) -> re.Match[str]:
    """The first line matching ``pattern`` within ``timeout`` seconds, else a failure showing the log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            break
        match = re.search(pattern, line)
        if match:
            return match
    raise AssertionError(f"no line matching {pattern!r}; output so far:\n{''.join(log)}")
