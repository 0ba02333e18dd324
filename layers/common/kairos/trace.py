"""The run trace: append-only, gap-free ``run_events``, written under the run's fence.

``append`` is the only writer. The sequence number comes from ``runs.last_seq``, bumped in the same
statement, so appends to one run serialize on its row and ``seq`` has no gaps. A worker passes its
fence: when it has lost the lease (another claim bumped the fence, or the rescuer requeued the run),
nothing is written and ``append`` returns None. Event data must be safe: ids, counts, codes,
durations — never prompts, completions, tool payloads or secrets; ``assert_safe`` refuses the keys
that would carry them.

``page`` is the reader: events after a seq in seq order, at most ``MAX_PAGE`` per call, with every
``step.progress`` folded into the ``step.started`` row of its step (``progress_count``,
``last_progress_at``) instead of listed. It does not check ownership: callers resolve the run
through ``kairos.runs.get`` (owner-scoped) first.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from kairos import calendar, db
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


MAX_PAGE = 200


def rfc3339(value: datetime | None) -> str | None:
    """``calendar.rfc3339`` that passes None through (optional columns)."""
    return None if value is None else calendar.rfc3339(value)


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
