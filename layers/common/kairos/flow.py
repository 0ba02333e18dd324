"""Webhook flow control at intake: debounce and batch windows, and deliveries deferred over the rate.

Role: ``kairos.webhooks.accept`` asks this module, under the schedule's row lock (deliveries of one
schedule serialize on it), what a delivery becomes when its schedule has ``flow``
(``kairos.schedules.flow_spec``):

* **Fold** (``fold``): with ``debounce_seconds`` or ``batch``, a delivery joins the schedule's open
  window — a queued run whose ``held_until`` is still ahead (and, for a batch, holds fewer than
  ``max_events``), locked ``FOR NO KEY UPDATE`` in the same statement that changes it. Debounce keeps
  the last payload and moves the close to ``now + debounce_seconds``, never past ``window_deadline``
  (the first delivery + ``DEBOUNCE_MAX_FACTOR`` windows); a batch appends the payload to the run's
  array and closes at once when it reaches ``max_events``. Either way ``deliveries`` counts it. The
  delivery is recorded as a ``coalesced`` occurrence naming the run (``coalesced_into``) and answered
  with that run's id; it makes no run and does not count against the rate.
* **Open** (``open_window``): no window is open, so the delivery's own run opens one: held until the
  debounce window or the batch's ``max_wait_seconds`` has passed, carrying ``deliveries`` 1 (a batch's
  payload is the array of its one delivery).
* **Rate** (``rate_hold``): a hook dispatches at most ``rate_limit_per_minute`` runs in any 60 s, each
  counted at the instant it became dispatchable (``coalesce(held_until, created_at)``). Over it,
  ``over_rate: reject`` raises ``RateLimited`` (429 with ``Retry-After``); ``defer`` holds the run
  until the first instant the rate allows, so a burst is dispatched at the rate. A deferred run is a
  queued run: the owner's queue cap still refuses beyond it (``kairos.occurrences``, 429 ``queue_full``).

Windows close on time: a held run is handed to SQS as a delayed message (``timer_delay``: at most
SQS's 900 s), the claim refuses it while ``held_until`` is ahead (the worker then sends it again with
the remaining delay, ``kairos.execution``), and the tick's repair sends a run whose window closed
with no message since (a lost timer is repaired like a lost handoff).

Guarantees: concurrent deliveries to one window fold one at a time (the schedule lock, and the
window run's row lock against a claim); a fold and a claim never both win (each is guarded by
``held_until`` against the other's write). Idempotency keys keep working inside a window: the caller
answers a live receipt before asking this module anything, so a retried delivery is not counted twice.

Must not: send anything (the caller hands off after its commit) or decide with the Lambda clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from kairos import db
from kairos.errors import RateLimited
from kairos.schedules.flow_spec import DEBOUNCE_MAX_FACTOR
from kairos.states import FlowWindow, OverRate

RATE_WINDOW = timedelta(seconds=60)
SQS_MAX_DELAY_SECONDS = 900


@dataclass(frozen=True)
class Folded:
    """A delivery folded into an open window: the run, when it closes, and whether it is now full."""

    run_id: UUID
    held_until: datetime
    deliveries: int
    closed: bool  # a batch that reached max_events: hand it off now


def window_of(flow: Mapping[str, Any] | None) -> FlowWindow | None:
    """The kind of window a schedule's flow collects deliveries in, if any."""
    if not flow:
        return None
    if flow.get("debounce_seconds") is not None:
        return FlowWindow.DEBOUNCE
    if flow.get("batch") is not None:
        return FlowWindow.BATCH
    return None


def fold(conn: psycopg.Connection[db.Row], schedule_id: UUID, flow: Mapping[str, Any], payload: Any, *,
         now: datetime | None) -> Folded | None:
    """Folds the delivery into the schedule's open window; None when no window is open (or the flow has
    none). The caller holds the schedule's row lock."""
    window = window_of(flow)
    if window is None:
        return None
    batch = flow.get("batch") or {}
    row = db.fetch_one(conn, "runs_fold_into_window", {
        "schedule_id": schedule_id, "window": window.value, "payload": Jsonb(payload),
        "debounce_seconds": flow.get("debounce_seconds") or 0, "max_events": batch.get("max_events") or 0,
        "now": now})
    if row is None:
        return None
    return Folded(row["id"], row["held_until"], int(row["deliveries"]), bool(row["closed"]))


def first_payload(flow: Mapping[str, Any] | None, payload: Any) -> Any:
    """The payload of a run that opens a window: a batch's is the array of its deliveries."""
    return [payload] if window_of(flow) is FlowWindow.BATCH else payload


def rate_hold(conn: psycopg.Connection[db.Row], schedule_id: UUID, *, limit: int, over_rate: str,
              db_now: datetime, now: datetime | None) -> datetime | None:
    """The instant a new run of this hook may be dispatched, when that is later than now (None: now).

    Over the rate with ``reject``: ``RateLimited`` with the seconds until the window frees a slot."""
    row = db.fetch_one(conn, "runs_hook_rate_window", {"schedule_id": schedule_id, "offset": limit - 1, "now": now})
    if row is None:
        return None
    free_at: datetime = row["at"] + RATE_WINDOW
    if free_at <= db_now:
        return None
    if over_rate != OverRate.DEFER:
        retry_after = max(1, math.ceil((free_at - db_now).total_seconds()))
        raise RateLimited(f"this hook accepts at most {limit} deliveries per minute", retry_after=retry_after)
    return free_at


def open_window(conn: psycopg.Connection[db.Row], run_id: UUID, flow: Mapping[str, Any] | None, *,
                held: datetime | None, db_now: datetime, now: datetime | None) -> datetime | None:
    """Holds the just-recorded run: until its window closes (debounce, batch) and no earlier than
    ``held`` (the rate). Returns the instant it is held until, or None when it is dispatchable now."""
    window = window_of(flow)
    held_until, deadline = held, None
    if window is not None and flow is not None:
        span = timedelta(seconds=int(flow["debounce_seconds"]) if window is FlowWindow.DEBOUNCE
                         else int(flow["batch"]["max_wait_seconds"]))
        closes = db_now + span
        deadline = db_now + span * (DEBOUNCE_MAX_FACTOR if window is FlowWindow.DEBOUNCE else 1)
        held_until = closes if held is None else max(closes, held)
        deadline = max(deadline, held_until)
    if held_until is None:
        return None
    db.fetch_row(conn, "runs_hold", {"run_id": run_id, "held_until": held_until, "deadline": deadline,
                                     "window": None if window is None else window.value, "now": now})
    return held_until


def timer_delay(held_until: datetime | None, db_now: datetime) -> int:
    """The SQS delay of a held run's message: the seconds until it is due, at most 900 (0: now)."""
    if held_until is None or held_until <= db_now:
        return 0
    return min(SQS_MAX_DELAY_SECONDS, max(1, math.ceil((held_until - db_now).total_seconds())))
