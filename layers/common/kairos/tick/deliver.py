"""The deliver step: owed run-ending webhooks (``notify_deliveries``) are sent, retried, or given up.

Role: after fire, the tick sends what the settle step owed (``kairos.notify``). ``Deliver.run_once``
claims one due delivery at a time (``FOR UPDATE SKIP LOCKED``; the claim counts the attempt and moves
``next_attempt_at`` a lease ahead, then commits), makes one attempt outside any transaction, and
records the outcome at once in its own short transaction: ``delivered`` on a 2xx, a retry after
``notify.backoff_seconds`` (30 s doubling to an hour), or ``gave_up`` on a permanent refusal or once
the next attempt would fall more than 24 h after the run's report was owed. A gave-up delivery leaves
a ``notify_gave_up`` note in the schedule's conversation. It stops after ``limit`` attempts or when the
tick's time runs short, whichever comes first.

Guarantees: two ticks never send one delivery at the same time (the claim is skipped while locked,
and once committed the lease keeps it out of every other claim for longer than an attempt can take).
A delivery the receiver accepted is marked in the transaction right after the send and never sent
again; the mark does not depend on the lease (a 2xx is a 2xx). Every attempt carries the same
``webhook-id`` (the run id). A tick that dies between the send and the mark leaves the delivery to be
sent again after the lease: at least once, and the receiver dedupes on ``webhook-id``.

Must not: hold a transaction open across an HTTP call, log the URL or the secret, or delay a fire
(the tick runs it after the fire batches).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from kairos import conversations, db, notify, secrets
from kairos.tick.counts import counted

DEFAULT_LIMIT = 20
# Longer than any attempt can take (connect and read are bounded by notify.SEND_TIMEOUT_SECONDS per address).
LEASE_SECONDS = 300


@dataclass(frozen=True)
class DeliverReport:
    attempted: int = 0
    delivered: int = counted("notify_delivered")
    retried: int = counted("notify_retried")
    gave_up: int = counted("notify_gave_up")
    full: bool = False  # stopped at the limit: more may be due


class Deliver:
    """Sends owed notify webhooks; holds no connection of its own."""

    def __init__(self, database: db.Database, *, allow: Sequence[str] = (), limit: int = DEFAULT_LIMIT,
                 resolve: notify.Resolver = socket.getaddrinfo, secret: notify.SecretSource = secrets.resolve,
                 clock: Callable[[], float] = time.time, timeout: float = notify.SEND_TIMEOUT_SECONDS,
                 ca_certs: str | None = None) -> None:
        self.db = database
        self.limit = limit
        self.sender = notify.Sender(allow=allow, resolve=resolve, secret=secret, clock=clock, timeout=timeout,
                                    ca_certs=ca_certs)

    def run_once(self, now: datetime | None = None, time_left: Callable[[], bool] | None = None) -> DeliverReport:
        """Up to ``limit`` attempts, each claimed, sent and recorded on its own."""
        counts = {"delivered": 0, "retry": 0, "give_up": 0}
        attempted = 0
        while attempted < self.limit and (time_left is None or time_left()):
            with self.db.transaction() as conn:
                claim = db.fetch_one(conn, "notify_deliveries_claim", {
                    "now": now, "lease_seconds": LEASE_SECONDS, "preview": notify.OUTPUT_PREVIEW_CHARS})
            if claim is None:
                break
            attempted += 1
            outcome = self.sender.attempt(claim)
            counts[self._record(claim, outcome, now)] += 1
        return DeliverReport(attempted, counts["delivered"], counts["retry"], counts["give_up"],
                             full=attempted >= self.limit)

    def _record(self, claim: db.Row, outcome: notify.Outcome, now: datetime | None) -> str:
        """Writes the outcome of one attempt; what was recorded (``delivered``, ``retry``, ``give_up``)."""
        delay = notify.backoff_seconds(int(claim["attempts"]))
        deadline = claim["created_at"] + timedelta(seconds=notify.GIVE_UP_AFTER_SECONDS)
        final = outcome.verdict == "give_up" or (
            outcome.verdict == "retry" and claim["now"] + timedelta(seconds=delay) > deadline)
        params = {"run_id": claim["run_id"], "attempts": claim["attempts"], "status": outcome.status,
                  "error": outcome.error, "now": now}
        with self.db.transaction() as conn:
            if outcome.verdict == "delivered":
                db.fetch_one(conn, "notify_deliveries_delivered", params)
            elif not final:
                db.fetch_one(conn, "notify_deliveries_retry", {**params, "delay_seconds": delay})
            elif db.fetch_one(conn, "notify_deliveries_give_up", params) is not None:
                conversations.note(conn, claim["conversation_id"], kind="notify_gave_up", now=now, body={
                    "run_id": str(claim["run_id"]), "schedule_id": str(claim["schedule_id"]),
                    "attempts": int(claim["attempts"]), "last_status": outcome.status, "last_error": outcome.error})
        notify.log_outcome(claim, outcome, final=final)
        return "delivered" if outcome.verdict == "delivered" else ("give_up" if final else "retry")
