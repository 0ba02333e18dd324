"""The tick's loop: ``Tick.run`` calls the steps in their order and totals their reports.

Role: the one place that knows the order of a tick's steps (``kairos.tick`` says what each does and
why in that order) and turns their reports into the ``TickReport`` the handler returns, its log
line and its metrics. Guarantees and must-nots are the package's (``kairos.tick``).
"""


from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from kairos import db, heap
from kairos.observability import logger
from kairos.observability import metrics as default_metrics
from kairos.probes import NO_PROBES, Probes
from kairos.settings import DEFAULT_RETENTION_DAYS
from kairos.tick.counts import add_up
from kairos.tick.decision import GRACE
from kairos.tick.deliver import Deliver, DeliverReport
from kairos.tick.fire import DEFAULT_BATCH, Fire, FireReport, Key
from kairos.tick.prune import Prune, PruneReport
from kairos.tick.repair import Repair, RepairReport
from kairos.tick.settle import Settle, SettleReport

MIN_REMAINING_MS = 10_000  # stop starting new batches when less of the invocation is left
FIRE_WORKERS = 2  # fire batches in flight at once within one tick (each on its own pooled connection)
Clock = Callable[[], datetime]


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class TickReport:
    """Counts of one tick (the handler returns ``as_dict()``)."""

    settled: int = 0
    paused: int = 0  # by settle (3 failures) and by fire (rule no longer evaluates)
    released: int = 0  # queued-behind runs whose blocker ended
    slots_released: int = 0  # waiting runs the repair released into free slots (kairos.budgets)
    resent: int = 0
    rescued: int = 0
    requeued: int = 0
    abandoned: int = 0
    failed: int = 0
    cancelled: int = 0
    undeliverable: int = 0  # queued runs failed after five unclaimed handoffs
    approvals_expired: int = 0  # approval waits that expired (their runs ended policy_blocked)
    batches: int = 0
    schedules: int = 0  # due schedules handled
    dispatched: int = 0
    skipped: int = 0
    queued_behind: int = 0
    fires_covered: int = 0
    completed: int = 0
    conflicts: int = 0
    handoff_failures: int = 0
    pruned: int = 0  # expired webhook and idempotent-create receipts deleted
    notes: int = 0  # run_ended inbox notes written by settle
    notify_delivered: int = 0  # notify webhooks accepted by their receivers
    notify_retried: int = 0
    notify_gave_up: int = 0
    runs_pruned: int = 0  # ended runs past retention: payload cleared, own thread emptied (kairos.tick.prune)
    threads_pruned: int = 0
    entries_pruned: int = 0
    payloads_pruned: int = 0
    steps_pruned: int = 0  # step-log rows, corpus outputs and records deleted past retention
    corpus_rows_pruned: int = 0
    previews_pruned: int = 0  # approvals' argument previews and input requests' questions forgotten
    questions_pruned: int = 0
    reservations_pruned: int = 0  # settled budget reservations cleared (the daily ledger keeps the totals)
    fire_lag_p50_seconds: float | None = None
    fire_lag_max_seconds: float | None = None
    fire_db_seconds: float = 0.0  # fire batches: database work, and SQS calls, wall time
    fire_sqs_seconds: float = 0.0
    duration_ms: float = 0.0
    stopped_for_time: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Totals:
    settle: list[SettleReport]
    repair: list[RepairReport]
    fire: list[FireReport]
    prune: list[PruneReport] = field(default_factory=list)
    deliver: list[DeliverReport] = field(default_factory=list)

    def report(self, duration_ms: float, stopped_for_time: bool) -> TickReport:
        """The step reports' counted fields summed by name (``kairos.tick.counts``), plus what is not a sum."""
        sums = add_up([(SettleReport, self.settle), (RepairReport, self.repair), (FireReport, self.fire),
                              (PruneReport, self.prune), (DeliverReport, self.deliver)])
        lags = [lag for f in self.fire for lag in f.lags]
        return TickReport(
            **sums,
            batches=sum(1 for f in self.fire if f.locked),
            fire_lag_p50_seconds=statistics.median(lags) if lags else None,
            fire_lag_max_seconds=max(lags) if lags else None,
            duration_ms=duration_ms,
            stopped_for_time=stopped_for_time,
        )


class Tick:
    """One tick over a database and a queue. Cheap to build; holds no connection of its own."""

    def __init__(self, database: db.Database, sqs: Any, queue_url: str, clock: Clock | None = None, *,
                 batch_size: int = DEFAULT_BATCH, grace: timedelta = GRACE, probes: Probes = NO_PROBES,
                 metrics: Any = default_metrics, min_remaining_ms: int = MIN_REMAINING_MS,
                 fire_workers: int = FIRE_WORKERS, retention_days: int = DEFAULT_RETENTION_DAYS,
                 egress_allow: Sequence[str] = ()) -> None:
        if not queue_url:
            raise ValueError("the tick needs the run queue's URL (RUN_QUEUE_URL)")
        self.db = database
        self.clock: Clock = clock or _utc_now
        self.metrics = metrics
        self.min_remaining_ms = min_remaining_ms
        self.fire_workers = max(1, fire_workers)
        self.settle = Settle(database, sqs, queue_url)
        self.repair = Repair(database, sqs, queue_url)
        self.fire = Fire(database, sqs, queue_url, batch_size=batch_size, grace=grace, probes=probes)
        self.deliver = Deliver(database, allow=egress_allow)
        self.prune = Prune(database, retention_days=retention_days)

    def run_once(self, now: datetime | None = None) -> TickReport:
        """One pass of each step (one fire batch): what tests drive step by step."""
        started = time.perf_counter()
        totals = _Totals([self.settle.run_once(now)], [self.repair.run_once(now)], [self.fire.run_once(now)],
                         deliver=[self.deliver.run_once(now)])
        report = totals.report((time.perf_counter() - started) * 1000, False)
        self._emit(report)
        return report

    def run(self, remaining_ms: Callable[[], int] | None = None, *, now: datetime | None = None) -> TickReport:
        """The whole tick: settle, repair, then fire batches until none are due or time runs short.

        Runs with the collector's young threshold raised (``kairos.heap``): the batches' objects die by
        reference counting, and full collections no longer run mid-tick to find that out."""
        with heap.batch_threshold():
            return self._run(remaining_ms, now)

    def _run(self, remaining_ms: Callable[[], int] | None, now: datetime | None) -> TickReport:
        started = time.perf_counter()
        self._log_start(now)

        def time_left() -> bool:
            return remaining_ms is None or remaining_ms() >= self.min_remaining_ms

        totals = _Totals([], [], [])
        while True:
            settled = self.settle.run_once(now)
            totals.settle.append(settled)
            if settled.schedules < self.settle.limit or not time_left():
                break
        while time_left():
            repaired = self.repair.run_once(now)
            totals.repair.append(repaired)
            if not (repaired.rescue_full or repaired.resend_full):
                break
        stopped = self._fire_all(now, time_left, totals.fire)
        while not stopped and time_left():  # after the fires: a slow receiver never delays one
            delivered = self.deliver.run_once(now, time_left)
            totals.deliver.append(delivered)
            if not delivered.full:
                break
        while not stopped and time_left():  # the cleaner last: it never delays a fire
            pruned = self.prune.run_once(now)
            totals.prune.append(pruned)
            if not pruned.full:
                break
        report = totals.report((time.perf_counter() - started) * 1000, stopped)
        self._emit(report)
        logger.info("tick finished", extra={"action": "tick_finished", **report.as_dict()})
        return report

    def _fire_all(self, now: datetime | None, time_left: Callable[[], bool], reports: list[FireReport]) -> bool:
        """Fire batches until none is due; with several workers, batches overlap, so one batch's SQS
        calls and Python work run while another waits on the database (``_FireWorkers``)."""
        workers = _FireWorkers(self.fire, self.fire_workers, now, time_left, reports)
        if self.fire_workers == 1:
            workers.loop(0)
        else:
            threads = [threading.Thread(target=workers.loop, args=(i,), name=f"tick-fire-{i}")
                       for i in range(self.fire_workers)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        if workers.failures:
            raise workers.failures[0]
        return workers.stopped

    def _log_start(self, now: datetime | None) -> None:
        lambda_now = self.clock()
        with self.db.transaction() as conn:
            row = db.fetch_row(conn, "schedules_due_backlog", {"now": now})
        logger.info(
            "tick started",
            extra={"action": "tick_started", "due": int(row["due"]), "db_now": row["now"].isoformat(),
                   "lambda_now": lambda_now.isoformat(),
                   "clock_skew_seconds": round((lambda_now - row["now"]).total_seconds(), 3)},
        )

    def _emit(self, report: TickReport) -> None:
        if self.metrics is None:
            return
        m = self.metrics
        # FiresDispatched counts fires that created a run (queued_behind runs start once their blocker ends).
        m.add_metric(name="FiresDispatched", unit=MetricUnit.Count, value=report.dispatched + report.queued_behind)
        m.add_metric(name="FiresSkipped", unit=MetricUnit.Count, value=report.skipped)
        m.add_metric(name="Rescues", unit=MetricUnit.Count, value=report.rescued)
        m.add_metric(name="RunsSettled", unit=MetricUnit.Count, value=report.settled)
        m.add_metric(name="SchedulesPaused", unit=MetricUnit.Count, value=report.paused)
        m.add_metric(name="TickDurationMs", unit=MetricUnit.Milliseconds, value=report.duration_ms)
        m.add_metric(name="RunsPruned", unit=MetricUnit.Count, value=report.runs_pruned)
        m.add_metric(name="EntriesPruned", unit=MetricUnit.Count, value=report.entries_pruned)
        if report.fire_lag_max_seconds is not None:
            m.add_metric(name="FireLagSeconds", unit=MetricUnit.Seconds, value=report.fire_lag_max_seconds)


class _FireWorkers:
    """The fire batches of one tick, on ``parts`` workers.

    Each of n workers first fires its own part of the owners (worker k: owners hashing to k of n,
    ``Fire.run_once(part=...)``), so two workers' batches never share an owner and never wait on each
    other's owner queue and slot locks (held to a batch's commit). A worker resumes each batch after
    the last ``(next_dispatch_at, id)`` it claimed (a keyset cursor of its own), so it never walks back
    over the index entries (and, under a long-running snapshot, the unprunable dead row versions) of
    schedules fired earlier in this tick; when a resumed batch finds nothing, one batch from the start
    of its part picks up what the cursor passed (rows another tick held, schedules due earlier than the
    cursor since). When that finds nothing, the worker helps with every owner: batches of all parts
    after a cursor shared by the helpers, the same way — what is left of a slower worker's part (or
    everything, when one owner holds all the due schedules). The tick ends when every worker's batch
    from the start of all parts finds nothing. The parts only spread the work: exactly-once rests on
    the row locks and the guarded cursor, whoever fires a schedule. A worker that raises halts the
    others after their batch; the caller re-raises.
    """

    def __init__(self, fire: Fire, parts: int, now: datetime | None, time_left: Callable[[], bool],
                 reports: list[FireReport]) -> None:
        self.fire = fire
        self.parts = parts
        self.now = now
        self.time_left = time_left
        self.reports = reports
        self.failures: list[BaseException] = []
        self.stopped = False  # time ran short
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._shared: Key | None = None

    def loop(self, k: int) -> None:
        try:
            if self.parts == 1 or self._own_part(k):
                self._every_owner()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread (Tick._fire_all)
            self.failures.append(exc)
            self._halt.set()

    def _go_on(self) -> bool:
        if self._halt.is_set():
            return False
        if not self.time_left():
            self.stopped = True
            return False
        return True

    def _own_part(self, k: int) -> bool:
        """Worker k's part; True when it is done (a batch from the start of it found nothing)."""
        after: Key | None = None
        while self._go_on():
            fired = self.fire.run_once(self.now, after=after, part=(k, self.parts))
            self.reports.append(fired)
            if fired.last_key is not None:
                after = fired.last_key
            elif after is None:
                return True
            else:
                after = None  # this pass is done: next, one batch from the start of the part
        return False

    def _every_owner(self) -> None:
        while self._go_on():
            with self._lock:
                after = self._shared
            fired = self.fire.run_once(self.now, after=after)
            self.reports.append(fired)
            with self._lock:
                if fired.last_key is not None:
                    if self._shared is None or fired.last_key > self._shared:
                        self._shared = fired.last_key
                    continue
                if after is None:
                    return  # a batch from the start found nothing due
                if self._shared == after:
                    self._shared = None  # this pass is done: next, one batch from the start
