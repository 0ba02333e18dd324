"""Run-path throughput: whole run-function invocations per second beside two baselines on the same server.

What is measured (all on one PostgreSQL server, one database each, same run, rounds interleaved):

1. **pgbench** ``-b simple-update -c 8 -j 2 -T 10`` (scale 1): the server's own transaction rate
   for a small update transaction, the ceiling any job system on this box works under.
2. **The run handler** (the headline): ``functions/run/app.py``'s ``handler`` — its Powertools
   decorators, the SQS batch adapter, ``runs.worker.process`` with the ``echo`` executor in fork mode
   (claim with the fork thread and prompt entry, transcript window, effect and budget reserved,
   answer entry, terminal state), EMF metrics and logs written (to /dev/null) — in 8 worker
   processes (8 Lambda containers, one run at a time each), fed one SQS-shaped event per run (the
   template's batch size), as Lambda would; SQS itself is not involved. ``--owners`` deals the runs
   over that many owners. The runs hold their slots, as the tick hands them over (a claim takes no lock).
3. **Procrastinate** (``App`` + ``PsycopgConnector``, its schema in a third database) with 8
   concurrent coroutines: the equivalent job cycle ``defer`` → ``fetch_job`` → ``finish_job``
   (its ``JobManager`` directly, without its worker's polling, sleeps and middleware), reported
   both for the full cycle (three commits) and for fetch + finish alone.
4. **The lifecycle subset**, kept for comparison: the claim, one heartbeat and the terminal update
   (``moves.claim``, ``Heartbeat.beat_once``, ``moves.succeed``: three statements, three commits, no
   executor, no entries), 8 processes and 8 threads.

5. **MVCC pressure**: the handler series again while another connection holds a REPEATABLE READ
   transaction that has read ``runs`` (vacuum must keep every row version the runs write).
6. **CPU per run**: the handler processes' own CPU for their runs and the server backends' CPU, for
   the 8-process series and for the same handler in one process (a quarter of the runs), beside the
   same for a Procrastinate job: on two cores the eight processes and their eight backends cost each
   run more CPU than one process does alone, and Procrastinate's clients are one process.

An untimed handler series runs first: the measured series start from a database with history and
statistics that describe it, as a deployment has.

Targets: the handler's runs/s ÷ pgbench TPS ≥ 0.2; the handler ≥ Procrastinate's cycle; under the
held snapshot ≥ 0.9 of the same round's handler rate.
``--profile PREFIX`` cProfiles the handler processes of the last round and prints the top entries.
``--statements`` prints each statement's mean execution time in the last round's handler and held
series, and the share of the one-process series' server CPU that statements' execution accounts for
(``pg_stat_statements``: point ``DATABASE_URL`` at a server started with
``-c shared_preload_libraries=pg_stat_statements``, e.g. the system PostgreSQL 15); then prices a
run's statements, commits and explicit transactions with ``bench/statement_cost.py`` on the same
server, and says what is left of a run's CPU once they are taken away (what no batching or folding of
statements across runs can win back) beside a Procrastinate job's CPU.
``--quiet-statistics RUNS`` adds, after the rounds, the handler series draining RUNS queued runs twice:
with statistics that describe them, and planned from statistics taken while none was queued (``runs``
analyzed after the previous series drained it, autovacuum held off): what a burst meets in a live
database (migration 0017).

The server is ``DATABASE_URL``'s when set (its databases ``kairos_bench*`` are dropped and
recreated), else an embedded one started here with default durability settings (fsync on).

Run: ``.venv/bin/python bench/run.py [--runs N] [--seconds S] [--rounds R] [--owners K]
[--quiet-statistics RUNS]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import json
import logging
import multiprocessing
import os
import queue
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

import psycopg
from baseline import Meter, Work, held_snapshot, pgbench_tps, recreate, server, server_cpu
from statement_cost import Machinery, describe, measure

from kairos import migrations, trace
from kairos.db import Database
from kairos.execution.heartbeat import Heartbeat
from kairos.runs import moves
from kairos.settings import Settings
from kairos.states import EventType

WORKERS = 8


class Round(NamedTuple):
    load: str
    tps: float | None
    handler: float
    procrastinate: float
    fetch_finish: float
    procs: float
    threads: float
    held: float  # the handler series again while another connection holds a REPEATABLE READ snapshot
    work: dict[str, Work]  # what a unit of each series wrote: "pgbench" (a transaction), "handler", "procrastinate"
    # CPU ms a run cost (handler processes, server backends): the 8-process series, and one process alone
    cpu: tuple[float, float | None]
    single_cpu: tuple[float, float | None]
    single: float  # runs/s of the one-process series
    procrastinate_cpu: tuple[float, float | None]  # CPU ms a job cost (its one process, the server backends)

# One owner ('bench') runs every worker's runs: its budgets must not be what is measured.
SETTINGS = Settings(owner_concurrency=1000, owner_queue_max=100_000, owner_daily_tokens=10**12,
                    owner_daily_cost_usd=10**9)


# --- pgbench ---------------------------------------------------------------------------------------


# --- Kairos --------------------------------------------------------------------------------------------


def seed_runs(url: str, count: int, mode: str = "append", owners: int = 1, analyze: bool = True,
              admitted: bool = True) -> list[uuid.UUID]:
    """Per owner one conversation (with two entries, the transcript a fork reads) and schedule; ``count``
    occurrences and queued runs in all, dealt round-robin over the owners and interleaved in the
    order the workers take them (not timed). ``analyze=False`` leaves the statistics as they were.
    ``admitted``: each run holds its slot, as the tick or the intake hands a run to SQS (a claim then
    takes no lock); without it every claim is a stray message's, under its owner's slot lock."""
    per_owner: list[list[uuid.UUID]] = []
    with psycopg.connect(url, autocommit=True) as conn:
        for k in range(owners):
            owner = "bench" if owners == 1 else f"bench-{k}"
            n = count // owners + (1 if k < count % owners else 0)
            conv, sched = uuid.uuid4(), uuid.uuid4()
            conn.execute("INSERT INTO conversations (id, owner, agent) VALUES (%s, %s, '{\"executor\": \"echo\"}')",
                         (conv, owner))
            conn.execute("""INSERT INTO conversation_entries (conversation_id, seq, role, content)
                            VALUES (%s, 1, 'user', 'hello'), (%s, 2, 'assistant', 'echo: hello')""", (conv, conv))
            conn.execute("""INSERT INTO schedules (id, owner, conversation_id, prompt, kind, token_hash)
                            VALUES (%s, %s, %s, 'p', 'webhook', md5(random()::text))""", (sched, owner, conv))
            rows = conn.execute(
                """WITH o AS (
                       INSERT INTO occurrences (id, schedule_id, source, fire_at, local_time, utc_offset, timezone,
                                                tzdata_version, schedule_revision, decision, idempotency_key)
                       SELECT gen_random_uuid(), %(s)s, 'webhook', now(), now()::timestamp, interval '0', 'UTC', 'b',
                              1, 'dispatched', g::text
                         FROM generate_series(1, %(n)s) g
                       RETURNING id)
                   INSERT INTO runs (id, occurrence_id, schedule_id, owner, source, source_conversation_id,
                                     conversation_id, mode, prompt, agent, admitted_at, slot_limit)
                   SELECT gen_random_uuid(), o.id, %(s)s, %(w)s, 'webhook', %(c)s,
                          CASE WHEN %(m)s = 'append' THEN %(c)s END, %(m)s, 'p', '{"executor": "echo"}',
                          CASE WHEN %(a)s THEN now() END, %(slots)s
                     FROM o
                   RETURNING id""", {"s": sched, "c": conv, "n": n, "m": mode, "w": owner, "a": admitted,
                                     "slots": SETTINGS.owner_concurrency}).fetchall()
            per_owner.append([r[0] for r in rows])
        # Statistics as a live database has them (autovacuum's ANALYZE): a plan made from an empty
        # table's statistics scans small tables sequentially, which is not what a deployment runs.
        if analyze:
            conn.execute("ANALYZE")
    dealt = [ids[i] for i in range(max(map(len, per_owner), default=0)) for ids in per_owner if i < len(ids)]
    return dealt


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
                            events=[trace.Event(EventType.STEP_FINISHED, "model", {"outcome": "succeeded"})])
        assert done


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


def _process_worker(ids: list[uuid.UUID], next_index: Any, start_line: Any, finished: Any, url: str) -> None:
    _quiet()  # its EMF metrics, as Lambda's would go to CloudWatch
    logging.getLogger("kairos").setLevel(logging.WARNING)
    database = Database(url, max_size=2)
    with database.connection() as conn:
        conn.execute("SELECT 1")
    start_line.wait()
    cpu = time.process_time()
    while True:
        with next_index.get_lock():  # one shared queue, as with threads: no process idles at the end
            index = next_index.value
            next_index.value += 1
        if index >= len(ids):
            break
        lifecycle(database, ids[index])
    # Before the process's own teardown, which is not run work.
    finished.put((time.monotonic(), time.process_time() - cpu))
    database.close()


def _quiet() -> None:
    """A worker process writes its logs and metrics to /dev/null (Lambda writes them to CloudWatch)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)


class _Context:
    """The LambdaContext attributes the run handler and Powertools read (ten minutes left)."""

    function_name = "kairos-bench-run"
    function_version = "$LATEST"
    memory_limit_in_mb = 512
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:kairos-bench-run"
    log_group_name = "/aws/lambda/kairos-bench-run"
    log_stream_name = "2026/01/01/[$LATEST]bench"

    def __init__(self) -> None:
        self.aws_request_id = str(uuid.uuid4())

    def get_remaining_time_in_millis(self) -> int:
        return 600_000


def _sqs_event(run_id: uuid.UUID) -> dict[str, Any]:
    """One SQS record (the template's ``RunBatchSize`` is 1), shaped as Lambda delivers it."""
    return {"Records": [{
        "messageId": str(uuid.uuid4()), "receiptHandle": "bench", "body": json.dumps({"run_id": str(run_id)}),
        "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "1767592801500",
                       "SenderId": "AROAEXAMPLEROLEID:kairos-TickFunction", "ApproximateFirstReceiveTimestamp":
                       "1767592801510"},
        "messageAttributes": {}, "md5OfBody": "", "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:kairos-RunQueue", "awsRegion": "us-east-1"}]}


def _handler_env(url: str) -> None:
    """The run function's environment, as the template sets it (no queue: nothing here retries)."""
    os.environ.update({"DATABASE_URL": url, "KAIROS_OWNER_CONCURRENCY": str(SETTINGS.owner_concurrency),
                       "KAIROS_OWNER_QUEUE_MAX": str(SETTINGS.owner_queue_max),
                       "KAIROS_OWNER_DAILY_TOKENS": str(SETTINGS.owner_daily_tokens),
                       "KAIROS_OWNER_DAILY_COST_USD": str(SETTINGS.owner_daily_cost_usd),
                       "POWERTOOLS_METRICS_NAMESPACE": "Kairos", "POWERTOOLS_SERVICE_NAME": "kairos",
                       "LOG_LEVEL": "INFO"})
    os.environ.pop("RUN_QUEUE_URL", None)


def _handler_worker(ids: list[uuid.UUID], next_index: Any, start_line: Any, finished: Any, url: str,
                    profile: str | None) -> None:
    """One Lambda container: the run function's ``handler`` called with one SQS event per run. Its
    logs and EMF metrics are written (to /dev/null), as Lambda writes them to CloudWatch."""
    _quiet()
    _handler_env(url)
    from kairos.local.stack import load_function

    app = load_function("run")
    runtime_database = app.runtime.database()
    with runtime_database.connection() as conn:  # a warm container: its connection is open
        conn.execute("SELECT 1")
    profiler = cProfile.Profile(time.process_time) if profile else None  # CPU, not wall time
    start_line.wait()
    if profiler is not None:
        profiler.enable()
    cpu = time.process_time()
    handle_shared(app.handler, ids, next_index)
    cpu = time.process_time() - cpu  # this container's CPU for its runs (its imports and warm-up excluded)
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(f"{profile}.{os.getpid()}")
    finished.put((time.monotonic(), cpu))
    runtime_database.close()


def handle_shared(handler: Callable[..., Any], ids: list[uuid.UUID], next_index: Any) -> None:
    """Calls ``handler`` with one SQS event per run until ``next_index`` (shared by the containers) passes
    the last id; a record the handler reports failed stops the bench."""
    while True:
        with next_index.get_lock():
            index = next_index.value
            next_index.value += 1
        if index >= len(ids):
            return
        response = handler(_sqs_event(ids[index]), _Context())
        if response != {"batchItemFailures": []}:
            raise RuntimeError(f"record failed: {response}")


def _spawned(target: Callable[..., None], workers: int, ids: list[uuid.UUID], *args: Any) -> tuple[float, float]:
    """Seconds for ``workers`` fresh processes running ``target(ids, next_index, start_line, finished,
    *args)`` to take every id from one shared index, from their common start to the last one's finish;
    and the CPU seconds the processes reported for that work (each puts ``(finish, cpu)``)."""
    context = multiprocessing.get_context("spawn")
    start_line = context.Barrier(workers + 1)
    finished = context.Queue()
    next_index = context.Value("i", 0)
    children = [context.Process(target=target, args=(ids, next_index, start_line, finished, *args))
                for _ in range(workers)]
    for child in children:
        child.start()
    start_line.wait()
    started = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process on the host
    reports: list[tuple[float, float]] = [finished.get(timeout=3600) for _ in children]
    for child in children:
        child.join()
    if any(child.exitcode != 0 for child in children):
        raise RuntimeError(f"a {target.__name__} process failed")
    return max(end for end, _ in reports) - started, sum(cpu for _, cpu in reports)


def quiet_handler_rate(url: str, count: int, owners: int) -> float:
    """The handler series draining ``count`` runs queued after ``runs`` was analyzed with none queued
    (autovacuum held off until the series ends): the statistics a burst meets in a live database, where
    autovacuum analyzes runs only after a tenth of it has changed (migration 0017)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE runs SET (autovacuum_enabled = false)")
        conn.execute("VACUUM ANALYZE runs")  # the previous series drained every run: nothing is queued
    try:
        return handler_rate(url, count, WORKERS, None, owners, analyze=False)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ALTER TABLE runs RESET (autovacuum_enabled)")


def _handler_workers(url: str, ids: list[uuid.UUID], workers: int, profile: str | None = None) -> tuple[float, float]:
    return _spawned(_handler_worker, workers, ids, url, profile)


def handler_rate(url: str, count: int, workers: int, profile: str | None = None, owners: int = 1,
                 work: list[Work] | None = None, statements: dict[str, tuple[int, float]] | None = None,
                 cpu: list[tuple[float, float | None]] | None = None, analyze: bool = True,
                 admitted: bool = True) -> float:
    """Whole run-function invocations per second: ``functions/run/app.py``'s handler (its Powertools
    decorators, the SQS batch adapter, ``runs.worker.process`` with the echo executor, fork mode), one
    SQS-shaped event per run, ``workers`` processes (Lambda containers); SQS itself is not involved.
    ``statements``, when given, receives each statement's calls and mean execution time (ms) over the
    series, from ``pg_stat_statements``; ``cpu`` the CPU milliseconds a run cost the handler processes and
    the server's backends (None: not a local server)."""
    ids = seed_runs(url, count, "fork", owners, analyze=analyze, admitted=admitted)
    meter = Meter(url)
    meter.start()
    read_statements = _statement_times(url) if statements is not None else None
    server_before = server_cpu(url)
    elapsed, client = _handler_workers(url, ids, workers, profile)  # returns once every worker has exited
    if work is not None:
        work.append(meter.stop(count))
    if cpu is not None:
        server_after = server_cpu(url)
        cpu.append((1000 * client / count, None if server_before is None or server_after is None
                    else 1000 * (server_after - server_before) / count))
    if read_statements is not None and statements is not None:
        statements.update(read_statements())
    with psycopg.connect(url) as conn:
        done = conn.execute("SELECT count(*) FROM runs WHERE state = 'succeeded' AND id = ANY(%s)", (ids,)).fetchone()
    assert done is not None and done[0] == count, done
    return count / elapsed


def _statement_times(url: str) -> Callable[[], dict[str, tuple[int, float]]]:
    """Resets ``pg_stat_statements`` (the server must preload it: see ``--statements``); the function
    returned reads, per statement of this database, its calls and mean execution time in ms. A
    Kairos statement is named by its query name (its text's first line matched against the shipped
    queries), any other (a trigger's, a foreign-key check, a trace.change template) by its first 90
    characters of SQL."""
    from kairos.db import QUERIES

    names = {text.splitlines()[0].strip(): name for name, text in QUERIES.items()}
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset()")

    def read() -> dict[str, tuple[int, float]]:
        with psycopg.connect(url, autocommit=True) as conn:
            rows = conn.execute(
                """SELECT query, calls, total_exec_time FROM pg_stat_statements
                    WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND calls > 0
                      AND query NOT LIKE '%%pg_stat_statements%%'""").fetchall()
        times: dict[str, tuple[int, float]] = {}
        for query, calls, total in rows:
            first = str(query).strip().splitlines()[0].strip()
            code = " ".join(line for line in str(query).splitlines() if not line.strip().startswith("--"))
            key = names.get(first) or " ".join(code.split())[:90]
            seen_calls, seen_total = times.get(key, (0, 0.0))
            times[key] = (seen_calls + int(calls), seen_total + float(total))
        return {k: (calls, total / calls) for k, (calls, total) in times.items()}

    return read


def _execution_share(statements: dict[str, tuple[int, float]], runs: int, server_ms: float | None) -> str:
    """One sentence for the one-process series (no other run to wait for, so a statement's execution time
    is its work, not lock waits): every statement's execution time per run beside the server's CPU per
    run in the same series. The difference is what no statement's plan can win back: the protocol's
    parse, bind and result messages, transaction starts and commits (the WAL flush's system time)."""
    executing = sum(calls * mean for calls, mean in statements.values()) / runs
    if server_ms is None:
        return (f"Every statement's execution took {executing:.2f} ms a run "
                "(the server's CPU is read on local servers only).")
    return (f"The handler in one process (the last round): every statement's execution took {executing:.2f} ms a run, "
            f"of the {server_ms:.2f} ms of server CPU a run ({100 * executing / server_ms:.0f} %); the rest is outside "
            "any statement's plan: protocol messages, transaction starts and commits. (The 8-process series' "
            "means above include lock waits: an owner's runs queue on its slot lock and its day row of the ledger.)")


def _median_cpu(cpus: list[tuple[float, float | None]]) -> tuple[float, float | None]:
    """Medians of (client, server) CPU ms; the server's None when no round could read it."""
    servers = [server for _, server in cpus if server is not None]
    return statistics.median(client for client, _ in cpus), statistics.median(servers) if servers else None


def _machinery_bound(machinery: Machinery, statements: dict[str, tuple[int, float]], runs: int, commits: float,
                     single_cpu: tuple[float, float | None], job_cpu: tuple[float, float | None]) -> str:
    """What sharing statements and commits across runs (batching, folding) could win at most: the
    one-process series' statements, commits and explicit transactions a run, priced by
    ``bench/statement_cost.py`` (each statement with a round trip of its own: an upper bound, as a
    run pipelines some), against that series' CPU a run and a Procrastinate job's (medians)."""
    explicit = statements.get("BEGIN", (0, 0.0))[0] / runs
    sent = sum(calls for key, (calls, _) in statements.items() if key not in ("BEGIN", "COMMIT")) / runs
    cost = machinery.of(sent, commits, explicit)
    (client, server), (job_client, job_server) = single_cpu, job_cpu
    if server is None or cost.server is None or job_server is None:
        return f"Machinery: {describe(machinery)} (server CPU is read on local servers only)."
    own_client, own_server = client - cost.client / 1000, server - cost.server / 1000
    job = job_client + job_server
    return (f"Machinery (same server, one process): {describe(machinery)}. A run's {sent:.1f} statements, "
            f"{commits:.1f} commits and {explicit:.1f} explicit transactions cost at most "
            f"{(cost.client + cost.server) / 1000:.2f} ms of the one-process series' {client + server:.2f} ms a run. "
            f"At least {own_client:.2f} ms client + {own_server:.2f} ms server is each run's own work (its Python; "
            f"its rows, their index entries and key checks), which no sharing of statements and commits across "
            f"runs removes; a Procrastinate job costs {job_client:.2f} + {job_server:.2f} = {job:.2f} ms in all. "
            f"With every statement and commit shared, a run would still cost at least "
            f"{(own_client + own_server) / job:.2f}x a job.")


def _process_workers(url: str, ids: list[uuid.UUID], workers: int) -> tuple[float, float]:
    return _spawned(_process_worker, workers, ids, url)


def kairos_rate(url: str, count: int, workers: int, *, processes: bool = False) -> float:
    """Lifecycles (or, with ``full``, whole ``runs.worker.process`` calls) per second over ``count`` fresh
    runs, with ``workers`` threads or processes."""
    # A full run in append mode would read the one shared transcript, growing with every run.
    ids = seed_runs(url, count, "append")
    elapsed = _process_workers(url, ids, workers)[0] if processes else _thread_workers(url, ids, workers)
    with psycopg.connect(url) as conn:
        done = conn.execute("SELECT count(*) FROM runs WHERE state = 'succeeded' AND id = ANY(%s)", (ids,)).fetchone()
    assert done is not None and done[0] == count, done
    return count / elapsed


# --- Procrastinate -------------------------------------------------------------------------------------


async def procrastinate_rates(url: str, count: int, workers: int, written: list[Work] | None = None,
                              cpu: list[tuple[float, float | None]] | None = None) -> tuple[float, float]:
    import procrastinate
    from procrastinate.jobs import Status

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url, min_size=workers,
                                                                     max_size=workers))

    @app.task(name="bench", queue="bench")
    def bench_task() -> None:  # never executed: the cycle below fetches and finishes jobs itself
        return None

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
    server_before = server_cpu(url)  # the schema's backends have exited
    async with app.open_async():
        manager = app.job_manager
        worker_ids = [await manager.register_worker() for _ in range(workers)]
        meter = Meter(url)
        meter.start()

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
        client = time.process_time()
        started = time.perf_counter()
        await asyncio.gather(*(defer_some(n) for n in share))
        deferred = time.perf_counter()
        finished = sum(await asyncio.gather(*(work(w) for w in worker_ids)))
        ended = time.perf_counter()
        client = time.process_time() - client
    # Read once the app's pool is closed: its backends have reported their counts.
    if written is not None:
        written.append(meter.stop(count))
    if cpu is not None:
        server_after = server_cpu(url)
        cpu.append((1000 * client / count, None if server_before is None or server_after is None
                    else 1000 * (server_after - server_before) / count))
    assert finished == count, finished
    return count / (ended - started), count / (ended - deferred)


# --- main ----------------------------------------------------------------------------------------------


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def _print_profile(prefix: str, top: int) -> None:
    import glob
    import pstats

    files = glob.glob(f"{prefix}.*")
    if not files:
        return
    stats = pstats.Stats(files[0], stream=sys.stdout)
    for extra in files[1:]:
        stats.add(extra)
    print(f"cProfile (process CPU time) of the {len(files)} handler processes (one round), top {top}:")
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2000, help="runs (and jobs) per measurement")
    parser.add_argument("--seconds", type=int, default=10, help="pgbench duration")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of every series, interleaved; medians are reported")
    parser.add_argument("--owners", type=int, default=1,
                        help="owners the handler series' runs are dealt over (one owner's claims serialize on "
                             "its slot lock, and its model calls on its day's budget row)")
    parser.add_argument("--statements", action="store_true",
                        help="print each statement's mean execution time in the last round's handler series and "
                             "held-snapshot series (pg_stat_statements; the server, DATABASE_URL's, must preload it)")
    parser.add_argument("--quiet-statistics", metavar="RUNS", type=int, default=0,
                        help="after the rounds, the handler series draining RUNS queued runs with fresh statistics "
                             "and then planned from statistics taken while none was queued, side by side")
    parser.add_argument("--profile", metavar="PREFIX", default=None,
                        help="cProfile the handler processes of the last round into PREFIX.<pid> and print the top")
    args = parser.parse_args()
    logging.getLogger("kairos").setLevel(logging.WARNING)  # the library logs every claim at INFO
    logging.getLogger("procrastinate").setLevel(logging.ERROR)

    with server() as (admin_url, pgbench_binary):
        kairos_url = recreate(admin_url, "kairos_bench")
        migrations.apply(kairos_url)
        # A live database has history, and statistics that describe it: one untimed handler series first.
        # Without it the first round plans the hot statements from the statistics of a database holding
        # one conversation and no effects (ANALYZE after seeding), and those generic plans scan tables
        # that grow with every run of the series (each run reads all of them: quadratic in the series).
        handler_rate(kairos_url, args.runs, WORKERS, None, args.owners)
        pgbench_url = recreate(admin_url, "kairos_bench_pgbench")
        # The machine's noise moves every series by 10-20 % from one minute to the next: interleave
        # the compared series and report each one's median (and the ratios of every round).
        rounds: list[Round] = []
        statements: dict[str, tuple[int, float]] = {}  # the last round's handler series (--statements)
        held_statements: dict[str, tuple[int, float]] = {}  # and its held-snapshot series
        single_statements: dict[str, tuple[int, float]] = {}  # and its one-process series
        single_runs = max(100, args.runs // 4)  # the one-process series' runs
        for n in range(max(1, args.rounds)):
            load = _load()
            work: dict[str, list[Work]] = {"pgbench": [], "handler": [], "procrastinate": []}
            tps = pgbench_tps(pgbench_binary, pgbench_url, args.seconds, work["pgbench"])
            last = n == max(1, args.rounds) - 1
            # The held-snapshot series goes first in odd rounds and last in even ones: the runs table grows
            # with every series, so a fixed order would charge the growth to one side.
            held_first = n % 2 == 1
            if held_first:
                with held_snapshot(kairos_url, "runs"):
                    held = handler_rate(kairos_url, args.runs, WORKERS, None, args.owners,
                                        statements=held_statements if last and args.statements else None)
            cpu: list[tuple[float, float | None]] = []
            handler = handler_rate(kairos_url, args.runs, WORKERS, args.profile if last else None, args.owners,
                                   work["handler"], statements=statements if last and args.statements else None,
                                   cpu=cpu)
            # The same handler in one process: what a run costs when nothing else wants the two cores.
            single = handler_rate(kairos_url, single_runs, 1, None, args.owners, cpu=cpu,
                                  statements=single_statements if last and args.statements else None)
            full, fetch_finish = asyncio.run(procrastinate_rates(
                recreate(admin_url, "kairos_bench_procrastinate"), args.runs, WORKERS, work["procrastinate"], cpu))
            procs = kairos_rate(kairos_url, args.runs, WORKERS, processes=True)
            with contextlib.redirect_stdout(io.StringIO()):  # the EMF lines of the threads' metrics
                threads = kairos_rate(kairos_url, args.runs, WORKERS)
            if not held_first:
                with held_snapshot(kairos_url, "runs"):
                    held = handler_rate(kairos_url, args.runs, WORKERS, None, args.owners,
                                        statements=held_statements if last and args.statements else None)
            rounds.append(Round(load, tps, handler, full, fetch_finish, procs, threads, held,
                                {k: v[0] for k, v in work.items() if v}, cpu[0], cpu[1], single, cpu[2]))
        machinery: Machinery | None = None
        if args.statements:
            machinery = measure(admin_url)
        quiet: tuple[float, float] | None = None
        if args.quiet_statistics:
            quiet = (handler_rate(kairos_url, args.quiet_statistics, WORKERS, None, args.owners),
                     quiet_handler_rate(kairos_url, args.quiet_statistics, args.owners))

    def med(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None

    def ratio(value: float | None, base: float | None) -> str:
        return "n/a" if not base or value is None else f"{value / base:.2f}"

    print()
    print(f"Run path: {args.runs} runs/jobs per series, {WORKERS} concurrent clients; {len(rounds)} interleaved "
          f"rounds, medians below; load average (1/5/15 min) taken at each round's start.")
    print()
    for i, r in enumerate(rounds, 1):
        print(f"round {i} (load {r.load}): pgbench {r.tps or float('nan'):.0f} TPS, handler {r.handler:.0f}/s "
              f"({ratio(r.handler, r.tps)} of pgbench, {ratio(r.handler, r.procrastinate)} of Procrastinate "
              f"{r.procrastinate:.0f}/s), lifecycle processes {r.procs:.0f}/s ({ratio(r.procs, r.tps)}), "
              f"threads {r.threads:.0f}/s ({ratio(r.threads, r.tps)}), handler under a held snapshot "
              f"{r.held:.0f}/s ({ratio(r.held, r.handler)} of the same round's handler)")
    tps = med([r.tps for r in rounds])
    handler = statistics.median(r.handler for r in rounds)
    full = statistics.median(r.procrastinate for r in rounds)
    fetch_finish = statistics.median(r.fetch_finish for r in rounds)
    procs = statistics.median(r.procs for r in rounds)
    threads = statistics.median(r.threads for r in rounds)
    held = statistics.median(r.held for r in rounds)
    held_ratio = statistics.median(r.held / r.handler for r in rounds)
    print()
    print("| measure | per second | ÷ pgbench TPS | handler ÷ this |")
    print("|---|---:|---:|---:|")
    print(f"| pgbench simple-update, -c 8 -j 2 -T {args.seconds} (TPS) | "
          f"{tps if tps is not None else float('nan'):.0f} | 1.00 | {ratio(handler, tps)} |")
    print(f"| **Kairos run handler** (`functions/run/app.py`, one SQS event per run, echo, fork mode, "
          f"{args.owners} owner{'s' if args.owners > 1 else ''}), 8 processes | {handler:.0f} | "
          f"{ratio(handler, tps)} | 1.00 |")
    print(f"| Procrastinate defer + fetch + finish, 8 coroutines | {full:.0f} | {ratio(full, tps)} | "
          f"{ratio(handler, full)} |")
    print(f"| Procrastinate fetch + finish only, 8 coroutines | {fetch_finish or float('nan'):.0f} | "
          f"{ratio(fetch_finish, tps)} | {ratio(handler, fetch_finish)} |")
    print(f"| Kairos lifecycle subset (claim, heartbeat, terminal), 8 processes | {procs or float('nan'):.0f} | "
          f"{ratio(procs, tps)} | {ratio(handler, procs)} |")
    print(f"| Kairos lifecycle subset, 8 threads of one process | {threads or float('nan'):.0f} | "
          f"{ratio(threads, tps)} | {ratio(handler, threads)} |")
    print(f"| Kairos run handler while a REPEATABLE READ snapshot is held open, 8 processes | "
          f"{held or float('nan'):.0f} | {ratio(held, tps)} | {ratio(handler, held)} |")
    print()
    print("What one unit of work wrote (medians of the rounds; WAL is the server's, rows and commits the")
    print("series' own database, triggers' writes included):")
    print()
    print("| unit | WAL bytes | rows written | commits |")
    print("|---|---:|---:|---:|")
    for key, unit in (("pgbench", "pgbench simple-update transaction"), ("handler", "Kairos run (the handler series)"),
                      ("procrastinate", "Procrastinate job (defer + fetch + finish)")):
        seen = [r.work[key] for r in rounds if key in r.work]
        if seen:
            print(f"| {unit} | {statistics.median(w.wal_bytes for w in seen):,.0f} | "
                  f"{statistics.median(w.rows for w in seen):.1f} | {statistics.median(w.commits for w in seen):.1f} |")
    print()
    print("What a run (a job) cost in CPU (medians of the rounds; the client processes' own CPU for their work,")
    print("and the server backends' CPU, read from the postmaster's reaped children: local servers only):")
    print()
    print("| series | runs/s | client CPU ms/run | server CPU ms/run | total ms/run |")
    print("|---|---:|---:|---:|---:|")
    series: list[tuple[str, list[float], list[tuple[float, float | None]]]] = [
        ("run handler, 8 processes", [r.handler for r in rounds], [r.cpu for r in rounds]),
        ("run handler, 1 process", [r.single for r in rounds], [r.single_cpu for r in rounds]),
        ("Procrastinate defer + fetch + finish, 8 coroutines of 1 process", [r.procrastinate for r in rounds],
         [r.procrastinate_cpu for r in rounds])]
    for label, rates, cpus in series:
        client_ms, server_ms = _median_cpu(cpus)
        total = "n/a" if server_ms is None else f"{client_ms + server_ms:.2f}"
        print(f"| {label} | {statistics.median(rates):.0f} | {client_ms:.2f} | "
              f"{'n/a' if server_ms is None else f'{server_ms:.2f}'} | {total} |")
    print()
    print(f"MVCC pressure (run handler under a held snapshot ÷ without it, median of the rounds' ratios): "
          f"{held_ratio:.2f} (target ≥ 0.9: {'met' if held_ratio >= 0.9 else 'NOT met'}).")
    met_pg = tps is not None and handler / tps >= 0.2
    print(f"Targets (run handler, medians): ÷ pgbench ≥ 0.2: {'met' if met_pg else 'NOT met'} "
          f"({ratio(handler, tps)}); ≥ 1.0x Procrastinate's cycle: {'met' if handler >= full else 'NOT met'} "
          f"({ratio(handler, full)}x).")
    if quiet is not None:
        print(f"Statistics from a quiet moment ({args.quiet_statistics} runs queued after runs was analyzed with none "
              f"queued): run handler {quiet[1]:.0f}/s beside {quiet[0]:.0f}/s with fresh statistics "
              f"({ratio(quiet[1], quiet[0])}).")
    if statements:
        print()
        print("Statements of the last round's handler series, beside its held-snapshot series (pg_stat_statements, "
              "execution time only, the top 10 by total time; a run makes each once unless the calls say otherwise):")
        print()
        print("| statement | calls | mean ms | held: calls | held: mean ms | held ÷ without |")
        print("|---|---:|---:|---:|---:|---:|")
        for key, (calls, mean) in sorted(statements.items(), key=lambda kv: -kv[1][0] * kv[1][1])[:10]:
            held_calls, held_mean = held_statements.get(key, (0, float("nan")))
            print(f"| `{key}` | {calls} | {mean:.3f} | {held_calls} | {held_mean:.3f} | {held_mean / mean:.1f}x |")
        print()
        print(_execution_share(single_statements, single_runs, rounds[-1].single_cpu[1]))
        handler_work = [r.work["handler"] for r in rounds if "handler" in r.work]
        if machinery is not None and handler_work:
            print()
            print(_machinery_bound(machinery, single_statements, single_runs,
                                   statistics.median(w.commits for w in handler_work),
                                   _median_cpu([r.single_cpu for r in rounds]),
                                   _median_cpu([r.procrastinate_cpu for r in rounds])))
    if args.profile:
        print()
        _print_profile(args.profile, 25)


if __name__ == "__main__":
    main()
