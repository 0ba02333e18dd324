"""How an attempt stops early: the exceptions the worker (``kairos.execution.execute``) and its tool loop
(``kairos.execution.tool_loop``) raise inside an execution and turn into the run's ending."""

from __future__ import annotations


class LeaseLost(Exception):
    """A fenced write matched nothing: another claim holds the run now."""


class Cancelled(Exception):
    """The run's cancel was requested (seen at a boundary or by the heartbeat)."""


class Failure(Exception):
    """The run fails (or retries) with a reason code; raised inside the execution steps."""

    def __init__(self, reason_code: str, *, retry_safe: bool = False, summary: str | None = None) -> None:
        super().__init__(reason_code)
        self.reason_code = reason_code
        self.retry_safe = retry_safe
        self.summary = summary
