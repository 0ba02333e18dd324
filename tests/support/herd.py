"""The 07:00 herd on simulated time: the tick and the run handler's ``process``, driven minute by minute.

Many schedules fire at one nominal instant; each run holds one of its owner's running slots for
``run_seconds`` of simulated time. The driver keeps one simulated clock and injects it (``now=``) into
everything: a tick every minute (``Tick.run``), each SQS message the tick (or anything else) sends is
delivered at the instant it was sent, and a delivery calls ``process`` in its own thread at that
instant. A claimed run stops in the ``after_claim`` probe — it is ``running`` in the database, so it
holds its slot — until the clock reaches its end, then finishes. A run the claim defers (its owner's
slots are full) is delivered again after the delay its outcome names and its handoff is stamped, as
``kairos.execution.sqs``'s re-send does. Nothing sleeps: the clock jumps from event to event.

What comes back is read from the database: for each run its occurrence's ``dispatch_at``, the instant
the tick recorded it (fire lag) and ``started_at`` (start lag), its state; and the fires the owner's queue
cap turned away (``skipped_budget``). Used by tests/db/test_jitter.py and bench/herd.py.
"""

from __future__ import annotations

import heapq
import itertools
import json
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row

from kairos import handoff
from kairos.db import Database
from kairos.execution.claim import Outcome
from kairos.execution.execute import process
from kairos.probes import Probes
from kairos.settings import Settings
from kairos.tick import Tick

TICK = timedelta(minutes=1)
_FINISH, _TICK, _DELIVER = 0, 1, 2  # at one instant: slots free first, then the tick, then deliveries


@dataclass
class HerdRun:
    run_id: uuid.UUID
    owner: str
    fire_at: datetime
    dispatch_at: datetime
    fired_at: datetime  # when the tick recorded the fire and its run (and handed the run to SQS)
    started_at: datetime | None
    state: str

    @property
    def fire_lag(self) -> float:
        """Seconds from the dispatch instant to the tick that fired it."""
        return (self.fired_at - self.dispatch_at).total_seconds()

    @property
    def start_lag(self) -> float | None:
        """Seconds from the dispatch instant to the claim."""
        return None if self.started_at is None else (self.started_at - self.dispatch_at).total_seconds()


@dataclass
class Herd:
    runs: list[HerdRun]
    decisions: Counter[str]  # occurrences by decision (skipped_budget: the owner's queue cap)
    deliveries: int = 0
    deferrals: int = 0
    ended_at: datetime | None = None
    starts: list[tuple[datetime, uuid.UUID]] = field(default_factory=list)
    # Each deferral: when, which run, and how many of its owner's runs were running at that instant.
    deferred: list[tuple[datetime, uuid.UUID, int]] = field(default_factory=list)

    def states(self) -> Counter[str]:
        return Counter(r.state for r in self.runs)


class _Running:
    """One ``process`` call in its thread: claimed (stopped in the probe) or returned."""

    def __init__(self, db: Database, run_id: uuid.UUID, now: datetime, settings: Settings) -> None:
        self.run_id = run_id
        self.changed = threading.Event()
        self.claimed = False
        self.release = threading.Event()
        self.outcome: Outcome | None = None
        self.error: BaseException | None = None
        probes = Probes().on("after_claim", self._hold)
        self.thread = threading.Thread(target=self._work, args=(db, now, settings, probes), daemon=True)
        self.thread.start()

    def _hold(self, **_: Any) -> None:
        self.claimed = True
        self.changed.set()
        if not self.release.wait(timeout=600):
            raise TimeoutError("the herd driver never released this run")

    def _work(self, db: Database, now: datetime, settings: Settings, probes: Probes) -> None:
        try:
            self.outcome = process(db, self.run_id, settings=settings, now=now, probes=probes)
        except BaseException as exc:
            self.error = exc
        finally:
            self.changed.set()

    def settle(self) -> None:
        if not self.changed.wait(timeout=120):
            raise TimeoutError(f"process({self.run_id}) neither claimed nor returned")
        if self.error is not None:
            raise self.error

    def finish(self) -> None:
        self.release.set()
        self.thread.join(timeout=120)
        if self.thread.is_alive():
            raise TimeoutError(f"run {self.run_id} did not finish")
        if self.error is not None:
            raise self.error


def drive(db: Database, url: str, sqs: Any, queue_url: str, *, start: datetime, expected: int,
          run_seconds: float, slots: int, limit: timedelta = timedelta(hours=3)) -> Herd:
    """Runs the herd from ``start`` until ``expected`` occurrences are recorded and no run is queued or
    running (at most ``limit`` of simulated time); see the module docstring."""
    settings = Settings(owner_concurrency=slots)
    tick = Tick(db, sqs, queue_url, metrics=None)
    events: list[tuple[datetime, int, int, Any]] = []
    order = itertools.count()
    herd = Herd(runs=[], decisions=Counter())

    def push(at: datetime, kind: int, payload: Any) -> None:
        heapq.heappush(events, (at, kind, next(order), payload))

    def drain(at: datetime) -> None:
        while True:
            got = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
            batch = got.get("Messages", [])
            if not batch:
                return
            for message in batch:
                push(at, _DELIVER, uuid.UUID(json.loads(message["Body"])["run_id"]))
                sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])

    push(start, _TICK, None)
    while events:
        now, kind, _, payload = heapq.heappop(events)
        if now - start > limit:
            raise AssertionError(f"the herd was not done after {limit}")
        if kind == _FINISH:
            payload.finish()
            # What RunFunction does after an end: send the runs its statement released (kairos.handoff).
            handoff.send_released(db, sqs, queue_url, [payload.run_id], now=now)
            drain(now)
        elif kind == _TICK:
            tick.run(now=now)
            drain(now)
            if not _done(url, expected):
                push(now + TICK, _TICK, None)
            else:
                herd.ended_at = now
        else:
            herd.deliveries += 1
            running = _Running(db, payload, now, settings)
            running.settle()
            if running.claimed:
                herd.starts.append((now, payload))
                push(now + timedelta(seconds=run_seconds), _FINISH, running)
            elif running.outcome is not None and running.outcome.result == "slot_wait":
                # A message for a run that holds no slot (none is sent since runs wait in the database):
                # acknowledged, nothing re-sent; the run waits for its release.
                herd.deferrals += 1
                with db.transaction() as conn:
                    held = conn.execute(
                        "SELECT count(*) AS n FROM runs WHERE state = 'running'"
                        "   AND owner = (SELECT owner FROM runs WHERE id = %s)", (payload,)).fetchone()
                herd.deferred.append((now, payload, 0 if held is None else int(held["n"])))
    herd.runs, herd.decisions = _read(url)
    return herd


def _done(url: str, expected: int) -> bool:
    with psycopg.connect(url, row_factory=dict_row) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM occurrences) AS recorded,"
            "       (SELECT count(*) FROM runs WHERE state IN ('queued', 'running')) AS open").fetchone()
    assert row is not None
    return int(row["recorded"]) >= expected and int(row["open"]) == 0


def _read(url: str) -> tuple[list[HerdRun], Counter[str]]:
    with psycopg.connect(url, row_factory=dict_row) as conn:
        found = conn.execute(
            "SELECT r.id, r.owner, o.fire_at, coalesce(o.dispatch_at, o.fire_at) AS dispatch_at, r.created_at,"
            "       r.started_at, r.state"
            "  FROM runs r JOIN occurrences o ON o.id = r.occurrence_id ORDER BY dispatch_at, r.id").fetchall()
        decisions = conn.execute("SELECT decision, count(*) AS n FROM occurrences GROUP BY decision").fetchall()
    runs = [HerdRun(r["id"], r["owner"], r["fire_at"], r["dispatch_at"], r["created_at"], r["started_at"], r["state"])
            for r in found]
    return runs, Counter({d["decision"]: int(d["n"]) for d in decisions})


def ideal_starts(dispatches: list[datetime], *, slots: int, run_seconds: float) -> list[datetime]:
    """When each run (in dispatch order) would start if ``slots`` slots served them first come, first
    served, each handed over at the first tick at or after its dispatch instant: the time the slots allow."""
    free: list[datetime] = []
    starts: list[datetime] = []
    for at in sorted(dispatches):
        handed = at if at.second == 0 and at.microsecond == 0 else \
            at.replace(second=0, microsecond=0) + TICK
        begin = handed if len(free) < slots else max(handed, heapq.heappop(free))
        heapq.heappush(free, begin + timedelta(seconds=run_seconds))
        starts.append(begin)
    return starts
