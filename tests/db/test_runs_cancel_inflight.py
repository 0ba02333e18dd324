"""Cancel reaches the call in flight: the heartbeat that reads the cancel request aborts the HTTP call,
so a cancelled run does not wait out (and pay for) a model or target that holds its answer. A real
local server holds every response until the test releases it; nothing here waits on a clock."""

from __future__ import annotations

import json
import select
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from kairos import runs
from kairos.db import Database
from kairos.execution.claim import Outcome
from kairos.execution.execute import process
from kairos.settings import Settings
from tests import factories

SETTINGS = Settings(egress_allow=("127.0.0.1",))
BOUND = 20.0  # seconds any wait may take before the test fails; a passing run never comes near it


@dataclass
class HoldingServer:
    port: int = 0
    received: threading.Event = field(default_factory=threading.Event)  # a request arrived
    closed: threading.Event = field(default_factory=threading.Event)  # its client closed before the release
    release: threading.Event = field(default_factory=threading.Event)  # the test lets the answer go

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


@pytest.fixture
def holding(monkeypatch: pytest.MonkeyPatch) -> Iterator[HoldingServer]:
    monkeypatch.setenv("KAIROS_E2E_HOLD_KEY", "whsec_" + "a2V5" * 8)
    monkeypatch.setenv("KAIROS_SHARED_SECRETS", "env:KAIROS_E2E_HOLD_KEY@http://127.0.0.1:*")
    state = HoldingServer()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            state.received.set()
            # Hold the answer. The socket turns readable when the client closes it (EOF) — or never.
            readable, _, _ = select.select([self.connection], [], [], BOUND)
            if readable and not state.release.is_set():
                try:
                    eof = self.connection.recv(1, socket.MSG_PEEK) == b""
                except OSError:
                    eof = True
                if eof:
                    state.closed.set()
                    return
            state.release.wait(BOUND)
            body = json.dumps({"choices": [{"message": {"role": "assistant", "content": "late"}}]}).encode()
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:
                pass

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.block_on_close = False
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()


def _agent(executor: str, server: HoldingServer) -> dict[str, Any]:
    if executor == "openai":
        return {"executor": "openai", "model": "m", "base_url": server.base_url}
    return {"executor": "http", "base_url": server.base_url, "api_key_secret": "env:KAIROS_E2E_HOLD_KEY"}


@pytest.mark.parametrize(("executor", "effect_state"), [("openai", "failed"), ("http", "ambiguous")])
def test_cancel_aborts_the_call_in_flight_and_the_run_ends_cancelled(
        db: Database, db_url: str, holding: HoldingServer, executor: str, effect_state: str) -> None:
    # Given a run whose call reached a server that holds its answer
    sched = factories.schedule(db_url, agent=_agent(executor, holding))
    run = factories.run(db_url, schedule_row=sched)
    result: dict[str, Outcome] = {}

    def work() -> None:
        result["outcome"] = process(db, run["id"], settings=SETTINGS, heartbeat_interval=0.05)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    try:
        assert holding.received.wait(BOUND)

        # When its owner cancels it
        with db.transaction() as conn:
            assert runs.cancel(conn, run["id"], owner="alice").cancel_requested_at is not None

        # Then the server sees the connection closed and the run ends, with the answer still held
        assert holding.closed.wait(BOUND), "the call in flight was not aborted"
        worker.join(BOUND)
        assert not worker.is_alive() and not holding.release.is_set()
    finally:
        holding.release.set()
        worker.join(BOUND)
    outcome = result["outcome"]
    assert (outcome.result, outcome.state) == ("cancelled", "cancelled")
    with psycopg.connect(db_url, row_factory=dict_row, autocommit=True) as conn:
        row = conn.execute("SELECT state, fence, diagnosis FROM runs WHERE id = %s", (run["id"],)).fetchone()
        effect = conn.execute("SELECT state, fence FROM effects WHERE run_id = %s", (run["id"],)).fetchone()
        types = [r["type"] for r in conn.execute("SELECT type FROM run_events WHERE run_id = %s ORDER BY seq",
                                                 (run["id"],))]
    assert row is not None and effect is not None
    assert row["state"] == "cancelled" and row["diagnosis"]["reason_code"] == "cancelled"
    # Closed under the run's fence: a model call that was cut is failed, a mutation's outcome is unknown
    assert (effect["state"], effect["fence"]) == (effect_state, row["fence"])
    assert types[-1] == "run.cancelled" and "output.published" not in types


def test_a_call_whose_abort_fired_before_it_connected_sends_nothing(holding: HoldingServer) -> None:
    from kairos.executors import egress
    from kairos.executors.base import Abort

    abort = Abort()
    abort.fire()
    target = egress.check(holding.base_url, allow=["127.0.0.1"])
    with pytest.raises(egress.TransportFailure) as info:
        egress.post(target, body=b"{}", headers={}, timeout=5, read_limit=1024, abort=abort)
    assert (info.value.stage, info.value.detail) == ("connect", "aborted")
    assert not holding.received.is_set()
