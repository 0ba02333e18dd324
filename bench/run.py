"""Run-worker throughput: Kairos run lifecycles per second beside two baselines on the same server.

What is measured (all on one PostgreSQL server, one database each, same run):

1. **pgbench** ``-b simple-update -c 8 -j 2 -T 10`` (scale 1): the server's own transaction rate
   for a small update transaction, the ceiling any job system on this box works under.
2. **Kairos run lifecycle** with 8 worker processes (how Lambda runs it: one container, one
   process, one run at a time), with 8 threads of one process (the local stack), and with 1: N
   queued runs (inserted up front, not timed), each taken through the real library functions, as
   ``runs.worker.process`` writes them — (1) ``runs.moves.claim``: the guarded claim, ``run.claimed`` and
   ``step.started`` in one statement; (2) one heartbeat (``Heartbeat.beat_once``, its own pooled
   connection); (3) ``moves.succeed``: the fenced terminal update with ``step.finished`` and
   ``run.succeeded`` in one statement. Three commits, four trace events, one connection per run.
   No executor call, no conversation entries and no SQS: this is the database work of the lifecycle.
3. **Procrastinate** (``App`` + ``PsycopgConnector``, its schema in a third database) with 8
   concurrent coroutines: the equivalent job cycle ``defer`` → ``fetch_job`` → ``finish_job``
   (its ``JobManager`` directly, without its worker's polling, sleeps and middleware, which would
   only slow it down). Reported both for the full cycle (defer + fetch + finish, three commits)
   and for fetch + finish alone.

Targets: Kairos lifecycles/s ÷ pgbench TPS ≥ 0.2; Kairos ≥ Procrastinate's cycle.

The server is ``DATABASE_URL``'s when set (its databases ``kairos_bench*`` are dropped and
recreated), else an embedded one started here with default durability settings (fsync on).

Run: ``.venv/bin/python bench/run.py [--runs N] [--seconds S]``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import queue
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from baseline import pgbench_tps, recreate, server
from kairos import migrations, trace
from kairos.db import Database
from kairos.runs import moves
from kairos.runs.heartbeat import Heartbeat
from kairos.runs.worker import process
from kairos.settings import Settings
from kairos.states import EventType

WORKERS = 8
# One owner ('bench') runs every worker's runs: its budgets must not be what is measured.
SETTINGS = Settings(owner_concurrency=1000, owner_queue_max=100_000, owner_daily_tokens=10**12,
                    owner_daily_cost_usd=10**9)


# --- pgbench ---------------------------------------------------------------------------------------


# --- Kairos --------------------------------------------------------------------------------------------


def seed_runs(url: str, count: int, mode: str = "append") -> list[uuid.UUID]:
    """One conversation and schedule, ``count`` occurrences and queued runs (not timed)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conv, sched = uuid.uuid4(), uuid.uuid4()
        conn.execute("INSERT INTO conversations (id, owner, agent) VALUES (%s, 'bench', '{\"executor\": \"echo\"}')",
                     (conv,))
        conn.execute("""INSERT INTO schedules (id, owner, conversation_id, prompt, kind, token_hash)
                        VALUES (%s, 'bench', %s, 'p', 'webhook', md5(random()::text))""", (sched, conv))
        rows = conn.execute(
            """WITH o AS (
                   INSERT INTO occurrences (id, schedule_id, source, fire_at, local_time, utc_offset, timezone,
                                            tzdata_version, schedule_revision, decision, idempotency_key)
                   SELECT gen_random_uuid(), %(s)s, 'webhook', now(), now()::timestamp, interval '0', 'UTC', 'b', 1,
                          'dispatched', g::text
                     FROM generate_series(1, %(n)s) g
                   RETURNING id)
               INSERT INTO runs (id, occurrence_id, schedule_id, owner, source, source_conversation_id,
                                 conversation_id, mode, prompt, agent)
               SELECT gen_random_uuid(), o.id, %(s)s, 'bench', 'webhook', %(c)s,
                      CASE WHEN %(m)s = 'append' THEN %(c)s END, %(m)s, 'p', '{"executor": "echo"}'
                 FROM o
               RETURNING id""", {"s": sched, "c": conv, "n": count, "m": mode}).fetchall()
    return [r[0] for r in rows]


def lifecycle(database: Database, run_id: uuid.UUID) -> None:
    """One run as ``runs.worker.process`` writes it, without the executor call and the conversation entries:
    the claim (with ``run.claimed`` and ``step.started``), one heartbeat, and the terminal update
    (with ``step.finished`` and ``run.succeeded``). Three statements, each its own transaction."""
    with database.connection() as conn:  # one connection for the run; each statement commits alone
        row = moves.claim(conn, run_id, owner_slots=SETTINGS.owner_concurrency)
        assert row is not None
        fence = int(row["fence"])
        assert Heartbeat(database, run_id, fence).beat_once()  # on its own pooled connection
        done = moves.succeed(conn, run_id, fence, output={"conversation_id": "x", "entry_seq": 1, "attempt": 1},
                            usage={"calls": 1},
                            events=[trace.Event(EventType.STEP_FINISHED, "model", {"outcome": "succeeded"})])
        assert done


def full_process(database: Database, run_id: uuid.UUID) -> None:
    """One run through ``runs.worker.process`` with the ``echo`` executor: everything the run Lambda does
    per run except SQS — claim, prompt entry, transcript read, heartbeat thread, effect reserved and
    settled, answer entry, terminal state."""
    outcome = process(database, run_id, settings=SETTINGS)
    assert outcome.result == "succeeded", outcome


def _thread_workers(url: str, ids: list[uuid.UUID], workers: int,
                    one: Callable[[Database, uuid.UUID], None] = lifecycle) -> float:
    work: queue.SimpleQueue[uuid.UUID | None] = queue.SimpleQueue()
    for run_id in ids:
        work.put(run_id)
    for _ in range(workers):
        work.put(None)
    database = Database(url, max_size=2 * workers)
    errors: list[Exception] = []
    start_line = threading.Barrier(workers + 1)

    def worker() -> None:
        with database.connection() as conn:  # warm one connection per worker outside the timing
            conn.execute("SELECT 1")
        start_line.wait()
        while (run_id := work.get()) is not None:
            try:
                one(database, run_id)
            except Exception as exc:  # noqa: BLE001 - reported after the join, not hidden
                errors.append(exc)
                return

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for t in threads:
        t.start()
    start_line.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    database.close()
    if errors:
        raise errors[0]
    return elapsed


def _process_worker(url: str, ids: list[uuid.UUID], next_index: Any, start_line: Any, finished: Any) -> None:
    logging.getLogger("kairos").setLevel(logging.WARNING)
    database = Database(url, max_size=2)
    with database.connection() as conn:
        conn.execute("SELECT 1")
    start_line.wait()
    while True:
        with next_index.get_lock():  # one shared queue, as with threads: no process idles at the end
            index = next_index.value
            next_index.value += 1
        if index >= len(ids):
            break
        lifecycle(database, ids[index])
    finished.put(time.monotonic())  # before the process's own teardown, which is not run work
    database.close()


def _process_workers(url: str, ids: list[uuid.UUID], workers: int) -> float:
    context = multiprocessing.get_context("spawn")
    start_line = context.Barrier(workers + 1)
    finished = context.Queue()
    next_index = context.Value("i", 0)
    children = [context.Process(target=_process_worker, args=(url, ids, next_index, start_line, finished))
                for _ in range(workers)]
    for child in children:
        child.start()
    start_line.wait()
    started = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process on the host
    ended: float = max(finished.get(timeout=3600) for _ in children)
    for child in children:
        child.join()
    if any(child.exitcode != 0 for child in children):
        raise RuntimeError("a worker process failed")
    return ended - started


def kairos_rate(url: str, count: int, workers: int, *, processes: bool = False, full: bool = False) -> float:
    """Lifecycles (or, with ``full``, whole ``runs.worker.process`` calls) per second over ``count`` fresh
    runs, with ``workers`` threads or processes."""
    # A full run in append mode would read the one shared transcript, growing with every run.
    ids = seed_runs(url, count, "fresh" if full else "append")
    if full:
        elapsed = _thread_workers(url, ids, workers, full_process)
    else:
        elapsed = (_process_workers if processes else _thread_workers)(url, ids, workers)
    with psycopg.connect(url) as conn:
        done = conn.execute("SELECT count(*) FROM runs WHERE state = 'succeeded' AND id = ANY(%s)", (ids,)).fetchone()
    assert done is not None and done[0] == count, done
    return count / elapsed


# --- Procrastinate -------------------------------------------------------------------------------------


async def procrastinate_rates(url: str, count: int, workers: int) -> tuple[float, float]:
    import procrastinate
    from procrastinate.jobs import Status

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url, min_size=workers,
                                                                     max_size=workers))

    @app.task(name="bench", queue="bench")
    def bench_task() -> None:  # never executed: the cycle below fetches and finishes jobs itself
        return None

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        manager = app.job_manager
        worker_ids = [await manager.register_worker() for _ in range(workers)]

        async def defer_some(n: int) -> None:
            for _ in range(n):
                await bench_task.defer_async()

        async def work(worker_id: int) -> int:
            done = 0
            while (job := await manager.fetch_job(queues=["bench"], worker_id=worker_id)) is not None:
                await manager.finish_job(job, status=Status.SUCCEEDED, delete_job=False)
                done += 1
            return done

        share = [count // workers + (1 if i < count % workers else 0) for i in range(workers)]
        started = time.perf_counter()
        await asyncio.gather(*(defer_some(n) for n in share))
        deferred = time.perf_counter()
        finished = sum(await asyncio.gather(*(work(w) for w in worker_ids)))
        ended = time.perf_counter()
    assert finished == count, finished
    return count / (ended - started), count / (ended - deferred)


# --- main ----------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2000, help="runs (and jobs) per measurement")
    parser.add_argument("--seconds", type=int, default=10, help="pgbench duration")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of pgbench, 8 processes and 8 threads, interleaved; medians are reported")
    args = parser.parse_args()
    logging.getLogger("kairos").setLevel(logging.WARNING)  # the library logs every claim at INFO
    logging.getLogger("procrastinate").setLevel(logging.ERROR)

    with server() as (admin_url, pgbench_binary):
        kairos_url = recreate(admin_url, "kairos_bench")
        migrations.apply(kairos_url)
        pgbench_url = recreate(admin_url, "kairos_bench_pgbench")
        # The machine's noise moves every series by 10-20 % from one minute to the next: interleave
        # the three compared series and report each one's median (and the ratio of every round).
        rounds: list[tuple[float | None, float, float]] = []
        for _ in range(max(1, args.rounds)):
            rounds.append((pgbench_tps(pgbench_binary, pgbench_url, args.seconds),
                           kairos_rate(kairos_url, args.runs, WORKERS, processes=True),
                           kairos_rate(kairos_url, args.runs, WORKERS)))
        measured = [r[0] for r in rounds if r[0] is not None]
        tps = statistics.median(measured) if measured else None
        kairos_8 = statistics.median(r[1] for r in rounds)
        kairos_8_threads = statistics.median(r[2] for r in rounds)
        kairos_1 = kairos_rate(kairos_url, max(200, args.runs // 4), 1)
        kairos_full = kairos_rate(kairos_url, args.runs, WORKERS, full=True)
        full, fetch_finish = asyncio.run(procrastinate_rates(recreate(admin_url, "kairos_bench_procrastinate"),
                                                              args.runs, WORKERS))

    def ratio(value: float, base: float | None) -> str:
        return "n/a" if not base else f"{value / base:.2f}"

    print()
    print(f"Run lifecycles: {args.runs} runs/jobs, {WORKERS} concurrent clients unless noted; pgbench and the")
    print(f"8-worker series are medians of {len(rounds)} interleaved rounds.")
    print()
    for i, (round_tps, procs, threads) in enumerate(rounds, 1):
        print(f"round {i}: pgbench {round_tps or float('nan'):.0f} TPS, processes {procs:.0f}/s "
              f"({ratio(procs, round_tps)}), threads {threads:.0f}/s ({ratio(threads, round_tps)})")
    print()
    print("| measure | per second | vs pgbench TPS | Kairos (8 workers) ÷ this |")
    print("|---|---:|---:|---:|")
    print(f"| pgbench simple-update, -c 8 -j 2 -T {args.seconds} (TPS) | "
          f"{tps if tps is not None else float('nan'):.0f} | 1.00 | {ratio(kairos_8, tps)} |")
    print(f"| Kairos lifecycle (claim, heartbeat, 2 events, terminal), 8 worker processes | {kairos_8:.0f} | "
          f"{ratio(kairos_8, tps)} | 1.00 |")
    print(f"| Kairos lifecycle, 8 worker threads in one process | {kairos_8_threads:.0f} | "
          f"{ratio(kairos_8_threads, tps)} | {ratio(kairos_8, kairos_8_threads)} |")
    print(f"| Kairos lifecycle, 1 worker | {kairos_1:.0f} | {ratio(kairos_1, tps)} | {ratio(kairos_8, kairos_1)} |")
    print(f"| Kairos `runs.worker.process` (echo executor: entries, effect ledger, heartbeat thread), 8 threads | "
          f"{kairos_full:.0f} | {ratio(kairos_full, tps)} | {ratio(kairos_8, kairos_full)} |")
    print(f"| Procrastinate defer + fetch + finish, 8 coroutines | {full:.0f} | {ratio(full, tps)} | "
          f"{ratio(kairos_8, full)} |")
    print(f"| Procrastinate fetch + finish only, 8 coroutines | {fetch_finish:.0f} | {ratio(fetch_finish, tps)} | "
          f"{ratio(kairos_8, fetch_finish)} |")
    print()
    def verdict(value: float) -> str:
        return "met" if tps is not None and value / tps >= 0.2 else "NOT met"

    print(f"Targets: Kairos ÷ pgbench ≥ 0.2: {verdict(kairos_8_threads)} with 8 threads, {verdict(kairos_8)} with 8 "
          f"processes (on this machine their Python competes with the server for the same cores); "
          f"Kairos ≥ Procrastinate cycle: {'met' if min(kairos_8, kairos_8_threads) >= full else 'NOT met'}.")


if __name__ == "__main__":
    main()
