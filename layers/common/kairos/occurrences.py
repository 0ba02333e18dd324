"""Recording a fire: the one place an occurrence and its queued run are written.

A fire is an immutable ``occurrences`` row (the tick's scheduled fires, one accepted webhook
delivery) and, when it was dispatched or queued behind another run, the queued run it produced
with that run's ``run.queued`` event. ``record`` writes a whole batch of them in one statement
(``occurrences_insert``), idempotently: an occurrence id seen before inserts nothing and comes
back absent from the result, so a duplicate tick or a redelivered webhook converges on the rows
the first one wrote. The run snapshots the schedule's prompt, mode, conversation and agent at
insert time, whichever path recorded it.

The owner's queue cap (``KAIROS_OWNER_QUEUE_MAX``, ``kairos.budgets``): ``record`` first takes the
queue locks of the batch's owners, and the statement records a fire that would make more than
``queue_max`` of an owner's runs queued ``skipped_budget``, without a run. The tick keeps those; an
API caller (trigger, webhook, backfill) that finds one in its result refuses instead (``refuse_over_cap``:
429 ``queue_full``, its transaction rolls back and nothing is recorded).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from kairos import budgets, db, runtime
from kairos.calendar import Fire
from kairos.errors import QueueFull
from kairos.states import Decision, Source


def planned(
    *,
    occurrence_id: UUID,
    schedule_id: UUID,
    source: Source,
    fire: Fire,
    revision: int,
    decision: Decision,
    run_id: UUID | None,
    blocked_by: UUID | None = None,
    covers_from: datetime | None = None,
    covers_until: datetime | None = None,
    covers_count: int = 1,
    idempotency_key: str | None = None,
    key_generation: int = 0,
    payload: Any = None,
    retry_of: UUID | None = None,
) -> dict[str, Any]:
    """One row of a batch for ``record`` (JSON-ready: the batch travels as one document)."""
    return {
        "occurrence_id": str(occurrence_id),
        "schedule_id": str(schedule_id),
        "source": source.value,
        "fire_at": fire.fire_at.isoformat(),
        "local_time": fire.local_time.isoformat(),
        "utc_offset_seconds": int(fire.utc_offset.total_seconds()),
        "fold": fire.fold,
        "timezone": fire.timezone,
        "tzdata_version": fire.tzdata_version,
        "revision": revision,
        "decision": decision.value,
        "covers_from": _iso(covers_from),
        "covers_until": _iso(covers_until),
        "covers_count": covers_count,
        "idempotency_key": idempotency_key,
        "key_generation": key_generation,
        "run_id": None if run_id is None else str(run_id),
        "blocked_by": None if blocked_by is None else str(blocked_by),
        "payload": payload,
        "retry_of": None if retry_of is None else str(retry_of),
    }


def record(conn: psycopg.Connection[db.Row], rows: list[dict[str, Any]], *,
           now: datetime | None = None, queue_max: int | None = None) -> list[db.Row]:
    """Inserts the batch; returns one row per occurrence this call recorded (with its run, if any).
    ``queue_max`` defaults to the deployment's ``KAIROS_OWNER_QUEUE_MAX``."""
    if not rows:
        return []
    if queue_max is None:
        queue_max = runtime.settings().owner_queue_max
    budgets.hold_queues(conn, [r["schedule_id"] for r in rows])
    # json.dumps is C, psycopg's array adaptation is not, and this is the hot path of a large tick.
    return db.fetch_all(conn, "occurrences_insert", {"occurrences": json.dumps(rows), "now": now,
                                                     "queue_max": queue_max})


def refuse_over_cap(recorded: list[db.Row], *, queue_max: int | None = None) -> None:
    """For an API caller: ``QueueFull`` (429) when the owner's queue cap skipped any of these fires (the
    caller's transaction then rolls back, so nothing is recorded and the request may be repeated)."""
    if any(r["decision"] == Decision.SKIPPED_BUDGET.value for r in recorded):
        raise QueueFull(runtime.settings().owner_queue_max if queue_max is None else queue_max)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()
