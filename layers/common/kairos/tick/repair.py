"""The repair step: queued work that never reached SQS is sent again; runs of vanished workers are rescued.

Role:
* Release: owners with runs waiting for a slot have their free slots released to the oldest of
  them (``kairos.budgets``), which are sent: a release that a crash or a race left undone.
* Resend: ``queued`` runs that hold a slot, are not blocked and whose handoff never happened
  (released more than ``fresh`` ago, so a tick or worker that is about to send them is left alone)
  or happened longer than ``stale`` ago are sent to SQS again and stamped; so is a run held by its
  webhook flow (``kairos.flow``: a window, a deferral over the rate) whose hold ended more than
  ``fresh`` ago with no message sent since — its timer was lost, and this closes the window. A run
  waiting for a slot is never sent. A run SQS already accepted ``undeliverable_after`` (5) times
  since its last claim, none of which a worker claimed, is not sent again: it ends
  ``failed`` (``undeliverable``) with ``run.failed``, and the settle step counts it toward the
  schedule's three-failure pause like any failure (rather than being resent every 15 minutes forever).
* Rescue: ``running`` runs whose lease expired. Effects their worker left ``reserved`` are closed
  (a mutation becomes ``ambiguous``: its outcome is unknown; a non-mutation ``failed``). Then, in
  this order: a requested cancel ends the run ``cancelled``; a mutation that may have reached the
  outside world ends it ``failed`` (``ambiguous_effect``, never replayed); ``restarts`` at the limit
  (2) ends it ``failed`` (``restart_limit``); a scheduled run with catch-up off ends ``abandoned``
  (``abandoned_late``: a 07:00 briefing is never delivered at 11:00); otherwise it goes back to
  ``queued`` with ``restarts + 1``, a ``run.rescued`` event, and is sent again. Terminal moves clear
  the lease, set ``finished_at`` and append ``run.<state>``.

The run moves themselves (requeue, end, fail undeliverable: each one statement with its event) are
``kairos.runs.rescue``'s; this step locks, decides and sends.

Guarantees: rows are locked ``SKIP LOCKED`` for the whole step, including the SQS send and the
stamp, so concurrent ticks never repair the same run twice; every move is guarded by state, fence
and the expired lease, so a worker that heartbeats in time keeps its run. A message sent for a
rescue whose transaction then fails finds nothing to claim (the run is still ``running``) and the
next tick rescues it again.

Must not: replay a run with a possibly-applied mutation, or write with a worker's fence.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
from aws_lambda_powertools.metrics import MetricUnit

from kairos import approvals, budgets, db, handoff
from kairos.observability import logger, metrics
from kairos.runs import rescue
from kairos.states import RunState, Source
from kairos.tick.counts import counted

RESTART_LIMIT = 2
FRESH = timedelta(seconds=30)  # a tick sends its new runs right after commit: leave them this long
STALE = timedelta(minutes=15)  # a handoff older than this, with the run still queued, is redone
UNDELIVERABLE_AFTER = 5  # handoffs since the last claim, none claimed: the run fails undeliverable
DEFAULT_LIMIT = 500


@dataclass(frozen=True)
class RepairReport:
    resent: int = counted()
    resend_full: bool = False
    slots_released: int = counted()  # waiting runs released into free slots nobody had released them into
    rescued: int = counted()  # lease-expired runs handled (any outcome)
    requeued: int = counted()
    abandoned: int = counted()
    failed: int = counted()
    cancelled: int = counted()
    rescue_full: bool = False
    handoff_failures: int = counted()
    undeliverable: int = counted()  # queued runs given up after UNDELIVERABLE_AFTER unclaimed handoffs (failed)
    approvals_expired: int = counted()  # approval waits nobody decided in time: their runs ended policy_blocked


@dataclass(frozen=True)
class _Outcome:
    state: RunState
    reason_code: str | None


class Repair:
    def __init__(self, database: db.Database, sqs: Any, queue_url: str, *, limit: int = DEFAULT_LIMIT,
                 fresh: timedelta = FRESH, stale: timedelta = STALE, restart_limit: int = RESTART_LIMIT,
                 undeliverable_after: int = UNDELIVERABLE_AFTER) -> None:
        self.db = database
        self.sqs = sqs
        self.queue_url = queue_url
        self.limit = limit
        self.fresh = fresh
        self.stale = stale
        self.restart_limit = restart_limit
        self.undeliverable_after = undeliverable_after

    def run_once(self, now: datetime | None = None) -> RepairReport:
        rescued = self.rescue_once(now)
        released = self.release_once(now)
        resent = self.resend_once(now)
        with self.db.transaction() as conn:
            expired = approvals.expire_due(conn, limit=self.limit, now=now)
        return RepairReport(
            resent=resent.resent,
            resend_full=resent.resend_full,
            slots_released=released.slots_released,
            rescued=rescued.rescued,
            requeued=rescued.requeued,
            abandoned=rescued.abandoned,
            failed=rescued.failed,
            cancelled=rescued.cancelled,
            rescue_full=rescued.rescue_full,
            handoff_failures=rescued.handoff_failures + released.handoff_failures + resent.handoff_failures,
            undeliverable=resent.undeliverable,
            approvals_expired=expired,
        )

    def release_once(self, now: datetime | None = None) -> RepairReport:
        """Releases waiting runs into free slots that nobody released them into (a crash between an
        end and its release's send is repaired by ``resend_once``; this covers a release that never
        happened: a run requeued or unblocked outside a worker, a lost race), then sends them."""
        with self.db.transaction() as conn:
            owners = [str(r["owner"]) for r in db.fetch_all(conn, "runs_waiting_owners", {"limit": self.limit})]
            released = budgets.release(conn, owners, now=now)
        if not released:
            return RepairReport()
        result = handoff.send_batch(self.sqs, self.queue_url, released)
        with self.db.transaction() as conn:
            handoff.stamp(conn, result.sent, now=now)
        logger.info("waiting runs released", extra={"action": "runs_slot_released", "released": len(released),
                                                    "failed": len(result.failed)})
        return RepairReport(slots_released=len(released), handoff_failures=len(result.failed))

    def resend_once(self, now: datetime | None = None) -> RepairReport:
        with self.db.transaction() as conn:
            rows = db.fetch_all(
                conn,
                "runs_lock_unsent",
                {"now": now, "limit": self.limit, "fresh_seconds": self.fresh.total_seconds(),
                 "stale_seconds": self.stale.total_seconds()},
            )
            if not rows:
                return RepairReport()
            # Owner order: each end releases under its owner's slot lock (kairos.budgets).
            given_up = sorted((r for r in rows if int(r["unclaimed_handoffs"]) >= self.undeliverable_after),
                              key=lambda r: str(r["owner"]))
            undeliverable = self._fail_undeliverable(conn, given_up, now) if given_up else 0
            to_send = [r["id"] for r in rows if int(r["unclaimed_handoffs"]) < self.undeliverable_after]
            result = handoff.send_batch(self.sqs, self.queue_url, to_send)
            handoff.stamp(conn, result.sent, now=now)
        if to_send:
            logger.info("unsent runs handed off again",
                        extra={"action": "handoff_repaired", "resent": len(result.sent), "failed": len(result.failed)})
        return RepairReport(resent=len(result.sent), resend_full=len(rows) >= self.limit,
                            handoff_failures=len(result.failed), undeliverable=undeliverable)

    def _fail_undeliverable(self, conn: psycopg.Connection[db.Row], rows: list[db.Row], now: datetime | None) -> int:
        """Ends each locked run that SQS took ``undeliverable_after`` times without a claim ``failed``."""
        failed = 0
        for row in rows:
            done = rescue.fail_undeliverable(conn, row, handoffs=self.undeliverable_after, now=now)
            if done is None:
                continue
            failed += 1
            logger.warning("run never claimed after repeated handoffs; failed as undeliverable",
                           extra={"action": "run_undeliverable", "run_id": str(row["id"]),
                                  "schedule_id": str(done["schedule_id"]),
                                  "handoffs": int(done["unclaimed_handoffs"])})
        if failed:
            metrics.add_metric(name="RunFailed", unit=MetricUnit.Count, value=failed)
        return failed

    def rescue_once(self, now: datetime | None = None) -> RepairReport:
        with self.db.transaction() as conn:
            rows = db.fetch_all(conn, "runs_lock_expired", {"now": now, "limit": self.limit})
            if not rows:
                return RepairReport()
            run_ids = [r["id"] for r in rows]
            closed = db.fetch_all(conn, "effects_close_vanished", {"run_ids": run_ids, "now": now})
            unreplayable = {r["run_id"] for r in db.fetch_all(conn, "effects_unreplayable_runs", {"run_ids": run_ids})}
            counts = {state: 0 for state in RunState}
            requeued: list[UUID] = []
            ended: list[UUID] = []
            # Owner order: an end releases the next waiting run under its owner's slot lock, held to
            # commit (kairos.budgets); every statement that takes several takes them in this order.
            for row in sorted(rows, key=lambda r: str(r["owner"])):
                outcome = self._outcome(row, unreplayable)
                if self._apply(conn, row, outcome, now):
                    counts[outcome.state] += 1
                    if outcome.state is RunState.QUEUED:
                        requeued.append(row["id"])
                    else:
                        ended.append(row["id"])
            # The closed calls settle at the commit: their stripes are taken now, in order, the last lock.
            charged = [r["id"] for r in closed if r["charge_day"] is not None]
            if len(charged) > 1:
                budgets.lock_charged(conn, charged)
            # A requeued run keeps its slot; an ended one released the owner's next waiting runs.
            # Sent while the rows are still locked: a worker's claim waits for this commit.
            to_send = [*requeued, *budgets.unsent(conn, ended)]
            result = handoff.send_batch(self.sqs, self.queue_url, to_send)
            handoff.stamp(conn, result.sent, now=now)
        return RepairReport(
            rescued=sum(counts.values()),
            requeued=counts[RunState.QUEUED],
            abandoned=counts[RunState.ABANDONED],
            failed=counts[RunState.FAILED],
            cancelled=counts[RunState.CANCELLED],
            rescue_full=len(rows) >= self.limit,
            handoff_failures=len(result.failed),
        )

    def _outcome(self, row: db.Row, unreplayable: set[UUID]) -> _Outcome:
        if row["cancel_requested_at"] is not None:
            return _Outcome(RunState.CANCELLED, "cancelled")
        if row["id"] in unreplayable:
            return _Outcome(RunState.FAILED, "ambiguous_effect")
        if int(row["restarts"]) >= self.restart_limit:
            return _Outcome(RunState.FAILED, "restart_limit")
        if row["source"] == Source.SCHEDULED and not row["catch_up"] and not row.get("corpus_run"):
            return _Outcome(RunState.ABANDONED, "abandoned_late")
        return _Outcome(RunState.QUEUED, None)

    def _apply(self, conn: psycopg.Connection[db.Row], row: db.Row, outcome: _Outcome, now: datetime | None) -> bool:
        if outcome.state is RunState.QUEUED:
            return rescue.requeue(conn, row, now=now)
        if outcome.reason_code is None:  # every rescue outcome but a requeue names its reason
            raise RuntimeError(f"the rescue outcome {outcome.state} has no reason code")
        return rescue.end(conn, row, outcome.state, outcome.reason_code, restart_limit=RESTART_LIMIT, now=now)
