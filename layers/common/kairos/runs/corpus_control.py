"""Pause and resume of a corpus run: the owner's controls, without a new run state.

Role: a paused corpus run is a ``queued`` run with ``paused_at`` set — the claim skips it (leaving
it queued), the tick's repair does not re-send it, and it does not expire (``expires_at`` cleared).
``pause`` of a ``queued`` run marks it paused at once (``run.paused``, by the owner); of a ``running``
run it records ``pause_requested_at``, and the worker parks the run at its next partition or phase
boundary (``kairos.execution.corpus.phases``: ``run.paused`` by the worker, ``running → queued``, lease cleared).
``resume`` clears both marks with ``run.resumed``; a queued run is then to be sent to SQS again
(``Resumed.send``), and it continues from what it committed (manifest, records, checkpoints).

Guarantees: owner-scoped (another owner's run is the same ``NotFound`` as a missing one); a run that
is not a queued or running corpus run answers ``NotCorpusRun`` (409 ``not_corpus_run``), resume of
a run that is neither paused nor asked to pause ``NotPaused`` (409 ``not_paused``); both idempotent
for a run already in the asked condition.

Must not: move a run's state (the worker's boundary does, under its fence); send to SQS (the caller
does, after commit).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from kairos import db, trace
from kairos.errors import NotCorpusRun, NotFound, NotPaused
from kairos.runs import Run
from kairos.states import EventType, RunState


@dataclass(frozen=True)
class Resumed:
    run: dict[str, Any]  # the run's API shape (``as_json``)
    send: bool  # queued again: hand it to SQS after commit


def as_json(row: db.Row) -> dict[str, Any]:
    """The run's API shape, with whether it is paused or asked to pause."""
    return {**Run.from_row(row).as_json(), "paused": row["paused_at"] is not None,
            "pause_requested": row["pause_requested_at"] is not None}


def pause(conn: psycopg.Connection[db.Row], run_id: UUID, *, owner: str,
          now: datetime | None = None) -> dict[str, Any]:
    row = _corpus_run(conn, run_id, owner)
    if row["state"] == RunState.QUEUED:
        events = [] if row["paused_at"] is not None else [trace.Event(EventType.RUN_PAUSED, None, {"by": "owner"})]
        moved = trace.change(conn, "runs_corpus_pause_queued", {"run_id": run_id, "owner": owner}, events, now=now)
    elif row["state"] == RunState.RUNNING and row["pause_requested_at"] is None:
        moved = db.fetch_one(conn, "runs_corpus_request_pause", {"run_id": run_id, "owner": owner, "now": now})
    else:
        moved = row
    if moved is None:  # cancelling: no pause
        raise NotCorpusRun("the run is being cancelled")
    return as_json(_reread(conn, run_id, owner))


def resume(conn: psycopg.Connection[db.Row], run_id: UUID, *, owner: str, now: datetime | None = None) -> Resumed:
    row = _corpus_run(conn, run_id, owner)
    if row["paused_at"] is None and row["pause_requested_at"] is None:
        raise NotPaused("the corpus run is not paused")
    moved = trace.change(conn, "runs_corpus_resume", {"run_id": run_id, "owner": owner},
                         [trace.Event(EventType.RUN_RESUMED, None, {"by": "owner"})], now=now)
    if moved is None:
        raise NotPaused("the corpus run is not paused")
    return Resumed(as_json(_reread(conn, run_id, owner)), send=row["state"] == RunState.QUEUED)


def _corpus_run(conn: psycopg.Connection[db.Row], run_id: UUID, owner: str) -> db.Row:
    row = db.fetch_one(conn, "runs_lock_owned", {"run_id": run_id, "owner": owner})
    if row is None:
        raise NotFound("run")
    if row["corpus"] is None or row["state"] not in (RunState.QUEUED, RunState.RUNNING):
        raise NotCorpusRun("pause and resume apply to a corpus run that is queued or running")
    return row


def _reread(conn: psycopg.Connection[db.Row], run_id: UUID, owner: str) -> db.Row:
    row = db.fetch_row(conn, "runs_get_owned", {"run_id": run_id, "owner": owner})
    return row
