"""A scriptable local HTTP(S) server (``Peer``), the behaviours the executor and transport tests give it, and a
resolver that sends every name to it."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kairos.executors import egress


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]  # lower-cased names
    body: bytes


Behaviour = Callable[[BaseHTTPRequestHandler, "Peer"], None]


class Peer:
    """A real HTTP(S) server on 127.0.0.1, port 0, answering every POST with ``behaviour``.

    ``release`` is the event a hanging handler waits on: a test sets it once its client has timed
    out, so nothing depends on sleeping. ``received`` lists what arrived, in order.
    """

    def __init__(self, behaviour: Behaviour, *, tls: ssl.SSLContext | None = None) -> None:
        self.behaviour = behaviour
        self.received: list[Received] = []
        self.release = threading.Event()
        peer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                peer.received.append(
                    Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                )
                try:
                    peer.behaviour(self, peer)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client stopped reading (read limit) or timed out: expected in these tests
                self.close_connection = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        # A short poll interval keeps shutdown() (which waits for the loop to notice) from costing 0.5 s.
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.01},
                                        daemon=True)

    def url(self, path: str = "/v1", *, host: str = "127.0.0.1", scheme: str = "http") -> str:
        return f"{scheme}://{host}:{self.port}{path}"

    def __enter__(self) -> Peer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def respond(status: int, body: bytes | str, content_type: str = "application/json") -> Behaviour:
    data = body.encode() if isinstance(body, str) else body

    def behaviour(handler: BaseHTTPRequestHandler, peer: Peer) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    return behaviour


def hang(handler: BaseHTTPRequestHandler, peer: Peer) -> None:
    """Read the request, then answer nothing until the test releases it."""
    peer.release.wait(30)


def partial_then_hang(handler: BaseHTTPRequestHandler, peer: Peer) -> None:
    """Answer 200 and the first bytes of a longer body, then nothing until the test releases it."""
    handler.send_response(200)
    handler.send_header("Content-Length", "100")
    handler.end_headers()
    handler.wfile.write(b"first part")
    handler.wfile.flush()
    peer.release.wait(30)


def drop(handler: BaseHTTPRequestHandler, peer: Peer) -> None:
    """Read the request, then close the connection without a status line."""
    handler.connection.shutdown(socket.SHUT_RDWR)


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def resolver_to(address: str, calls: list[str] | None = None) -> egress.Resolver:
    """A resolver answering ``address`` for every name, recording the names it was asked."""

    def resolve(host: str, port: int, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        if calls is not None:
            calls.append(host)
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        return [(family, socket.SOCK_STREAM, 6, "", (address, port))]

    return resolve
