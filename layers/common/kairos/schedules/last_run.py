"""A schedule's last run: what every schedule the API answers carries as ``last_run``.

``last_run`` is the schedule's newest run (by ``created_at``, then id — the order of ``GET /v1/runs``)
as ``{"id", "state", "source", "created_at", "finished_at"}``, or null before its first run. It is
read, never stored: one statement (``runs_last_of_schedules``) probes the runs' schedule index once
per schedule, so a list of schedules costs one more statement whatever its length, and the value is
never stale.

``shown`` is how a route turns schedules into their API shape: ``Schedule.as_json()`` plus
``last_run``. Every route that answers a schedule goes through it (``kairos.api.models.ScheduleOut``
requires the field, so one that does not is a 500 in its first test, not a silently thinner body).

Must not: import ``kairos.runs`` (the listings never load it) or show anything of a run beyond
these five fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from kairos import db
from kairos.instants import rfc3339
from kairos.schedules import Schedule


@dataclass(frozen=True)
class LastRun:
    id: UUID
    state: str
    source: str
    created_at: datetime
    finished_at: datetime | None

    def as_json(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "state": self.state,
            "source": self.source,
            "created_at": rfc3339(self.created_at),
            "finished_at": None if self.finished_at is None else rfc3339(self.finished_at),
        }


def of(conn: psycopg.Connection[db.Row], schedule_ids: Sequence[UUID], *, owner: str) -> dict[UUID, LastRun]:
    """The newest run of each of ``owner``'s schedules in ``schedule_ids``; a schedule without runs
    (or not the owner's) has no entry."""
    if not schedule_ids:
        return {}
    rows = db.fetch_all(conn, "runs_last_of_schedules", {"schedule_ids": list(schedule_ids), "owner": owner})
    return {r["schedule_id"]: LastRun(r["id"], r["state"], r["source"], r["created_at"], r["finished_at"])
            for r in rows}


def shown(conn: psycopg.Connection[db.Row], found: Sequence[Schedule], *, owner: str) -> list[dict[str, Any]]:
    """The API shape of each schedule, in order: ``as_json()`` with its ``last_run`` (or null)."""
    latest = of(conn, [s.id for s in found], owner=owner)
    out: list[dict[str, Any]] = []
    for schedule in found:
        run = latest.get(schedule.id)
        out.append({**schedule.as_json(), "last_run": None if run is None else run.as_json()})
    return out


def one(conn: psycopg.Connection[db.Row], schedule: Schedule, *, owner: str) -> dict[str, Any]:
    """``shown`` of one schedule."""
    return shown(conn, [schedule], owner=owner)[0]
