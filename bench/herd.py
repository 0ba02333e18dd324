"""The 07:00 herd with and without jitter: fire lag, start lag and runs per owner, side by side.

Two workloads, each run with jitter 0 and with jitter (``--jitter``), on one PostgreSQL server:

1. **Burst**: 10,000 schedules ``0 7 * * *`` across 100 owners (100 each, ten per conversation), all
   with the cursor at 07:00. The real tick (``Tick.run``) runs once a simulated minute from 07:00
   (``now`` injected; a stub SQS accepts every message) until every fire is recorded. *Fire lag* is
   each run's tick instant minus its occurrence's ``dispatch_at``, read back from the database (the
   minute's granularity: 0-60 s), beside the tick's wall time per minute. *Start lag* comes from a
   model of the run handler fed with those handoffs: per owner 4 running slots (the default
   ``KAIROS_OWNER_CONCURRENCY``), each run holding its slot ``--run-seconds``; a run finding its
   owner's slots full waits in the database and is released, oldest first, the moment a run of its
   owner ends (``kairos.budgets``), and a run not started by ``dispatch_at + 600`` ends ``expired``
   (the default ``max_delay_seconds``). The model is the run handler's claim rule, not the handler:
   workload 2 runs the handler itself.
2. **Herd of 300** (tests/db/test_jitter.py's workload): 300 schedules of one owner at 07:00, driven
   through the real tick and the real run handler (``process``) on simulated time
   (``tests/support/herd.py``), each run holding its slot ``--run-seconds``, the owner's queue cap
   raised to 1,000 so that what is measured is expiry (at the default 200 a third of an unjittered
   herd is refused before it queues: reported too). ``--skip-herd`` leaves it out (a few minutes).

Reported: p50/p99 of fire lag and start lag, runs expired, and runs per owner (created; started in
time: min/max over owners) — the fairness of one owner's herd is that every owner gets all of its
runs. The server is ``DATABASE_URL``'s when set (databases ``kairos_bench_herd*`` are recreated),
else an embedded one.

Run: ``.venv/bin/python bench/herd.py [--schedules 10000] [--owners 100] [--jitter 300]
[--run-seconds 8] [--skip-herd]``.
"""

from __future__ import annotations

import argparse
import heapq
import json
import logging
import os
import random
import sys
import time
import uuid
from collections import Counter, defaultdict, deque
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support.herd

import psycopg
from baseline import recreate, server
from psycopg.rows import dict_row

from kairos import migrations, runtime
from kairos.db import Database
from kairos.tick import Tick

T = datetime(2030, 3, 4, 7, 0, tzinfo=UTC)
AGENT = {"executor": "echo", "model": "echo", "system": "bench"}
SLOTS = 4
MAX_DELAY = 600


class StubSqs:
    """Accepts every entry at once (the tick's own cost)."""

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        return {"Successful": [{"Id": e["Id"], "MessageId": e["Id"]} for e in Entries], "Failed": []}


def populate(url: str, *, schedules: int, owners: int, jitter: int) -> None:
    per_owner = schedules // owners
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        conversations = [uuid.uuid4() for _ in range(schedules // 10)]
        with cur.copy("COPY conversations (id, owner, agent) FROM STDIN") as copy:
            for n, cid in enumerate(conversations):
                copy.write_row((cid, f"owner-{(n * 10) // per_owner}", json.dumps(AGENT)))
        with cur.copy("""COPY schedules (id, owner, conversation_id, prompt, kind, cron, timezone, next_fire_at,
                                          jitter_seconds) FROM STDIN""") as copy:
            for i in range(schedules):
                copy.write_row((uuid.uuid4(), f"owner-{i // per_owner}", conversations[i // 10], "Brief me.", "cron",
                                "0 7 * * *", "UTC", T, jitter))
        conn.execute("ANALYZE")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def burst(admin_url: str, *, schedules: int, owners: int, jitter: int, run_seconds: float) -> dict[str, Any]:
    url = recreate(admin_url, f"kairos_bench_herd_{jitter}")
    migrations.apply(url)
    populate(url, schedules=schedules, owners=owners, jitter=jitter)
    database = Database(url, max_size=4)
    tick = Tick(database, StubSqs(), "stub://runs", metrics=None)
    walls: list[float] = []
    now = T
    try:
        while True:
            started = time.perf_counter()
            tick.run(now=now)
            walls.append(time.perf_counter() - started)
            with psycopg.connect(url) as conn:
                row = conn.execute("SELECT count(*) FROM occurrences").fetchone()
            if row is not None and row[0] >= schedules:
                break
            now += timedelta(minutes=1)
    finally:
        database.close()
    with psycopg.connect(url, row_factory=dict_row) as conn:
        runs = conn.execute(
            "SELECT r.owner, r.created_at, coalesce(o.dispatch_at, o.fire_at) AS dispatch_at, o.decision"
            "  FROM occurrences o LEFT JOIN runs r ON r.occurrence_id = o.id").fetchall()
    decisions = Counter(r["decision"] for r in runs)
    made = [r for r in runs if r["owner"] is not None]
    fire_lags = [(r["created_at"] - r["dispatch_at"]).total_seconds() for r in made]
    starts = model_starts(made, run_seconds=run_seconds)
    start_lags = [lag for lag in starts.values() if lag is not None]
    per_owner_made = Counter(r["owner"] for r in made)
    per_owner_started: Counter[str] = Counter()
    for (owner, _), lag in starts.items():
        if lag is not None:
            per_owner_started[owner] += 1
    return {"jitter": jitter, "decisions": dict(decisions), "ticks": len(walls), "tick_wall_max_s": max(walls),
            "fire_lag_p50": pct(fire_lags, 0.5), "fire_lag_p99": pct(fire_lags, 0.99),
            "start_lag_p50": pct(start_lags, 0.5), "start_lag_p99": pct(start_lags, 0.99),
            "expired": sum(1 for lag in starts.values() if lag is None),
            "runs_per_owner": (min(per_owner_made.values()), max(per_owner_made.values())),
            "started_per_owner": (min(per_owner_started.values(), default=0),
                                  max(per_owner_started.values(), default=0))}


def model_starts(runs: list[dict[str, Any]], *, run_seconds: float) -> dict[tuple[str, int], float | None]:
    """The run handler's claim rule per owner (see the module docstring): start lag, None if expired."""
    by_owner: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        by_owner[r["owner"]].append(r)
    out: dict[tuple[str, int], float | None] = {}
    for owner, mine in by_owner.items():
        events: list[tuple[datetime, int, int]] = []  # (at, kind 0 = a slot frees / 1 = a delivery, run)
        for n, r in enumerate(mine):
            heapq.heappush(events, (r["created_at"], 1, n))
        running = 0
        waiting: deque[int] = deque()  # runs waiting in the database for a slot, oldest first
        while events:
            at, kind, n = heapq.heappop(events)
            if kind == 0:
                running -= 1
                if not waiting:
                    continue
                n = waiting.popleft()  # the end releases the oldest waiting run into its slot
            dispatch = mine[n]["dispatch_at"]
            if at >= dispatch + timedelta(seconds=MAX_DELAY):
                out[(owner, n)] = None
                if kind == 0 and waiting:  # the slot is still free: the next waiting run takes it
                    heapq.heappush(events, (at, 0, -1))
                    running += 1
            elif running < SLOTS:
                running += 1
                out[(owner, n)] = (at - dispatch).total_seconds()
                heapq.heappush(events, (at + timedelta(seconds=run_seconds), 0, n))
            else:
                waiting.append(n)
    return out


def herd300(admin_url: str, *, jitter: int, run_seconds: float, queue_max: int) -> dict[str, Any]:
    from moto import mock_aws
    from tests.support import herd

    url = recreate(admin_url, f"kairos_bench_herd300_{jitter}_{queue_max}")
    migrations.apply(url)
    populate(url, schedules=300, owners=1, jitter=jitter)
    os.environ["KAIROS_OWNER_QUEUE_MAX"] = str(queue_max)
    runtime.reset()
    random.seed(40)
    database = Database(url, max_size=8)
    try:
        with mock_aws():
            import boto3

            sqs = boto3.client("sqs", region_name="us-east-1")
            queue_url = sqs.create_queue(QueueName="runs")["QueueUrl"]
            result = herd.drive(database, url, sqs, queue_url, start=T, expected=300, run_seconds=run_seconds,
                                slots=SLOTS)
    finally:
        database.close()
    lags = [r.start_lag for r in result.runs if r.start_lag is not None]
    fire = [r.fire_lag for r in result.runs]
    states = result.states()
    return {"jitter": jitter, "queue_max": queue_max, "decisions": dict(result.decisions),
            "fire_lag_p50": pct(fire, 0.5), "fire_lag_p99": pct(fire, 0.99),
            "start_lag_p50": pct(lags, 0.5), "start_lag_p99": pct(lags, 0.99), "start_lag_max": max(lags, default=0),
            "succeeded": states["succeeded"], "expired": states["expired"], "deliveries": result.deliveries,
            "deferrals": result.deferrals}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--owners", type=int, default=100)
    parser.add_argument("--jitter", type=int, default=300)
    parser.add_argument("--herd-jitter", type=int, default=600)
    parser.add_argument("--run-seconds", type=float, default=8.0)
    parser.add_argument("--skip-herd", action="store_true")
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)
    os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "KairosBench")
    print(f"load average {os.getloadavg()[0]:.1f}")
    with server() as (admin_url, _):
        for jitter in (0, args.jitter):
            r = burst(admin_url, schedules=args.schedules, owners=args.owners, jitter=jitter,
                      run_seconds=args.run_seconds)
            print(f"burst {args.schedules} / {args.owners} owners, jitter {jitter:>4}: "
                  f"fire lag p50 {r['fire_lag_p50']:.0f} s p99 {r['fire_lag_p99']:.0f} s | "
                  f"start lag p50 {r['start_lag_p50']:.0f} s p99 {r['start_lag_p99']:.0f} s | "
                  f"expired {r['expired']} | runs per owner {r['runs_per_owner']}, started in time "
                  f"{r['started_per_owner']} | ticks {r['ticks']}, slowest {r['tick_wall_max_s']:.2f} s | "
                  f"{r['decisions']}", flush=True)
        if args.skip_herd:
            return
        for jitter, queue_max in ((0, 200), (0, 1000), (args.herd_jitter, 1000)):
            r = herd300(admin_url, jitter=jitter, run_seconds=args.run_seconds, queue_max=queue_max)
            print(f"herd 300 / 1 owner (real handlers), jitter {jitter:>4}, queue cap {queue_max}: "
                  f"fire lag p50 {r['fire_lag_p50']:.0f} s p99 {r['fire_lag_p99']:.0f} s | "
                  f"start lag p50 {r['start_lag_p50']:.0f} s p99 {r['start_lag_p99']:.0f} s "
                  f"max {r['start_lag_max']:.0f} s | succeeded {r['succeeded']} expired {r['expired']} | "
                  f"{r['decisions']} | deliveries {r['deliveries']}, deferrals {r['deferrals']}", flush=True)


if __name__ == "__main__":
    main()
