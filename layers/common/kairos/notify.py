"""Notify: what a schedule says when one of its runs ends — an inbox note, and a signed webhook.

Role: a schedule's ``notify`` (checked by ``kairos.schedules.request.validate_notify``) names the
terminal run states it reports and, optionally, a webhook. ``report_endings`` is called by the settle
step for the runs it has just settled: for each run whose state is in ``on`` it writes one
``run_ended`` note (run id, state, reason code) to the schedule's conversation and, with a webhook,
owes one delivery in ``notify_deliveries``. ``Sender.attempt`` makes one delivery attempt for the
tick's deliver step (``kairos.tick.deliver``) and says what it proved.

The webhook is Standard Webhooks: body ``{"type": "run.<state>", "run_id", "schedule_id",
"output"?}`` (``output``: a succeeded run's answer, cut to ``OUTPUT_PREVIEW_CHARS``), headers
``webhook-id`` = the run id (the same on every retry, so a receiver dedupes on it),
``webhook-timestamp`` and ``webhook-signature`` from ``kairos.executors.http.sign`` (the one signer).
The POST goes through the egress check to the approved address only (``egress.check`` then
``egress.post``), follows no redirects and reads little.

Outcomes (the receiver decides, we never guess):

| answer | outcome |
|---|---|
| 2xx (even a cut-off body) | delivered: never sent again |
| 410 Gone | gave up: the receiver says the endpoint is gone for good (Standard Webhooks' rule) |
| any other status, connect failure, timeout, dropped connection | retry with backoff |
| a literal address the egress check refuses, a secret refused or unreadable for good | gave up |
| a host name without an allowed address (``connect_failed``) | retry: DNS may change |

Guarantees: reports are written in the settling transaction, so each run is reported once (the
settled marker and the outbox's primary key); the secret is resolved for the send only and is never
logged, stored or put in ``last_error``; the URL is not logged either (receivers put tokens in paths).
Must not: commit, or decide a run's state (the run is terminal before it is reported).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

import psycopg

from kairos import conversations, db, secrets
from kairos.observability import logger

OUTPUT_PREVIEW_CHARS = 1_000
SEND_TIMEOUT_SECONDS = 5.0  # per attempt: a tick (60 s, stops starting work with 10 s left) sends several
READ_LIMIT = 4_096  # the receiver's answer is only read to see its status
GIVE_UP_AFTER_SECONDS = 24 * 3_600
BACKOFF_BASE_SECONDS = 30
BACKOFF_CAP_SECONDS = 3_600
GONE = 410

Resolver = Callable[..., Sequence[tuple[Any, ...]]]
SecretSource = Callable[..., str]


@dataclass(frozen=True)
class Reported:
    notes: int = 0
    deliveries: int = 0


def report_endings(conn: psycopg.Connection[db.Row], schedules: Sequence[db.Row], runs: Sequence[db.Row],
                   settled: set[UUID], now: datetime | None) -> Reported:
    """Notes and owed deliveries for the ``settled`` runs among ``runs`` (rows with ``id``,
    ``schedule_id``, ``state``, ``reason_code``) of ``schedules`` (rows with ``id``, ``owner``,
    ``conversation_id``, ``notify``), in the caller's transaction."""
    by_id = {s["id"]: s for s in schedules}
    notes = deliveries = 0
    for run in runs:
        schedule = by_id.get(run["schedule_id"])
        if run["id"] not in settled or schedule is None:
            continue
        config: Mapping[str, Any] = schedule["notify"] or {}
        if run["state"] not in config.get("on", ()):
            continue
        conversations.note(conn, schedule["conversation_id"], kind="run_ended", now=now, body={
            "run_id": str(run["id"]), "schedule_id": str(schedule["id"]), "state": run["state"],
            "reason_code": run["reason_code"]})
        notes += 1
        webhook = config.get("webhook")
        if isinstance(webhook, Mapping):
            added = db.fetch_one(conn, "notify_deliveries_add", {
                "run_id": run["id"], "schedule_id": schedule["id"], "owner": schedule["owner"],
                "url": webhook["url"], "secret_ref": webhook["secret"], "now": now})
            deliveries += added is not None
    return Reported(notes, deliveries)


def backoff_seconds(attempts: int) -> int:
    """The wait after the ``attempts``-th failed attempt: 30 s, doubling, at most an hour."""
    return int(min(BACKOFF_BASE_SECONDS * 2 ** min(max(attempts - 1, 0), 20), BACKOFF_CAP_SECONDS))


def body_of(claim: Mapping[str, Any]) -> bytes:
    """The webhook's JSON (canonical: sorted keys, no spaces) for a claimed delivery row."""
    from kairos.executors.base import canonical_json

    content: dict[str, Any] = {"type": f"run.{claim['state']}", "run_id": str(claim["run_id"]),
                               "schedule_id": str(claim["schedule_id"])}
    if claim.get("output_text") is not None:
        content["output"] = claim["output_text"]
    return canonical_json(content)


@dataclass(frozen=True)
class Outcome:
    """What one attempt proved: ``delivered``, ``retry`` or ``give_up``; ``error`` is a reason code and a
    short message (never a body, a header or a secret)."""

    verdict: Literal["delivered", "retry", "give_up"]
    status: int | None = None
    error: str | None = None


class Sender:
    """Makes delivery attempts: the egress allow list, the resolver, the secret source and the clock."""

    def __init__(self, *, allow: Sequence[str] = (), resolve: Resolver = socket.getaddrinfo,
                 secret: SecretSource = secrets.resolve, clock: Callable[[], float] = time.time,
                 timeout: float = SEND_TIMEOUT_SECONDS, ca_certs: str | None = None) -> None:
        self._allow = tuple(allow)
        self._resolve = resolve
        self._secret = secret
        self._clock = clock
        self._timeout = timeout
        self._ca_certs = ca_certs

    def attempt(self, claim: Mapping[str, Any]) -> Outcome:
        """One signed POST of a claimed delivery (``notify_deliveries_claim``'s row) through the egress
        check. The reference is checked again for the owner here (``secrets.resolve``): one edited in
        the database since it was written still cannot sign with someone else's key."""
        # The executors' transport, imported on the first delivery: a tick that owes none never loads urllib3.
        from kairos.executors import egress
        from kairos.executors.base import ExecutorError
        from kairos.executors.http import sign, signing_key

        run_id = str(claim["run_id"])
        try:
            target = egress.check(claim["url"], allow=self._allow, resolve=self._resolve)
            key = signing_key(self._secret(claim["secret_ref"], owner=claim["owner"], audience=None))
        except ExecutorError as refused:
            verdict: Literal["retry", "give_up"] = "retry" if refused.retry_safe else "give_up"
            return Outcome(verdict, error=_short(f"{refused.reason_code}: {refused.message}"))
        except secrets.SecretUnavailable as unavailable:
            return Outcome("retry" if unavailable.retry_safe else "give_up",
                           error=_short(f"secret_unavailable: {unavailable.message}"))
        body = body_of(claim)
        stamp = int(self._clock())
        headers = {"Content-Type": "application/json", "User-Agent": "kairos", "webhook-id": run_id,
                   "webhook-timestamp": str(stamp),
                   "webhook-signature": sign(key, message_id=run_id, timestamp=stamp, body=body)}
        try:
            answer = egress.post(target, body=body, headers=headers, timeout=self._timeout, read_limit=READ_LIMIT,
                                 ca_certs=self._ca_certs)
            status = answer.status
        except egress.TransportFailure as failure:
            if failure.status is None:
                return Outcome("retry", error=_short(f"{failure.stage}: {failure.detail}"))
            status = failure.status  # the status line arrived; only the answer's body broke off
        except ExecutorError as refused:
            return Outcome("give_up", error=_short(f"{refused.reason_code}: {refused.message}"))
        if 200 <= status < 300:
            return Outcome("delivered", status=status)
        if status == GONE:
            return Outcome("give_up", status=status, error="gone: the receiver answered 410")
        return Outcome("retry", status=status, error=f"http_status: the receiver answered {status}")


def _short(text: str) -> str:
    return text[:300]


def log_outcome(claim: Mapping[str, Any], outcome: Outcome, *, final: bool) -> None:
    """One line per attempt, with ids, the attempt number and the verdict; never the URL or the secret."""
    action = {"delivered": "notify_delivered", "retry": "notify_retry", "give_up": "notify_gave_up"}[
        "give_up" if final and outcome.verdict == "retry" else outcome.verdict]
    extra = {"action": action, "run_id": str(claim["run_id"]), "schedule_id": str(claim["schedule_id"]),
             "attempt": int(claim["attempts"]), "status": outcome.status, "error": outcome.error}
    if outcome.verdict == "delivered":
        logger.info("notify webhook delivered", extra=extra)
    else:
        logger.warning("notify webhook not delivered", extra=extra)
