"""A local stand-in for API Gateway's HTTP API: real HTTP requests in, payload v2 events to a handler.

``ApiGatewayServer(handler)`` listens on 127.0.0.1 (port 0 picks a free one), turns each request into
the event API Gateway would send with a ``$default`` route (``rawPath``, ``rawQueryString``,
lower-case ``headers`` with repeated values comma-joined, ``queryStringParameters``, ``cookies``,
``requestContext.http``, ``body`` as text or base64), calls ``handler(event, context)`` and writes its
response (``statusCode``, ``headers``, ``cookies``, ``body``, ``isBase64Encoded``) back. It is what
``sam local start-api`` does, without Docker; the local stack (``kairos dev``) and the end-to-end
tests serve the API through it.

JWT authorization is API Gateway's job, not the function's: pass ``claims`` (a function from the
request headers to the claims dict, or None for "no principal") to put
``requestContext.authorizer.jwt.claims`` into events, as the JWT authorizer would.

Guarantees: requests are handled on their own threads (the handler must be thread-safe); the request
path is never logged (webhook tokens travel in it) — the server's own access lines carry the method
and status only; bodies above ``max_body`` (API Gateway's 10 MB) answer 413 without calling the
handler, whether the body comes with ``Content-Length`` or chunked (a chunked body is read to its end,
so no leftover bytes are taken for a next request); a ``Content-Length`` that is not a non-negative
integer, or given twice, answers 400 and closes the connection; the listen backlog (128) takes bursts of concurrent
clients. Not emulated: stages other than ``$default``, custom domains, throttling, CORS.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from kairos.observability import logger

Handler = Callable[[dict[str, Any], Any], Mapping[str, Any]]
Claims = Callable[[Mapping[str, str]], Mapping[str, Any] | None]

MAX_BODY = 10 * 1024 * 1024
_TEXT_TYPES = ("application/json", "text/", "application/x-www-form-urlencoded", "application/xml")


class LocalContext:
    """The few LambdaContext attributes handlers and Powertools read (the local stack reuses it for
    the tick and run functions, naming them)."""

    function_version = "$LATEST"
    memory_limit_in_mb = 512

    def __init__(self, timeout_ms: int = 30_000, *, function_name: str = "kairos-local-api") -> None:
        self.function_name = function_name
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:000000000000:function:{function_name}"
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = "local"
        self._deadline = time.monotonic() + timeout_ms / 1000

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def build_event(method: str, target: str, headers: Mapping[str, str], body: bytes | None, *,
                source_ip: str = "127.0.0.1", host: str = "localhost",
                claims: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The HTTP API payload v2 event for one request (``target`` is the path with its query string)."""
    parts = urlsplit(target)
    lowered: dict[str, str] = {}
    cookies: list[str] = []
    for name, value in headers.items():
        key = name.lower()
        if key == "cookie":
            cookies.extend(c.strip() for c in value.split(";") if c.strip())
            continue
        lowered[key] = f"{lowered[key]},{value}" if key in lowered else value
    query: dict[str, str] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        query[key] = f"{query[key]},{value}" if key in query else value
    now = time.time()
    event: dict[str, Any] = {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": parts.path or "/",
        "rawQueryString": parts.query,
        "headers": lowered,
        "requestContext": {
            "accountId": "000000000000",
            "apiId": "local",
            "domainName": host,
            "domainPrefix": host.split(".")[0],
            "http": {
                "method": method.upper(),
                "path": parts.path or "/",
                "protocol": "HTTP/1.1",
                "sourceIp": source_ip,
                "userAgent": lowered.get("user-agent", ""),
            },
            "requestId": str(uuid.uuid4()),
            "routeKey": "$default",
            "stage": "$default",
            "time": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now)),
            "timeEpoch": int(now * 1000),
        },
        "isBase64Encoded": False,
    }
    if cookies:
        event["cookies"] = cookies
    if query:
        event["queryStringParameters"] = query
    if claims is not None:
        event["requestContext"]["authorizer"] = {"jwt": {"claims": dict(claims), "scopes": None}}
    if body:
        event["body"], event["isBase64Encoded"] = _body(body, lowered.get("content-type", "application/json"))
    return event


def _body(body: bytes, content_type: str) -> tuple[str, bool]:
    """As API Gateway passes a body: text types that decode as UTF-8 as text, anything else base64."""
    if content_type.lower().startswith(_TEXT_TYPES):
        try:
            return body.decode("utf-8"), False
        except UnicodeDecodeError:
            pass
    return base64.b64encode(body).decode("ascii"), True


class _RequestHandler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def _serve(self) -> None:
        try:
            body = self._read_body()
        except _Refused as refused:
            self._write(refused.status, {"Content-Type": "application/json"},
                        json.dumps({"message": refused.message}).encode(), close=True)
            return
        claims = self.server.claims(dict(self.headers.items())) if self.server.claims else None
        event = build_event(self.command, self.path, dict(self.headers.items()), body,
                            source_ip=self.client_address[0], host=self.headers.get("Host", "localhost"),
                            claims=claims)
        try:
            response = dict(self.server.handler(event, LocalContext()))
        except Exception:  # noqa: BLE001 - what API Gateway answers when the function fails
            logger.exception("local api handler failed", extra={"action": "apigw_handler_error"})
            self._write(500, {"Content-Type": "application/json"},
                        json.dumps({"message": "Internal Server Error"}).encode())
            return
        self._respond(response)

    def _read_body(self) -> bytes:
        """The request body, from ``Content-Length`` or chunked transfer coding, within ``max_body``."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked()
        given = self.headers.get_all("Content-Length") or []
        if len(given) > 1:  # two lengths (even equal ones): which body is meant is ambiguous (smuggling)
            raise _Refused(400, "Bad Request")
        raw = (given[0] if given else "0").strip()
        if not raw.isdigit():  # "-1", "abc", "1, 2": API Gateway answers 400 and so does this server
            raise _Refused(400, "Bad Request")
        length = int(raw)
        if length > self.server.max_body:
            raise _Refused(413, "Request Entity Too Large")
        body = self.rfile.read(length) if length else b""
        if len(body) < length:
            raise _Refused(400, "Bad Request")
        return body

    def _read_chunked(self) -> bytes:
        """A chunked body (RFC 9112 7.1): size lines, data, CRLF, a zero chunk, then optional trailers."""
        body = bytearray()
        while True:
            line = self.rfile.readline(1026)
            size_text = line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise _Refused(400, "Bad Request") from None
            if size < 0 or not line.endswith(b"\n"):
                raise _Refused(400, "Bad Request")
            if size == 0:
                break
            if len(body) + size > self.server.max_body:
                raise _Refused(413, "Request Entity Too Large")
            chunk = self.rfile.read(size)
            if len(chunk) < size or self.rfile.readline(3) not in (b"\r\n", b"\n"):
                raise _Refused(400, "Bad Request")
            body += chunk
        while True:  # trailer fields, up to the empty line that ends the message
            trailer = self.rfile.readline(8192)
            if trailer in (b"\r\n", b"\n", b""):
                return bytes(body)
            if not trailer.endswith(b"\n"):
                raise _Refused(400, "Bad Request")

    def _respond(self, response: Mapping[str, Any]) -> None:
        if "statusCode" not in response:  # the HTTP API "simple response" format
            self._write(200, {"Content-Type": "application/json"}, json.dumps(response).encode())
            return
        raw = response.get("body") or ""
        payload = base64.b64decode(raw) if response.get("isBase64Encoded") else str(raw).encode("utf-8")
        headers = {str(k): str(v) for k, v in (response.get("headers") or {}).items()}
        cookies = [str(c) for c in response.get("cookies") or []]
        self._write(int(response["statusCode"]), headers, payload, cookies=cookies)

    def _write(self, status: int, headers: Mapping[str, str], payload: bytes, *,
               cookies: list[str] | None = None, close: bool = False) -> None:
        self.send_response(status)
        for name, value in headers.items():
            if name.lower() not in ("content-length", "connection", "transfer-encoding"):
                self.send_header(name, value)
        for cookie in cookies or []:
            self.send_header("Set-Cookie", cookie)
        self.send_header("Content-Length", str(len(payload)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def __getattr__(self, name: str) -> Any:
        # API Gateway hands every method (TRACE, PROPFIND, …) to the function: so does this server.
        if name.startswith("do_"):
            return self._serve
        raise AttributeError(name)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # Never the path: webhook tokens travel in it.
        logger.debug("local api request", extra={"action": "apigw_request", "method": self.command,
                                                  "status": str(code)})

    def log_message(self, format: str, *args: Any) -> None:
        return


class _Refused(Exception):
    """A request refused before the handler: its status and API Gateway's message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # socketserver's default of 5 resets the 6th concurrent client

    def __init__(self, address: tuple[str, int], handler: Handler, claims: Claims | None, max_body: int) -> None:
        self.handler = handler
        self.claims = claims
        self.max_body = max_body
        super().__init__(address, _RequestHandler)


class ApiGatewayServer:
    """Serves ``handler`` over HTTP on a background thread; use as a context manager or start/stop."""

    def __init__(self, handler: Handler, *, host: str = "127.0.0.1", port: int = 0,
                 claims: Claims | None = None, max_body: int = MAX_BODY) -> None:
        self._server = _Server((host, port), handler, claims, max_body)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self._server.server_address[0]!s}:{self.port}"

    def start(self) -> ApiGatewayServer:
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever, name="kairos-apigw", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:  # shutdown() waits for serve_forever: never for a server not started
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()

    close = stop

    def __enter__(self) -> ApiGatewayServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(handler: Handler, *, host: str = "127.0.0.1", port: int = 0, claims: Claims | None = None,
          max_body: int = MAX_BODY) -> ApiGatewayServer:
    """A started server for ``handler`` (``.url``, ``.port``; ``.close()`` stops it)."""
    return ApiGatewayServer(handler, host=host, port=port, claims=claims, max_body=max_body).start()
