"""The runs of one SQS batch execute at once in one invocation (``KAIROS_RUN_CONCURRENCY_PER_INVOCATION``):
real PostgreSQL, the real run handler, a local model server that holds every request until the batch's
runs are all in their call at the same moment. Killed mid-batch, each run still ends exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from kairos import db as kairos_db
from kairos import runtime
from kairos.db import Database
from kairos.local.stack import load_function
from kairos.tick.repair import Repair
from tests import factories
from tests.support.aws import LambdaContext, run_body, sqs_event

ROOT = Path(__file__).resolve().parents[2]
WAIT = 30.0  # seconds: a bound on events that happen at once, never a timing assumption
BATCH = 10

app = load_function("run")


class GatedModel:
    """An OpenAI-compatible server that answers no request until ``need`` are in flight together (or
    ``WAIT`` ran out, once: then it stops waiting), and, while ``held``, not until ``release`` is set."""

    def __init__(self, need: int) -> None:
        self.need = need
        self.cond = threading.Condition()
        self.in_flight = self.peak = self.total = 0
        self.gave_up = False
        self.held = False
        self.release = threading.Event()
        gate = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                gate.arrive()
                try:
                    if gate.held:
                        gate.release.wait(WAIT)
                    body = json.dumps({
                        "id": "chatcmpl-batch", "object": "chat.completion",
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": "at once"}}],
                        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the invocation was killed while its call was in flight
                finally:
                    with gate.cond:
                        gate.in_flight -= 1

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.01},
                                       daemon=True)

    def arrive(self) -> None:
        with self.cond:
            self.in_flight += 1
            self.total += 1
            self.peak = max(self.peak, self.in_flight)
            self.cond.notify_all()
            if not self.cond.wait_for(lambda: self.peak >= self.need or self.gave_up, timeout=WAIT):
                self.gave_up = True  # one after another: let the rest through at once
                self.cond.notify_all()

    def wait_peak(self, timeout: float = WAIT) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.peak >= self.need, timeout=timeout)

    @property
    def agent(self) -> dict[str, Any]:
        return {"executor": "openai", "model": "m", "base_url": f"http://127.0.0.1:{self.server.server_address[1]}/v1",
                "max_tokens": 16}

    def __enter__(self) -> GatedModel:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def env(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    values = {"DATABASE_URL": db_url, "KAIROS_EGRESS_ALLOW": "127.0.0.1", "KAIROS_OWNER_CONCURRENCY": str(BATCH)}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("RUN_QUEUE_URL", raising=False)
    monkeypatch.delenv("KAIROS_RUN_CONCURRENCY_PER_INVOCATION", raising=False)  # the default
    runtime.reset()
    try:
        yield values
    finally:
        if db_url in kairos_db._databases:
            kairos_db._databases.pop(db_url).close()
        runtime.reset()


def runs_of(db_url: str, model: GatedModel, n: int) -> list[uuid.UUID]:
    # One schedule each (a newer fire of one schedule would supersede the older ones), one owner; with
    # catch-up, so that a rescued run is replayed rather than abandoned late.
    return [factories.run(db_url, schedule_row=factories.schedule(db_url, agent=model.agent, catch_up=True))["id"]
            for _ in range(n)]


def summary(db_url: str, run_id: uuid.UUID) -> dict[str, Any]:
    with psycopg.connect(db_url, row_factory=dict_row, autocommit=True) as conn:
        row = conn.execute("SELECT state, attempt, restarts FROM runs WHERE id = %s", (run_id,)).fetchone()
        events = conn.execute("SELECT type FROM run_events WHERE run_id = %s ORDER BY seq", (run_id,)).fetchall()
    assert row is not None
    types = [e["type"] for e in events]
    return {**row, "succeeded": types.count("run.succeeded"), "rescued": types.count("run.rescued"),
            "claimed": types.count("run.claimed")}


def test_a_batch_of_ten_runs_is_in_its_model_calls_at_once(env: dict[str, str], db_url: str) -> None:
    with GatedModel(need=BATCH) as model:
        run_ids = runs_of(db_url, model, BATCH)
        response = app.handler(sqs_event(*[run_body(r) for r in run_ids]), LambdaContext())

    assert response == {"batchItemFailures": []}
    assert model.peak >= BATCH and not model.gave_up  # all ten calls were in flight together
    assert [summary(db_url, r) for r in run_ids] == [
        {"state": "succeeded", "attempt": 1, "restarts": 0, "succeeded": 1, "rescued": 0, "claimed": 1}] * BATCH


def test_the_runs_of_a_batch_keep_their_own_connections_within_the_pool(env: dict[str, str]) -> None:
    # A run and its heartbeat per concurrent run: a full batch never waits on the pool.
    assert runtime.pool_size(runtime.settings()) >= 2 * BATCH
    assert runtime.database()._pool.max_size >= 2 * BATCH


_INVOKE = """
import json, sys
from kairos.local.stack import load_function
from tests.support.aws import LambdaContext
print(json.dumps(load_function("run").handler(json.loads(sys.stdin.read()), LambdaContext())), flush=True)
"""


def test_a_batch_killed_while_its_runs_execute_at_once_ends_each_run_once(
        env: dict[str, str], db_url: str) -> None:
    with GatedModel(need=BATCH) as model:
        model.held = True
        run_ids = runs_of(db_url, model, BATCH)
        event = sqs_event(*[run_body(r) for r in run_ids])
        # The invocation in its own process, killed (SIGKILL: nothing runs on the way out) once every
        # run of its batch is claimed and in its model call.
        proc = subprocess.Popen(
            [sys.executable, "-c", _INVOKE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, cwd=ROOT,
            env={**os.environ, **env, "PYTHONPATH": f"{ROOT / 'layers' / 'common'}{os.pathsep}{ROOT}"})
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(event).encode())
        proc.stdin.close()
        try:
            assert model.wait_peak(), "the batch's runs never were in their calls together"
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(WAIT)
        assert [summary(db_url, r)["state"] for r in run_ids] == ["running"] * BATCH
        model.held = False
        model.release.set()

        # Their leases (120 s) run out, well before their expiry; the tick's repair rescues each once,
        # and SQS delivers them again.
        database = Database(db_url)
        try:
            report = Repair(database, None, "").rescue_once(datetime.now(UTC) + timedelta(minutes=3))
        finally:
            database.close()
        assert (report.rescued, report.requeued) == (BATCH, BATCH)
        response = app.handler(sqs_event(*[run_body(r) for r in run_ids]), LambdaContext())
        again = app.handler(sqs_event(*[run_body(r) for r in run_ids]), LambdaContext())  # a late duplicate

    assert response == again == {"batchItemFailures": []}
    assert [summary(db_url, r) for r in run_ids] == [
        {"state": "succeeded", "attempt": 2, "restarts": 1, "succeeded": 1, "rescued": 1, "claimed": 2}] * BATCH
    assert model.total == 2 * BATCH  # each run's call: once by the killed attempt, once by the rescued one
