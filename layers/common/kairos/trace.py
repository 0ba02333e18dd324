"""The run trace: append-only, gap-free ``run_events``, written under the run's fence.

Two writers: ``append`` (one event) and ``change`` (a run's state change and its events, one
statement). Each statement stores its events as one ``run_event_batches`` row (migration 0034);
``run_events`` is the view that answers them one row per event. The sequence number comes from
``runs.last_seq``, bumped in the same statement, so appends to one run serialize on its row and
``seq`` has no gaps. A worker passes its fence: when it has lost the lease (another claim bumped the
fence, or the rescuer requeued the run), nothing is written and the writer returns None.

Why ``change`` exists: a transaction that updates a run row a second time makes PostgreSQL re-check
every foreign key of the row (the row it updates was written by the same transaction), four
lookups that also key-share-lock the run's occurrence, schedule and conversations — rows shared by
every run of a schedule. Folding a state change and its events into one statement keeps a run to
one row version per transaction. Event data must be safe: ids, counts, codes,
durations — never prompts, completions, tool payloads or secrets; ``assert_safe`` refuses the keys
that would carry them.

``page`` is the reader: events after a seq in seq order, at most ``MAX_PAGE`` per call, with every
``step.progress`` folded into the ``step.started`` row of its step (``progress_count``,
``last_progress_at``) instead of listed. It does not check ownership: callers resolve the run
through ``kairos.runs.get`` (owner-scoped) first.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, LiteralString, NamedTuple
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from kairos import db, instants
from kairos.states import EventType

FORBIDDEN_KEYS = frozenset(
    {"prompt", "content", "completion", "messages", "system", "api_key", "token", "secret", "payload", "body"}
)


def assert_safe(data: Mapping[str, Any]) -> None:
    for key, value in data.items():
        if key in FORBIDDEN_KEYS:
            raise ValueError(f"trace data must not carry {key!r}")
        if isinstance(value, Mapping):
            assert_safe(value)


def append(
    conn: psycopg.Connection[db.Row],
    run_id: UUID,
    event_type: EventType,
    *,
    data: Mapping[str, Any] | None = None,
    fence: int | None = None,
    step: str | None = None,
    now: datetime | None = None,
) -> int | None:
    """Appends one event; returns its seq, or None when the fence no longer holds."""
    payload = dict(data or {})
    assert_safe(payload)
    row = db.fetch_one(
        conn,
        "run_events_append",
        {
            "run_id": run_id,
            "type": EventType(event_type).value,
            "fence": fence,
            "step": step,
            "data": Jsonb(payload),
            "now": now,
        },
    )
    return None if row is None else int(row["seq"])


class Event(NamedTuple):
    """One trace event to write with a state change (``change``)."""

    type: EventType
    step: str | None = None
    data: Mapping[str, Any] | None = None


_CHANGE_MARK = "%(events)s"


def change_sql(query: str) -> LiteralString:
    """The statement ``change`` runs for the named ``UPDATE runs`` (the template with it spliced in)."""
    update = db.q(query)
    if _CHANGE_MARK not in update or "RETURNING" not in update:
        raise ValueError(f"{query} must bump last_seq by its events and return the run row")
    return db.q("run_events_with_change").replace("{change}", update.rstrip().rstrip(";"))


@functools.cache
def _compiled_change(query: str) -> db.Compiled:
    return db.compile_query(change_sql(query))


def change(
    conn: psycopg.Connection[db.Row],
    query: str,
    params: Mapping[str, Any],
    events: Sequence[Event],
    *,
    now: datetime | None = None,
) -> db.Row | None:
    """Runs the named guarded ``UPDATE runs … RETURNING …`` and appends ``events`` in order in the
    same statement; the row it returns, or None when the guard matched nothing (nothing written).

    The update must add ``jsonb_array_length(%(events)s::jsonb)`` to ``last_seq`` and return at least
    ``id, last_seq, attempt, fence``; the events carry the updated row's attempt and fence and the
    database time (or ``now``). A prepared query's change runs prepared too.
    """
    return send_change(conn, query, params, events, now=now)()


def send_change(
    conn: psycopg.Connection[db.Row],
    query: str,
    params: Mapping[str, Any],
    events: Sequence[Event],
    *,
    now: datetime | None = None,
) -> Callable[[], db.Row | None]:
    """``change`` sent now (queued, in a pipeline); the function returned reads its row."""
    for event in events:
        assert_safe(event.data or {})
    return db.run(  # built only from shipped named queries, never from input
        conn,
        _compiled_change(query),
        {
            **params,
            # One JSON parameter: far cheaper to send than three arrays.
            "events": Jsonb([{"type": EventType(e.type).value, "step": e.step, "data": dict(e.data or {})}
                             for e in events]),
            "now": now,
        },
        prepare=query in db.PREPARED,
    ).fetchone


MAX_PAGE = 200


def rfc3339(value: datetime | None) -> str | None:
    """``instants.rfc3339`` that passes None through (optional columns)."""
    return None if value is None else instants.rfc3339(value)


def page(
    conn: psycopg.Connection[db.Row], run_id: UUID, *, after: int = 0, limit: int = 50
) -> tuple[list[dict[str, Any]], int]:
    """Events with ``seq > after`` (``limit`` capped at ``MAX_PAGE``) and the ``next_after`` cursor.

    ``step.progress`` events are not listed: each ``step.started`` row carries how many progress
    events its step wrote under the same fence and when the last one was written. ``next_after``
    is the last listed seq (or ``after`` when nothing is listed), so a reader resumes from it.
    """
    after = max(0, int(after))
    limit = max(1, min(int(limit), MAX_PAGE))
    rows = db.fetch_all(conn, "run_events_page", {"run_id": run_id, "after": after, "limit": limit})
    events: list[dict[str, Any]] = []
    for row in rows:
        event: dict[str, Any] = {
            "seq": int(row["seq"]),
            "type": row["type"],
            "at": rfc3339(row["at"]),
            "attempt": int(row["attempt"]),
            "step": row["step"],
            "data": row["data"],
        }
        if row["type"] == EventType.STEP_STARTED.value:
            event["progress_count"] = int(row["progress_count"] or 0)
            event["last_progress_at"] = rfc3339(row["last_progress_at"])
        events.append(event)
    return events, (events[-1]["seq"] if events else after)
