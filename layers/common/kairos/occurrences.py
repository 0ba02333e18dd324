"""Recording a fire: the one place an occurrence and its queued run are written.

A fire is an immutable ``occurrences`` row (the tick's scheduled fires, one accepted webhook
delivery) and, when it was dispatched or queued behind another run, the queued run it produced
with that run's ``run.queued`` event. ``record`` writes a whole batch of them in one statement
(``occurrences_insert``), idempotently: an occurrence id seen before inserts nothing and comes
back absent from the result, so a duplicate tick or a redelivered webhook converges on the rows
the first one wrote. The run snapshots the schedule's prompt, mode, conversation and agent at
insert time, whichever path recorded it.

``page`` reads them back: one schedule's occurrences newest first (``fire_at``, then id) in keyset
pages (``kairos.pages``), each with its decision, source, revision, covered range and the run it
produced, so a skipped fire is visible where its owner looks.

The owner's queue cap (``KAIROS_OWNER_QUEUE_MAX``, ``kairos.budgets``): ``record`` first takes the
queue locks of the batch's owners, and the statement records a fire that would make more than
``queue_max`` of an owner's runs queued ``skipped_budget``, without a run. The tick keeps those; an
API caller (trigger, webhook, backfill, chat turn) that finds one in its result refuses instead (``refuse_over_cap``:
429 ``queue_full``, its transaction rolls back and nothing is recorded).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from uuid import UUID

import psycopg

from kairos import budgets, db, limits, pages, runtime
from kairos.errors import NotFound, QueueFull
from kairos.instants import iso_text, offset_text, rfc3339
from kairos.states import Decision, Source

if TYPE_CHECKING:
    from kairos.calendar import Fire

PAGE = "occurrences"  # the list kairos.pages cursors of GET /v1/schedules/{id}/occurrences name


def planned(
    *,
    occurrence_id: UUID,
    schedule_id: UUID | None,
    source: Source,
    fire: Fire,
    revision: int,
    dispatch_at: datetime | None = None,
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
    corpus: dict[str, Any] | None = None,
    coalesced_into: UUID | None = None,
    concurrency: tuple[str, int] | None = None,
) -> dict[str, Any]:
    """One row of a batch for ``record`` (JSON-ready: the batch travels as one document). A chat turn
    has no schedule: ``chat`` gives its conversation and prompt (its run appends to the conversation).

    Only what is set is in it: ``occurrences_insert`` reads the batch with ``jsonb_to_record``, where a
    missing key is NULL as a null one is, and a tick's fire leaves about half the fields unset (the
    document is encoded and parsed once a fire, on the tick's hot path; its instants via ``iso_text``).
    ``dispatch_at`` is a jittered fire's dispatch instant; without it (or equal to ``fire_at``) the
    occurrence is recorded as dispatched at ``fire_at``."""
    row: dict[str, Any] = {
        "occurrence_id": str(occurrence_id),
        "source": source.value,
        "fire_at": iso_text(fire.fire_at),
        "local_time": iso_text(fire.local_time),
        "utc_offset_seconds": int(fire.utc_offset.total_seconds()),
        "fold": fire.fold,
        "timezone": fire.timezone,
        "tzdata_version": fire.tzdata_version,
        "revision": revision,
        "decision": decision.value,
        "covers_count": covers_count,
        "key_generation": key_generation,
    }
    for key, value in (("schedule_id", schedule_id), ("run_id", run_id), ("blocked_by", blocked_by),
                       ("retry_of", retry_of), ("coalesced_into", coalesced_into)):
        if value is not None:
            row[key] = str(value)
    for key, instant in (("covers_from", covers_from), ("covers_until", covers_until), ("dispatch_at", dispatch_at)):
        if instant is not None and (key != "dispatch_at" or instant != fire.fire_at):
            row[key] = iso_text(instant)
    if chat is not None:
        row.update(conversation_id=str(chat[0]), prompt=chat[1], mode="append")
    extras: tuple[tuple[str, Any], ...] = (  # corpus: a chat turn's (a schedule's comes from its revision)
        ("idempotency_key", idempotency_key), ("payload", payload), ("corpus", corpus))
    row.update((key, extra) for key, extra in extras if extra is not None)
    if concurrency is not None:  # a webhook run's concurrency key and its limit (kairos.budgets)
        row.update(concurrency_key=concurrency[0], concurrency_limit=concurrency[1])
    return row


def record(conn: psycopg.Connection[db.Row], rows: list[dict[str, Any]], *,
           now: datetime | None = None, queue_max: int | None = None,
           owner_slots: int | None = None, admit: bool = False) -> list[db.Row]:
    """Inserts the batch; returns one row per occurrence this call recorded (with its run, if any, and
    ``admitted``: whether the run holds a slot). ``queue_max`` and ``owner_slots`` (the runs' slot
    limit) default to the deployment's ``KAIROS_OWNER_QUEUE_MAX`` and ``KAIROS_OWNER_CONCURRENCY``.
    With ``admit`` (the tick's fire: scheduled rows only) it takes the owners' slot locks after their
    queue locks and inserts each run that may take a free slot at once already holding it
    (``occurrences_insert``); the caller sends those after commit. Without it, no run holds a slot."""
    if not rows:
        return []
    if queue_max is None:
        queue_max = runtime.settings().owner_queue_max
    if owner_slots is None:
        owner_slots = runtime.settings().owner_concurrency
    schedule_ids = [r["schedule_id"] for r in rows if "schedule_id" in r]
    budgets.hold_queues(conn, schedule_ids,
                        [r["conversation_id"] for r in rows if "schedule_id" not in r and "conversation_id" in r])
    if admit:
        budgets.hold_owner_slots(conn, schedule_ids)
    # json.dumps is C, psycopg's array adaptation is not, and this is the hot path of a large tick.
    return db.fetch_all(conn, "occurrences_insert", {"occurrences": json.dumps(rows), "now": now,
                                                     "queue_max": queue_max, "owner_slots": owner_slots,
                                                     "admit": admit,
                                                     **limits.sql_parameters(runtime.settings())})


def refuse_over_cap(recorded: list[db.Row], *, queue_max: int | None = None) -> None:
    """For an API caller: ``QueueFull`` (429) when the owner's queue cap skipped any of these fires (the
    caller's transaction then rolls back, so nothing is recorded and the request may be repeated)."""
    if any(r["decision"] == Decision.SKIPPED_BUDGET.value for r in recorded):
        raise QueueFull(runtime.settings().owner_queue_max if queue_max is None else queue_max)


@dataclass(frozen=True)
class Occurrence:
    """One occurrence as its owner reads it (``GET /v1/schedules/{id}/occurrences``)."""

    id: UUID
    source: str
    fire_at: datetime
    local_time: datetime
    utc_offset: timedelta
    fold: int
    schedule_revision: int
    dispatch_at: datetime
    decision: str
    covers_from: datetime | None
    covers_until: datetime | None
    covers_count: int
    run_id: UUID | None

    def as_json(self) -> dict[str, Any]:
        """RFC 3339 UTC instants (``dispatch_at``: ``fire_at`` plus the fire's jitter offset); ``local_time``
        is the wall time in the schedule's zone (ISO 8601, no offset) and ``utc_offset`` its offset at
        ``fire_at``; ``run_id`` is null for a fire that made no run."""
        return {
            "id": str(self.id),
            "source": self.source,
            "fire_at": rfc3339(self.fire_at),
            "dispatch_at": rfc3339(self.dispatch_at),
            "local_time": self.local_time.isoformat(),
            "utc_offset": offset_text(self.utc_offset),
            "fold": self.fold,
            "schedule_revision": self.schedule_revision,
            "decision": self.decision,
            "covers_from": None if self.covers_from is None else rfc3339(self.covers_from),
            "covers_until": None if self.covers_until is None else rfc3339(self.covers_until),
            "covers_count": self.covers_count,
            "run_id": None if self.run_id is None else str(self.run_id),
        }


def page(conn: psycopg.Connection[db.Row], schedule_id: UUID, *, owner: str, before: str | None = None,
         limit: int = pages.LIMIT_DEFAULT) -> tuple[list[Occurrence], str | None]:
    """One page of ``owner``'s schedule's occurrences, newest first, below the cursor ``before``, and
    the next page's cursor (None at the end). The arguments are checked first, so a bad cursor or
    limit is ``ValidationFailed`` whether or not the id names a schedule; then a missing or foreign
    schedule is ``NotFound("schedule")`` (occurrences have no owner column: the schedule's decides)."""
    key = pages.decode(PAGE, before)
    limit = pages.check_limit(limit)
    if db.fetch_one(conn, "schedules_get", {"schedule_id": schedule_id, "owner": owner}) is None:
        raise NotFound("schedule")
    rows = db.fetch_all(conn, "occurrences_list", {
        "schedule_id": schedule_id, "before_at": None if key is None else key.at,
        "before_id": None if key is None else key.id, "limit": limit + 1})
    found, next_before = pages.cut(PAGE, rows, limit, lambda r: pages.Key(r["fire_at"], r["id"]))
    return [Occurrence(r["id"], r["source"], r["fire_at"], r["local_time"], r["utc_offset"], int(r["fold"]),
                       int(r["schedule_revision"]), r["dispatch_at"], r["decision"], r["covers_from"],
                       r["covers_until"], int(r["covers_count"]), r["run_id"]) for r in found], next_before
