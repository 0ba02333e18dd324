"""Benchmark: webhook deliveries through the API handler, beside a bare Powertools resolver.

Both sides are driven in-process with API Gateway HTTP API v2 events (``kairos.local.apigw.build_event``):

* ``bare``: an ``APIGatewayHttpResolver`` with one route ``POST /v1/hooks/<token>`` answering a
  constant — the floor any Powertools HTTP handler pays on this machine;
* ``kairos``: ``functions/webhook/app.handler`` (Powertools logger/tracer decorators, route match,
  token lookup by hash, receipt, rate window, occurrence + run + ``run.queued`` + receipt, commit,
  then the SQS handoff and its stamp), every delivery with its own ``Idempotency-Key``;
  * with SQS stubbed (a client whose ``send_message_batch`` succeeds at once): database + Python;
  * with moto's SQS in-process, the time inside ``send_message_batch`` reported apart (moto is no
    measure of SQS: its queue scan grows with the queue).

The target is "p99 under 20 ms of the database round trips it needs": we count the round trips per
delivery (``psycopg.Connection.wait`` calls: every statement, BEGIN, COMMIT and the pool's
connection check), measure one round trip (``SELECT 1`` p50) and report
``p99 - round trips x RTT`` — the handler's own overhead at p99.

Run: ``.venv/bin/python bench/api.py [--n 2000] [--threads 4]``. Uses ``DATABASE_URL``'s server
when set (a fresh database is created on it), else an embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psycopg
from aws_lambda_powertools.event_handler import APIGatewayHttpResolver
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

from kairos import migrations, runtime
from kairos.local import apigw, stack
from kairos.observability import logger

# ---- round-trip counting ---------------------------------------------------------------------

_counter = threading.local()
_original_wait = psycopg.Connection.wait


def _counting_wait(self: psycopg.Connection[Any], gen: Any, *args: Any, **kwargs: Any) -> Any:
    _counter.n = getattr(_counter, "n", 0) + 1
    started = time.perf_counter()
    try:
        return _original_wait(self, gen, *args, **kwargs)
    finally:
        _counter.seconds = getattr(_counter, "seconds", 0.0) + time.perf_counter() - started


psycopg.Connection.wait = _counting_wait  # type: ignore[method-assign]


def round_trips() -> int:
    return int(getattr(_counter, "n", 0))


def db_seconds() -> float:
    """Seconds this thread spent waiting on PostgreSQL (round trips, server work, commits)."""
    return float(getattr(_counter, "seconds", 0.0))


# ---- helpers ---------------------------------------------------------------------------------


class StubSqs:
    """Accepts every message at once (a benchmark stand-in; tests use moto)."""

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        return {"Successful": [{"Id": e["Id"], "MessageId": e["Id"]} for e in Entries], "Failed": []}


class TimedSqs:
    """Wraps a client and adds up the seconds spent in ``send_message_batch``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seconds = 0.0
        self._lock = threading.Lock()

    def send_message_batch(self, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return self.inner.send_message_batch(**kwargs)
        finally:
            with self._lock:
                self.seconds += time.perf_counter() - started


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Logs and EMF metrics are formatted as in Lambda, then dropped (not timed against a terminal)."""
    handler = logger.registered_handler
    assert hasattr(handler, "setStream")
    previous = handler.setStream(io.StringIO())
    sink = open(os.devnull, "w")
    try:
        with contextlib.redirect_stdout(sink):
            yield
    finally:
        handler.setStream(previous)
        sink.close()


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))]


@dataclass
class Series:
    name: str
    rps: float
    latencies: list[float]  # ms
    outside_db: list[float]  # ms of each request not spent waiting on PostgreSQL
    trips: int
    note: str = ""


def drive(name: str, call: Callable[[int], dict[str, Any]], n: int, threads: int) -> Series:
    """Runs ``call(i)`` n times on ``threads`` threads."""
    latencies: list[float] = [0.0] * n
    outside: list[float] = [0.0] * n
    trips: list[int] = [0] * n

    def one(i: int) -> None:
        before, db_before = round_trips(), db_seconds()
        started = time.perf_counter()
        response = call(i)
        elapsed = time.perf_counter() - started
        latencies[i] = elapsed * 1000
        outside[i] = (elapsed - (db_seconds() - db_before)) * 1000
        trips[i] = round_trips() - before
        status = response["statusCode"]
        if status not in (200, 202):
            raise RuntimeError(f"unexpected status {status}: {response.get('body')}")

    started = time.perf_counter()
    if threads <= 1:
        for i in range(n):
            one(i)
    else:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(one, range(n)))
    elapsed = time.perf_counter() - started
    return Series(name, n / elapsed, latencies, outside, round(statistics.median(trips)))


# ---- setup -----------------------------------------------------------------------------------


@contextlib.contextmanager
def database() -> Iterator[str]:
    given = os.environ.get("DATABASE_URL")
    server = None
    if given:
        admin_url = given
    else:
        from kairos.local.postgres import LocalPostgres

        server = LocalPostgres()
        admin_url = server.url()
    name = f"kairos_bench_api_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = make_conninfo(admin_url, dbname=name)
    try:
        migrations.apply(url)
        yield url
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        if server is not None:
            server.stop()


def seed(url: str) -> str:
    """A webhook schedule through the API itself; returns its token."""
    from kairos import conversations, schedules

    with psycopg.connect(url, row_factory=dict_row) as conn:
        conversation = conversations.create(conn, owner="bench", agent={"executor": "echo", "model": "echo"})
        created = schedules.create(conn, owner="bench", raw={
            "conversation_id": str(conversation.id), "prompt": "on hook", "kind": "webhook"})
        conn.execute("UPDATE schedules SET rate_limit_per_minute = 100000000")
    assert created.token is not None
    return created.token


def rtt_ms(url: str, n: int = 500) -> float:
    samples = []
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(n):
            started = time.perf_counter()
            conn.execute("SELECT 1")
            samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def hook_event(token: str, i: int, run: str) -> dict[str, Any]:
    body = json.dumps({"ref": "refs/heads/main", "n": i}).encode()
    return apigw.build_event("POST", f"/v1/hooks/{token}",
                             {"content-type": "application/json", "idempotency-key": f"{run}-{i}"}, body)


# ---- main ------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="deliveries per measured series")
    parser.add_argument("--moto-n", type=int, default=300, help="deliveries with moto's SQS")
    parser.add_argument("--threads", type=int, default=4, help="threads for the throughput series")
    args = parser.parse_args()

    bare = APIGatewayHttpResolver()

    @bare.post("/v1/hooks/<token>")
    def constant(token: str) -> dict[str, Any]:
        return {"run_id": "00000000-0000-0000-0000-000000000000", "occurrence_id": "0"}

    context = apigw.LocalContext()
    series: list[Series] = []
    with database() as url:
        # KAIROS_OWNER_QUEUE_MAX: no worker drains the runs here, and a full queue would answer 429s.
        os.environ.update({"DATABASE_URL": url, "KAIROS_AUTH": "dev", "RUN_QUEUE_URL": "https://sqs.local/q",
                           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x",
                           "KAIROS_OWNER_QUEUE_MAX": "100000"})
        runtime.reset()
        handler = stack.load_handler("webhook")
        with quiet():
            token = seed(url)
        rtt = rtt_ms(url)
        runtime._sqs = StubSqs()  # the per-container client, replaced by the stub
        with quiet():
            for i in range(50):  # warm-up: imports, pool connections
                handler(hook_event(token, i, "warm"), context)
                bare.resolve(hook_event(token, i, "warm"), context)
            n, t = args.n, args.threads
            series.append(drive("bare resolver, 1 thread",
                                lambda i: bare.resolve(hook_event(token, i, "b1"), context), n, 1))
            series.append(drive("kairos hook, SQS stub, 1 thread",
                                lambda i: handler(hook_event(token, i, "k1"), context), n, 1))
            series.append(drive(f"bare resolver, {t} threads",
                                lambda i: bare.resolve(hook_event(token, i, "bN"), context), n, t))
            series.append(drive(f"kairos hook, SQS stub, {t} threads",
                                lambda i: handler(hook_event(token, i, "kN"), context), n, t))

            from moto import mock_aws

            with mock_aws():
                import boto3

                client = boto3.client("sqs", region_name="us-east-1")
                os.environ["RUN_QUEUE_URL"] = client.create_queue(QueueName="bench-runs")["QueueUrl"]
                runtime.reset()
                timed = TimedSqs(client)
                runtime._sqs = timed
                moto = drive("kairos hook, moto SQS, 1 thread",
                             lambda i: handler(hook_event(token, i, "moto"), context), args.moto_n, 1)
                moto.note = f"of which SQS (moto) {timed.seconds / args.moto_n * 1000:.2f} ms/req"
                series.append(moto)
        with psycopg.connect(url) as conn:
            counted = conn.execute(
                "SELECT count(*), count(handoff_at) FROM runs").fetchone() or (0, 0)

    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\nWebhook deliveries through the handler, in-process HTTP API v2 events. "
          f"One DB round trip (SELECT 1, p50) = {rtt:.3f} ms. {os.cpu_count()} CPUs, load average {load}.\n")
    print("| series | req/s | p50 ms | p99 ms | DB waits | outside DB p50 / p99 ms | p99 - waits x RTT ms | note |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for s in series:
        p99 = percentile(s.latencies, 99)
        print(f"| {s.name} | {s.rps:,.0f} | {percentile(s.latencies, 50):.2f} | {p99:.2f} | {s.trips} | "
              f"{percentile(s.outside_db, 50):.2f} / {percentile(s.outside_db, 99):.2f} | "
              f"{p99 - s.trips * rtt:.2f} | {s.note} |")
    single = series[1]
    print(f"\nkairos / bare throughput (1 thread): {single.rps / series[0].rps:.3f}. "
          f"Runs stored {counted[0]}, handoffs stamped {counted[1]}.")
    outside = percentile(single.outside_db, 99)
    print(f"Target: p99 within 20 ms of its database round trips (1 thread, SQS stub): p99 outside the DB "
          f"{outside:.2f} ms -> {'met' if outside < 20 else 'NOT met'}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
