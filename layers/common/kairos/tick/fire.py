"""The fire step: due schedules become occurrences and runs, exactly once per due fire.

Role: one ``run_once`` handles one bounded batch. In one transaction it locks up to ``batch_size``
due schedules (``FOR NO KEY UPDATE SKIP LOCKED``, by database time, in ``(next_dispatch_at, id)`` order
after an optional keyset cursor ``after``: the tick resumes each batch after the last key the
previous ones claimed, so no batch rescans the index entries — and the dead row versions behind
them — of schedules already fired; the report's ``last_key`` is the key to resume after; with
``part=(k, n)`` only the schedules of owners whose hash is k modulo n, so the tick's fire workers,
each on its own part, never hold locks of the same owner at once — ``kairos.tick.loop``), decides each
(``kairos.tick.decision``), moves the cursors first (guarded by the value read: a schedule whose
cursor someone else moved is dropped from the batch), then records the occurrences, runs and
``run.queued`` events in one statement, under the owners' queue and slot locks: a run takes a free
slot of its owner in that insert (``admitted_at``) when ``kairos_release_slots`` would admit it at
once — nothing of its owner waits for a slot, it is not queued behind another run, it has no
concurrency key, and its owner holds fewer slots than its limit (the first of the batch's new runs of
that owner, in run id order, up to the free slots). After the commit it sends exactly those to SQS
(and what a cancel in the batch released into the slot it gave up), stamping their handoff
(``kairos.handoff``); there is no release round after the commit. A run inserted without a slot
waits queued until a run of its owner ends (whose statement releases it) or the tick's repair
releases it. The
``run.queued`` events are written in that statement (seq 1 of a run just inserted) rather than
through ``trace.append`` one run at a time: a batch is one round trip.

Guarantees:
* A due fire ends in exactly one occurrence and at most one run, whatever ticks run concurrently,
  repeat a minute, or die between two statements: the batch is one transaction, rows are locked,
  the cursor update is guarded, and occurrence/run ids are deterministic with unique constraints
  (a replay converges on the existing rows).
* An owner's slots hold exactly: the insert counts the owner's holders under the owner's slot lock,
  which every release, end and unreleased claim of that owner waits for, and its snapshot begins
  after the lock is taken (so it sees every end and release committed before); a run ending while
  the batch is recorded releases, after the batch commits, the runs the batch left waiting.
* Runs reach SQS only after they are committed, and only once they hold a slot; a send that fails
  (or a tick that dies before it) leaves ``handoff_at`` NULL, which the repair step notices and
  sends again (and a release a tick died before, the repair makes).
* The parts only spread the work between workers: a schedule of any part may be fired by any batch
  (a worker done with its part helps with all of them), and exactly-once rests on the row locks and
  the guarded cursor alone, never on which worker holds which part.
* A schedule whose rule can no longer be evaluated (e.g. a zone that vanished from tzdata) is paused
  with an inbox note rather than blocking the batch or being retried forever.

Lock order (no deadlock with anything that takes an owner's slot lock, ``'kairos.owner_slots:'``):
the fire's transaction takes (1) the due schedules' rows (``FOR NO KEY UPDATE SKIP LOCKED``), (2)
the rows of the runs its cancel_replace fires may cancel that hold a slot (``overlap.lock_holding``,
id order), (3) its owners' queue locks (owner order), (4) its owners' slot locks (owner order,
``schedules_hold_owner_slots``), then inserts, and only then locks other runs (``overlap.replace``:
a replaced run that holds no slot). The other takers of slot locks:
* a statement ending or parking a run that holds a slot (the trigger of migration 0030): the run's
  row, then its owner's slot lock, then the rows of that owner's waiting runs it releases. The fire
  holds such a row only from (2), before any slot lock; the waiting runs it would release are not
  the fire's (the fire's own inserts are invisible to it, and a replaced waiting run is locked by the
  fire only after (4), so the ending statement already waits for the slot lock, holding none of the
  fire's rows). A run whose statement takes its row and then the loop's schedule row
  (``goal_report``) takes the slot lock after both: it never holds the slot lock while waiting.
* ``runs_release_slots`` (the handoff of other intakes, the repair's release pass): several owners'
  slot locks in owner order, then waiting runs' rows — the same order as (4), and never a row the
  fire locked before (4) (those hold a slot, so they are not waiting).
* a claim of a run nobody released (``kairos_claim_slot_free`` in ``runs_claim``): its owner's slot
  lock, then that run's row (a waiting one: again not a row the fire holds before (4)).
* other intakes (webhook, API, chat) take queue locks, then at most their own owner's slot lock (a
  cancel's trigger) — after the queue lock, as here; no statement takes a slot lock and then a queue
  lock. A cancel in this batch (``overlap.replace``, or a new run blocked as not replace-safe) takes
  its owner's slot lock again: already held since (4).
So every transaction acquires slot locks in owner order after the queue locks, and no one waits for
a row the fire locked before its slot locks while holding a slot lock. Two batches of one tick wait
on each other's owner locks only when they share an owner: each fire worker first fires its own part
of the owners, so that happens only once a worker done with its part helps with the others' (and
between the batches of two ticks running at once) — a wait in the same order, never a deadlock.

Must not: use any clock but the database's (``now`` comes back from the lock query), send before
commit, or hold row locks while talking to SQS.

Probes (``kairos.probes``, the run worker's mechanism too) fire at each boundary — ``after_select``,
``after_cursor``, ``after_inserts`` (inside the transaction), ``after_commit`` (before the send) and
``after_send`` (before the stamp). Tests make one raise to simulate a tick dying there.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg

from kairos import db, handoff, occurrences, overlap
from kairos.errors import KairosError
from kairos.instants import iso_text
from kairos.observability import logger
from kairos.probes import NO_PROBES, Probes
from kairos.states import Decision, Source, parse
from kairos.tick.counts import counted
from kairos.tick.decision import GRACE, Due, Plan, decide
from kairos.tick.pause import pause_with_note

DEFAULT_BATCH = 500
# (next_dispatch_at, id) of a due schedule: the keyset cursor. next_dispatch_at is the cursor's nominal
# instant plus its jitter offset (a generated column; equal to next_fire_at without jitter).
Key = tuple[datetime, UUID]
START: Key = (datetime(1, 1, 1, tzinfo=UTC), UUID(int=0))  # before every key: a full scan
# (k, n): the due schedules whose owner hashes to k of n parts (``schedules_lock_due``); (0, 1) is all.
Part = tuple[int, int]
ALL: Part = (0, 1)


@dataclass(frozen=True)
class FireReport:
    """What one batch did. ``locked == 0`` means nothing was due (or all due rows were held)."""

    locked: int = counted("schedules")
    dispatched: int = counted()
    skipped: int = counted()  # skipped_late + skipped_overlap + expired + skipped_budget occurrences
    queued_behind: int = counted()
    fires_covered: int = counted()  # due instants accounted for (collapsed and skipped ones included)
    completed: int = counted()
    paused: int = counted()  # rules that no longer evaluate
    conflicts: int = counted()  # cursors someone else had moved, occurrences recorded before
    handoff_failures: int = counted()
    lags: tuple[float, ...] = field(default=(), repr=False)  # now - dispatch_at of dispatched fires, seconds
    db_seconds: float = counted("fire_db_seconds", default=0.0)
    sqs_seconds: float = counted("fire_sqs_seconds", default=0.0)
    last_key: Key | None = None  # the last (next_dispatch_at, id) locked: where the next batch may resume


class Fire:
    """Fires due schedules in bounded batches (see the module docstring)."""

    def __init__(self, database: db.Database, sqs: Any, queue_url: str, *, batch_size: int = DEFAULT_BATCH,
                 grace: timedelta = GRACE, probes: Probes = NO_PROBES) -> None:
        self.db = database
        self.sqs = sqs
        self.queue_url = queue_url
        self.batch_size = batch_size
        self.grace = grace
        self.probes = probes

    def run_once(self, now: datetime | None = None, after: Key | None = None, part: Part = ALL) -> FireReport:
        """One batch: the due schedules after the key ``after`` (all due ones when None), of the
        owners in ``part`` (every owner by default)."""
        started = time.perf_counter()
        after_at, after_id = after or START
        k, n = part
        with self.db.transaction() as conn:
            rows = db.fetch_all(conn, "schedules_lock_due", {"now": now, "limit": self.batch_size,
                                                             "after_at": after_at, "after_id": after_id,
                                                             "part": k, "parts": n})
            if not rows:
                return FireReport()
            db_now: datetime = rows[0]["db_now"]
            self.probes.fire("after_select")
            plans, broken = self._decide(rows, db_now)
            moved = self._advance(conn, plans, now)
            conflicts = len(plans) - len(moved)
            if conflicts:
                plans = [p for p in plans if p.schedule_id in moved]
            self.probes.fire("after_cursor")
            # The runs a cancel_replace may end, locked before the owners' slot locks (see above).
            overlap.lock_holding(conn, sorted({o.replaces_run_id for p in plans for o in p.occurrences
                                               if o.replaces_run_id is not None}))
            inserted = self._record(conn, plans, now)
            blocked, replaced = self._replace(conn, plans, inserted, now)
            self.probes.fire("after_inserts")
            paused = self._pause_broken(conn, broken, now)
        db_seconds = time.perf_counter() - started
        # Committed: the runs exist. Only now may their ids reach SQS.
        self.probes.fire("after_commit")
        # Only runs that hold a slot go: those inserted holding one, and those a cancel (of a replaced
        # run, or of a new run blocked as not replace-safe) released into the slot it gave up. The
        # rest wait queued until a run of their owner ends, or the repair releases them (kairos.budgets).
        to_send = [row["run_id"] for row in inserted
                   if row["admitted"] and (not blocked or row["run_id"] not in blocked)]
        ended = [*replaced, *blocked]
        if ended:
            admit_started = time.perf_counter()
            to_send = [*to_send, *handoff.admit(self.db, [], now=now, ended=ended)]
            db_seconds += time.perf_counter() - admit_started
        result = handoff.send_batch(self.sqs, self.queue_url, to_send)
        self.probes.fire("after_send")
        if result.sent:
            stamp_started = time.perf_counter()
            with self.db.transaction() as conn:
                handoff.stamp(conn, result.sent, now=now)
            db_seconds += time.perf_counter() - stamp_started
        return self._report(rows, plans, inserted, db_now, conflicts, paused, result, db_seconds)

    def _decide(self, rows: list[db.Row], db_now: datetime) -> tuple[list[Plan], list[db.Row]]:
        plans: list[Plan] = []
        broken: list[db.Row] = []
        for row in rows:
            try:
                plans.append(decide(Due.from_row(row), db_now, grace=self.grace))
            except (KairosError, ValueError, OverflowError) as exc:
                logger.error(
                    "schedule rule cannot be evaluated; pausing it",
                    extra={"action": "fire_rule_error", "schedule_id": str(row["id"]), "error": type(exc).__name__,
                           "detail": str(exc)[:300]},
                )
                broken.append(row)
        return plans, broken

    def _advance(self, conn: psycopg.Connection[db.Row], plans: list[Plan], now: datetime | None) -> set[UUID]:
        if not plans:
            return set()
        moves = [
            {"id": str(p.schedule_id), "read_next_fire_at": iso_text(p.read_next_fire_at),
             "next_fire_at": _iso(p.next_fire_at), "last_fire_at": _iso(p.last_fire_at),
             "runs_created": p.runs_created, "completed": p.completed}
            for p in plans
        ]
        rows = db.fetch_all(conn, "schedules_advance_cursor", {"moves": json.dumps(moves), "now": now})
        moved = {row["id"] for row in rows}
        if len(moved) == len(plans):  # each plan's schedule once, and only theirs come back: all moved
            return moved
        for plan in plans:
            if plan.schedule_id not in moved:
                logger.warning("cursor moved by someone else; nothing recorded for this schedule",
                               extra={"action": "fire_cursor_conflict", "schedule_id": str(plan.schedule_id)})
        return moved

    def _record(self, conn: psycopg.Connection[db.Row], plans: list[Plan], now: datetime | None) -> list[db.Row]:
        return occurrences.record(conn, [
            occurrences.planned(
                occurrence_id=o.id, schedule_id=plan.schedule_id, source=Source.SCHEDULED, fire=o.fire,
                dispatch_at=o.dispatch_at, revision=plan.revision, decision=o.decision, run_id=o.run_id,
                blocked_by=o.blocked_by_run_id,
                covers_from=o.covers_from, covers_until=o.covers_until, covers_count=o.covers_count)
            for plan in plans
            for o in plan.occurrences
        ], now=now, admit=True)

    def _replace(self, conn: psycopg.Connection[db.Row], plans: list[Plan], inserted: list[db.Row],
                 now: datetime | None) -> tuple[set[UUID], list[UUID]]:
        """cancel_replace: each new run replaces its schedule's active run (the replaced are returned
        second: their cancel may have released a waiting run, this tick's to send), or is blocked (first)."""
        blocked: set[UUID] = set()
        replaced: list[UUID] = []
        if not any(o.replaces_run_id is not None for plan in plans for o in plan.occurrences):
            return blocked, replaced  # no cancel_replace fire in the batch (the usual one)
        recorded = {row["run_id"] for row in inserted if row["run_id"] is not None}
        for plan in plans:
            for o in plan.occurrences:
                new, old = o.run_id, o.replaces_run_id
                if new not in recorded or new is None or old is None:
                    continue
                if overlap.replace(conn, old_run_id=old, new_run_id=new, now=now):
                    replaced.append(old)
                else:
                    blocked.add(new)
        return blocked, replaced

    def _pause_broken(self, conn: psycopg.Connection[db.Row], broken: list[db.Row], now: datetime | None) -> int:
        return len(pause_with_note(conn, [r["id"] for r in broken], reason_code="rule_error", now=now,
                                   reason="the schedule's rule can no longer be evaluated"))

    def _report(self, rows: list[db.Row], plans: list[Plan], inserted: list[db.Row], db_now: datetime,
                conflicts: int, paused: int, result: handoff.HandoffResult, db_seconds: float) -> FireReport:
        # The decision as recorded: the owner's queue cap may have made a planned fire skipped_budget.
        recorded = {row["occurrence_id"]: parse(Decision, row["decision"]) for row in inserted}
        dispatched = skipped = queued_behind = covered = 0
        lags: list[float] = []
        for plan in plans:
            for o in plan.occurrences:
                if o.id not in recorded:
                    conflicts += 1
                    continue
                covered += o.covers_count
                decision = recorded[o.id]
                if decision is Decision.DISPATCHED:
                    dispatched += 1
                    lags.append((db_now - o.dispatch_at).total_seconds())
                elif decision is Decision.QUEUED_BEHIND:
                    queued_behind += 1
                else:
                    skipped += 1
                    logger.info(
                        "fire not dispatched",
                        extra={"action": "fire_skipped", "schedule_id": str(plan.schedule_id),
                               "occurrence_id": str(o.id), "decision": decision.value,
                               "fire_at": o.fire_at.isoformat(), "covers_count": o.covers_count},
                    )
        report = FireReport(
            locked=len(rows),
            last_key=(rows[-1]["next_dispatch_at"], rows[-1]["id"]),
            dispatched=dispatched,
            skipped=skipped,
            queued_behind=queued_behind,
            fires_covered=covered,
            completed=sum(1 for p in plans if p.completed),
            paused=paused,
            conflicts=conflicts,
            handoff_failures=len(result.failed),
            lags=tuple(lags),
            db_seconds=db_seconds,
            sqs_seconds=result.seconds,
        )
        logger.info(
            "fire batch committed",
            extra={"action": "fire_batch", "locked": report.locked, "dispatched": dispatched, "skipped": skipped,
                   "queued_behind": queued_behind, "completed": report.completed, "conflicts": conflicts,
                   "handoff_failures": report.handoff_failures,
                   "max_lag_seconds": max(lags) if lags else None,
                   "median_lag_seconds": statistics.median(lags) if lags else None},
        )
        return report


def _iso(value: datetime | None) -> str | None:
    return None if value is None else iso_text(value)
