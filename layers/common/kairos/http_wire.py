"""One HTTP/1.1 exchange on a botocore session's pooled keep-alive connection, without http.client's
request writer and header parser on the way a 200 comes back.

Role: ``kairos.sqs_batch``'s sends. After its own pipeline was gone, about three quarters of a lean
``SendMessageBatch``'s CPU was urllib3 and http.client: ``putheader`` per header, two socket writes (the
headers, then the body), the ``email`` package parsing every response header into a message object,
urllib3's response wrapper and botocore's ``HeadersDict`` copy of it (``bench/sqs_send.py``).
``Wire.exchange(headers, body)`` writes the request on a connection the session's urllib3 pool already holds
open, in one write, and reads the answer:

* the bytes written are the ones urllib3 writes for the same request (its request line, ``Host`` and
  ``Accept-Encoding`` as http.client adds them, then the request's headers in order, then the body);
* a ``HTTP/1.1 200`` answer framed by one ``Content-Length``, strictly CRLF, no folded or odd header
  line, and nothing after the body, is read here: only its framing headers are looked at, its other
  headers are parsed (by the library) only if someone reads them;
* any other answer (an error status, chunked, read-to-close, HTTP/1.0, 1xx, a malformed header block,
  a short body) is handed, every byte already read first, to http.client's own parser and urllib3's
  response, exactly as urllib3 would have read it from the socket;
* the socket's timeouts are the pool's (connect timeout while writing, read timeout while reading),
  keep-alive is http.client's rule (``Connection: close`` closes it), and a transport error closes the
  connection and is raised as the botocore exception the session would raise (``ReadTimeoutError``,
  ``ConnectionClosedError``, ``SSLError``, ``HTTPClientError``).

Guarantees: used only for what it can do exactly as the session does — a botocore ``URLLib3Session`` on
urllib3 2, no proxy for the URL, no proxy headers on the pool, the pool's timeouts fixed numbers, a
connection already open (and, for HTTPS, verified), request headers that are legal latin-1 values;
for anything else ``exchange`` answers None and the caller uses ``session.send`` (which also opens every
new connection: connecting, TLS, custom CA bundles and their errors stay urllib3's and botocore's).
``tests/aws/test_http_wire.py`` holds the bytes written and every outcome equal to the session's.

Must not: retry (the caller's retry policy decides), follow redirects (urllib3 is called with
``redirect`` off by botocore too), log.
"""

from __future__ import annotations

import errno
import http.client
import io
import os
import re
import ssl
from asyncio import CancelledError
from collections.abc import Mapping
from typing import Any

import urllib3
from botocore.awsrequest import AWSPreparedRequest, AWSResponse, HeadersDict
from botocore.exceptions import ConnectionClosedError, HTTPClientError, ReadTimeoutError, SSLError
from botocore.httpsession import URLLib3Session
from urllib3.exceptions import ProtocolError
from urllib3.exceptions import ReadTimeoutError as URLLib3ReadTimeoutError
from urllib3.exceptions import SSLError as URLLib3SSLError
from urllib3.util.response import assert_header_parsing
from urllib3.util.ssl_match_hostname import CertificateError

URLLIB3_VERSION: str = getattr(urllib3, "__version__", "")
OK_STATUS = b"HTTP/1.1 200 "
MAX_HEAD = 32768  # a header block longer than this goes to http.client (its own limits: 65536 a line, 100 lines)
RECV = 65536
# A header name as the email parser takes it (printable ASCII, no colon or space).
_NAME = re.compile(rb"[!-9;-~]+")
# http.client's check for an illegal header value (CR or LF not starting a continuation).
_ILLEGAL_VALUE = re.compile(r"\n(?![ \t])|\r(?![ \t\n])")
_BLOCKING = {errno.EAGAIN, errno.EWOULDBLOCK}
_normalize = getattr(urllib3.connection, "_normalize_header_values", None)


def wire(session: Any, url: str) -> Wire | None:
    """The exchange for requests to ``url`` through ``session``, or None when only ``session.send`` may
    carry them."""
    if type(session) is not URLLib3Session or not URLLIB3_VERSION.startswith("2."):
        return None
    parts: Any = session  # its private parts, as botocore's send uses them
    try:
        if parts._proxy_config.proxy_url_for(url):
            return None
        target = parts._get_request_target(url, None)
        manager = parts._manager
    except AttributeError:  # a botocore whose private parts moved
        return None
    scheme = url.split(":", 1)[0].lower()
    if scheme not in ("http", "https"):
        return None
    return Wire(manager, url, target, scheme == "https")


class Wire:
    """Exchanges on one URL's pool (thread-safe: the pool hands each connection to one caller)."""

    def __init__(self, manager: Any, url: str, target: str, https: bool) -> None:
        self._manager = manager
        self._url = url
        self._request_line = f"POST {target} HTTP/1.1\r\n".encode("ascii")
        self._https = https
        self._pool: Any = None
        self._declined = False
        self._timeouts: tuple[float | None, float | None] = (None, None)  # (connect, read)
        self._start = b""  # the request line, Host and Accept-Encoding, once the first connection is seen

    def exchange(self, headers: Mapping[str, str], body: bytes) -> AWSResponse | None:
        """The answer to ``POST`` with ``headers`` and ``body``, or None: not exchanged here (nothing was
        written), the caller sends it through the session."""
        pool = self._pool
        if pool is None or pool.pool is None:
            if not self._declined:
                self._adopt()
            return None
        if pool.proxy_headers or os.environ.get("BOTO_EXPERIMENTAL__ADD_PROXY_HOST_HEADER"):
            return None
        try:
            conn = pool._get_conn()
        except Exception:  # noqa: BLE001 - a closed pool: the session's path picks the new one
            return None
        sock = conn.sock
        if sock is None or (self._https and not conn.is_verified):
            pool._put_conn(conn)  # not open: the session's path opens it (and warns on an unverified one)
            return None
        try:
            head = self._head(headers, self._start or self._first(conn))
        except (UnicodeError, ValueError):
            pool._put_conn(conn)
            return None  # http.client refuses this header: the session's path raises what it raises
        connect_timeout, read_timeout = self._timeouts
        pool.num_requests += 1
        reading = False
        try:
            sock.settimeout(connect_timeout)
            try:
                sock.sendall(head + body)
            except BrokenPipeError:
                pass  # as urllib3: the server may have answered before it stopped reading
            except OSError as exc:
                if exc.errno not in (errno.EPROTOTYPE, errno.ECONNRESET):
                    raise
            reading = True
            sock.settimeout(read_timeout)
            answer, close = self._read(sock)
        except BaseException as exc:
            conn.close()
            pool._put_conn(None)
            mapped = self._transport_error(exc, reading, headers, body, read_timeout)
            if mapped is exc:
                raise
            raise mapped from exc
        if close:
            conn.close()
        pool._put_conn(conn)
        return answer

    def _adopt(self) -> None:
        """Takes the pool the session sends through (the session's first send made it), unless its
        timeouts are not fixed numbers (then only the session sends)."""
        try:
            pool = self._manager.connection_from_url(self._url)
            timeout = pool.timeout
            connect, read = timeout.connect_timeout, timeout.read_timeout
        except Exception:  # noqa: BLE001 - a urllib3 that moved: the session's path
            self._declined = True
            return
        numbers = all(value is None or type(value) in (int, float) for value in (connect, read))
        if timeout.total is not None or not numbers or read == 0:
            self._declined = True
            return
        self._timeouts = (connect, read)
        self._pool = pool

    def _first(self, conn: Any) -> bytes:
        """The request line, then ``Host`` and ``Accept-Encoding`` as http.client's ``putrequest`` adds
        them for this connection."""
        host, port = conn.host, conn.port
        try:
            host_bytes = host.encode("ascii")
        except UnicodeEncodeError:
            host_bytes = host.encode("idna")
        if ":" in host:
            host_bytes = b"[" + host_bytes + b"]"
        if port != conn.default_port:
            host_bytes += f":{port}".encode("ascii")
        self._start = self._request_line + b"Host: " + host_bytes + b"\r\nAccept-Encoding: identity\r\n"
        return self._start

    @staticmethod
    def _head(headers: Mapping[str, str], start: bytes) -> bytes:
        """The request line and headers as http.client writes them (values latin-1, illegal ones refused)."""
        lines = []
        for name, value in headers.items():
            if _ILLEGAL_VALUE.search(value):
                raise ValueError("illegal header value")
            lines.append(f"{name}: {value}\r\n")
        return start + "".join(lines).encode("latin-1") + b"\r\n"

    def _read(self, sock: Any) -> tuple[AWSResponse, bool]:
        """(the answer, whether the connection closes after it)."""
        data = b""
        while True:
            chunk = sock.recv(RECV)
            if not chunk:
                return self._library(sock, data)
            data += chunk
            if not OK_STATUS.startswith(data[:len(OK_STATUS)]) or len(data) > MAX_HEAD:
                return self._library(sock, data)
            # Where http.client's header block ends: the first empty line, CRLF or bare LF.
            blank = data.find(b"\n\r\n")
            bare = data.find(b"\n\n")
            if blank >= 0 or bare >= 0:
                break
        end = blank - 1
        if blank < 0 or (0 <= bare < blank) or data[end:blank] != b"\r":
            return self._library(sock, data)
        block = data[:end]
        lines = block.split(b"\r\n")
        if len(lines) > 100 or not block.count(b"\r") == block.count(b"\n") == len(lines) - 1:  # a bare CR or LF
            return self._library(sock, data)
        length = close = None
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not _NAME.fullmatch(name):
                return self._library(sock, data)
            lowered = name.lower()
            if lowered == b"content-length":
                value = value.strip(b" \t")
                if length is not None or not value.isdigit():
                    return self._library(sock, data)
                length = int(value)
            elif lowered == b"connection":
                if close is not None:
                    return self._library(sock, data)
                close = b"close" in value.lower()
            elif lowered == b"transfer-encoding":
                return self._library(sock, data)
        if length is None:
            return self._library(sock, data)
        start = end + 4
        total = start + length
        while len(data) < total:
            chunk = sock.recv(RECV)
            if not chunk:
                return self._library(sock, data)
            data += chunk
        if len(data) != total:
            return self._library(sock, data)
        return Answer(self._url, lines[1:], data[start:]), bool(close)

    def _library(self, sock: Any, read: bytes) -> tuple[AWSResponse, bool]:
        """The answer as urllib3 reads it with http.client (what botocore's session sends it through),
        from the bytes already read and then the socket."""
        response = http.client.HTTPResponse(_Replay(sock, read), method="POST")  # type: ignore[arg-type]
        response.begin()
        try:
            assert_header_parsing(response.msg)
        except Exception:  # noqa: BLE001, S110 - urllib3 only logs a warning here; so does nothing
            pass
        items = _normalize(response.msg) if _normalize is not None else response.msg.items()
        raw = urllib3.response.HTTPResponse(
            body=response, headers=urllib3.HTTPHeaderDict(items), status=response.status,
            version=response.version, version_string="HTTP/1.1", reason=response.reason, preload_content=False,
            decode_content=False, original_response=response, enforce_content_length=False,
            request_method="POST", request_url=None)
        headers: Any = raw.headers
        answer = AWSResponse(self._url, response.status, headers, raw)
        answer.content  # noqa: B018 - read now, as botocore's session does for a non-streaming call
        return answer, bool(response.will_close)

    def _transport_error(self, exc: BaseException, reading: bool, headers: Mapping[str, str], body: bytes,
                         read_timeout: float | None) -> BaseException:
        """``exc`` raised while writing or reading, as urllib3 and then botocore's session raise it."""
        if not isinstance(exc, Exception) or isinstance(exc, CancelledError):
            return exc  # as botocore's session: only an Exception becomes a botocore error
        error: BaseException = exc
        if reading and isinstance(exc, TimeoutError | OSError) and (
                isinstance(exc, TimeoutError) or getattr(exc, "errno", None) in _BLOCKING):
            error = URLLib3ReadTimeoutError(self._pool, self._url, f"Read timed out. (read timeout={read_timeout})")
        elif isinstance(exc, ssl.SSLError | CertificateError):
            error = URLLib3SSLError(exc)
        elif isinstance(exc, OSError | http.client.HTTPException):
            error = ProtocolError("Connection aborted.", exc)
        if isinstance(error, URLLib3SSLError):
            return SSLError(endpoint_url=self._url, error=error)
        if isinstance(error, URLLib3ReadTimeoutError):
            return ReadTimeoutError(endpoint_url=self._url, error=error)
        if isinstance(error, ProtocolError):
            sent: Any = dict(headers)
            request = AWSPreparedRequest("POST", self._url, sent, body, False)
            return ConnectionClosedError(error=error, request=request, endpoint_url=self._url)
        return HTTPClientError(error=error)


class Answer(AWSResponse):
    """A 200 read here: status and body; its headers parsed by http.client only when read."""

    def __init__(self, url: str, lines: list[bytes], body: bytes) -> None:
        self.url = url
        self.status_code = 200
        self.raw = None
        self._content = body
        self._lines = lines
        self._headers: Any = None

    @property
    def headers(self) -> Any:
        if self._headers is None:
            message = http.client.parse_headers(io.BytesIO(b"".join(line + b"\r\n" for line in self._lines) + b"\r\n"))
            items = _normalize(message) if _normalize is not None else message.items()
            self._headers = HeadersDict(urllib3.HTTPHeaderDict(items))
        return self._headers

    @headers.setter
    def headers(self, value: Any) -> None:
        self._headers = value


class _Replay(io.RawIOBase):
    """The socket as http.client reads it, with the bytes already read in front."""

    def __init__(self, sock: Any, read: bytes) -> None:
        self._sock = sock
        self._read = read

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(self)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._read:
            count = min(len(buffer), len(self._read))
            buffer[:count] = self._read[:count]
            self._read = self._read[count:]
            return count
        return int(self._sock.recv_into(buffer))
