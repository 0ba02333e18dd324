"""The ``http`` executor: POST the run to the agent's own endpoint, signed like Standard Webhooks.

``prepare`` passes ``base_url`` through the egress check, resolves ``api_key_secret`` (required: it is
the signing secret) and builds the body ``{"run_id", "attempt", "prompt", "payload"}`` as canonical
JSON, whose SHA-256 is the effect's digest. Headers follow Standard Webhooks:

* ``webhook-id``: ``<run_id>:<attempt>`` (stable for one attempt, new for the next);
* ``webhook-timestamp``: unix seconds when the call was prepared;
* ``webhook-signature``: ``v1,<base64 HMAC-SHA256 over "{id}.{timestamp}.{body}">``. A secret of the
  form ``whsec_<base64>`` is base64-decoded to the key; any other secret is used as its UTF-8 bytes.

The call is a mutation: the target may act on it. ``send`` makes exactly one attempt (no retries, no
redirects) to the checked address, and only says "retry-safe" when nothing can have happened:

| outcome | reason_code | retry_safe | outcome_unknown |
|---|---|---|---|
| 2xx | (a ``Reply`` with the response text) | | |
| refused, no (allowed) address for the name, connect timeout, TLS failure | connect_failed | yes | no |
| sent, no status line in time | timeout | no | yes |
| connection dropped after sending, no status line | ambiguous_effect | no | yes |
| 429 (the target refused the request) | rate_limited | yes | no |
| 5xx, 3xx (the target may have acted) | peer_error | no | yes |
| other 4xx | peer_error | no | no |

A 2xx proves the effect happened, so a 2xx whose body is longer than the bound (1 MiB on the wire,
65,536 characters of text), or whose body broke off or ran out of time, is still a ``Reply``, cut and
marked ``truncated=True``: failing it would misreport a mutation that took place.

The secret never leaves this module except as the signature; it is not logged or put in a message.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import socket
import time
from collections.abc import Callable, Sequence

from kairos import secrets
from kairos.executors import egress
from kairos.executors.base import (
    READ_LIMIT,
    ExecutionRequest,
    ExecutorError,
    PreparedCall,
    Reply,
    SecretSource,
    agent_text,
    bounded_content,
    canonical_json,
    digest,
    recorded_target,
    secret_errors,
)


def signing_key(secret: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret: ``whsec_<base64>`` decoded, else the raw UTF-8 bytes."""
    if secret.startswith("whsec_"):
        try:
            return base64.b64decode(secret[len("whsec_"):], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ExecutorError("secret_unavailable", "the whsec_ signing secret is not valid base64") from exc
    return secret.encode("utf-8")


def sign(key: bytes, *, message_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``."""
    mac = hmac.new(key, f"{message_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode("ascii")


class HttpExecutor:
    name = "http"

    def __init__(self, *, allow: Sequence[str] = (), resolve: egress.Resolver = socket.getaddrinfo,
                 secret: SecretSource = secrets.resolve, clock: Callable[[], float] = time.time,
                 ca_certs: str | None = None, read_limit: int = READ_LIMIT) -> None:
        self._allow = tuple(allow)
        self._resolve = resolve
        self._secret = secret
        self._clock = clock
        self._ca_certs = ca_certs
        self._read_limit = read_limit

    def prepare(self, request: ExecutionRequest) -> PreparedCall:
        base_url = agent_text(request.agent, "base_url", required=True)
        key_ref = agent_text(request.agent, "api_key_secret", required=True)
        target = egress.check(base_url, allow=self._allow, resolve=self._resolve)
        with secret_errors():
            key = signing_key(self._secret(key_ref, owner=request.owner, audience=base_url))
        body = canonical_json(
            {"run_id": request.run_id, "attempt": request.attempt, "prompt": request.prompt,
             "payload": request.payload}
        )
        message_id = f"{request.run_id}:{request.attempt}"
        timestamp = int(self._clock())
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "kairos",
            "webhook-id": message_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(key, message_id=message_id, timestamp=timestamp, body=body),
        }
        return PreparedCall(kind="http_call", mutation=True, method="POST", url=recorded_target(base_url), body=body,
                            digest=digest(body), headers=headers, target=target)

    def send(self, prepared: PreparedCall, *, timeout: float) -> Reply:
        if prepared.target is None:
            raise ExecutorError("internal", "the call was not prepared by the http executor")
        try:
            answer = egress.post(prepared.target, body=prepared.body, headers=prepared.headers, timeout=timeout,
                                 read_limit=self._read_limit, ca_certs=self._ca_certs,
                                 abort=prepared.abort)
        except egress.TransportFailure as failure:
            if failure.status is not None and 200 <= failure.status < 300:
                return _reply(failure.partial, cut=True)  # the target accepted; only its answer is incomplete
            if failure.status is not None:
                raise _status_error(failure.status) from failure
            raise _transport_error(failure) from failure
        if not 200 <= answer.status < 300:
            raise _status_error(answer.status)
        return _reply(answer.body, cut=answer.overflow)


def _reply(body: bytes, *, cut: bool) -> Reply:
    # Undecodable bytes and NULs (which PostgreSQL text cannot hold) become U+FFFD: the target has
    # acted, so its answer is kept rather than failing the run after the effect.
    text, shortened = bounded_content(body.decode("utf-8", errors="replace").replace("\x00", "\ufffd"))
    return Reply(content=text, truncated=cut or shortened)


def _transport_error(failure: egress.TransportFailure) -> ExecutorError:
    if failure.stage == "connect":
        return ExecutorError("connect_failed", f"could not connect to the target ({failure.detail})", retry_safe=True)
    if failure.stage == "timeout":
        return ExecutorError("timeout", "the target did not answer in time; it may have acted", outcome_unknown=True)
    return ExecutorError("ambiguous_effect", f"the connection to the target broke after sending ({failure.detail}); "
                         "it may have acted", outcome_unknown=True)


def _status_error(status: int) -> ExecutorError:
    if status == 429:
        return ExecutorError("rate_limited", "the target is rate limiting (HTTP 429)", retry_safe=True)
    if status >= 500 or 300 <= status < 400:
        return ExecutorError("peer_error", f"the target answered HTTP {status}; it may have acted",
                             outcome_unknown=True)
    return ExecutorError("peer_error", f"the target refused the request (HTTP {status})")
