"""The ``http`` executor against a real local target: the signed request it sends (verified with the
Standard Webhooks algorithm computed here independently) and how each answer is classified. The call
is a mutation, so anything short of proof that nothing happened leaves the outcome unknown."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Iterator
from typing import Any

import pytest

from kairos.executors import registry as executors
from kairos.executors.base import ExecutionRequest, ExecutorError, PreparedCall, Reply, canonical_json
from kairos.executors.http import HttpExecutor
from kairos.settings import Settings
from tests.support.peer import Peer, closed_port, drop, hang, partial_then_hang, respond

SETTINGS = Settings(egress_allow=("127.0.0.1",))
RAW_KEY = b"\x01\x02secret-signing-key\xff"
WHSEC = "whsec_" + base64.b64encode(RAW_KEY).decode()
RUN_ID = "5f0c2a9e-0000-4000-8000-00000000abcd"


@pytest.fixture(autouse=True)
def signing_secret(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("KAIROS_TEST_HOOK_SECRET", WHSEC)
    monkeypatch.setenv("KAIROS_TEST_PLAIN_SECRET", "plain-text-secret")
    # Shared keys go only to their host: these two to the local peers the tests run.
    monkeypatch.setenv("KAIROS_SHARED_SECRETS",
                       "env:KAIROS_TEST_HOOK_SECRET@http://127.0.0.1:*,env:KAIROS_TEST_PLAIN_SECRET@http://127.0.0.1:*")
    yield


def request_for(url: str, *, secret: str | None = "env:KAIROS_TEST_HOOK_SECRET",
                payload: Any = None) -> ExecutionRequest:
    agent = {"executor": "http", "base_url": url}
    if secret is not None:
        agent["api_key_secret"] = secret
    return ExecutionRequest(owner="alice", run_id=RUN_ID, attempt=2, agent=agent, transcript=(),
                            prompt="Deploy the docs.", payload=payload)


def call(request: ExecutionRequest, *, timeout: float = 5.0) -> tuple[PreparedCall, Reply]:
    executor = executors.get("http", settings=SETTINGS)
    prepared = executor.prepare(request)
    return prepared, executor.send(prepared, timeout=timeout)


def failure(peer: Peer, *, timeout: float = 5.0) -> ExecutorError:
    with pytest.raises(ExecutorError) as info:
        call(request_for(peer.url("/hook")), timeout=timeout)
    return info.value


def verify(key: bytes, headers: dict[str, str], body: bytes) -> bool:
    """Standard Webhooks verification, written from the specification, not from the executor."""
    content = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.{body.decode()}".encode()
    expected = base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()
    signatures = [s.split(",", 1)[1] for s in headers["webhook-signature"].split() if s.startswith("v1,")]
    return any(hmac.compare_digest(expected, s) for s in signatures)


def test_a_2xx_delivers_the_signed_canonical_body_and_returns_the_text() -> None:
    payload = {"action": "opened", "number": 7}
    with Peer(respond(200, "accepted: ticket 7", "text/plain")) as peer:
        prepared, reply = call(request_for(peer.url("/hook?team=docs"), payload=payload))

    (got,) = peer.received
    expected = canonical_json({"run_id": RUN_ID, "attempt": 2, "prompt": "Deploy the docs.", "payload": payload})
    assert got.path == "/hook?team=docs"
    assert got.body == expected == prepared.body
    assert hashlib.sha256(got.body).hexdigest() == prepared.digest
    assert got.headers["webhook-id"] == f"{RUN_ID}:2"
    assert got.headers["webhook-timestamp"].isdigit()
    assert verify(RAW_KEY, got.headers, got.body)  # whsec_ secrets are base64-decoded
    assert not verify(WHSEC.encode(), got.headers, got.body)
    assert reply == Reply(content="accepted: ticket 7")
    assert (prepared.kind, prepared.mutation) == ("http_call", True)
    assert WHSEC not in repr(prepared)


def test_a_plain_secret_signs_with_its_own_bytes_at_the_given_time() -> None:
    executor = HttpExecutor(allow=["127.0.0.1"], clock=lambda: 1_700_000_000.9)
    with Peer(respond(204, "")) as peer:
        prepared = executor.prepare(request_for(peer.url("/hook"), secret="env:KAIROS_TEST_PLAIN_SECRET"))
        reply = executor.send(prepared, timeout=5)
    got = peer.received[0]
    assert got.headers["webhook-timestamp"] == "1700000000"
    assert verify(b"plain-text-secret", got.headers, got.body)
    assert reply == Reply(content="")


def test_a_tampered_body_does_not_verify() -> None:
    with Peer(respond(200, "ok")) as peer:
        call(request_for(peer.url("/hook")))
    got = peer.received[0]
    assert not verify(RAW_KEY, got.headers, got.body.replace(b"Deploy", b"Delete"))


def test_a_5xx_is_a_peer_error_with_unknown_outcome() -> None:
    with Peer(respond(503, "busy")) as peer:
        error = failure(peer)
    assert (error.reason_code, error.retry_safe, error.outcome_unknown) == ("peer_error", False, True)


def test_a_redirect_is_not_followed_and_leaves_the_outcome_unknown() -> None:
    with Peer(respond(303, "")) as peer:
        error = failure(peer)
    assert (error.reason_code, error.retry_safe, error.outcome_unknown) == ("peer_error", False, True)
    assert len(peer.received) == 1


def test_a_4xx_is_a_final_peer_error() -> None:
    with Peer(respond(404, "no such hook")) as peer:
        error = failure(peer)
    assert (error.reason_code, error.retry_safe, error.outcome_unknown) == ("peer_error", False, False)
    assert "404" in error.message


def test_a_429_is_rate_limited_and_retry_safe() -> None:
    with Peer(respond(429, "slow down")) as peer:
        error = failure(peer)
    assert (error.reason_code, error.retry_safe, error.outcome_unknown) == ("rate_limited", True, False)


def test_a_timeout_leaves_the_outcome_unknown() -> None:
    with Peer(hang) as peer:
        error = failure(peer, timeout=0.2)
        peer.release.set()
    assert (error.reason_code, error.retry_safe, error.outcome_unknown) == ("timeout", False, True)
    assert len(peer.received) == 1


def test_a_2xx_whose_body_never_completes_is_a_cut_reply_because_the_target_accepted() -> None:
    with Peer(partial_then_hang) as peer:
        _, reply = call(request_for(peer.url("/hook")), timeout=0.2)
        peer.release.set()
    assert reply == Reply(content="first part", truncated=True)


def test_a_dropped_connection_after_sending_is_an_ambiguous_effect() -> None:
    with Peer(drop) as peer:
        error = failure(peer)
    assert (error.reason_code, error.retry_safe, error.outcome_unknown) == ("ambiguous_effect", False, True)


def test_connection_refused_is_a_retry_safe_connect_failure() -> None:
    with pytest.raises(ExecutorError) as info:
        call(request_for(f"http://127.0.0.1:{closed_port()}/hook"), timeout=2)
    error = info.value
    assert (error.reason_code, error.retry_safe, error.outcome_unknown) == ("connect_failed", True, False)


def test_an_over_long_2xx_answer_is_kept_cut_because_the_effect_happened() -> None:
    with Peer(respond(200, "z" * ((1 << 20) + 10), "text/plain")) as peer:
        _, reply = call(request_for(peer.url("/hook")))
    assert reply.truncated is True
    assert reply.content == "z" * 65_536


def test_a_2xx_answer_with_nul_bytes_is_kept_with_each_nul_replaced_because_the_effect_happened() -> None:
    # PostgreSQL text cannot hold NUL: the answer (stored as the run's assistant entry) keeps the rest.
    with Peer(respond(200, "ok\x00done\x00", "text/plain")) as peer:
        _, reply = call(request_for(peer.url("/hook")))
    assert reply == Reply(content="ok\ufffddone\ufffd")


def test_a_signing_secret_is_required() -> None:
    with pytest.raises(ExecutorError) as info:
        executors.get("http", settings=SETTINGS).prepare(request_for("http://127.0.0.1:9/hook", secret=None))
    assert info.value.reason_code == "agent_invalid"


def test_a_malformed_whsec_secret_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAIROS_TEST_HOOK_SECRET", "whsec_***not-base64***")
    with pytest.raises(ExecutorError) as info:
        executors.get("http", settings=SETTINGS).prepare(request_for("http://127.0.0.1:9/hook"))
    assert info.value.reason_code == "secret_unavailable"
    assert "not-base64" not in info.value.message


def test_the_metadata_address_is_refused_even_when_allowed() -> None:
    executor = executors.get("http", settings=Settings(egress_allow=("169.254.169.254", "127.0.0.1")))
    with pytest.raises(ExecutorError) as info:
        executor.prepare(request_for("http://169.254.169.254/latest/api/token"))
    assert info.value.reason_code == "egress_refused"
    assert json.dumps(info.value.message).count("metadata") == 1
