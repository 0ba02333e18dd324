"""A counting TCP proxy in front of PostgreSQL: what a code path costs on the wire.

``WireCounter`` listens on a local port and relays every connection to the real server, parsing
the frontend protocol as it passes. It counts, over all connections, from its last ``reset``:

* ``round_trips``: the times a client sent after the server had answered (a burst of client bytes
  between two answers is one trip, however many messages or TCP segments it holds) — what latency
  multiplies, independent of how the client library batches. The server speaks only when asked
  (``Sync``, ``Flush``, a simple ``Query``), so in pipeline mode the statements sent before one such
  request and the answer to it are one trip;
* ``statements``: the statements executed (extended-protocol ``Execute`` and simple ``Query``
  messages; ``BEGIN`` and ``COMMIT`` count);
* ``texts``: the statements' texts where the wire names them (``Parse`` and ``Query``; a prepared
  statement's later executions do not repeat its text).

It never changes a byte. Commits are counted elsewhere (the distinct ``xmin`` of the rows written).
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from psycopg.conninfo import conninfo_to_dict, make_conninfo


class WireCounter:
    def __init__(self, url: str) -> None:
        params = conninfo_to_dict(url)
        self._target = (str(params.get("host") or "localhost"), int(params.get("port") or 5432))
        self._listener = socket.create_server(("127.0.0.1", 0))
        params["host"], params["port"] = "127.0.0.1", self._listener.getsockname()[1]
        params["sslmode"] = "disable"  # the proxy reads the protocol in clear
        params["gssencmode"] = "disable"
        self.url = make_conninfo(**params)
        self._lock = threading.Lock()
        self.round_trips = 0
        self.statements = 0
        self.texts: list[str] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def reset(self) -> None:
        with self._lock:
            self.round_trips = 0
            self.statements = 0
            self.texts = []

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = _connect(self._target)
            state = {"answered": True}  # the server spoke last (or nobody yet)
            threading.Thread(target=self._client_to_server, args=(client, server, state), daemon=True).start()
            threading.Thread(target=self._server_to_client, args=(server, client, state), daemon=True).start()

    def _server_to_client(self, server: socket.socket, client: socket.socket, state: dict[str, bool]) -> None:
        try:
            while data := server.recv(65536):
                with self._lock:
                    state["answered"] = True
                client.sendall(data)
        except OSError:
            pass
        finally:
            _close(client)

    def _client_to_server(self, client: socket.socket, server: socket.socket, state: dict[str, bool]) -> None:
        buffer = b""
        started = False  # the startup message has no type byte
        try:
            while data := client.recv(65536):
                with self._lock:
                    if state["answered"]:
                        self.round_trips += 1
                        state["answered"] = False
                buffer += data
                while not started and len(buffer) >= 8:
                    length, code = struct.unpack("!ii", buffer[:8])
                    if len(buffer) < length:
                        break
                    buffer = buffer[length:]
                    started = code not in _NEGOTIATIONS  # SSL/GSS requests precede the startup message
                if not started:
                    server.sendall(data)
                    continue
                buffer = self._parse(buffer)
                server.sendall(data)
        except OSError:
            pass
        finally:
            _close(server)

    def _parse(self, buffer: bytes) -> bytes:
        while len(buffer) >= 5:
            kind = buffer[:1]
            (length,) = struct.unpack("!i", buffer[1:5])
            if len(buffer) < 1 + length:
                break
            body = buffer[5 : 1 + length]
            buffer = buffer[1 + length :]
            with self._lock:
                if kind == b"Q":
                    self.statements += 1
                    self.texts.append(body.rstrip(b"\0").decode(errors="replace"))
                elif kind == b"E":
                    self.statements += 1
                elif kind == b"P":
                    name_end = body.index(b"\0")
                    text_end = body.index(b"\0", name_end + 1)
                    self.texts.append(body[name_end + 1 : text_end].decode(errors="replace"))
        return buffer


_NEGOTIATIONS = (80877103, 80877104)  # SSLRequest, GSSENCRequest


def _connect(target: tuple[str, int]) -> socket.socket:
    host, port = target
    if host.startswith("/"):  # a Unix-domain socket directory
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(f"{host}/.s.PGSQL.{port}")
        return sock
    return socket.create_connection(target)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


@contextmanager
def wire_counter(url: str) -> Iterator[WireCounter]:
    counter = WireCounter(url)
    try:
        yield counter
    finally:
        counter.close()
