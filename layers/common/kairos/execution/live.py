"""Live output: a model step's output preview grown while the model streams its answer.

Role: ``LiveOutput`` is the ``on_text`` callback the worker hands a model call
(``kairos.executors.base.PreparedCall.on_text``). Told the answer's text so far as it arrives, it
writes the step's output preview (``kairos.runs.steps.progress``, redacted and bounded like every
preview) at most once per ``PREVIEW_SECONDS`` — the first text at once — and, when the step's
``step.progress`` is due (at most once per ``kairos.execution.heartbeat.PROGRESS_MIN_SECONDS`` per step,
shared with the heartbeat's beats), a ``step.progress`` event carrying the character count only.
A run without tools writes its one model step only when the answer is published: its step is opened
here, at the first write (``opening``), so a call that never streams costs no extra statement.

Guarantees: every write is under the run's fence (the statements join the run row), so a worker that
lost its lease changes nothing; after a refused write it writes no more (the heartbeat stops the call).
The end of the step (``kairos.runs.steps.finish``) replaces the preview with the whole answer, so the
text that arrived after the last write is never lost. A write that fails (the database unreachable)
is logged and skipped: the answer matters more than its preview, and the call goes on.

Must not: raise into the executor's read loop; log or trace the text.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from datetime import datetime
from uuid import UUID

import psycopg

from kairos import db, trace
from kairos.execution.heartbeat import Heartbeat
from kairos.observability import logger
from kairos.runs import steps as run_steps
from kairos.states import EventType

PREVIEW_SECONDS = 2.0

# Opens the step (``kairos.runs.steps.begin``) in the transaction of its first preview; False: the fence moved on.
Opening = Callable[[psycopg.Connection[db.Row]], bool]


class LiveOutput:
    """The ``on_text`` of one model step ``n`` (trace step ``step``) of a claimed attempt."""

    def __init__(self, database: db.Database, run_id: UUID, fence: int, n: int, step: str, *,
                 heartbeat: Heartbeat, secrets: Iterable[str] = (), opening: Opening | None = None,
                 now: datetime | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._database = database
        self._run_id = run_id
        self._fence = fence
        self._n = n
        self._step = step
        self._heartbeat = heartbeat
        self._secrets = frozenset(secrets)
        self._opening = opening
        self._now = now
        self._clock = clock
        self._written_at: float | None = None
        self.writes = 0  # previews written (what tests and the log count)
        self.refused = False  # a write found the fence moved on: nothing more is written

    def __call__(self, text: str) -> None:
        if self.refused:
            return
        now = self._clock()
        if self._written_at is not None and now - self._written_at < PREVIEW_SECONDS:
            return
        self._written_at = now
        try:
            self._write(text)
        except Exception:  # noqa: BLE001 - logged; a preview is never worth the answer (the module doc)
            logger.warning("live output not written", exc_info=True, extra={
                "action": "live_output_failed", "run_id": str(self._run_id), "fence": self._fence})

    def _write(self, text: str) -> None:
        preview = run_steps.preview({"content": text, "tool_calls": []}, self._secrets)
        event = self._heartbeat.progress_due()
        if self._opening is None and not event:  # one fenced statement: autocommit is enough
            with self._database.connection() as conn:
                self._wrote(run_steps.progress(conn, self._run_id, self._fence, self._n, preview))
            return
        with self._database.transaction() as conn:
            if self._opening is not None:
                # False also when an earlier attempt (its worker lost) left the step running: it is grown as it stands.
                self._opening(conn)
            grown = run_steps.progress(conn, self._run_id, self._fence, self._n, preview)
            if grown and event:
                trace.append(conn, self._run_id, EventType.STEP_PROGRESS, data={"chars": len(text)},
                             fence=self._fence, step=self._step, now=self._now)
        self._opening = None
        self._wrote(grown)

    def _wrote(self, written: bool) -> None:
        if written:
            self.writes += 1
        else:
            self.refused = True
