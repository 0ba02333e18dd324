"""Notify: what a schedule says when one of its runs ends — an inbox note, and a signed webhook.

Role: a schedule's ``notify`` names the terminal run states it reports and, optionally, a webhook;
``validate_notify`` checks it when a schedule is created or edited (``kairos.schedules.request``): which
run endings are reported, and where a signed webhook may go. ``report_endings`` is called by the settle
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
from urllib.parse import urlsplit
from uuid import UUID

import psycopg
from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from kairos import agents, conversations, db, secrets
from kairos.errors import FieldError, ValidationFailed, from_validation_error
from kairos.executors import egress
from kairos.executors.base import ExecutorError, canonical_json
from kairos.executors.http import sign, signing_key
from kairos.observability import logger
from kairos.settings import Settings
from kairos.states import TERMINAL_RUN_STATES, RunState

OUTPUT_PREVIEW_CHARS = 1_000
SEND_TIMEOUT_SECONDS = 5.0  # per attempt: a tick (60 s, stops starting work with 10 s left) sends several
READ_LIMIT = 4_096  # the receiver's answer is only read to see its status
GIVE_UP_AFTER_SECONDS = 24 * 3_600
BACKOFF_BASE_SECONDS = 30
BACKOFF_CAP_SECONDS = 3_600
GONE = 410
# A schedule's notify when the request gives none: every unhappy end, to the inbox only
# (docs/architecture.md "Schedules and time"). Migration 0009 writes the same default for the rows
# that existed before it.
NOTIFY_ON_DEFAULT: tuple[RunState, ...] = (RunState.FAILED, RunState.ABANDONED, RunState.EXPIRED,
                                           RunState.POLICY_BLOCKED)
URL_MAX = 2_048

Resolver = Callable[..., Sequence[tuple[Any, ...]]]
SecretSource = Callable[..., str]


# --- The notify field, as a schedule's create and edit check it ------------------------------


class NotifyWebhook(BaseModel):
    """Where a schedule's run endings are POSTed, signed like Standard Webhooks; the secret is a reference."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    url: StrictStr = Field(max_length=URL_MAX)
    secret: agents.SecretReference

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 - raises ValueError for a port out of range
        except ValueError:
            raise PydanticCustomError("url", "give an https URL such as https://hooks.example.com/kairos") from None
        if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in value):
            raise PydanticCustomError("url", "give an https URL such as https://hooks.example.com/kairos")
        if "@" in parts.netloc:
            raise PydanticCustomError("url", "credentials must not be part of the URL; the secret signs the body")
        return value



class NotifyConfig(BaseModel):
    """Which terminal run states a schedule reports (an inbox note each), and an optional webhook."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    on: list[StrictStr] = Field(default_factory=lambda: [s.value for s in NOTIFY_ON_DEFAULT], max_length=16)
    webhook: NotifyWebhook | None = None

    @field_validator("on")
    @classmethod
    def _terminal_states(cls, value: list[str]) -> list[str]:
        terminal = sorted(s.value for s in TERMINAL_RUN_STATES)
        for state in value:
            if state not in terminal:
                raise PydanticCustomError("terminal_state", f"{state[:40]!r} is not a terminal run state; use "
                                          f"{', '.join(terminal)}")
        if len(set(value)) != len(value):
            raise PydanticCustomError("duplicate", "name each state once")
        return value


def validate_notify(raw: object, *, owner: str, allow: Sequence[str] | None = None) -> dict[str, Any]:
    """The notify JSON, normalized (``on`` filled in); ``ValidationFailed`` naming ``notify.<name>``.

    The webhook's URL is https, or http only to a host ``KAIROS_EGRESS_ALLOW`` lists (``allow``, read
    from the environment when None: a test server or an internal receiver), and a literal address
    must pass the egress check (no metadata or link-local target, ever). Its secret must be one of
    the owner's own ARNs, exactly like ``signing.secret``: it signs what is sent, so it may not be a
    key the owner does not hold. Host names are not resolved here; the deliver step checks every
    address before each send.
    """
    if not isinstance(raw, Mapping):
        raise ValidationFailed([FieldError("notify", "type", "give notify as a JSON object")])
    allow = Settings.from_env().egress_allow if allow is None else allow
    try:
        config = NotifyConfig.model_validate(dict(raw))
    except ValidationError as error:
        problems = from_validation_error(error, prefix="notify")
        # A well-formed URL is still judged, so one answer names every problem of the webhook.
        url = raw.get("webhook", {}).get("url") if isinstance(raw.get("webhook"), Mapping) else None
        if isinstance(url, str) and not any(p.field.startswith("notify.webhook.url") for p in problems):
            problems.extend(_notify_url_problems(url, allow))
        raise ValidationFailed(problems) from None
    problems = []
    if config.webhook is not None:
        if not config.on:
            problems.append(FieldError("notify.on", "empty", "a webhook needs at least one state to report"))
        problems.extend(_notify_url_problems(config.webhook.url, allow))
        try:
            secrets.check(config.webhook.secret, owner=owner, audience=None)
        except secrets.Refused as refused:
            problems.append(secrets.field_error(refused, "notify.webhook.secret"))
    if problems:
        raise ValidationFailed(problems)
    return config.model_dump(exclude_none=True)


def _notify_url_problems(url: str, allow: Sequence[str]) -> list[FieldError]:
    """https anywhere public; http only to a listed host; a literal address through the egress check."""
    import ipaddress


    parts = urlsplit(url)
    host = (parts.hostname or "").rstrip(".")
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if parts.scheme == "http":
        hosts, networks = egress.parse_allow(allow, port=parts.port or 80)
        listed = host in hosts or (address is not None and any(
            address.version == n.version and address in n for n in networks))
        if not listed:
            return [FieldError("notify.webhook.url", "https_required",
                               "use https; http is allowed only to hosts listed in KAIROS_EGRESS_ALLOW")]
    if address is not None:
        try:
            egress.check(url, allow=allow)
        except ExecutorError as refused:
            return [FieldError("notify.webhook.url", "egress_refused", str(refused))]
    return []


# --- Reports and deliveries ----------------------------------------------------------------------


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
