"""Recording a fire: the one place an occurrence and its queued run are written.

A fire is an immutable ``occurrences`` row (the tick's scheduled fires, one accepted webhook
delivery) and, when it was dispatched or queued behind another run, the queued run it produced
with that run's ``run.queued`` event. ``record`` writes a whole batch of them in one statement
(``occurrences_insert``), idempotently: an occurrence id seen before inserts nothing and comes
back absent from the result, so a duplicate tick or a redelivered webhook converges on the rows
the first one wrote. The run snapshots the schedule's prompt, mode, conversation and agent at
insert time, whichever path recorded it.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from kairos import db
from kairos.calendar import Fire
from kairos.states import Decision, Source


def planned(
    *,
    occurrence_id: UUID,
    schedule_id: UUID | None,
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
    chat: tuple[UUID, str] | None = None,
) -> dict[str, Any]:
    """One row of a batch for ``record`` (JSON-ready: the batch travels as one document). A chat turn
    has no schedule: ``chat`` gives its conversation and prompt (its run appends to the conversation)."""
    return {
        "occurrence_id": str(occurrence_id),
        "schedule_id": None if schedule_id is None else str(schedule_id),
        "conversation_id": None if chat is None else str(chat[0]),
        "prompt": None if chat is None else chat[1],
        "mode": None if chat is None else "append",
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
           now: datetime | None = None) -> list[db.Row]:
    """Inserts the batch; returns one row per occurrence this call recorded (with its run, if any)."""
    if not rows:
        return []
    # json.dumps is C, psycopg's array adaptation is not, and this is the hot path of a large tick.
    return db.fetch_all(conn, "occurrences_insert", {"occurrences": json.dumps(rows), "now": now})


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()
