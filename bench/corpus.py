"""Corpus runs: wall time at concurrency 1 vs 4, and peak memory of a large corpus's export.

What is measured, in one run, on one PostgreSQL server, moto's S3 server in a child process (so its
memory is not counted here) and a local chat-completions server (a real HTTP server on 127.0.0.1 that
answers each partition with one JSON Lines record per item after a fixed ``--latency``):

1. **concurrency**: a corpus of ``--items`` S3 objects (partition size 20) run to the end with
   ``KAIROS_CORPUS_MAX_CONCURRENCY`` 1 and 4; medians of ``--rounds`` interleaved rounds; the two
   exports are compared byte for byte. Baseline: the model's latency times the number of partitions
   (the floor of a sequential run).
2. **memory**: a corpus of ``--large`` objects of ``--item-bytes`` each (records carry 1 KiB of the
   item back) run and exported; the process's peak RSS (``resource.getrusage``) printed beside its
   RSS after imports and setup (the baseline, same process).

Run: ``.venv/bin/python bench/corpus.py [--items 400] [--large 10000] [--latency 0.05]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from baseline import recreate, server

ITEM = re.compile(r"^--- item (\d+): (\S+)$", re.MULTILINE)
SOURCE, EXPORTS = "bench-corpus", "bench-exports"


def rss_mb() -> float:
    """Peak RSS of this process so far, in MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@contextmanager
def model_server(latency: float) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            prompt = body["messages"][-1]["content"]
            time.sleep(latency)
            lines = [json.dumps({"kind": "doc", "id": key, "ordinal": int(n),
                                 "summary": prompt[prompt.find(key):][:1024]})
                     for n, key in ITEM.findall(prompt)]
            data = json.dumps({"choices": [{"index": 0, "finish_reason": "stop",
                                            "message": {"role": "assistant", "content": "\n".join(lines)}}],
                               "usage": {"prompt_tokens": 10, "completion_tokens": 2}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()
        httpd.server_close()


@contextmanager
def moto_server() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    binary = Path(sys.executable).with_name("moto_server")
    process = subprocess.Popen([str(binary), "-H", "127.0.0.1", "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    try:
        yield endpoint
    finally:
        process.terminate()
        process.wait(timeout=10)


def put_objects(s3: Any, prefix: str, count: int, size: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    filler = ("lorem ipsum dolor sit amet " * (size // 27 + 1))[:size]

    def put(i: int) -> None:
        s3.put_object(Bucket=SOURCE, Key=f"{prefix}{i:05d}.txt", Body=f"{i} {filler}"[:size].encode())

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, range(count)))


def corpus_run(database: Any, base_url: str, prefix: str) -> Any:
    from kairos import chat, conversations

    agent = {"executor": "openai", "model": "m", "base_url": base_url, "max_tokens": 1024,
             "max_input_tokens": 100_000}
    with database.transaction() as conn:
        conversation = conversations.create(conn, owner="bench", agent=agent, title="bench")
        return chat.post(conn, conversation.id, owner="bench", raw={"content": "go", "corpus": {
            "source": {"s3": {"bucket": SOURCE, "prefix": prefix}}, "instructions": "Summarise each item."}}).run_id


def timed(database: Any, run_id: Any, settings: Any) -> float:
    from kairos.execution.execute import process

    started = time.perf_counter()
    outcome = process(database, run_id, settings=settings)
    while outcome.result == "continued":  # a slice ended (the run's runtime limit): the next one resumes
        outcome = process(database, run_id, settings=settings)
    if outcome.result != "succeeded":
        raise RuntimeError(f"corpus run ended {outcome.result} ({outcome.reason_code})")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--large", type=int, default=10_000)
    parser.add_argument("--item-bytes", type=int, default=4096)
    args = parser.parse_args()
    logging.getLogger("kairos").setLevel(logging.WARNING)
    with server() as (admin_url, _), model_server(args.latency) as base_url, moto_server() as endpoint:
        os.environ.update({"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                           "AWS_DEFAULT_REGION": "us-east-1", "KAIROS_CORPUS_BUCKETS": SOURCE})
        import boto3

        from kairos import migrations
        from kairos.db import Database
        from kairos.settings import Settings

        url = recreate(admin_url, "kairos_bench_corpus")
        migrations.apply(url)
        database = Database(url, max_size=8)
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket=SOURCE)
        s3.create_bucket(Bucket=EXPORTS)
        put_objects(s3, "bench/small/", args.items, 200)
        put_objects(s3, "bench/large/", args.large, args.item_bytes)
        one = Settings(egress_allow=("127.0.0.1",), corpus_buckets=(SOURCE,), export_bucket=EXPORTS)
        four = Settings(egress_allow=("127.0.0.1",), corpus_buckets=(SOURCE,), export_bucket=EXPORTS,
                        corpus_max_concurrency=4)
        baseline_rss = current_rss_mb()
        rounds = []
        pairs = []
        for _ in range(max(1, args.rounds)):
            a, b = corpus_run(database, base_url, "bench/small/"), corpus_run(database, base_url, "bench/small/")
            rounds.append((timed(database, a, one), timed(database, b, four)))
            pairs.append((a, b))
        same = all(s3.get_object(Bucket=EXPORTS, Key=f"exports/bench/{a}/records.jsonl")["Body"].read()
                   == s3.get_object(Bucket=EXPORTS, Key=f"exports/bench/{b}/records.jsonl")["Body"].read()
                   for a, b in pairs)
        before_large = rss_mb()
        large = corpus_run(database, base_url, "bench/large/")
        large_seconds = timed(database, large, four)
        head = s3.head_object(Bucket=EXPORTS, Key=f"exports/bench/{large}/records.jsonl")
        database.close()
    partitions = -(-args.items // 20)
    t1 = statistics.median(r[0] for r in rounds)
    t4 = statistics.median(r[1] for r in rounds)
    print()
    print(f"Corpus runs: {args.items} items in {partitions} partitions, model latency {args.latency * 1000:.0f} ms; "
          f"medians of {len(rounds)} interleaved rounds.")
    print()
    print("| series | wall time | baseline (same run) |")
    print("|---|---:|---:|")
    print(f"| concurrency 1 | {t1:.2f} s | model latency x partitions: {args.latency * partitions:.2f} s |")
    print(f"| concurrency 4 | {t4:.2f} s ({t1 / t4:.2f}x faster) | exports byte-identical: {same} |")
    print(f"| {args.large:,} items of {args.item_bytes} B (concurrency 4), export {head['ContentLength'] / 1e6:.1f} MB"
          f" | {large_seconds:.1f} s, peak RSS {rss_mb():.0f} MB (before it: {before_large:.0f} MB) | "
          f"RSS after setup: {baseline_rss:.0f} MB |")


if __name__ == "__main__":
    main()
