"""A local SQS stand-in: enough of SQS's JSON protocol for ``SendMessageBatch``, with a delay per call.

Why: moto scans its queue on every send (it measures moto, not the tick), and real SQS is not here.
The stand-in answers ``AmazonSQS.SendMessageBatch`` after ``delay_ms`` (threaded server: calls overlap
as the client overlaps them), accepts every entry (``Successful`` with the MD5 of each body) except:

* entries whose body contains a string in ``refuse_entries`` come back under ``Failed``;
* a call with any body containing a string in ``fail_calls`` is answered ``400 QueueDoesNotExist``
  (a whole-call ``ClientError``, which botocore does not retry).

Every answer is written without waiting for Nagle's algorithm (``TCP_NODELAY``): before, a call that
"answered at once" took ~40 ms (the body's write waited for the client's delayed ACK of the headers'
write), so a tick measured against it waited on the stand-in, not on SQS's protocol.

It records what a test or bench observes: calls, entries, the bodies accepted, and the largest number
of calls in flight at once (``max_in_flight``; also ``GET /stats`` for a bench that runs the stand-in
in its own process, off its GIL). No other SQS action is served (answered 400).

Use: ``with SqsStandin(delay_ms=20) as standin: client = standin.client()`` (a botocore client pointed
at it, connection pool sized ``pool``), or ``python bench/sqs_standin.py --port 9324 --delay-ms 20``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Stats:
    calls: int = 0
    entries: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    accepted: list[str] = field(default_factory=list)  # bodies
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class SqsStandin:
    """A threaded HTTP server on 127.0.0.1 (an ephemeral port unless given); a context manager."""

    def __init__(self, *, delay_ms: float = 0.0, port: int = 0, refuse_entries: tuple[str, ...] = (),
                 fail_calls: tuple[str, ...] = (), nagle: bool = False) -> None:
        self.delay = delay_ms / 1000
        self.refuse_entries = refuse_entries
        self.fail_calls = fail_calls
        self.stats = Stats()
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: the client's pooled connections are reused
            # An answer goes out at once: with Nagle's algorithm on, the body (a second small write after
            # the headers) waited for the client's delayed ACK of the headers, about 40 ms a call
            # (``nagle=True`` keeps that, to compare with what the stand-in measured before).
            disable_nagle_algorithm = not nagle

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                payload = json.loads(self.rfile.read(length) or b"{}")
                target = self.headers.get("X-Amz-Target", "")
                status, answer = standin._answer(target, payload)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.0")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("x-amzn-RequestId", str(uuid.uuid4()))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # /stats: what the stand-in observed (for a bench in another process)
                stats = standin.stats
                with stats.lock:
                    data = json.dumps({"calls": stats.calls, "entries": stats.entries,
                                       "max_in_flight": stats.max_in_flight}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="sqs-standin", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def queue_url(self) -> str:
        return f"{self.url}/123456789012/runs"

    def client(self, pool: int = 16) -> Any:
        """A botocore SQS client pointed at the stand-in (no retries: what a call does is what it shows)."""
        import botocore.session
        from botocore.config import Config

        config = Config(max_pool_connections=pool, retries={"max_attempts": 1, "mode": "standard"})
        return botocore.session.get_session().create_client(
            "sqs", region_name="us-east-1", endpoint_url=self.url, aws_access_key_id="standin",
            aws_secret_access_key="standin", config=config)

    def _answer(self, target: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        stats = self.stats
        with stats.lock:
            stats.calls += 1
            stats.in_flight += 1
            stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
        try:
            if self.delay:
                time.sleep(self.delay)
            if target != "AmazonSQS.SendMessageBatch":
                return 400, {"__type": "com.amazonaws.sqs#InvalidAction", "message": f"not served: {target}"}
            entries = payload.get("Entries", [])
            if any(marker in e.get("MessageBody", "") for e in entries for marker in self.fail_calls):
                return 400, {"__type": "com.amazonaws.sqs#QueueDoesNotExist", "message": "queue does not exist"}
            ok, failed = [], []
            for entry in entries:
                text = entry.get("MessageBody", "")
                if any(marker in text for marker in self.refuse_entries):
                    failed.append({"Id": entry["Id"], "SenderFault": False, "Code": "InternalError",
                                   "Message": "try again"})
                    continue
                ok.append({"Id": entry["Id"], "MessageId": str(uuid.uuid4()),
                           "MD5OfMessageBody": hashlib.md5(text.encode()).hexdigest()})
            with stats.lock:
                stats.entries += len(entries)
                stats.accepted.extend(e["MessageBody"] for e in entries
                                      if not any(m in e["MessageBody"] for m in self.refuse_entries))
            return 200, {"Successful": ok, "Failed": failed}
        finally:
            with stats.lock:
                stats.in_flight -= 1

    def start(self) -> SqsStandin:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> SqsStandin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class StandinProcess:
    """The stand-in in a child process (``python bench/sqs_standin.py``): its threads never compete with
    the measured process for the GIL. ``client()``, ``queue_url`` and ``stats()`` as in-process."""

    def __init__(self, *, delay_ms: float = 0.0, nagle: bool = False) -> None:
        import socket
        import subprocess
        import sys

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.process = subprocess.Popen([sys.executable, __file__, "--port", str(self.port), "--delay-ms",
                                         str(delay_ms), *(["--nagle"] if nagle else [])],
                                        stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        self.process.stdout.readline()  # the ready line

    url = SqsStandin.url
    queue_url = SqsStandin.queue_url

    @property
    def server(self) -> Any:  # what SqsStandin.url reads
        class Address:
            server_address = ("127.0.0.1", self.port)

        return Address

    def client(self, pool: int = 16) -> Any:
        client = SqsStandin.client(self, pool)  # type: ignore[arg-type]
        client.standin_pid = self.process.pid  # a bench reads the stand-in's CPU time from /proc
        return client

    def stats(self) -> dict[str, int]:
        import urllib.request

        with urllib.request.urlopen(f"{self.url}/stats", timeout=5) as answer:
            return dict(json.loads(answer.read()))

    def __enter__(self) -> StandinProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9324)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--nagle", action="store_true", help="answer with Nagle's algorithm on (~40 ms a call)")
    args = parser.parse_args()
    standin = SqsStandin(delay_ms=args.delay_ms, port=args.port, nagle=args.nagle).start()
    print(f"SQS stand-in on {standin.url} ({args.delay_ms} ms a call); Ctrl-C ends it", flush=True)
    try:
        standin.thread.join()
    except KeyboardInterrupt:
        standin.stop()


if __name__ == "__main__":
    main()
