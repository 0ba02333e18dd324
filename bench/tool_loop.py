"""The tool loop's overhead per step, beside a bare model call to the same local model server.

What is measured, in one run, on one PostgreSQL server and one local chat-completions server (a real
HTTP server on 127.0.0.1 that answers at once, so its own time is the same in every series):

1. **bare model call**: ``OpenAIExecutor.prepare`` + ``send`` for a chat-completions request, no
   database — the cost every step of a loop pays anyway;
2. **plain run**: ``runs.worker.process`` of a chat turn whose agent has no tools (claim, prompt
   entry, one model call with its effect, the answer, the terminal update);
3. **tool-loop run**: a chat turn whose agent has ``schedules`` tools and a model that asks for
   ``schedules_list`` ``K`` times before answering: ``K + 1`` model turns and ``K`` tool steps, each an
   effect under the fence and a recorded step.

Reported: milliseconds per run and per step, and the overhead of a loop step over a bare model call
(``(loop run - plain run) / (2K)`` beside ``bare model call``). Runs are processed one at a time
(latency, not throughput).

Run: ``.venv/bin/python bench/tool_loop.py [--runs N] [--steps K]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from baseline import recreate, server

from kairos import chat, conversations, migrations
from kairos.db import Database
from kairos.execution.execute import process
from kairos.executors.base import ExecutionRequest
from kairos.executors.openai import OpenAIExecutor
from kairos.settings import Settings

SETTINGS = Settings(egress_allow=("127.0.0.1",))


@contextmanager
def model_server(steps: int) -> Iterator[str]:
    """Asks for ``schedules_list`` until the request carries ``steps`` tool answers, then answers."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            answered = sum(1 for m in body["messages"] if m["role"] == "tool")
            if body.get("tools") and answered < steps:
                message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [{
                    "id": f"c{answered}", "type": "function",
                    "function": {"name": "schedules_list", "arguments": "{}"}}]}
            else:
                message = {"role": "assistant", "content": "done"}
            data = json.dumps({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
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


def bare_calls(base_url: str, count: int) -> float:
    """Milliseconds per bare model call (prepare + send)."""
    executor = OpenAIExecutor(allow=("127.0.0.1",))
    request = ExecutionRequest(run_id="bench", attempt=1, owner="bench",
                               agent={"executor": "openai", "model": "m", "base_url": base_url},
                               transcript=(), prompt="hi")
    started = time.perf_counter()
    for _ in range(count):
        executor.send(executor.prepare(request), timeout=10)
    return (time.perf_counter() - started) * 1000 / count


def runs(database: Database, agent: dict[str, Any], count: int) -> float:
    """Milliseconds per chat turn processed to its end (the turn's recording not timed)."""
    ids: list[uuid.UUID] = []
    with database.transaction() as conn:
        for _ in range(count):
            conversation = conversations.create(conn, owner="bench", agent=agent, title="bench")
            ids.append(chat.post(conn, conversation.id, owner="bench", raw={"content": "what runs?"}).run_id)
    started = time.perf_counter()
    for run_id in ids:
        outcome = process(database, run_id, settings=SETTINGS)
        if outcome.result != "succeeded":
            raise RuntimeError(f"run {run_id} ended {outcome.result} ({outcome.reason_code})")
    return (time.perf_counter() - started) * 1000 / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100, help="runs per series")
    parser.add_argument("--steps", type=int, default=3, help="tool calls the model asks for per run (K)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    args = parser.parse_args()
    logging.getLogger("kairos").setLevel(logging.WARNING)
    k = args.steps
    with server() as (admin_url, _), model_server(k) as base_url:
        url = recreate(admin_url, "kairos_bench_tools")
        migrations.apply(url)
        database = Database(url, max_size=4)
        plain_agent = {"executor": "openai", "model": "m", "base_url": base_url}
        loop_agent = {**plain_agent, "tools": ["schedules"], "approval": "never", "max_steps": k + 1}
        bare_calls(base_url, 20)  # warm the connection paths
        rounds = [(bare_calls(base_url, args.runs * 2), runs(database, plain_agent, args.runs),
                   runs(database, loop_agent, args.runs)) for _ in range(max(1, args.rounds))]
        database.close()
    bare = statistics.median(r[0] for r in rounds)
    plain = statistics.median(r[1] for r in rounds)
    loop = statistics.median(r[2] for r in rounds)
    per_step = (loop - plain) / (2 * k)
    print()
    print(f"Tool loop: {args.runs} runs per series, K = {k} tool calls per loop run "
          f"({k + 1} model turns, {k} tool steps); medians of {len(rounds)} interleaved rounds.")
    print()
    print("| series | ms per run | ms per model call or step |")
    print("|---|---:|---:|")
    print(f"| bare model call (prepare + send, no database) | — | {bare:.2f} |")
    print(f"| plain run (chat turn, one model call) | {plain:.2f} | {plain:.2f} |")
    print(f"| tool-loop run ({k + 1} model turns, {k} tool steps) | {loop:.2f} | {loop / (2 * k + 1):.2f} |")
    print()
    print(f"Overhead of a loop step (a model turn or a tool call, each an effect and a recorded step) over the plain "
          f"run: {per_step:.2f} ms, beside {bare:.2f} ms for the bare model call it wraps "
          f"({per_step / bare:.1f}x).")


if __name__ == "__main__":
    main()
