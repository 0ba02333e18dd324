"""Idempotency keys: the one rule for the key header, and idempotent creates.

A caller that retries ``POST /v1/schedules`` or ``POST /v1/conversations`` with the same
``Idempotency-Key`` must not make a second object. ``begin`` (inside the route's transaction, before
the create) answers one of three ways, per owner and key, for 24 h:

* never seen (or its receipt has expired): a ``Pending`` the route completes with ``remember`` after
  its create, in the same transaction, so the receipt exists exactly when the object does;
* seen with the same request (route and canonical JSON body): a ``Replay`` of the first response,
  byte for byte (a webhook schedule's token included, so a client whose first answer was lost still
  learns its token);
* seen with another request: ``IdempotencyMismatch`` (422).

Requests presenting one (owner, key) serialize on a transaction-level advisory lock, so two racing
retries make one object and the second answers the first's response. A failed create (4xx) rolls
back and remembers nothing: the caller may correct the body and retry under the same key.

Secrecy at rest. The first response may carry a webhook token, which is shown once and otherwise
stored only as SHA-256. To replay it we keep the response sealed, and neither the key nor the owner
in clear:

* the row is found by ``key_digest`` = SHA-256 of the JSON array ``["kairos/idempotency", owner,
  key]`` (an unambiguous encoding, so no two (owner, key) pairs share an input);
* the response is sealed with AES-256-GCM (``cryptography``'s ``AESGCM``, a random 96-bit nonce
  stored in front of the ciphertext) under a key derived with HKDF-SHA256 from the Idempotency-Key
  (input key material) with the owner as salt and a fixed purpose label as info; the associated data
  binds the ciphertext to its row (``key_digest``, ``request_digest``).

So a reader of the database (a backup, a replica, a support query) sees a digest and ciphertext;
only a caller presenting the same key as the same owner can open it. No secret of ours is involved
(no KMS call on the create path, nothing to rotate); the price is that the seal is only as strong as
the key's entropy, which is why clients are told to send random keys (UUIDs): a guessable key
("1") would let someone holding a database copy open that one response. Standard primitives only:
no homemade cryptography.

Keys (``check_key``): at most 255 characters of printable ASCII (space to ``~``), surrounding
spaces dropped; anything else (NUL, control characters, non-ASCII) is a 422 naming the header,
never a 500 from the database or an encoder. Webhook intake (``kairos.webhooks``) uses the same rule.

Must not: log a key, a digest or a response body; decide time with the Lambda clock.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg

from kairos import db
from kairos.errors import INVALID_CHARACTER, FieldError, IdempotencyMismatch, ValidationFailed
from kairos.observability import logger

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

MAX_KEY_LENGTH = 255
_KEY_TEXT = re.compile(r"[\x20-\x7e]+")
_PURPOSE = b"kairos/idempotency-receipt/v1"
_NONCE_BYTES = 12


def check_key(header: str, value: str | None) -> str | None:
    """The key a header carries (stripped), None when absent or blank; 422 naming ``header`` when it
    is longer than 255 characters or not printable ASCII."""
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    if len(value) > MAX_KEY_LENGTH:
        raise ValidationFailed([FieldError(header, "max_length", f"at most {MAX_KEY_LENGTH} characters")])
    if not _KEY_TEXT.fullmatch(value):
        raise ValidationFailed([FieldError(header, INVALID_CHARACTER,
                                           "use printable ASCII only (a UUID is a good key)")])
    return value


@dataclass(frozen=True)
class Replay:
    """The first response to this key, to be answered again."""

    status: int
    body: Any


@dataclass(frozen=True)
class Pending:
    """A key seen for the first time (or again after its receipt expired): remember the response."""

    owner: str
    key: str
    key_digest: str
    request_digest: str


def begin(conn: psycopg.Connection[db.Row], *, owner: str, key: str, route: str, body: Any,
          now: datetime | None = None) -> Replay | Pending:
    """Takes the key's lock for the transaction, then answers as the module doc says."""
    digest = key_digest(owner, key)
    request = request_digest(route, body)
    db.fetch_one(conn, "idempotency_receipts_lock", {"key_digest": digest})
    row = db.fetch_one(conn, "idempotency_receipts_find", {"key_digest": digest, "now": now})
    if row is None:
        return Pending(owner, key, digest, request)
    require_same(row["request_digest"], request)
    plain = _open(bytes(row["sealed"]), owner=owner, key=key, aad=_aad(digest, request))
    logger.info("idempotent replay", extra={"action": "idempotency_replayed", "route": route})
    return Replay(int(row["status"]), json.loads(plain))


def remember(conn: psycopg.Connection[db.Row], pending: Pending, *, status: int, body: Any,
             now: datetime | None = None) -> None:
    """Stores the sealed first response (same transaction as the create it answers)."""
    plain = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    sealed = _seal(plain, owner=pending.owner, key=pending.key,
                   aad=_aad(pending.key_digest, pending.request_digest))
    db.fetch_one(conn, "idempotency_receipts_insert", {
        "key_digest": pending.key_digest, "request_digest": pending.request_digest, "status": status,
        "sealed": sealed, "now": now,
    })


def require_same(stored_digest: str, presented_digest: str) -> None:
    """The one refusal of a live key reused for another request (here and for webhook deliveries)."""
    if not hmac.compare_digest(stored_digest, presented_digest):
        raise IdempotencyMismatch(
            "this Idempotency-Key was already used with another request; use a new key for a new request",
            fields=[FieldError("Idempotency-Key", "idempotency_key_reused",
                               "the key was used with another request in the last 24 hours")],
        )


def key_digest(owner: str, key: str) -> str:
    """SHA-256 hex of (owner, key): how a receipt is found without storing either."""
    encoded = json.dumps(["kairos/idempotency", owner, key], ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(encoded.encode("ascii")).hexdigest()


def request_digest(route: str, body: Any) -> str:
    """SHA-256 hex of the route key and the body as canonical JSON (key order and spacing do not count)."""
    canonical = json.dumps([route, body], sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def _aad(key_digest_hex: str, request_digest_hex: str) -> bytes:
    return f"{key_digest_hex}:{request_digest_hex}".encode("ascii")


def _aead(owner: str, key: str) -> AESGCM:
    # Imported here: the webhook route needs only check_key, and cryptography costs its cold start.
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=owner.encode("utf-8"),
                   info=_PURPOSE).derive(key.encode("utf-8"))
    return AESGCM(derived)


def _seal(plain: bytes, *, owner: str, key: str, aad: bytes) -> bytes:
    nonce = os.urandom(_NONCE_BYTES)
    return nonce + _aead(owner, key).encrypt(nonce, plain, aad)


def _open(sealed: bytes, *, owner: str, key: str, aad: bytes) -> bytes:
    from cryptography.exceptions import InvalidTag

    try:
        return _aead(owner, key).decrypt(sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:], aad)
    except InvalidTag:
        # Only a digest collision or a tampered row gets here; the caller learns nothing more.
        logger.error("idempotency receipt does not open", extra={"action": "idempotency_receipt_invalid"})
        raise IdempotencyMismatch(
            "this Idempotency-Key cannot be replayed; use a new key",
            fields=[FieldError("Idempotency-Key", "idempotency_key_reused", "use a new key")],
        ) from None
