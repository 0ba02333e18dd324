"""The settle step: runs that ended are accounted to their schedule, each exactly once.

Role: for every run with ``finished_at`` set and ``settled_at`` NULL: ``failed`` adds one to its
schedule's ``consecutive_failures``, ``succeeded`` resets it, any other end changes nothing; then the
run is marked settled (a chat turn, which has no schedule, is only marked; so is a test run, which
never counts toward failures or pause and is never reported). A schedule that reaches
3 failures in a row while active is paused (revision + 1) and a ``schedule_paused`` note goes to its
conversation's inbox. Runs queued behind a run that has ended (``queue_one``, backfill chains, chat
turns) are released and handed to SQS. A settled run whose state its schedule's ``notify.on`` names
is reported (``kairos.notify.report_endings``): a ``run_ended`` inbox note and, with a webhook, one
owed delivery for the deliver step.

Guarantees: each run is settled once (the ``settled_at`` marker, set in the transaction that applies
its count and writes its report, so each run is reported once too). The schedule row is locked
before its runs, so concurrent settlers never interleave on one schedule and its runs are counted in
the order they finished. Busy schedules are skipped, not waited for: a later tick settles them.

Must not: touch runs that have not ended, or change a schedule that is not active into paused.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from kairos import db, handoff, notify
from kairos.observability import logger
from kairos.states import RunState
from kairos.tick.counts import counted
from kairos.tick.pause import pause_with_note

PAUSE_AFTER = 3
DEFAULT_LIMIT = 500


@dataclass(frozen=True)
class SettleReport:
    schedules: int = 0  # schedules locked (a full batch means more may be waiting)
    settled: int = counted()
    paused: int = counted()
    released: int = counted()
    handoff_failures: int = counted()
    notes: int = counted()  # run_ended inbox notes written
    deliveries: int = 0  # notify webhooks owed


class Settle:
    def __init__(self, database: db.Database, sqs: Any, queue_url: str, *, limit: int = DEFAULT_LIMIT,
                 pause_after: int = PAUSE_AFTER) -> None:
        self.db = database
        self.sqs = sqs
        self.queue_url = queue_url
        self.limit = limit
        self.pause_after = pause_after

    def run_once(self, now: datetime | None = None) -> SettleReport:
        with self.db.transaction() as conn:
            schedules = db.fetch_all(conn, "schedules_lock_unsettled", {"limit": self.limit})
            settled = paused = 0
            reported = notify.Reported()
            if schedules:
                runs = db.fetch_all(conn, "runs_lock_unsettled", {"schedule_ids": [s["id"] for s in schedules]})
                settled, paused, reported = self._apply(conn, schedules, runs, now)
            # Chat turns have no schedule to account to: they are only marked settled.
            settled += len(db.fetch_all(conn, "runs_settle_unscheduled", {"limit": self.limit, "now": now}))
            released = [r["id"] for r in db.fetch_all(conn, "runs_release_blocked", {"limit": self.limit, "now": now})]
        # Released runs are committed unblocked: hand them to SQS (repair resends what fails here).
        result = handoff.send(self.db, self.sqs, self.queue_url, released, now=now)
        if released:
            logger.info("queued-behind runs released", extra={"action": "runs_released", "released": len(released)})
        return SettleReport(len(schedules), settled, paused, len(released), len(result.failed), reported.notes,
                            reported.deliveries)

    def _apply(self, conn: Any, schedules: list[db.Row], runs: list[db.Row],
               now: datetime | None) -> tuple[int, int, notify.Reported]:
        by_schedule: dict[UUID, list[db.Row]] = defaultdict(list)
        counted_runs = [run for run in runs if not run["test"]]  # a test run is settled, never counted or reported
        for run in counted_runs:
            by_schedule[run["schedule_id"]].append(run)
        ids: list[UUID] = []
        failures: list[int] = []
        to_pause: list[UUID] = []
        for schedule in schedules:
            count = int(schedule["consecutive_failures"])
            failed_now = False
            for run in by_schedule.get(schedule["id"], []):  # finished order
                if run["state"] == RunState.FAILED:
                    count += 1
                    failed_now = True
                elif run["state"] == RunState.SUCCEEDED:
                    count = 0
            ids.append(schedule["id"])
            failures.append(count)
            if failed_now and count >= self.pause_after and schedule["status"] == "active":
                to_pause.append(schedule["id"])
        db.execute(conn, "schedules_set_failures", {"ids": ids, "failures": failures})
        settled = db.fetch_all(conn, "runs_mark_settled", {"ids": [r["id"] for r in runs], "now": now})
        reported = notify.report_endings(conn, schedules, counted_runs, {r["id"] for r in settled}, now)
        paused = pause_with_note(conn, to_pause, reason=f"{self.pause_after} consecutive failures",
                                 reason_code="consecutive_failures", now=now,
                                 details=lambda row: {"failures": int(row["consecutive_failures"])})
        return len(settled), len(paused), reported
