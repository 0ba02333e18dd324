"""The run trace: append-only, gap-free ``run_events``, written under the run's fence.

``append`` is the only writer. The sequence number comes from ``runs.last_seq``, bumped in the same
statement, so appends to one run serialize on its row and ``seq`` has no gaps. A worker passes its
fence: when it has lost the lease (another claim bumped the fence, or the rescuer requeued the run),
nothing is written and ``append`` returns None. Event data must be safe: ids, counts, codes,
durations — never prompts, completions, tool payloads or secrets; ``assert_safe`` refuses the keys
that would carry them.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from kairos import db
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
