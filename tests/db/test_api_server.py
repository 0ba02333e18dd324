"""``kairos.local.apigw``: real HTTP requests become HTTP API v2 events, and responses go back as sent.

A recording handler stands in for the function (no database needed), then the real API handler is
served once to check a webhook goes through end to end over HTTP.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import logging
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from kairos.local import apigw
from kairos.observability import logger
from tests.support.api import HANDLER, Api


class Recorder:
    def __init__(self, response: dict[str, Any] | None = None) -> None:
        self.events: list[dict[str, Any]] = []
        self.response = response or {"statusCode": 201, "headers": {"X-Answer": "yes"}, "body": '{"ok":true}',
                                     "cookies": ["a=1; Path=/"]}
        self.lock = threading.Lock()

    def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        assert context.get_remaining_time_in_millis() > 0
        with self.lock:
            self.events.append(event)
        return self.response


@pytest.fixture
def recorder() -> Iterator[tuple[Recorder, apigw.ApiGatewayServer]]:
    handler = Recorder()
    server = apigw.serve(handler, max_body=1024)
    try:
        yield handler, server
    finally:
        server.close()


def request(server: apigw.ApiGatewayServer, method: str, target: str, body: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes, list[str]]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request(method, target, body=body, headers=headers or {})
        answer = conn.getresponse()
        return answer.status, dict(answer.getheaders()), answer.read(), answer.headers.get_all("Set-Cookie") or []
    finally:
        conn.close()


def test_requests_become_payload_v2_events(recorder: tuple[Recorder, apigw.ApiGatewayServer]) -> None:
    handler, server = recorder
    status, headers, body, cookies = request(
        server, "POST", "/v1/things/abc?x=1&x=2&y=", b'{"a": 1}',
        {"Content-Type": "application/json", "X-Multi": "v", "Cookie": "c1=1; c2=2"})

    assert status == 201 and body == b'{"ok":true}' and headers["X-Answer"] == "yes"
    assert cookies == ["a=1; Path=/"]
    (event,) = handler.events
    assert event["version"] == "2.0" and event["routeKey"] == "$default"
    assert event["rawPath"] == "/v1/things/abc" and event["rawQueryString"] == "x=1&x=2&y="
    assert event["queryStringParameters"] == {"x": "1,2", "y": ""}
    assert event["headers"]["content-type"] == "application/json" and event["headers"]["x-multi"] == "v"
    assert event["cookies"] == ["c1=1", "c2=2"]
    assert event["requestContext"]["http"]["method"] == "POST"
    assert event["requestContext"]["http"]["path"] == "/v1/things/abc"
    assert event["requestContext"]["stage"] == "$default"
    assert event["body"] == '{"a": 1}' and event["isBase64Encoded"] is False


def test_binary_bodies_are_base64_and_any_method_reaches_the_handler(
        recorder: tuple[Recorder, apigw.ApiGatewayServer]) -> None:
    handler, server = recorder
    raw = bytes(range(256))
    request(server, "PUT", "/bin", raw, {"Content-Type": "application/octet-stream"})
    request(server, "TRACE", "/trace")
    request(server, "PROPFIND", "/dav")
    assert handler.events[0]["isBase64Encoded"] is True
    assert base64.b64decode(handler.events[0]["body"]) == raw
    assert [e["requestContext"]["http"]["method"] for e in handler.events] == ["PUT", "TRACE", "PROPFIND"]


def test_oversized_bodies_are_refused_before_the_handler(recorder: tuple[Recorder, apigw.ApiGatewayServer]) -> None:
    handler, server = recorder
    status, _, _, _ = request(server, "POST", "/x", b"x" * 1025, {"Content-Type": "application/json"})
    assert status == 413 and handler.events == []


def test_a_failing_handler_answers_500_as_api_gateway_does() -> None:
    def broken(event: dict[str, Any], context: Any) -> dict[str, Any]:
        raise RuntimeError("boom")

    with apigw.serve(broken) as server:
        status, _, body, _ = request(server, "GET", "/")
    assert status == 500 and json.loads(body) == {"message": "Internal Server Error"}


def test_jwt_claims_come_from_the_claims_function() -> None:
    seen: list[dict[str, Any]] = []

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        seen.append(event)
        return {"statusCode": 204, "body": ""}

    def claims(headers: Any) -> dict[str, Any] | None:
        return {"sub": "alice"} if headers.get("Authorization") == "Bearer jwt" else None

    with apigw.serve(handler, claims=claims) as server:
        request(server, "GET", "/a", headers={"Authorization": "Bearer jwt"})
        request(server, "GET", "/b")
    assert seen[0]["requestContext"]["authorizer"]["jwt"]["claims"] == {"sub": "alice"}
    assert "authorizer" not in seen[1]["requestContext"]


def test_the_real_api_over_http_never_logs_the_hook_path(api: Api, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    _, token = api.webhook_schedule()
    sink = io.StringIO()
    stream_handler = logger.registered_handler
    assert isinstance(stream_handler, logging.StreamHandler)
    previous = stream_handler.setStream(sink)
    try:
        with apigw.serve(HANDLER) as server:
            post = urllib.request.Request(f"{server.url}/v1/hooks/{token}", data=b'{"n": 1}', method="POST",
                                          headers={"Content-Type": "application/json", "Idempotency-Key": "k"})
            with urllib.request.urlopen(post) as answer:
                accepted = json.loads(answer.read())
                assert answer.status == 202
    finally:
        stream_handler.setStream(previous)
    assert set(accepted) == {"run_id", "occurrence_id"}
    logged = sink.getvalue() + "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert '"route":"POST /v1/hooks/{token}"' in logged
    assert token not in logged


def _raw(server: apigw.ApiGatewayServer, payload: bytes) -> bytes:
    """Sends raw bytes on a fresh socket, half-closes it and reads until the server closes."""
    import socket

    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def test_chunked_bodies_are_read_whole_and_nothing_is_left_for_a_next_request(
        recorder: tuple[Recorder, apigw.ApiGatewayServer]) -> None:
    handler, server = recorder
    answer = _raw(server, b"POST /c HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Transfer-Encoding: chunked\r\n\r\n"
                          b"5;ext=1\r\n{\"a\":\r\n3\r\n 1}\r\n0\r\nX-Trailer: t\r\n\r\n"
                          b"GET /second HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.count(b"HTTP/1.1 201") == 2, answer
    assert [e["rawPath"] for e in handler.events] == ["/c", "/second"]
    assert handler.events[0]["body"] == '{"a": 1}'


def test_a_chunked_body_over_the_limit_is_refused(recorder: tuple[Recorder, apigw.ApiGatewayServer]) -> None:
    handler, server = recorder
    chunks = b"".join(b"100\r\n" + b"x" * 256 + b"\r\n" for _ in range(5)) + b"0\r\n\r\n"
    answer = _raw(server, b"POST /big HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks)
    assert answer.startswith(b"HTTP/1.1 413"), answer
    assert handler.events == []


@pytest.mark.parametrize("length", [b"-1", b"abc", b"1, 2"])
def test_a_bad_content_length_is_400_and_closes(recorder: tuple[Recorder, apigw.ApiGatewayServer],
                                                length: bytes) -> None:
    handler, server = recorder
    # The connection stays open for writing: an answer that waited for more bytes would time out here.
    import socket

    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n\r\n{}")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400"), answer
    assert b"Connection: close" in answer
    assert handler.events == []


@pytest.mark.parametrize("lengths", [(b"2", b"2"), (b"2", b"10")])
def test_a_duplicated_content_length_is_400_and_closes(recorder: tuple[Recorder, apigw.ApiGatewayServer],
                                                       lengths: tuple[bytes, bytes]) -> None:
    """Two Content-Length fields, equal or not, leave the body's end ambiguous: refused, not the first taken."""
    handler, server = recorder
    headers = b"".join(b"Content-Length: " + n + b"\r\n" for n in lengths)
    answer = _raw(server, b"POST /x HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n{}")
    assert answer.startswith(b"HTTP/1.1 400"), answer
    assert b"Connection: close" in answer
    assert handler.events == []


def test_a_broken_chunk_is_400(recorder: tuple[Recorder, apigw.ApiGatewayServer]) -> None:
    handler, server = recorder
    answer = _raw(server, b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400"), answer
    assert handler.events == []


def test_twenty_concurrent_clients_are_all_served() -> None:
    """Twenty connections open at once, each held by a handler until all have arrived."""
    arrived = threading.Barrier(20, timeout=30)

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        arrived.wait()
        return {"statusCode": 200, "body": event["rawPath"]}

    results: list[tuple[int, bytes]] = []
    lock = threading.Lock()
    with apigw.serve(handler) as server:
        def client(i: int) -> None:
            status, _, body, _ = request(server, "GET", f"/c{i}")
            with lock:
                results.append((status, body))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    assert sorted(results) == sorted((200, f"/c{i}".encode()) for i in range(20))
    assert server._server.request_queue_size >= 128
