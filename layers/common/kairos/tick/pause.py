"""The tick's one way to pause a schedule: the guarded move, the inbox note and the log line together.

Role: settle pauses a schedule after consecutive failures, fire pauses one whose rule no longer
evaluates; both go through ``pause_with_note`` so the user finds the same ``schedule_paused`` note in
the conversation's inbox, whatever the cause, and operators the same log line.

Guarantees: only ``active`` schedules move (``schedules_pause_by_tick``: revision + 1), in the
caller's transaction; each schedule that moved gets exactly one note. Must not: commit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from kairos import conversations, db
from kairos.observability import logger

Details = Callable[[db.Row], Mapping[str, Any]]


def pause_with_note(conn: psycopg.Connection[db.Row], ids: Sequence[UUID], *, reason: str, reason_code: str,
                    now: datetime | None, details: Details | None = None) -> list[db.Row]:
    """Pauses the active schedules among ``ids`` and notes each one's conversation; the rows that
    moved. ``reason`` is the note's words for the user, ``reason_code`` the log's; ``details`` adds
    fields of a moved row to both."""
    if not ids:
        return []
    paused = db.fetch_all(conn, "schedules_pause_by_tick", {"ids": list(ids), "reason": reason, "now": now})
    for row in paused:
        extra = dict(details(row)) if details is not None else {}
        conversations.note(conn, row["conversation_id"], kind="schedule_paused",
                           body={"schedule_id": str(row["id"]), "reason": reason, **extra}, now=now)
        logger.warning("schedule paused by the tick", extra={
            "action": "schedule_paused", "schedule_id": str(row["id"]), "reason": reason_code, **extra})
    return paused
