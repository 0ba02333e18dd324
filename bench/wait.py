"""The model's wait billed once: a run-function container with a model that answers after 2 s, one run
per invocation (``RunBatchSize`` 1, the old default) beside a batch of 10 runs executed at once
(``KAIROS_RUN_CONCURRENCY_PER_INVOCATION`` 10, the template's default now).

Each configuration is one Lambda container: a process calling ``functions/run/app.py``'s ``handler``
(its decorators, the SQS batch adapter, the ``openai`` executor over local HTTP) with SQS-shaped events
of its batch size, one after another, until its runs are done. Reported per configuration, median of
interleaved rounds: **billed ms per run** (the wall time of every invocation, which is what Lambda
bills, divided by the runs it executed) and **runs/s per container**. Runs are fork-mode, one owner
(its slots raised so that the owner's budget is not what is measured), one schedule each.

The model is a local OpenAI-compatible server answering every request after ``--model-seconds`` (2 s).
The database is ``DATABASE_URL``'s server when set (database ``kairos_bench_wait`` is recreated),
else an embedded one.

Targets: batch ÷ one-per-invocation billed ms per run ≤ 0.15; runs/s per container ≥ 6x.

Run: ``.venv/bin/python bench/wait.py [--rounds 3] [--batches 3] [--singles 10] [--model-seconds 2]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg
from baseline import recreate, server
from run import _Context, _quiet

from kairos import migrations

BATCH = 10


def model_server(delay: float) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            time.sleep(delay)  # the model thinking: the wait this bench is about
            body = json.dumps({"id": "c", "object": "chat.completion",
                               "choices": [{"index": 0, "finish_reason": "stop",
                                            "message": {"role": "assistant", "content": "done"}}],
                               "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def seed(url: str, count: int, agent: dict[str, Any]) -> list[uuid.UUID]:
    """``count`` queued fork-mode runs of owner ``bench``, each of its own schedule (not timed)."""
    ids: list[uuid.UUID] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conv = uuid.uuid4()
        conn.execute("INSERT INTO conversations (id, owner, agent) VALUES (%s, 'bench', %s)", (conv, json.dumps(agent)))
        conn.execute("""INSERT INTO conversation_entries (conversation_id, seq, role, content)
                        VALUES (%s, 1, 'user', 'hello'), (%s, 2, 'assistant', 'hi')""", (conv, conv))
        for _ in range(count):
            sched, occ, run = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
            conn.execute("""INSERT INTO schedules (id, owner, conversation_id, prompt, kind, token_hash)
                            VALUES (%s, 'bench', %s, 'p', 'webhook', md5(random()::text))""", (sched, conv))
            conn.execute("""INSERT INTO occurrences (id, schedule_id, source, fire_at, local_time, utc_offset, timezone,
                                                     tzdata_version, schedule_revision, decision, idempotency_key)
                            VALUES (%s, %s, 'webhook', now(), now()::timestamp, interval '0', 'UTC', 'b', 1,
                                    'dispatched', %s)""", (occ, sched, str(occ)))
            conn.execute("""INSERT INTO runs (id, occurrence_id, schedule_id, owner, source, source_conversation_id,
                                              mode, prompt, agent)
                            VALUES (%s, %s, %s, 'bench', 'webhook', %s, 'fork', 'p', %s)""",
                         (run, occ, sched, conv, json.dumps(agent)))
            ids.append(run)
        conn.execute("ANALYZE")
    return ids


def _event(run_ids: list[uuid.UUID]) -> dict[str, Any]:
    return {"Records": [{
        "messageId": str(uuid.uuid4()), "receiptHandle": "bench", "body": json.dumps({"run_id": str(r)}),
        "attributes": {"ApproximateReceiveCount": "1"}, "messageAttributes": {}, "md5OfBody": "",
        "eventSource": "aws:sqs", "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:kairos-RunQueue",
        "awsRegion": "us-east-1"} for r in run_ids]}


def container(url: str, run_ids: list[uuid.UUID], batch: int, out: Any) -> None:
    """One Lambda container: invocations of ``batch`` records each, until ``run_ids`` are done."""
    _quiet()
    os.environ.update({"DATABASE_URL": url, "KAIROS_OWNER_CONCURRENCY": "1000", "KAIROS_EGRESS_ALLOW": "127.0.0.1",
                       "KAIROS_RUN_CONCURRENCY_PER_INVOCATION": str(batch), "POWERTOOLS_SERVICE_NAME": "kairos",
                       "POWERTOOLS_METRICS_NAMESPACE": "Kairos"})
    os.environ.pop("RUN_QUEUE_URL", None)
    from kairos.local.stack import load_function

    app = load_function("run")
    with app.runtime.database().connection() as conn:  # a warm container
        conn.execute("SELECT 1")
    billed = 0.0
    started = time.perf_counter()
    for i in range(0, len(run_ids), batch):
        t = time.perf_counter()
        response = app.handler(_event(run_ids[i:i + batch]), _Context())
        billed += (time.perf_counter() - t) * 1000
        if response != {"batchItemFailures": []}:
            raise RuntimeError(f"records failed: {response}")
    wall = time.perf_counter() - started
    out.put((billed / len(run_ids), len(run_ids) / wall))


def measure(url: str, run_ids: list[uuid.UUID], batch: int) -> tuple[float, float]:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=container, args=(url, run_ids, batch, out))
    proc.start()
    result: tuple[float, float] = out.get(timeout=600)
    proc.join(60)
    with psycopg.connect(url, autocommit=True) as conn:
        done = conn.execute("SELECT count(*) FROM runs WHERE id = ANY(%s) AND state = 'succeeded'",
                            (run_ids,)).fetchone()
    assert done is not None and done[0] == len(run_ids), f"{done} of {len(run_ids)} succeeded"
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=3, help="invocations of 10 runs per round")
    parser.add_argument("--singles", type=int, default=10, help="one-run invocations per round")
    parser.add_argument("--model-seconds", type=float, default=2.0)
    args = parser.parse_args()
    httpd = model_server(args.model_seconds)
    agent = {"executor": "openai", "model": "m", "base_url": f"http://127.0.0.1:{httpd.server_address[1]}/v1",
             "max_tokens": 16}
    with server() as (admin_url, _):
        url = recreate(admin_url, "kairos_bench_wait")
        migrations.apply(url)
        seed(url, BATCH, agent)  # history first, untimed
        one: list[tuple[float, float]] = []
        many: list[tuple[float, float]] = []
        for r in range(args.rounds):
            one.append(measure(url, seed(url, args.singles, agent), 1))
            many.append(measure(url, seed(url, args.batches * BATCH, agent), BATCH))
            print(f"round {r + 1}: batch 1: {one[-1][0]:,.0f} billed ms/run, {one[-1][1]:.2f} runs/s; "
                  f"batch {BATCH} at once: {many[-1][0]:,.0f} billed ms/run, {many[-1][1]:.2f} runs/s; "
                  f"ratios {many[-1][0] / one[-1][0]:.3f}x ms, {many[-1][1] / one[-1][1]:.2f}x runs/s", flush=True)
    ms1, rate1 = statistics.median(m for m, _ in one), statistics.median(r for _, r in one)
    msb, rateb = statistics.median(m for m, _ in many), statistics.median(r for _, r in many)
    print(f"\nmodel answers after {args.model_seconds:g} s; medians of {args.rounds} rounds; "
          f"load {os.getloadavg()[0]:.1f}")
    print("| configuration | billed ms per run | runs/s per container |")
    print("|---|---:|---:|")
    print(f"| one run per invocation (RunBatchSize 1) | {ms1:,.0f} | {rate1:.2f} |")
    print(f"| batch of {BATCH} at once (RunBatchSize 10, concurrency 10) | {msb:,.0f} | {rateb:.2f} |")
    print(f"| ratio | {msb / ms1:.3f}x (target <= 0.15) | {rateb / rate1:.2f}x (target >= 6) |")


if __name__ == "__main__":
    main()
