"""The lean SendMessageBatch (``kairos.sqs_batch``) ends every call the way botocore's client call does.

Against moto's server (a real HTTP endpoint speaking SQS's JSON protocol), the SQS stand-in, and small
local HTTP servers written here (throttling, 5xx, a signature check): the same messages delivered, the
same per-entry failures, the same exception class and error code, the same number of attempts under the
client's retry policy, credentials from the environment and from a refreshing provider signed correctly,
the endpoint override honoured, and the client's own call whenever the lean path must not be used.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import botocore.session
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest, AWSResponse
from botocore.config import Config
from botocore.credentials import CredentialProvider, Credentials, RefreshableCredentials
from botocore.exceptions import ClientError, EndpointConnectionError
from botocore.stub import Stubber

from kairos import handoff, runtime, sqs_batch
from tests.support.standin import SqsStandin

REGION = "us-east-1"


def client(endpoint: str | None, *, attempts: int = 3, session: Any = None, mode: str = "standard",
           **kwargs: Any) -> Any:
    session = session or botocore.session.get_session()
    config = Config(retries={"mode": mode, "total_max_attempts": attempts})
    keys = {} if "no_keys" in kwargs else {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
    kwargs.pop("no_keys", None)
    return session.create_client("sqs", region_name=REGION, endpoint_url=endpoint, config=config, **keys, **kwargs)


def entries(ids: list[uuid.UUID]) -> list[dict[str, Any]]:
    return [{"Id": i.hex, "MessageBody": handoff.body(i)} for i in ids]


def lean(sqs: Any) -> sqs_batch.Sender:
    sender = sqs_batch.sender(sqs)
    assert sender is not None, "the lean path should recognise this client"
    return sender


# --- moto's server --------------------------------------------------------------------------------


@pytest.fixture
def moto_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def drain(sqs: Any, url: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while True:
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0,
                                  MessageAttributeNames=["All"], AttributeNames=["All"])
        if not got.get("Messages"):
            return out
        for message in got["Messages"]:
            out.append(message)
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])


def test_moto_receives_exactly_what_botocore_would_send(moto_endpoint: str) -> None:
    sqs = client(moto_endpoint)
    lean_queue = sqs.create_queue(QueueName="lean")["QueueUrl"]
    boto_queue = sqs.create_queue(QueueName="boto")["QueueUrl"]
    ids = [uuid.uuid4() for _ in range(30)]
    delayed = entries(ids[:10])
    for entry in delayed:
        entry["DelaySeconds"] = 0  # an explicit member goes out as botocore serialises it

    lean_answers = [lean(sqs).send(lean_queue, batch) for batch in (delayed, entries(ids[10:20]), entries(ids[20:]))]
    boto_answers = [sqs.send_message_batch(QueueUrl=boto_queue, Entries=batch)
                    for batch in (delayed, entries(ids[10:20]), entries(ids[20:]))]

    def accepted(answers: list[dict[str, Any]]) -> list[tuple[str, str]]:
        return sorted((e["Id"], e["MD5OfMessageBody"]) for a in answers for e in a["Successful"])

    assert accepted(lean_answers) == accepted(boto_answers) and len(accepted(lean_answers)) == 30
    assert all(a["Failed"] == [] for a in lean_answers)
    got_lean, got_boto = drain(sqs, lean_queue), drain(sqs, boto_queue)
    assert sorted(m["Body"] for m in got_lean) == sorted(m["Body"] for m in got_boto) == sorted(
        handoff.body(i) for i in ids)
    assert sorted(m["MD5OfBody"] for m in got_lean) == sorted(m["MD5OfBody"] for m in got_boto)
    # The message ids SQS answered are the messages that arrived.
    assert {e["MessageId"] for a in lean_answers for e in a["Successful"]} == {m["MessageId"] for m in got_lean}


def test_a_missing_queue_raises_what_botocore_raises(moto_endpoint: str) -> None:
    sqs = client(moto_endpoint)
    missing = f"{moto_endpoint}/123456789012/no-such-queue"
    with pytest.raises(ClientError) as boto:
        sqs.send_message_batch(QueueUrl=missing, Entries=entries([uuid.uuid4()]))
    with pytest.raises(ClientError) as ours:
        lean(sqs).send(missing, entries([uuid.uuid4()]))

    assert type(ours.value) is type(boto.value)
    assert ours.value.response["Error"] == boto.value.response["Error"]
    assert ours.value.response["Error"]["Code"]  # the code the handoff logs: as botocore gives it
    # The handoff's outcome for the chunk is the same either way.
    chunk = [uuid.uuid4() for _ in range(3)]
    assert handoff._send_chunk(sqs, missing, chunk) == ([], chunk, boto.value.response["Error"]["Code"])


# --- per-entry failures and the handoff, against the stand-in --------------------------------------


def test_entries_refused_under_failed_are_the_same_failures() -> None:
    ids = [uuid.uuid4() for _ in range(10)]
    with SqsStandin(refuse_entries=(str(ids[2]), str(ids[7]))) as standin:
        sqs = standin.client()
        ours = lean(sqs).send(standin.queue_url, entries(ids))
        boto = sqs.send_message_batch(QueueUrl=standin.queue_url, Entries=entries(ids))
        result = handoff.send_batch(sqs, standin.queue_url, ids)

    assert ours["Failed"] == boto["Failed"] == [
        {"Id": i.hex, "SenderFault": False, "Code": "InternalError", "Message": "try again"} for i in (ids[2], ids[7])]
    assert sorted(e["Id"] for e in ours["Successful"]) == sorted(e["Id"] for e in boto["Successful"])
    assert set(result.failed) == {ids[2], ids[7]} and set(result.sent) == set(ids) - {ids[2], ids[7]}


def test_the_handoff_sends_on_the_lean_path() -> None:
    """``send_batch`` goes through ``kairos.sqs_batch``: botocore's own request pipeline never runs."""
    ids = [uuid.uuid4() for _ in range(95)]
    with SqsStandin() as standin:
        sqs = standin.client()
        pipeline: list[str] = []
        # Hooks in botocore's pipeline that do not make the lean path refuse the client: the signer and
        # the retry handler, wrapped, count every call botocore would have made.
        signer = sqs._request_signer
        original = signer.sign
        signer.sign = lambda *a, **k: (pipeline.append("sign"), original(*a, **k))[1]  # type: ignore[method-assign]
        result = handoff.send_batch(sqs, standin.queue_url, ids)
        bodies = sorted(standin.stats.accepted)

    assert sorted(result.sent) == sorted(ids) and result.failed == ()
    assert bodies == sorted(handoff.body(i) for i in ids)
    assert pipeline == []


# --- error answers from a local server: throttling, 5xx, a dead endpoint --------------------------


class Scripted:
    """A local HTTP server answering each request with the next scripted answer (the last one repeats),
    recording what it received."""

    def __init__(self, answers: list[tuple[int, dict[str, Any], dict[str, str]]],
                 check: Callable[[BaseHTTPRequestHandler, bytes], None] | None = None) -> None:
        self.answers = answers
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.errors: list[str] = []
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                scripted.requests.append((dict(self.headers), body))
                if check is not None:
                    try:
                        check(self, body)
                    except AssertionError as exc:
                        scripted.errors.append(str(exc))
                index = min(len(scripted.requests), len(scripted.answers)) - 1
                status, answer, headers = scripted.answers[index]
                if status == 200 and "Successful" not in answer:  # accept every entry
                    answer = {"Successful": [{"Id": e["Id"], "MessageId": str(uuid.uuid4()),
                                              "MD5OfMessageBody": "0" * 32} for e in json.loads(body)["Entries"]],
                              "Failed": []}
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.0")
                self.send_header("Content-Length", str(len(data)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Scripted:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


THROTTLED = (400, {"__type": "com.amazonaws.sqs#RequestThrottled", "message": "slow down"},
             {"x-amzn-query-error": "RequestThrottled;Sender"})
UNAVAILABLE = (503, {"__type": "com.amazonaws.sqs#ServiceUnavailable", "message": "busy"}, {})
OK = (200, {}, {})


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The backoffs the retry policy asks for, recorded instead of slept (both paths sleep through
    ``time.sleep``)."""
    asked: list[float] = []
    monkeypatch.setattr(time, "sleep", asked.append)
    return asked


def outcome(call: Callable[[], dict[str, Any]]) -> tuple[str, Any]:
    try:
        answer = call()
    except ClientError as exc:
        return type(exc).__name__, exc.response["Error"]
    except Exception as exc:  # the transport exception's class is the outcome
        return type(exc).__name__, None
    return "ok", sorted(e["Id"] for e in answer["Successful"])


@pytest.mark.parametrize(("script", "attempts"), [
    ([THROTTLED, THROTTLED, OK], 3),  # retried twice, then accepted
    ([THROTTLED], 3),  # throttled on every attempt: the client's max attempts, then its error
    ([UNAVAILABLE, OK], 2),  # a 5xx is retried
    ([(400, {"__type": "com.amazonaws.sqs#InvalidAddress", "message": "no"}, {})], 1),  # not retried
], ids=["throttled-then-ok", "throttled-always", "5xx-then-ok", "4xx"])
@pytest.mark.parametrize("mode", ["standard", "legacy"])
def test_error_answers_are_retried_as_the_client_retries_them(script: list[Any], attempts: int, mode: str,
                                                              waits: list[float]) -> None:
    batch = entries([uuid.uuid4() for _ in range(3)])
    results = []
    for path in ("botocore", "lean"):
        waits.clear()
        with Scripted(script) as server:
            sqs = client(server.url, attempts=3, mode=mode)
            queue = f"{server.url}/123456789012/runs"
            if path == "lean":
                answer = outcome(lambda sqs=sqs, queue=queue: lean(sqs).send(queue, batch))
            else:
                answer = outcome(lambda sqs=sqs, queue=queue: sqs.send_message_batch(QueueUrl=queue, Entries=batch))
            results.append((answer, len(server.requests), len(waits)))
    (boto, boto_requests, boto_waits), (ours, our_requests, our_waits) = results
    assert ours == boto
    if mode == "legacy" and script[0] is THROTTLED:
        attempts = 1  # legacy retries do not count SQS's RequestThrottled as throttling: neither path retries
    assert our_requests == boto_requests == attempts and our_waits == boto_waits == attempts - 1


def test_a_dead_endpoint_raises_the_transport_error_after_the_same_retries(waits: list[float]) -> None:
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    sqs = client(endpoint, attempts=2)
    queue = f"{endpoint}/123456789012/runs"
    batch = entries([uuid.uuid4()])

    boto = outcome(lambda: sqs.send_message_batch(QueueUrl=queue, Entries=batch))
    boto_waits, waits[:] = len(waits), []
    ours = outcome(lambda: lean(sqs).send(queue, batch))

    assert ours == boto == ("EndpointConnectionError", None)
    assert len(waits) == boto_waits == 1
    chunk = [uuid.uuid4()]
    assert handoff._send_chunk(sqs, queue, chunk) == ([], chunk, EndpointConnectionError.__name__)


# --- credentials, signature, endpoint ----------------------------------------------------------------


class _Raw:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self.data


@pytest.mark.parametrize("endpoint", ["https://sqs.eu-west-1.amazonaws.com", "http://127.0.0.1:9324",
                                      "https://sqs.example.com:8443/prefix"])
@pytest.mark.parametrize("token", [None, "a  session token"])
def test_the_request_is_the_one_botocore_builds(endpoint: str, token: str | None) -> None:
    """Body, URL and signature of the lean request equal botocore's own for the same call at the same
    instant (botocore's request captured before it is sent)."""
    keys = {"aws_access_key_id": "AKIDSIGN", "aws_secret_access_key": "sign-secret", "aws_session_token": token}
    session = botocore.session.get_session()
    config = Config(retries={"mode": "standard", "total_max_attempts": 1})
    reference = session.create_client("sqs", region_name="eu-west-1", endpoint_url=endpoint, config=config, **keys)
    captured: list[Any] = []

    def capture(request: Any, **_: Any) -> Any:
        captured.append(request)
        return AWSResponse(request.url, 200, {}, _Raw(b'{"Successful": [], "Failed": []}'))

    reference.meta.events.register("before-send.sqs.SendMessageBatch", capture)
    batch = entries([uuid.uuid4() for _ in range(3)])
    batch[0]["DelaySeconds"] = 30
    reference.send_message_batch(QueueUrl=f"{endpoint}/123456789012/runs", Entries=batch)
    theirs = captured[0]
    theirs_headers = {k.lower(): v.decode() if isinstance(v, bytes) else str(v) for k, v in theirs.headers.items()}

    sender = lean(session.create_client("sqs", region_name="eu-west-1", endpoint_url=endpoint, config=config, **keys))
    body = json.dumps({"QueueUrl": f"{endpoint}/123456789012/runs", "Entries": batch}).encode()
    ours = {k.lower(): v for k, v in sender.headers(body, Credentials("AKIDSIGN", "sign-secret", token),
                                                     theirs_headers["x-amz-date"]).items()}
    prepared = sender._signed(body)

    assert body == theirs.body
    assert prepared.url == theirs.url and prepared.method == theirs.method == "POST"
    assert ours["authorization"] == theirs_headers["authorization"]
    informational = {"user-agent", "amz-sdk-invocation-id", "amz-sdk-request"}
    assert {k: v for k, v in ours.items() if k not in informational} == {
        k: v for k, v in theirs_headers.items() if k not in informational}



def signature_check(keys: Callable[[str], tuple[str, str | None]]) -> Callable[[BaseHTTPRequestHandler, bytes], None]:
    """Recomputes the request's SigV4 signature with botocore's signer from the secret of the access key
    the request names (``keys``: access key -> (secret, session token))."""

    def check(handler: BaseHTTPRequestHandler, body: bytes) -> None:
        authorization = handler.headers["Authorization"]
        credential = authorization.split("Credential=")[1].split(",")[0]
        access_key, _day, region, service, _ = credential.split("/")
        signed = authorization.split("SignedHeaders=")[1].split(",")[0].split(";")
        secret, token = keys(access_key)
        assert handler.headers.get("X-Amz-Security-Token") == token
        assert (region, service) == (REGION, "sqs")
        assert handler.headers["X-Amz-Target"] == "AmazonSQS.SendMessageBatch"
        assert handler.headers["Content-Type"] == "application/x-amz-json-1.0"
        host = handler.headers["Host"]
        request = AWSRequest(method="POST", url=f"http://{host}{handler.path}", data=body,
                             headers={name: handler.headers[name] for name in signed if name != "host"})
        request.context["timestamp"] = handler.headers["X-Amz-Date"]
        auth = SigV4Auth(Credentials(access_key, secret, token), "sqs", REGION)
        expected = auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)
        assert authorization.endswith(f"Signature={expected}"), "the signature does not verify"

    return check


def test_credentials_from_the_environment_sign_the_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "env-token")
    with Scripted([OK], check=signature_check(lambda key: {"AKIDENV": ("env-secret", "env-token")}[key])) as server:
        sqs = client(server.url, no_keys=True)
        answer = lean(sqs).send(f"{server.url}/123456789012/runs", entries([uuid.uuid4()]))
    assert len(answer["Successful"]) == 1 and len(server.requests) == 1 and server.errors == []
    assert "Credential=AKIDENV/" in server.requests[0][0]["Authorization"]


class Refreshing(CredentialProvider):
    """Temporary credentials that are always about to expire: each use refreshes them (a new key)."""

    METHOD = "kairos-test-refreshing"

    def __init__(self) -> None:
        self.issued = 0

    def _fresh(self) -> dict[str, str]:
        self.issued += 1
        return {"access_key": f"AKIDTEMP{self.issued}", "secret_key": f"secret-{self.issued}",
                "token": f"token-{self.issued}",
                "expiry_time": (datetime.now(UTC) + timedelta(minutes=5)).isoformat()}

    def load(self) -> RefreshableCredentials:
        return RefreshableCredentials.create_from_metadata(self._fresh(), self._fresh, self.METHOD)


def test_refreshing_credentials_are_read_again_for_every_call() -> None:
    provider = Refreshing()
    session = botocore.session.get_session()
    session.get_component("credential_provider").insert_before("env", provider)

    def keys(access_key: str) -> tuple[str, str | None]:
        n = access_key.removeprefix("AKIDTEMP")
        return f"secret-{n}", f"token-{n}"

    with Scripted([OK], check=signature_check(keys)) as server:
        sqs = client(server.url, session=session, no_keys=True)
        sender = lean(sqs)
        for _ in range(2):
            sender.send(f"{server.url}/123456789012/runs", entries([uuid.uuid4()]))
    used = [headers["Authorization"].split("Credential=")[1].split("/")[0] for headers, _ in server.requests]
    assert len(set(used)) == 2, used  # each call signed with the key current at that moment
    assert server.errors == []


def test_the_endpoint_from_the_environment_is_where_the_lean_path_sends(monkeypatch: pytest.MonkeyPatch) -> None:
    with SqsStandin() as standin:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SQS", standin.url)
        monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        runtime.reset()
        try:
            proxy = runtime.LazySqs()  # the tick's client: seen through
            assert lean(proxy) is lean(runtime.sqs())
            ids = [uuid.uuid4() for _ in range(12)]
            result = handoff.send_batch(proxy, standin.queue_url, ids)
        finally:
            runtime.reset()
        assert sorted(result.sent) == sorted(ids)
        assert sorted(standin.stats.accepted) == sorted(handoff.body(i) for i in ids)


# --- the fallback --------------------------------------------------------------------------------------


def test_a_stubbed_client_makes_its_own_call_even_when_stubbed_after_first_use() -> None:
    sqs = client("http://127.0.0.1:9")  # never reached
    assert sqs_batch.sender(sqs) is not None
    run_id = uuid.uuid4()
    with Stubber(sqs) as stub:
        stub.add_response("send_message_batch", {"Successful": [], "Failed": [
            {"Id": run_id.hex, "SenderFault": True, "Code": "Stubbed"}]},
            {"QueueUrl": "https://queue.example/1/runs", "Entries": entries([run_id])})
        assert sqs_batch.sender(sqs) is None
        result = handoff._send_chunk(sqs, "https://queue.example/1/runs", [run_id])
        stub.assert_no_pending_responses()
    assert result == ([], [run_id], "Stubbed")


def test_clients_it_does_not_know_make_their_own_call() -> None:
    calls: list[int] = []

    class Fake:
        def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:
            calls.append(len(Entries))
            return {"Successful": [{"Id": e["Id"]} for e in Entries]}

    ids = [uuid.uuid4() for _ in range(3)]
    assert sqs_batch.sender(Fake()) is None
    assert handoff._send_chunk(Fake(), "q", ids) == (ids, [], None) and calls == [3]
    # A botocore client with a hook of its own on the operation, or another service's client.
    hooked = client("http://127.0.0.1:9")
    hooked.meta.events.register("before-send.sqs.SendMessageBatch", lambda **_: None)
    assert sqs_batch.sender(hooked) is None
    other = botocore.session.get_session().create_client("sns", region_name=REGION, aws_access_key_id="a",
                                                         aws_secret_access_key="b")
    assert sqs_batch.sender(other) is None
    unsigned = botocore.session.get_session().create_client(
        "sqs", region_name=REGION, config=Config(signature_version=botocore.UNSIGNED))
    assert sqs_batch.sender(unsigned) is None


def test_a_botocore_whose_private_parts_moved_makes_its_own_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore is not pinned apart from boto3: a release that renames what the lean path reads leaves
    the client's own call, not a send that fails every time."""
    from botocore.client import BaseClient

    ids = [uuid.uuid4() for _ in range(3)]
    with SqsStandin() as standin:
        sqs = standin.client()
        monkeypatch.delattr(BaseClient, "_resolve_endpoint_ruleset")
        assert sqs_batch.sender(sqs) is None
        monkeypatch.undo()  # the client's own call still needs it; the client stays unrecognised
        result = handoff.send_batch(sqs, standin.queue_url, ids)
    assert sorted(result.sent) == sorted(ids) and not result.failed


def test_moto_in_process_mock_is_honoured_while_on(monkeypatch: pytest.MonkeyPatch) -> None:
    from moto import mock_aws

    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    sqs = client(None)
    assert sqs_batch.sender(sqs) is not None  # moto imported but off: the lean path
    with mock_aws():
        queue = sqs.create_queue(QueueName="runs")["QueueUrl"]
        assert sqs_batch.sender(sqs) is None
        ids = [uuid.uuid4() for _ in range(4)]
        result = handoff.send_batch(sqs, queue, ids)
        got = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10)["Messages"]
    assert sorted(result.sent) == sorted(ids)
    assert sorted(m["Body"] for m in got) == sorted(handoff.body(i) for i in ids)
