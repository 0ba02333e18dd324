"""The demo model served over HTTP for ``kairos dev``, and the conversation the stack prints for it.

Role: ``DemoModelServer`` serves ``kairos.local.demo_model`` on loopback: ``POST /v1/chat/completions``
(a JSON answer, or ``"stream": true`` server-sent events ending ``data: [DONE]``) and ``GET
/v1/models``. ``POST /sink`` (or any path under it) is a local target for the ``http_post`` tool: it
keeps the last 100 bodies it received (``GET /sink`` lists them) and answers ``{"received": <the
body>, "count": <how many this path received>}``. ``GET /usage`` sums the usage of every completion it
answered since it started (``calls``, ``prompt_tokens``, ``completion_tokens``): what Kairos's own
accounting should match. The stack allows exactly this server's address and port through the egress
check (``egress_allow``: ``KAIROS_EGRESS_ALLOW``, in the local stack only), so runs reach it and
nothing else on loopback. ``bind`` picks its port (the API's + 1 by default);
``ensure_conversation`` and ``print_banner`` keep and print one conversation whose agent uses it.

Guarantees: requests are bounded (8 MiB; a missing or bad ``Content-Length`` answers 411 / 400); a
slow answer stops when the server stops or its client goes away (a cancelled run's call is
aborted), and a client gone mid-answer is no traceback on the console; a taken port is one line and
exit 2 before anything starts.
Must not: log requests (prompts and tool bodies travel in them); ship (``kairos.local`` is left out
of the Lambda layer).
"""

from __future__ import annotations

import errno
import json
import select
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kairos import conversations, db
from kairos.db import Database
from kairos.local.demo_model import MODEL, DemoModel, error_answer, stream_chunks

TITLE = "Kairos demo model"
MAX_BODY = 8 * 1024 * 1024
SINK_KEEP = 100
SINK_BODY_CHARS = 65_536

@dataclass
class _Sink:
    received: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=SINK_KEEP))
    counts: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, path: str, body: bytes) -> dict[str, Any]:
        text = body.decode("utf-8", errors="replace")[:SINK_BODY_CHARS]
        try:
            value: Any = json.loads(text)
        except ValueError:
            value = text
        with self.lock:
            self.counts[path] = self.counts.get(path, 0) + 1
            self.received.append({"path": path, "body": value})
            return {"received": value, "count": self.counts[path]}

    def listing(self) -> dict[str, Any]:
        with self.lock:
            return {"received": list(self.received)}


@dataclass
class _Tally:
    """The completions this server answered and the usage it reported in them, since it started."""

    counts: dict[str, int] = field(default_factory=lambda: {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0})
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, usage: dict[str, int]) -> None:
        with self.lock:
            self.counts["calls"] += 1
            self.counts["prompt_tokens"] += usage["prompt_tokens"]
            self.counts["completion_tokens"] += usage["completion_tokens"]

    def totals(self) -> dict[str, int]:
        with self.lock:
            return dict(self.counts)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "kairos"}]})
        elif path == "/sink":
            self._json(200, self.server.sink.listing())
        elif path == "/usage":
            self._json(200, self.server.tally.totals())
        else:
            self._json(404, error_answer(404, "no such route", "invalid_request_error").body)

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        raw = (self.headers.get("Content-Length") or "").strip()
        if not raw.isdigit():
            refusal = error_answer(400, "send a Content-Length", "invalid_request_error")
            self._json(411 if not raw else 400, refusal.body, close=True)
            return
        if int(raw) > MAX_BODY:
            self._json(413, error_answer(413, "the body is over 8 MiB", "invalid_request_error").body, close=True)
            return
        body = self.rfile.read(int(raw))
        if path == "/sink" or path.startswith("/sink/"):
            self._json(200, self.server.sink.take(path, body))
            return
        if path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
            self._json(404, error_answer(404, "no such route", "invalid_request_error").body)
            return
        try:
            request = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            request = None
        answer = self.server.model.answer(request) if request is not None else \
            error_answer(400, "the body is not JSON", "invalid_request_error")
        streamed = isinstance(request, dict) and request.get("stream") is True and answer.completion
        if not streamed and answer.delay and not self._wait(answer.delay):
            self.close_connection = True
            return  # the server is stopping, or the client went away (a cancelled run aborts its call)
        if answer.completion:
            self.server.tally.add(answer.body["usage"])
        if not streamed:
            self._json(answer.status, answer.body)
            return
        assert isinstance(request, dict)
        options = request.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        self._stream(stream_chunks(answer, include_usage=include_usage), answer.delay)

    def _json(self, status: int, value: dict[str, Any], *, close: bool = False) -> None:
        payload = json.dumps(value, sort_keys=True).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        try:
            self.wfile.write(payload)
        except OSError:
            self.close_connection = True  # the client went away before its answer

    def _stream(self, chunks: list[dict[str, Any]], seconds: float) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.close_connection = True
        self.end_headers()
        pause = seconds / len(chunks) if chunks else 0.0
        try:
            for item in _events(chunks):
                if pause and not self._wait(pause):
                    return
                self.wfile.write(item)
                self.wfile.flush()
        except OSError:
            return  # the client went away (a cancelled run aborts its call)

    def _wait(self, seconds: float) -> bool:
        """Waits ``seconds``; False as soon as the server stops or the client closes its connection."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self.server.stopping.is_set():
                return False
            readable, _, _ = select.select([self.connection], [], [], min(left, 0.2))
            if readable:
                try:
                    if not self.connection.recv(1, socket.MSG_PEEK):
                        return False  # the peer closed its side: nobody is waiting for the answer
                except OSError:
                    return False
                self.server.stopping.wait(min(deadline - time.monotonic(), 0.2))  # pipelined bytes: keep time
        return not self.server.stopping.is_set()

    def log_message(self, format: str, *args: Any) -> None:
        return  # never log requests: prompts and tool bodies travel in them


def _events(chunks: list[dict[str, Any]]) -> Iterator[bytes]:
    for item in chunks:
        yield b"data: " + json.dumps(item, sort_keys=True).encode("utf-8") + b"\n\n"
    yield b"data: [DONE]\n\n"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-answer is no error; anything else is one line (never a request)."""
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            print(f"demo model: a request failed ({type(error).__name__})", file=sys.stderr)

    def __init__(self, address: tuple[str, int]) -> None:
        self.model = DemoModel()
        self.sink = _Sink()
        self.tally = _Tally()
        self.stopping = threading.Event()
        super().__init__(address, _Handler)


class DemoModelServer:
    """The demo model on ``host:port`` (0: a free port), bound at construction, serving after ``start``."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server = _Server((host, port))
        self._thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        return str(self._server.server_address[0])

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """What an ``openai`` agent's ``base_url`` is to use it."""
        return f"{self.url}/v1"

    @property
    def allow_entry(self) -> str:
        """The one ``KAIROS_EGRESS_ALLOW`` entry that lets runs reach it: its address and port only."""
        return f"{self.host}:{self.port}"

    def egress_allow(self, existing: str | None) -> str:
        """``KAIROS_EGRESS_ALLOW`` with this server's entry added to the operator's own entries."""
        entries = [e.strip() for e in (existing or "").split(",") if e.strip()]
        if self.allow_entry not in entries:
            entries.append(self.allow_entry)
        return ",".join(entries)

    def print_banner(self, database_url: str, public_url: str, *, owner: str, token: str) -> uuid.UUID:
        """Finds or makes the owner's conversation that uses this model and prints how to talk to it."""

        db = Database(database_url, max_size=1)
        try:
            with db.transaction() as conn:
                conversation_id = ensure_conversation(conn, owner=owner, base_url=self.base_url)
        finally:
            db.close()
        print(f"demo model {self.base_url}  (model {MODEL}, no key; runs may reach {self.allow_entry}; "
              "directives: docs/try.md)")
        print(f"conversation {conversation_id} uses it (tools: {', '.join(TOOLS)})")
        print(f"try:  curl -sS -X POST {public_url}/v1/conversations/{conversation_id}/messages "
              f"-H 'Authorization: Bearer {token}' -H 'content-type: application/json' "
              """-d '{"content": "Hello, demo model"}'\n""")
        return conversation_id

    def start(self) -> DemoModelServer:
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever, name="kairos-demo-model", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._server.stopping.set()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> DemoModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def bind(api_port: int, demo_port: int | None) -> DemoModelServer | None:
    """The demo model bound for ``kairos dev`` (``demo_port``; by default the API's port + 1, or a free
    port when the API's is 0), or None after one line when that port is taken."""
    port = demo_port if demo_port is not None else (api_port + 1 if api_port else 0)
    try:
        return DemoModelServer(port=port)
    except OSError as err:
        if err.errno != errno.EADDRINUSE:
            raise
        print(f"kairos dev: demo model port {port} is in use; pass --demo-port (0 picks a free one)",
              file=sys.stderr)
        return None


# -- the conversation that uses it -----------------------------------------------------------------

TOOLS = ("http", "schedules")


def agent(base_url: str) -> dict[str, Any]:
    """The demo conversation's agent: the demo model, no key (none is needed), both tool families."""
    return {"executor": "openai", "base_url": base_url, "model": MODEL, "tools": list(TOOLS),
            "system": "You are the Kairos demo model: you follow the demo: lines of each message."}


def ensure_conversation(conn: Any, *, owner: str, base_url: str) -> uuid.UUID:
    """The owner's demo-model conversation for ``base_url``: found again when it exists, else made."""

    found = db.fetch_one(conn, "conversations_find_titled", {"owner": owner, "title": TITLE, "base_url": base_url})
    if found is not None:
        return uuid.UUID(str(found["id"]))
    return conversations.create(conn, owner=owner, agent=agent(base_url), title=TITLE).id

