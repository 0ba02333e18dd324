"""SQS messages sent per run: runs waiting for a slot in PostgreSQL, beside the re-send loop they replace.

Workload: the 07:00 herd of 300 schedules of one owner at one instant (no jitter), 4 running
slots (the default ``KAIROS_OWNER_CONCURRENCY``), each run holding its slot ``--run-seconds``, driven
through the real tick and the real run handler (``process``) on simulated time
(``tests/support/herd.py``, tests/db/test_jitter.py's harness); every message the tick, the repair and
the run handler send is counted (a local stand-in SQS that answers at once, not moto's timing).

* **now**: a run is sent once it holds a slot; the end of a run sends the run it released.
* **before** (a model of the removed loop, the same herd): every run was sent at its fire, and a claim
  that found the owner's four slots full re-sent it with an SQS delay of 30-60 s (uniform), until a
  slot was free at its delivery — each of those re-sends a message and an invocation.

Run: ``.venv/bin/python bench/slot_messages.py [--run-seconds 8]`` (bench/herd.py's server: an
embedded PostgreSQL unless ``DATABASE_URL`` names one).
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SLOTS = 4
RUNS = 300  # bench/herd.py's herd300
MAX_DELAY = 600


def model_before(runs: int, run_seconds: float, seed: int = 40) -> tuple[int, int]:
    """(messages, expired) of the removed re-send loop for ``runs`` deliveries at one instant."""
    rng = random.Random(seed)
    events: list[tuple[float, int, int]] = [(0.0, 1, n) for n in range(runs)]  # (at, kind: 0 end / 1 delivery)
    heapq.heapify(events)
    running = messages = expired = 0
    while events:
        at, kind, n = heapq.heappop(events)
        if kind == 0:
            running -= 1
            continue
        messages += 1
        if at >= MAX_DELAY:
            expired += 1
        elif running < SLOTS:
            running += 1
            heapq.heappush(events, (at + run_seconds, 0, n))
        else:
            heapq.heappush(events, (at + rng.randint(30, 60), 1, n))
    return messages, expired


def measure_now(admin_url: str, run_seconds: float) -> tuple[int, int, int]:
    """(messages, runs, expired) through the real tick and run handler (bench/herd.py's herd300)."""
    import herd as herd_bench  # bench/herd.py

    r = herd_bench.herd300(admin_url, jitter=0, run_seconds=run_seconds, queue_max=10_000)
    return int(r["deliveries"]), int(r["succeeded"]) + int(r["expired"]), int(r["expired"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-seconds", type=float, default=8.0)
    args = parser.parse_args()
    before, before_expired = model_before(RUNS, args.run_seconds)
    print(f"| herd of {RUNS}, {SLOTS} slots, {args.run_seconds:g} s runs | messages | per run | expired |")
    print("|---|---|---|---|")
    print(f"| before (re-send loop, model) | {before} | {before / RUNS:.2f} | {before_expired} |")
    import herd as herd_bench  # bench/herd.py: its server (DATABASE_URL's, else an embedded one)

    with herd_bench.server() as (admin_url, _):
        now, made, expired = measure_now(admin_url, args.run_seconds)
    print(f"| now (runs wait in PostgreSQL) | {now} | {now / max(made, 1):.2f} | {expired} |")


if __name__ == "__main__":
    main()
