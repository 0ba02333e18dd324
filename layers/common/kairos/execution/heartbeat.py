"""The heartbeat: keeps a claimed run's lease alive, reads its cancel flag, aborts its call in flight.

Role: while the worker is in an external call, a daemon thread extends the run's lease every
``HEARTBEAT_SECONDS`` under the fence (``runs_heartbeat``, each beat on its own pooled connection)
and reads ``cancel_requested_at``. That thread starts only when the first beat is due (one
dispatcher thread per process keeps the due times): a run that ends within one interval starts no
thread and borrows no connection. It writes ``step.progress`` (no content) for the step in flight
at most once per ``PROGRESS_MIN_SECONDS``, a count it shares with a streaming model step's own
``step.progress`` (``progress_due``; ``kairos.execution.live``).

Guarantees: a cancel request or a lost lease sets ``cancel_requested`` / ``lost`` and fires
``abort`` (``kairos.executors.base.Abort``): the worker hands that ``Abort`` to the executor, whose
HTTP call in flight stops at once (its socket is shut down) instead of waiting up to the call
timeout. A beat that fails (database unreachable) is logged and retried next interval; the fence
keeps a lease that expired meanwhile safe. The lease extension commits without waiting for the WAL
flush (see ``runs_heartbeat``).

Must not: share a connection with the worker; write anything but the lease and progress events.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from collections.abc import Callable
from datetime import datetime
from uuid import UUID

from kairos import db, trace
from kairos.executors.base import Abort
from kairos.observability import logger
from kairos.probes import NO_PROBES, Probes
from kairos.runs.moves import LEASE_SECONDS
from kairos.states import EventType

HEARTBEAT_SECONDS = 20.0
PROGRESS_MIN_SECONDS = 10.0


class Heartbeat:
    """Keeps one claimed run's lease alive and watches for a lost lease or a cancel request.

    ``beat_once`` is one beat (tests call it directly); ``start`` runs it every ``interval`` seconds
    on a daemon thread until ``stop``. Each beat borrows a pooled connection, so it never shares one
    with the worker. A beat also writes ``step.progress`` for the step in flight when at least
    ``PROGRESS_MIN_SECONDS`` passed since that step started or last reported.
    """

    def __init__(
        self,
        database: db.Database,
        run_id: UUID,
        fence: int,
        *,
        interval: float = HEARTBEAT_SECONDS,
        now: datetime | None = None,
        clock: Callable[[], float] = time.monotonic,
        probes: Probes = NO_PROBES,
    ) -> None:
        self.database = database
        self.run_id = run_id
        self.fence = fence
        self.interval = interval
        self.lost = threading.Event()
        self.cancel_requested = threading.Event()
        # Fired with either event: stops the run's call in flight (kairos.executors.base.Abort).
        self.abort = Abort()
        self._now = now
        self._clock = clock
        self._probes = probes
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._step: str | None = None
        self._step_mark = 0.0  # clock of the step's start or its last progress event
        self._step_started = 0.0
        self._thread: threading.Thread | None = None
        self._starting = threading.Lock()  # start (by the dispatcher) and stop never cross

    @property
    def should_stop(self) -> bool:
        return self.lost.is_set() or self.cancel_requested.is_set()

    def step_started(self, step: str) -> None:
        with self._lock:
            self._step = step
            self._step_started = self._step_mark = self._clock()

    def step_finished(self) -> None:
        with self._lock:
            self._step = None

    def progress_due(self) -> bool:
        """Whether the step in flight may write ``step.progress`` now (at most once per
        ``PROGRESS_MIN_SECONDS`` since it started or last reported, counting the beats' events); a True
        answer counts as that step's report (``kairos.execution.live`` writes one with its characters)."""
        with self._lock:
            if self._step is None or self._clock() - self._step_mark < PROGRESS_MIN_SECONDS:
                return False
            self._step_mark = self._clock()
            return True

    def beat_once(self) -> bool:
        """Extends the lease under the fence; False once the lease is lost (another fence holds)."""
        with self._lock:
            step = self._step
            due = step is not None and self._clock() - self._step_mark >= PROGRESS_MIN_SECONDS
            elapsed_ms = int((self._clock() - self._step_started) * 1000)
        # Autocommit: the lease extension and the progress event are each one fenced statement,
        # atomic on its own, so a beat costs one round trip (two when progress is due).
        with self.database.connection() as conn:
            row = db.fetch_one(
                conn,
                "runs_heartbeat",
                {"run_id": self.run_id, "fence": self.fence, "lease_seconds": LEASE_SECONDS, "now": self._now},
            )
            if row is None:
                self.lost.set()
            else:
                if row["cancel_requested_at"] is not None:
                    self.cancel_requested.set()
                if due and step is not None:
                    seq = trace.append(conn, self.run_id, EventType.STEP_PROGRESS, data={"elapsed_ms": elapsed_ms},
                                       fence=self.fence, step=step, now=self._now)
                    if seq is not None:
                        with self._lock:
                            self._step_mark = self._clock()
        if self.lost.is_set():
            logger.warning("lease lost", extra={"action": "lease_lost", "run_id": str(self.run_id),
                                                 "fence": self.fence, "by": "heartbeat"})
        if self.should_stop and not self.abort.fired:
            self.abort.fire()
            logger.info("call in flight aborted", extra={"action": "call_aborted", "run_id": str(self.run_id),
                                                         "fence": self.fence,
                                                         "by": "lease_lost" if self.lost.is_set() else "cancel"})
        self._probes.fire("heartbeat", run_id=self.run_id, fence=self.fence, alive=not self.lost.is_set(),
                         cancel_requested=self.cancel_requested.is_set())
        return not self.lost.is_set()

    def start(self) -> Heartbeat:
        """Beats every ``interval`` from one interval on, until ``stop``. Lazily: the run's beat thread
        is started only once the first beat is due (by the process's one ``_Dispatcher``), so a run
        that ends sooner — most runs — costs no thread and no connection."""
        _DISPATCHER.add(self, self._clock_due())
        return self

    def stop(self) -> None:
        with self._starting:
            already = self._stopped.is_set()
            self._stopped.set()
            thread = self._thread
        if not already and thread is None:  # never began: its entry waits in the dispatcher's heap
            _DISPATCHER.discard()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _clock_due(self) -> float:
        return time.monotonic() + self.interval

    def _begin(self) -> None:
        """The first beat is due: the run's beat thread starts (unless the run was stopped meanwhile)."""
        with self._starting:
            if self._stopped.is_set():
                return
            self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{self.run_id}", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stopped.is_set():
            try:
                if not self.beat_once():
                    return
            except Exception:  # noqa: BLE001 - logged; the thread must outlive one bad beat
                # A failed beat (database unreachable) is retried next interval; the fence keeps a
                # lease that expired meanwhile safe.
                logger.exception("heartbeat failed", extra={"action": "heartbeat_failed",
                                                             "run_id": str(self.run_id), "fence": self.fence})
            if self._stopped.wait(self.interval):
                return


class _Dispatcher:
    """The process's one timer thread for heartbeats: it starts a run's beat thread when that run's
    first beat falls due. Started heartbeats wait in a heap by due time; a stopped one is dropped when
    it reaches the top, and the heap is rebuilt without the stopped ones once they are more than half
    of it: most runs end long before their first beat, and a process running hundreds of runs a
    second would otherwise keep every one of the last interval's heartbeats (and their locks and
    events) alive, for the garbage collector to walk on every full collection. Adding one wakes the
    thread only when it falls due before the thread would wake anyway (``_wake_at``): a run's heartbeat
    is due one interval after the last one added, so the thread, waiting for an earlier heartbeat
    (whose run has most likely ended), wakes about once per interval instead of once per run (a
    thread switch and some 0.1 ms of the process's CPU per run)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Heartbeat]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopped = 0  # stopped heartbeats still in the heap (an upper bound: the top ones go unseen)
        # When the thread wakes at the latest: the due time it waits for, infinity while it waits for
        # anything to be added, minus infinity while it runs (it looks at the heap before it waits again).
        self._wake_at = -math.inf

    def __len__(self) -> int:
        with self._cond:
            return len(self._heap)

    def discard(self) -> None:
        """A heartbeat in the heap was stopped before its first beat."""
        with self._cond:
            self._stopped += 1
            if self._stopped * 2 > len(self._heap):
                self._heap = [entry for entry in self._heap if not entry[2]._stopped.is_set()]
                heapq.heapify(self._heap)
                self._stopped = 0

    def add(self, heartbeat: Heartbeat, due: float) -> None:
        with self._cond:
            heapq.heappush(self._heap, (due, next(self._order), heartbeat))
            if self._thread is None or not self._thread.is_alive():
                self._wake_at = -math.inf
                self._thread = threading.Thread(target=self._run, name="heartbeat-dispatcher", daemon=True)
                self._thread.start()
            elif due < self._wake_at:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    while self._heap and self._heap[0][2]._stopped.is_set():
                        heapq.heappop(self._heap)
                        self._stopped = max(0, self._stopped - 1)
                    if not self._heap:
                        self._wait(math.inf)
                        continue
                    due = self._heap[0][0]
                    if due <= time.monotonic():
                        heartbeat = heapq.heappop(self._heap)[2]
                        break
                    self._wait(due)
            heartbeat._begin()

    def _wait(self, until: float) -> None:
        """Waits (the condition's lock held) until ``until`` on the monotonic clock, or a notify."""
        self._wake_at = until
        try:
            self._cond.wait(None if until == math.inf else max(0.0, until - time.monotonic()))
        finally:
            self._wake_at = -math.inf


_DISPATCHER = _Dispatcher()
