"""Webhook intake: one delivery to ``POST /v1/hooks/{token}`` becomes at most one queued run.

Flow of ``receive`` (one transaction, then the SQS handoff):

1. bodies over 64 KiB are refused (413) before any lookup work;
2. the token is hashed (SHA-256 hex) and looked up against ``token_hash``, or ``previous_token_hash``
   while ``previous_token_expires_at`` is ahead; the stored hash is then compared with
   ``hmac.compare_digest``. Only an ``active`` webhook schedule answers: paused, cancelled,
   completed and unknown hooks all raise the same ``NotFound("hook")``. The row is locked
   (``FOR NO KEY UPDATE``), so the deliveries of one schedule serialize: the rate window and the
   receipt check below always see every earlier delivery;
3. the signature, when the schedule requires one (``signing``: Standard Webhooks or GitHub's
   ``X-Hub-Signature-256``), over the raw body, with a timestamp tolerance (Standard Webhooks);
4. the idempotency key (``idempotency_key``): ``Idempotency-Key``, else Standard Webhooks'
   ``webhook-id``, else GitHub's ``X-GitHub-Delivery``, else a fresh random key. A schedule that
   requires a signature dedupes on its scheme's own id first — the signed ``webhook-id``, GitHub's
   delivery id — so a captured delivery re-posted with a new, unsigned ``Idempotency-Key`` is the same
   delivery. Keys are printable ASCII of at most 255 characters (``kairos.idempotency.check_key``,
   else 422 naming the header). A live receipt (``expires_at``, 24 h) answers the first response
   again when the body digest matches, and ``IdempotencyMismatch`` (422) when it does not. A replay
   is answered before the rate limit: a sender retrying an accepted delivery gets its answer even
   when the schedule is at its limit. GitHub signs neither an id nor a time, so a schedule verifying
   GitHub signatures also remembers each accepted body's digest for the receipt window (a receipt
   keyed ``§body:sha256:<hex>``): the same signed body again, under any delivery id or none, answers
   the first run;
5. the schedule's ``flow`` (``kairos.flow``): a delivery that folds into an open debounce or batch
   window is recorded as a ``coalesced`` occurrence naming that window's run, and answered with it;
6. the rate limit: ``limits.rate_per_minute`` (``rate_per_minute``: default 60) runs of the hook
   dispatchable in any 60 s (``kairos.flow.rate_hold``): over it, ``RateLimited`` with the seconds until
   the window frees a slot, or with ``flow.over_rate: defer`` a run held until the rate allows;
7. the occurrence (source ``webhook``, ``fire_at`` = database now, local time from
   ``calendar.describe``), the run (payload = the JSON body, or ``{"raw": text}`` when it is not JSON
   PostgreSQL can store: ``NaN``, ``Infinity``, ``1e999``, NUL, lone surrogates; a batch window's run:
   the array of its deliveries), ``run.queued`` and the receipt are inserted, a held run (a window, a
   deferral) gets its ``held_until``; the transaction commits; then the run id is handed to SQS — a
   held run's with the delay until it is due (its timer). A failed send leaves the run queued with no
   handoff stamp: the tick's repair sends it.

Identity: occurrence id = uuid5(schedule, "webhook", key, generation), run id = uuid5(occurrence).
Once a key's receipt has expired the key is new again: the next delivery with it makes the key's
next generation (one past the newest occurrence it made), a new occurrence and run with the new
body. Every id stays deterministic: a retry of that delivery finds the new receipt.

Database failures: any ``psycopg.Error`` while recording a delivery answers 503
(``ServiceUnavailable``) and logs one line with the error class and SQLSTATE only — PostgreSQL's
message and context quote the values they refused (the payload), so they never reach a log here.

Rotation (``rotate``): one guarded UPDATE gives an active or paused webhook schedule a new token and
keeps the previous one valid for the overlap (``schedules.TOKEN_OVERLAP_*``); a refusal says why
(missing or foreign, not a webhook, cancelled or completed).

Guarantees: the raw token is never stored, logged or put in an error; logs carry ``action`` and ids.
This module must not decide anything with the Lambda clock: "now" is the database's.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import math
import re
import secrets as pysecrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from kairos import calendar, db, idempotency, identity, limits, occurrences, runtime, secrets
from kairos import flow as kairos_flow
from kairos.errors import (
    Conflict,
    FieldError,
    IdempotencyMismatch,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    ServiceUnavailable,
    SignatureInvalid,
    ValidationFailed,
)
from kairos.observability import logger, metrics
from kairos.schedules import TOKEN_OVERLAP_DEFAULT_SECONDS, TOKEN_OVERLAP_MAX_SECONDS, Schedule, flow_spec
from kairos.schedules import get as get_schedule
from kairos.states import Decision, OverRate, Source
from kairos.tokens import hash_token, new_token  # the one minter and hashing rule, shared with creation

MAX_BODY_BYTES = 65_536
MAX_KEY_LENGTH = idempotency.MAX_KEY_LENGTH
# Standard Webhooks timestamps are integer seconds; 12 digits reach the year 33658. Anything longer
# (10^400 overflowed float conversion: a 500) or not ASCII digits is refused as unsigned.
_TIMESTAMP = re.compile(r"-?[0-9]{1,12}")
DEFAULT_RATE_LIMIT = limits.DEFAULTS["rate_per_minute"]
DEFAULT_TOLERANCE_SECONDS = 300
RATE_WINDOW = kairos_flow.RATE_WINDOW

HandoffFn = Callable[..., object]  # (database, run_ids, *, delay_seconds=0): kairos.api.routes.handoff_committed


@dataclass(frozen=True)
class Delivery:
    """One request as received: the path token, the raw body, and headers with lower-case names."""

    token: str
    body: bytes
    headers: Mapping[str, str]

    def header(self, name: str) -> str | None:
        value = self.headers.get(name.lower())
        return value if value else None


@dataclass(frozen=True)
class Accepted:
    schedule_id: UUID
    occurrence_id: UUID
    run_id: UUID
    replayed: bool
    # What the caller hands to SQS after the commit: 0 the run now, n seconds later (a held run's timer,
    # kairos.flow), None nothing (a replay, or a delivery folded into a window that has its timer).
    send_delay: int | None = 0
    coalesced: bool = False  # folded into another delivery's run (kairos.flow)

    def as_json(self) -> dict[str, str]:
        return {"run_id": str(self.run_id), "occurrence_id": str(self.occurrence_id)}


def webhook_url(public_url: str, token: str) -> str:
    return f"{public_url.rstrip('/')}/v1/hooks/{token}"


def receive(database: db.Database, delivery: Delivery, *, now: datetime | None = None,
            handoff: HandoffFn | None = None) -> Accepted:
    """Accepts one delivery (see the module doc); commits before handing the run to SQS."""
    if len(delivery.body) > MAX_BODY_BYTES:
        _rejected("too_large", None)
        raise PayloadTooLarge(f"webhook bodies are limited to {MAX_BODY_BYTES} bytes")
    try:
        with database.transaction() as conn:
            accepted = accept(conn, delivery, now=now)
    except psycopg.Error as error:
        # PostgreSQL's message, detail and context quote the values they refused (the payload):
        # the class and SQLSTATE say what failed; nothing else of the error reaches the log.
        logger.error("webhook not recorded: database error", extra={
            "action": "webhook_database_error", "error_type": type(error).__name__,
            "sqlstate": getattr(error, "sqlstate", None)})
        metrics.add_metric(name="WebhooksFailed", unit="Count", value=1)
        raise ServiceUnavailable("the delivery could not be recorded; nothing was accepted, retry later") from None
    log_extra = {"action": "webhook_accepted", "schedule_id": str(accepted.schedule_id),
                 "occurrence_id": str(accepted.occurrence_id), "run_id": str(accepted.run_id),
                 "replayed": accepted.replayed, "coalesced": accepted.coalesced, "send_delay": accepted.send_delay}
    logger.info("webhook accepted", extra=log_extra)
    metrics.add_metric(name="WebhooksAccepted", unit="Count", value=1)
    if not accepted.replayed and handoff is not None and accepted.send_delay is not None:
        try:
            if accepted.send_delay:
                handoff(database, [accepted.run_id], delay_seconds=accepted.send_delay)
            else:
                handoff(database, [accepted.run_id])
        except Exception:  # noqa: BLE001 - the run is committed and queued: the tick's repair sends it
            logger.exception("webhook handoff failed", extra={
                "action": "webhook_handoff_failed", "schedule_id": str(accepted.schedule_id),
                "run_id": str(accepted.run_id)})
            metrics.add_metric(name="HandoffFailures", unit="Count", value=1)
    return accepted


def accept(conn: psycopg.Connection[db.Row], delivery: Delivery, *, now: datetime | None = None) -> Accepted:
    """Everything ``receive`` does inside the caller's transaction (no commit, no handoff)."""
    if len(delivery.body) > MAX_BODY_BYTES:
        raise PayloadTooLarge(f"webhook bodies are limited to {MAX_BODY_BYTES} bytes")
    hook = find(conn, delivery.token, now=now)
    if hook is None:
        _rejected("unknown", None)
        raise NotFound("hook")
    schedule_id: UUID = hook["id"]
    db_now: datetime = hook["now"]
    if hook["signing"]:
        _verify(hook, delivery, db_now)
    scheme = (hook["signing"] or {}).get("scheme")
    key, deduplicated = idempotency_key(delivery, scheme=scheme)
    digest = hashlib.sha256(delivery.body).hexdigest()
    # GitHub signs the body only (no id, no timestamp): a captured delivery re-posted without its
    # X-GitHub-Delivery, or with a new one, still verifies. Its body is remembered for the receipt
    # window, and the same signed body again is the same delivery: the first answer, no new run.
    body_key = _body_key(digest) if scheme == "github" else None
    if body_key is not None:
        seen = db.fetch_one(conn, "webhook_receipts_find",
                            {"schedule_id": schedule_id, "idempotency_key": body_key, "now": now})
        if seen is not None:
            return Accepted(schedule_id, seen["occurrence_id"], seen["run_id"], replayed=True)
    generation = 0
    if deduplicated:
        known = _replay_or_generation(conn, schedule_id, key, digest, now)
        if isinstance(known, Accepted):
            return known
        generation = known
    occurrence_id = identity.occurrence_id(schedule_id, Source.WEBHOOK, key=key, generation=generation)
    recorded = _record(conn, hook, occurrence_id, key, generation, payload_of(delivery.body), now)
    if recorded.replayed:
        return recorded
    run_id = recorded.run_id
    for remembered in ([key] if deduplicated else []) + ([body_key] if body_key is not None else []):
        db.fetch_one(conn, "webhook_receipts_insert", {
            "schedule_id": schedule_id, "idempotency_key": remembered, "request_digest": digest,
            "occurrence_id": occurrence_id, "run_id": run_id, "generation": generation, "now": now,
        })
    return recorded


def _record(conn: psycopg.Connection[db.Row], hook: Mapping[str, Any], occurrence_id: UUID, key: str,
            generation: int, payload: Any, now: datetime | None) -> Accepted:
    """The delivery's occurrence: folded into its schedule's open window (``kairos.flow``: a coalesced
    occurrence naming that run), or with a run of its own — held when it opens a window or waits for
    the rate; ``RateLimited`` or ``QueueFull`` when it may not have one."""
    schedule_id: UUID = hook["id"]
    db_now: datetime = hook["now"]
    flow: Mapping[str, Any] | None = hook.get("flow")
    fire = calendar.describe(db_now, hook["timezone"])
    planned = functools.partial(occurrences.planned, occurrence_id=occurrence_id, schedule_id=schedule_id,
                                source=Source.WEBHOOK, fire=fire, revision=hook["revision"],
                                idempotency_key=key, key_generation=generation)
    folded = kairos_flow.fold(conn, schedule_id, flow, payload, now=now) if flow else None
    if folded is not None:
        occurrences.record(conn, [planned(decision=Decision.COALESCED, run_id=None, coalesced_into=folded.run_id)],
                           now=now)
        # A full batch goes now; an open window's timer is already on its way.
        return Accepted(schedule_id, occurrence_id, folded.run_id, replayed=False,
                        send_delay=0 if folded.closed else None, coalesced=True)
    run_id = identity.run_id(occurrence_id)
    held = _rate_hold(conn, hook, flow, db_now, now)
    inserted = occurrences.record(conn, [planned(decision=Decision.DISPATCHED, run_id=run_id,
                                                 payload=kairos_flow.first_payload(flow, payload),
                                                 concurrency=concurrency_of(flow, payload))], now=now)
    occurrences.refuse_over_cap(inserted)  # 429 queue_full: the caller's transaction records nothing
    if not inserted:
        # Unreachable while deliveries of a schedule serialize on its row lock (the generation is read
        # under it); converging on the existing rows is the safe answer if that ever changes.
        return Accepted(schedule_id, occurrence_id, run_id, replayed=True)
    held_until = None
    if held is not None or kairos_flow.window_of(flow) is not None:
        held_until = kairos_flow.open_window(conn, run_id, flow, held=held, db_now=db_now, now=now)
    return Accepted(schedule_id, occurrence_id, run_id, replayed=False,
                    send_delay=kairos_flow.timer_delay(held_until, db_now))


# A key longer than this is stored as its digest: keys are compared, never shown in full.
MAX_CONCURRENCY_KEY_CHARS = 200


def concurrency_of(flow: Mapping[str, Any] | None, payload: Any) -> tuple[str, int] | None:
    """The run's concurrency key and limit (``flow.concurrency``: the value its JSON pointer names in
    the payload, a string as it is and anything else as canonical JSON); None without a concurrency
    setting or when the pointer names nothing (the run then waits only for its owner's slots)."""
    setting = (flow or {}).get("concurrency")
    if not isinstance(setting, Mapping) or not isinstance(setting.get("key"), str):
        return None
    value = flow_spec.pointer_value(payload, setting["key"])
    if value is None:
        return None
    key = value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))
    if len(key) > MAX_CONCURRENCY_KEY_CHARS:
        key = "sha256:" + hashlib.sha256(key.encode("utf-8")).hexdigest()
    return key, int(setting.get("limit") or 1)


def _rate_hold(conn: psycopg.Connection[db.Row], hook: Mapping[str, Any], flow: Mapping[str, Any] | None,
               db_now: datetime, now: datetime | None) -> datetime | None:
    """``kairos.flow.rate_hold`` for this hook: None (dispatch now), the instant a deferred run may go,
    or ``RateLimited`` (logged as a rejection) when its flow rejects what is over the rate."""
    try:
        return kairos_flow.rate_hold(conn, hook["id"], limit=rate_per_minute(hook),
                                     over_rate=(flow or {}).get("over_rate", OverRate.REJECT), db_now=db_now, now=now)
    except RateLimited:
        _rejected("rate_limited", hook["id"])
        raise


def _body_key(digest: str) -> str:
    """The receipt key of a signed body. It starts with a character no header key can hold (keys are
    printable ASCII, ``kairos.idempotency.check_key``), so a sender's key never names it."""
    return f"\N{SECTION SIGN}body:sha256:{digest}"


def _verify(hook: Mapping[str, Any], delivery: Delivery, db_now: datetime) -> None:
    try:
        verify_signature(hook["signing"], body=delivery.body, headers=delivery.headers, now=db_now,
                         owner=hook["owner"])
    except SignatureInvalid:
        _rejected("signature", hook["id"])
        raise


def _replay_or_generation(conn: psycopg.Connection[db.Row], schedule_id: UUID, key: str, digest: str,
                          now: datetime | None) -> Accepted | int:
    """A live receipt's first answer again (422 for another body); else the key is new (again), and
    its generation keeps the new rows apart from the ones an expired use of the key made."""
    receipt = db.fetch_one(conn, "webhook_receipts_find",
                           {"schedule_id": schedule_id, "idempotency_key": key, "now": now})
    if receipt is not None:
        try:
            idempotency.require_same(receipt["request_digest"], digest)
        except IdempotencyMismatch:
            _rejected("idempotency_mismatch", schedule_id)
            raise
        return Accepted(schedule_id, receipt["occurrence_id"], receipt["run_id"], replayed=True)
    row = db.fetch_one(conn, "occurrences_hook_key_generation", {"schedule_id": schedule_id, "idempotency_key": key})
    return int(row["generation"]) if row is not None else 0


def find(conn: psycopg.Connection[db.Row], token: str, *, now: datetime | None = None) -> db.Row | None:
    """The active webhook schedule this token opens (locked), or None. Compared in constant time."""
    presented = hash_token(token)
    row = db.fetch_one(conn, "schedules_find_hook", {"token_hash": presented, "now": now})
    if row is None:
        return None
    current = hmac.compare_digest(row["token_hash"] or "", presented)
    previous = hmac.compare_digest(row["previous_token_hash"] or "", presented)
    return row if current or previous else None


# Where a delivery's key comes from, first match wins. A signed schedule's own id header comes first:
# it is what the signature covers (Standard Webhooks signs ``webhook-id``) or what the signer sets
# (GitHub's delivery id, kept across its redeliveries), while ``Idempotency-Key`` is anyone's to set.
_KEY_HEADERS = (("idempotency-key", "Idempotency-Key"), ("webhook-id", "webhook-id"),
                ("x-github-delivery", "X-GitHub-Delivery"))
_SIGNED_ID = {"standard": ("webhook-id", "webhook-id"), "github": ("x-github-delivery", "X-GitHub-Delivery")}


def idempotency_key(delivery: Delivery, *, scheme: str | None = None) -> tuple[str, bool]:
    """The delivery's key and whether it came from the sender (a fresh random key dedupes nothing).

    ``scheme`` is the schedule's signing scheme (verified before this is called), if any.
    """
    order: tuple[tuple[str, str], ...] = _KEY_HEADERS
    if scheme in _SIGNED_ID:
        order = (_SIGNED_ID[scheme], *(h for h in _KEY_HEADERS if h != _SIGNED_ID[scheme]))
        if scheme == "standard":
            order = order[:1]  # the signed id is always there; an unsigned header must not override it
    for header, name in order:
        value = idempotency.check_key(name, delivery.header(header))
        if value is not None:
            return value, True
    return f"fresh:{pysecrets.token_hex(16)}", False


def payload_of(body: bytes) -> Any:
    """The run payload: the parsed JSON body, or ``{"raw": text}`` when it is not storable JSON."""
    text = body.decode("utf-8", errors="replace")
    try:
        # NaN, Infinity and numbers beyond a float (1e999) are Python's extensions, not JSON:
        # PostgreSQL's jsonb refuses them, so such a body is kept as its text.
        value = json.loads(text, parse_constant=_not_json, parse_float=_finite)
    except ValueError:
        return {"raw": text.replace("\x00", "\ufffd")}
    if _storable(value):
        return value
    return {"raw": text.replace("\x00", "\ufffd")}


def _not_json(token: str) -> Any:
    raise ValueError(f"{token} is not JSON")


def _finite(token: str) -> float:
    number = float(token)
    if not math.isfinite(number):
        raise ValueError("number out of range")
    return number


def _storable(value: Any) -> bool:
    """PostgreSQL jsonb refuses NUL characters and lone surrogates; such JSON is kept as raw text."""
    try:
        encoded = json.dumps(value, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, ValueError):
        return False
    return b"\\u0000" not in encoded


def verify_signature(signing: Mapping[str, Any], *, body: bytes, headers: Mapping[str, str], now: datetime,
                     owner: str, secret: str | None = None) -> None:
    """Raises ``SignatureInvalid`` unless the body carries a valid signature of the schedule's scheme.

    The secret reference is checked again for the schedule's ``owner`` (``kairos.secrets``): a
    reference edited in the database cannot make the hook verify against someone else's key.
    """
    scheme = signing.get("scheme")
    if secret is None:
        secret = _resolve_secret(str(signing.get("secret", "")), owner)
    if scheme == "github":
        presented = headers.get("x-hub-signature-256") or ""
        expected = "sha256=" + hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()
        if not presented or not _same(presented.strip().lower(), expected):
            raise SignatureInvalid("X-Hub-Signature-256 is missing or does not match the body")
        return
    if scheme == "standard":
        msg_id = headers.get("webhook-id") or ""
        stamp = headers.get("webhook-timestamp") or ""
        presented = headers.get("webhook-signature") or ""
        if not (msg_id and stamp and presented):
            raise SignatureInvalid("webhook-id, webhook-timestamp and webhook-signature headers are required")
        if not _TIMESTAMP.fullmatch(stamp):
            raise SignatureInvalid("webhook-timestamp must be integer seconds since the epoch")
        sent_at = int(stamp)
        tolerance = int(signing.get("tolerance_seconds") or DEFAULT_TOLERANCE_SECONDS)
        if abs(now.timestamp() - sent_at) > tolerance:
            raise SignatureInvalid(f"webhook-timestamp is more than {tolerance} seconds away from now")
        # Header text that is not UTF-8-encodable (lone surrogates) cannot have been signed as sent:
        # escaped, it simply fails to match instead of raising.
        signed = f"{msg_id}.{stamp}.".encode("utf-8", errors="backslashreplace") + body
        expected = base64.b64encode(hmac.new(_standard_key(secret), signed, hashlib.sha256).digest()).decode()
        for candidate in presented.split():
            version, _, value = candidate.partition(",")
            if version == "v1" and _same(value, expected):
                return
        raise SignatureInvalid("webhook-signature does not match the body")
    raise SignatureInvalid("the schedule's signing scheme is not supported")


def _same(presented: str, expected: str) -> bool:
    """Constant-time comparison that also takes non-ASCII text (``hmac.compare_digest`` raises on str)."""
    return hmac.compare_digest(presented.encode("utf-8", errors="backslashreplace"), expected.encode("ascii"))


def _standard_key(secret: str) -> bytes:
    """Standard Webhooks secrets are ``whsec_<base64>``; anything else is used as UTF-8 bytes."""
    if secret.startswith("whsec_"):
        try:
            return base64.b64decode(secret[len("whsec_"):], validate=True)
        except ValueError:
            pass
    return secret.encode("utf-8")


def _resolve_secret(reference: str, owner: str) -> str:

    try:
        return secrets.resolve(reference, owner=owner, audience=None)
    except secrets.SecretUnavailable:
        # Misconfiguration on our side; the sender only learns the signature could not be verified.
        logger.error("webhook signing secret unavailable", extra={"action": "webhook_secret_unavailable"})
        raise SignatureInvalid("the signature could not be verified") from None


def rate_per_minute(hook: Mapping[str, Any]) -> int:
    """The runs a hook dispatches per minute: its schedule's ``limits.rate_per_minute``, else the older
    ``rate_limit_per_minute`` column, else the default (60); never above ``KAIROS_MAX_RATE_PER_MINUTE``."""
    given = (hook.get("limits") or {}).get("rate_per_minute") or hook.get("rate_limit_per_minute")
    return min(int(given or DEFAULT_RATE_LIMIT), runtime.settings().max_rate_per_minute)


@dataclass(frozen=True)
class Rotation:
    """A rotated token (shown once, never stored) and the schedule as the rotation left it."""

    schedule: Schedule
    token: str = field(repr=False)


def rotate(conn: psycopg.Connection[db.Row], schedule_id: UUID, *, owner: str,
           overlap_seconds: int = TOKEN_OVERLAP_DEFAULT_SECONDS, now: datetime | None = None) -> Rotation:
    """``rotate_token``, then the schedule as it now is (its revision moved): the API's answer."""
    token = rotate_token(conn, schedule_id, owner=owner, overlap_seconds=overlap_seconds, now=now)
    return Rotation(get_schedule(conn, schedule_id, owner=owner), token)


def rotate_token(conn: psycopg.Connection[db.Row], schedule_id: UUID, *, owner: str,
                 overlap_seconds: int = TOKEN_OVERLAP_DEFAULT_SECONDS, now: datetime | None = None) -> str:
    """Gives a webhook schedule a new token (returned, shown once); the old one works for the overlap.

    Only one previous token is kept: rotating again ends the older one at once. One guarded UPDATE
    (owner, kind ``webhook``, status active or paused); when it matches no row the schedule is read to
    say why: ``NotFound("schedule")`` for a missing or foreign one (the same either way),
    ``ValidationFailed`` (``kind`` / ``webhook_only``) for a schedule without a token, ``Conflict``
    for a cancelled or completed one. A bad ``overlap_seconds`` (0..``TOKEN_OVERLAP_MAX_SECONDS``) is
    refused before any of it.
    """
    if not 0 <= overlap_seconds <= TOKEN_OVERLAP_MAX_SECONDS:
        rule = "min" if overlap_seconds < 0 else "max"  # kairos.errors.MIN / MAX, as the API body check
        raise ValidationFailed([FieldError("overlap_seconds", rule, f"between 0 and {TOKEN_OVERLAP_MAX_SECONDS}")])
    token = new_token()
    row = db.fetch_one(conn, "schedules_rotate_token", {
        "id": schedule_id, "owner": owner, "token_hash": hash_token(token),
        "overlap_seconds": overlap_seconds, "now": now,
    })
    if row is None:
        schedule = get_schedule(conn, schedule_id, owner=owner)
        if schedule.kind != "webhook":
            raise ValidationFailed([FieldError("kind", "webhook_only", "only webhook schedules have a token")])
        raise Conflict(f"a {schedule.status} schedule's token cannot be rotated")
    logger.info("webhook token rotated", extra={"action": "webhook_token_rotated", "schedule_id": str(schedule_id),
                                                "overlap_seconds": overlap_seconds})
    return token


def _rejected(reason: str, schedule_id: UUID | None) -> None:
    extra: dict[str, Any] = {"action": "webhook_rejected", "reason": reason}
    if schedule_id is not None:
        extra["schedule_id"] = str(schedule_id)
    logger.info("webhook rejected", extra=extra)
    metrics.add_metric(name="WebhooksRejected", unit="Count", value=1)
