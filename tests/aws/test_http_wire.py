"""The lean exchange (``kairos.http_wire``) writes what urllib3 writes and ends every answer the way
botocore's session (urllib3 + http.client) does.

Each case runs the same calls through two lean senders against two servers scripted alike: one sends on
``kairos.http_wire`` once its pooled connection is open, the other always through the client's HTTP
session. The signing time is fixed, so the bytes each server receives must be the same, byte for byte;
so must each call's outcome (the answer, the ClientError, the transport exception's class), the attempts
the retry policy makes, and which TCP connection every request arrived on (keep-alive, reconnects).
The scripted server answers with raw bytes: Content-Length, chunked and read-to-close bodies,
``Connection: close``, HTTP/1.0, a 100 Continue, folded and bare-LF headers, error statuses, an answer cut
short, a connection closed or reset without an answer, no answer at all (a read timeout), an idle
connection the server closed; over TLS with a custom CA bundle too; and through a proxy (the session's).
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import botocore.session
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from urllib3.util.timeout import Timeout

from kairos import handoff, http_wire, sqs_batch

REGION = "us-east-1"
FIXED = datetime(2026, 12, 7, 20, 0, 0, tzinfo=UTC)


def entries(n: int = 3) -> list[dict[str, Any]]:
    return [{"Id": i.hex, "MessageBody": handoff.body(i)} for i in (uuid.uuid4() for _ in range(n))]


def accepted(body: bytes) -> bytes:
    return json.dumps({"Successful": [{"Id": e["Id"], "MessageId": e["Id"], "MD5OfMessageBody": "0" * 32}
                                      for e in json.loads(body)["Entries"]], "Failed": []}).encode()


@dataclass
class Reply:
    """One scripted answer. ``body`` None: every entry accepted. ``framing``: length, chunked, close (no
    length, the connection closed after the body). ``then``: keep, close (FIN), reset (RST), hang (no
    answer: the connection is held until the server stops). ``cut``: the answer ends after that many bytes
    and the connection closes."""

    status: bytes = b"HTTP/1.1 200 OK"
    headers: list[bytes] = field(default_factory=lambda: [b"Content-Type: application/x-amz-json-1.0",
                                                          b"x-amzn-RequestId: 6d3c0d7c-request"])
    body: bytes | None = None
    framing: str = "length"
    then: str = "keep"
    before: bytes = b""
    cut: int | None = None
    eol: bytes = b"\r\n"
    pieces: int = 1
    trailing: bytes = b""  # bytes after the body (in the same write)

    def render(self, request_body: bytes) -> bytes:
        body = accepted(request_body) if self.body is None else self.body
        headers = list(self.headers)
        if self.framing == "length":
            headers.append(b"Content-Length: %d" % len(body))
        elif self.framing == "chunked":
            headers.append(b"Transfer-Encoding: chunked")
            half = len(body) // 2
            body = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:half], body[half:])) + b"0\r\n\r\n"
        data = self.before + self.eol.join([self.status, *headers]) + self.eol + self.eol + body + self.trailing
        return data if self.cut is None else data[:self.cut]


OK = Reply()
NO_ANSWER = Reply(then="close", cut=0)


class RawServer:
    """A TCP server answering each request it reads with the next scripted reply (the last repeats),
    recording (connection number, the request's bytes)."""

    def __init__(self, script: list[Reply], tls: ssl.SSLContext | None = None) -> None:
        self.script = script
        self.tls = tls
        self.requests: list[tuple[int, bytes]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.closed = threading.Condition(self.lock)
        self.closed_numbers: set[int] = set()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.connections = 0
        self.base = 0

    def reset(self) -> None:
        """The script from its start, for a second client (connections numbered from 0 again)."""
        with self.lock:
            self.requests.clear()
            self.base = self.connections

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def __enter__(self) -> RawServer:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.listener.close()

    def wait_closed(self, count: int) -> None:
        """Until the server has closed the first ``count`` connections since the last reset (a deadline,
        not a sleep)."""
        with self.closed:
            assert self.closed.wait_for(
                lambda: all(self.base + i in self.closed_numbers for i in range(count)), timeout=10)

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                number = self.connections
                self.connections += 1
            threading.Thread(target=self._serve, args=(sock, number), daemon=True).start()

    def _serve(self, sock: socket.socket, number: int) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls is not None:
            try:
                sock = self.tls.wrap_socket(sock, server_side=True)
            except (OSError, ssl.SSLError):
                sock.close()
                return
        reader = sock.makefile("rb")
        action = "close"
        try:
            while True:
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    line = reader.readline()
                    if not line:
                        return
                    head += line
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                body = reader.read(length)
                with self.lock:
                    self.requests.append((number - self.base, head + body))
                    reply = self.script[min(len(self.requests), len(self.script)) - 1]
                data = reply.render(body)
                step = max(1, -(-len(data) // reply.pieces))
                for i in range(0, len(data), step):
                    sock.sendall(data[i:i + step])
                action = reply.then
                if reply.cut is not None or reply.framing == "close":
                    action = "close" if action == "keep" else action
                if action != "keep":
                    return
        except OSError:
            return
        finally:
            if action == "hang":
                self.stop.wait(30)
            if action == "reset":
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
            with self.closed:
                self.closed_numbers.add(number)
                self.closed.notify_all()


def make_client(endpoint: str, *, attempts: int = 3, **config: Any) -> Any:
    session = botocore.session.get_session()
    verify = config.pop("verify", None)
    return session.create_client("sqs", region_name=REGION, endpoint_url=endpoint, verify=verify,
                                 config=Config(retries={"mode": "standard", "total_max_attempts": attempts},
                                               **config),
                                 aws_access_key_id="testing", aws_secret_access_key="testing")


def outcome(call: Callable[[], dict[str, Any]]) -> tuple[str, Any]:
    try:
        answer = call()
    except ClientError as exc:
        return "ClientError", exc.response["Error"]
    except Exception as exc:  # the transport exception's class is the outcome
        return type(exc).__name__, None
    # Everything the answer holds (a 200 the parser read includes ResponseMetadata with every header).
    return "ok", {**answer, "Successful": sorted(e["Id"] for e in answer.get("Successful", []))}


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The retry policy's backoffs, recorded instead of slept."""
    asked: list[float] = []
    monkeypatch.setattr(time, "sleep", asked.append)
    return asked


@dataclass
class Run:
    outcomes: list[tuple[str, Any]]
    requests: list[tuple[int, bytes]]
    session_sends: int
    waits: int


@contextmanager
def serving(script: list[Reply], tls: ssl.SSLContext | None = None) -> Iterator[RawServer]:
    with RawServer(script, tls) as server:
        yield server


def run(script: list[Reply], batches: list[list[dict[str, Any]]], *, wire: bool, waits: list[float],
        tls: ssl.SSLContext | None = None, between: Callable[[RawServer, int], None] | None = None,
        server: RawServer | None = None, **config: Any) -> Run:
    """The batches sent one after another by a lean sender, on the wire or through the session only."""
    waits.clear()
    with (nullcontext(server) if server is not None else serving(script, tls)) as server:
        server.reset()
        scheme = "https" if tls is not None else "http"
        host = "localhost" if tls is not None else "127.0.0.1"
        endpoint = f"{scheme}://{host}:{server.port}"
        sqs = make_client(endpoint, **config)
        sender = sqs_batch.sender(sqs)
        assert sender is not None
        sender._now = lambda: FIXED  # type: ignore[method-assign]  # both paths sign the same bytes
        if not wire:
            sender._wire = None
        sends: list[int] = []
        session = sqs._endpoint.http_session
        original = session.send
        session.send = lambda request: (sends.append(1), original(request))[1]
        queue = f"{endpoint}/123456789012/runs"
        outcomes = []
        for index, batch in enumerate(batches):
            if between is not None:
                between(server, index)
            outcomes.append(outcome(lambda batch=batch: sender.send(queue, batch)))
        requests = list(server.requests)
    return Run(outcomes, requests, len(sends), len(waits))


def same(script: list[Reply], calls: int = 3, **kwargs: Any) -> Run:
    """Runs both paths and asserts they end alike; returns the wire's run."""
    batches = [entries() for _ in range(calls)]
    with RawServer(script, kwargs.get("tls")) as server:  # one port: the same Host, the same signature
        wire = run(script, batches, wire=True, server=server, **kwargs)
        session = run(script, batches, wire=False, server=server, **kwargs)
    assert wire.outcomes == session.outcomes
    assert wire.waits == session.waits
    assert [n for n, _ in wire.requests] == [n for n, _ in session.requests], "keep-alive and reconnects differ"
    assert [r for _, r in wire.requests] == [r for _, r in session.requests], "the bytes written differ"
    assert session.session_sends >= len(session.requests)
    return wire


def on_the_wire(result: Run) -> bool:
    return result.session_sends < len(result.requests)


# --- 200 answers --------------------------------------------------------------------------------------


@pytest.mark.parametrize("reply", [
    OK,
    Reply(pieces=5),  # the answer in five writes: headers and body split anywhere
    Reply(headers=[b"Content-Length:   0000"], body=b""),  # an empty body (then not JSON: the parser's)
    Reply(framing="chunked"),
    Reply(framing="close"),  # no length: read to the end, then the connection is gone
    Reply(headers=[b"Connection: close"], then="close"),
    Reply(headers=[b"Connection: close"]),  # said, but the server keeps it open: the client closes it
    Reply(headers=[b"Connection: keep-alive"]),
    Reply(status=b"HTTP/1.0 200 OK", then="close"),
    Reply(status=b"HTTP/1.1 200 ", headers=[b"x-amzn-RequestId: r"]),  # no reason phrase
    Reply(before=b"HTTP/1.1 100 Continue\r\n\r\n"),
    Reply(headers=[b"X-Folded: a", b" b", b"Content-Type: application/x-amz-json-1.0"]),
    Reply(eol=b"\n"),
    Reply(headers=[b"Content-Length: 1", b"X: y"]),  # two lengths (the first one counts): the library's
    Reply(headers=[b"Bad Header: x"], then="close"),  # the email parser ends the headers there: read to close
    Reply(headers=[b"X-Many: x"] * 120),  # over http.client's header count
    Reply(body=b"not json"),
    Reply(trailing=b"EXTRA"),  # more than the length said: read and dropped with http.client's buffer
], ids=["length", "pieces", "empty", "chunked", "read-to-close", "connection-close", "close-kept-open", "keep-alive",
        "http-1.0", "no-reason", "100-continue", "folded", "bare-lf", "two-lengths", "bad-name", "120-headers",
        "not-json", "trailing"])
def test_200_answers_end_as_the_session_ends_them(reply: Reply, waits: list[float]) -> None:
    result = same([OK, reply, OK, OK], calls=4, waits=waits)
    assert on_the_wire(result)


def test_answers_of_many_sizes_are_read_whole(waits: list[float]) -> None:
    big = [OK] + [Reply(headers=[b"X-Pad: " + b"p" * size]) for size in (10, 4000, 30000, 60000, 70000)]
    result = same(big, calls=6, waits=waits, attempts=1)
    # A header line over http.client's 65,536 bytes is its LineTooLong on both paths.
    assert [kind for kind, _ in result.outcomes] == ["ok"] * 5 + ["ConnectionClosedError"]


# --- errors, retries, transport failures --------------------------------------------------------------


THROTTLED = Reply(status=b"HTTP/1.1 400 Bad Request", headers=[
    b"Content-Type: application/x-amz-json-1.0", b"x-amzn-query-error: RequestThrottled;Sender"],
    body=json.dumps({"__type": "com.amazonaws.sqs#RequestThrottled", "message": "slow down"}).encode())
MISSING = Reply(status=b"HTTP/1.1 400 Bad Request", headers=[
    b"Content-Type: application/x-amz-json-1.0", b"x-amzn-query-error: AWS.SimpleQueueService.NonExistentQueue;Sender"],
    body=json.dumps({"__type": "com.amazonaws.sqs#QueueDoesNotExist", "message": "no"}).encode())
UNAVAILABLE = Reply(status=b"HTTP/1.1 503 Service Unavailable", body=b'{"__type": "ServiceUnavailable"}')


@pytest.mark.parametrize("script", [
    [OK, THROTTLED, OK, OK],
    [OK, MISSING, OK],
    [OK, UNAVAILABLE, UNAVAILABLE, OK, OK],
    [OK, Reply(status=b"HTTP/1.1 500 Internal Server Error", framing="chunked", body=b"{}"), OK],
    [OK, NO_ANSWER, OK, OK],  # closed without a word: ConnectionClosedError, retried on a new connection
    [OK, Reply(then="reset", cut=0), OK, OK],
    [OK, Reply(cut=40), OK, OK],  # the headers cut short
    [OK, Reply(cut=150, then="reset"), OK, OK],  # the body cut short by a reset
    [OK, Reply(cut=150), OK],  # the body cut short by a close
    [OK, Reply(status=b"SPAM 200 OK", then="close"), OK],
    [OK, NO_ANSWER],  # every attempt unanswered: the transport error after the client's attempts
], ids=["throttled", "missing-queue", "5xx-twice", "5xx-chunked", "closed", "reset", "headers-cut", "body-reset",
        "body-closed", "bad-status-line", "never"])
def test_errors_and_broken_connections_end_as_the_session_ends_them(script: list[Reply], waits: list[float]) -> None:
    result = same(script, calls=3, waits=waits)
    assert on_the_wire(result)


def test_a_read_timeout_is_the_sessions_read_timeout(waits: list[float]) -> None:
    result = same([OK, Reply(then="hang", cut=0)], calls=2, waits=waits, attempts=1, read_timeout=0.3)
    assert result.outcomes[1] == ("ReadTimeoutError", None)


def test_a_connection_the_server_closed_while_idle_is_opened_again(waits: list[float]) -> None:
    def closed_before_next(server: RawServer, index: int) -> None:
        if index:
            server.wait_closed(index)  # the server's FIN is in before the next call looks at the pool

    result = same([Reply(then="close")], calls=3, waits=waits, between=closed_before_next)
    assert [n for n, _ in result.requests] == [0, 1, 2]
    assert all(kind == "ok" for kind, _ in result.outcomes)


def test_parallel_sends_share_the_pool(waits: list[float]) -> None:
    with RawServer([OK]) as server:
        endpoint = f"http://127.0.0.1:{server.port}"
        sqs = make_client(endpoint, max_pool_connections=4)
        sender = sqs_batch.sender(sqs)
        assert sender is not None
        queue = f"{endpoint}/123456789012/runs"
        batches = [entries(10) for _ in range(200)]
        results: list[tuple[str, Any]] = []

        def send(chunk: list[list[dict[str, Any]]]) -> None:
            for batch in chunk:
                results.append(outcome(lambda batch=batch: sender.send(queue, batch)))

        threads = [threading.Thread(target=send, args=(batches[i::8],)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(results) == 200 and all(kind == "ok" for kind, _ in results)
        assert len(server.requests) == 200
        # The session's pool bounds the connections (8 threads, 4 kept: others opened and discarded).
        assert server.connections <= 200


# --- TLS with a custom CA bundle, an unverified TLS connection, a proxy -------------------------------


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, Path]:
    """A server context for localhost and the CA bundle that verifies it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder = tmp_path_factory.mktemp("tls")
    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kairos test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(days=1))
          .not_valid_after(now + timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(days=1)).not_valid_after(now + timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    bundle = folder / "ca.pem"
    bundle.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    chain = folder / "server.pem"
    chain.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(chain)
    return context, bundle


def test_tls_with_a_custom_ca_bundle(tls: tuple[ssl.SSLContext, Path], waits: list[float]) -> None:
    context, bundle = tls
    result = same([OK, OK, MISSING, Reply(framing="chunked"), NO_ANSWER, OK], calls=5, waits=waits, tls=context,
                  verify=str(bundle))
    assert on_the_wire(result)
    assert result.outcomes[0][0] == "ok" and result.outcomes[2][0] == "ClientError"


def test_tls_refused_by_the_ca_bundle_is_the_sessions_ssl_error(tls: tuple[ssl.SSLContext, Path],
                                                                waits: list[float]) -> None:
    context, _ = tls
    result = same([OK], calls=2, waits=waits, tls=context, verify=True)  # the system's CAs: not ours
    assert result.outcomes == [("SSLError", None)] * 2


def test_an_unverified_tls_connection_stays_on_the_session(tls: tuple[ssl.SSLContext, Path],
                                                           waits: list[float]) -> None:
    """urllib3 warns on every request over an unverified connection: such a request keeps its warning."""
    context, _ = tls
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = run([OK], [entries() for _ in range(3)], wire=True, waits=waits, tls=context, verify=False)
    assert [kind for kind, _ in result.outcomes] == ["ok"] * 3
    assert result.session_sends == 3
    assert sum("Unverified HTTPS request" in str(w.message) for w in seen) == 3


def test_a_proxied_endpoint_stays_on_the_session(waits: list[float]) -> None:
    with RawServer([OK]) as proxy:
        endpoint = "http://sqs.kairos-test.invalid"
        sqs = make_client(endpoint, proxies={"http": f"http://127.0.0.1:{proxy.port}"})
        sender = sqs_batch.sender(sqs)
        assert sender is not None and sender._wire is None
        answers = [sender.send(f"{endpoint}/123456789012/runs", entries()) for _ in range(2)]
        assert all(len(a["Successful"]) == 3 for a in answers)
        lines = [r.split(b"\r\n", 1)[0] for _, r in proxy.requests]
        assert lines == [b"POST http://sqs.kairos-test.invalid/ HTTP/1.1"] * 2


def _wired(server: RawServer) -> tuple[str, Any, Any]:
    """(endpoint, client, sender) against ``server``, the sender's exchanges on the wire."""
    endpoint = f"http://127.0.0.1:{server.port}"
    sqs = make_client(endpoint)
    sender = sqs_batch.sender(sqs)
    assert sender is not None and sender._wire is not None
    return endpoint, sqs, sender


def test_pool_timeouts_that_are_not_fixed_numbers_stay_on_the_session(waits: list[float]) -> None:
    with RawServer([OK]) as server:
        endpoint, sqs, sender = _wired(server)
        sender.send(f"{endpoint}/123456789012/runs", entries())
        pool = sqs._endpoint.http_session._manager.connection_from_url(f"{endpoint}/")
        pool.timeout = Timeout(total=30)
        wire = http_wire.wire(sqs._endpoint.http_session, f"{endpoint}/")
        assert wire is not None
        assert wire.exchange({"Content-Length": "0"}, b"") is None  # adopts, and declines the pool
        assert wire.exchange({"Content-Length": "0"}, b"") is None and len(server.requests) == 1


def test_an_illegal_header_value_is_refused_as_the_session_refuses_it(waits: list[float]) -> None:
    with RawServer([OK]) as server:
        endpoint, _, sender = _wired(server)
        sender.send(f"{endpoint}/123456789012/runs", entries())
        sender.send(f"{endpoint}/123456789012/runs", entries())  # the wire has the pool now
        assert sender._wire.exchange({"X-Bad": "a\r\nInjected: yes", "Content-Length": "0"}, b"") is None
        assert len(server.requests) == 2
