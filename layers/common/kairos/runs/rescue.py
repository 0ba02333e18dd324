"""The tick's run moves: runs of vanished workers taken back, and queued runs nobody could claim given up.

Role: the statements ``kairos.tick.repair`` calls once it has locked the rows (``SKIP LOCKED``) and
decided each run's outcome:

* ``requeue`` — a ``running`` run whose lease expired goes back to ``queued`` with ``restarts + 1``,
  its lease cleared and its handoff to be redone, with ``run.rescued``;
* ``end`` — such a run ends ``cancelled`` / ``failed`` / ``abandoned`` with the rescue's diagnosis
  (``kairos.diagnosis.rescued``) and ``run.<state>``;
* ``fail_undeliverable`` — a ``queued`` run SQS accepted ``handoffs`` times since its last claim,
  none claimed, ends ``failed`` (``undeliverable``) with ``run.failed``.

Guarantees: each move and its event are one statement (``kairos.trace.change``): a rescue writes the
run row once. The rescue's moves are guarded by state, the fence the rescuer read and the expired
lease, so a worker that heartbeats in time keeps its run; none writes with a worker's fence (the
fence is not bumped: the next claim does that).

Must not: decide the outcome (the repair does); send to SQS.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from kairos import db, diagnosis, trace
from kairos.observability import logger
from kairos.runs import steps
from kairos.states import EventType, RunState, terminal_event


def _log(row: db.Row) -> dict[str, Any]:
    return {"run_id": str(row["id"]), "schedule_id": str(row["schedule_id"]), "fence": row["fence"],
            "restarts": int(row["restarts"])}


def requeue(conn: psycopg.Connection[db.Row], row: db.Row, *, now: datetime | None = None) -> bool:
    """``running -> queued`` for the lease-expired run ``row`` (as ``runs_lock_expired`` read it, still
    locked) with ``run.rescued``; False when its worker heartbeat in time or it moved on."""
    restarts = int(row["restarts"]) + 1  # the statement's own count: the row is locked since it was read
    moved = trace.change(conn, "runs_requeue_rescued", {"id": row["id"], "fence": row["fence"]},
                         [trace.Event(EventType.RUN_RESCUED, data={"reason": "lease_expired", "restarts": restarts})],
                         now=now)
    if moved is None:
        return False
    logger.info("run rescued after its lease expired", extra={"action": "run_rescued", **_log(row)})
    return True


def end(conn: psycopg.Connection[db.Row], row: db.Row, state: RunState, reason_code: str, *, restart_limit: int,
        now: datetime | None = None) -> bool:
    """``running -> state`` (cancelled, failed or abandoned) for the lease-expired run ``row`` with the
    rescue's diagnosis of ``reason_code`` and ``run.<state>``; False when it moved on."""
    ended = diagnosis.rescued(reason_code, restart_limit=restart_limit)
    moved = trace.change(conn, "runs_end_rescued",
                         {"id": row["id"], "fence": row["fence"], "state": state.value, "diagnosis": Jsonb(ended)},
                         [trace.Event(terminal_event(state), data={"reason_code": reason_code,
                                                                   "reason": "lease_expired"})], now=now)
    if moved is None:
        return False
    steps.end_with_run(conn, row["id"], now=now)  # what its lost worker left running
    logger.warning("run ended after its lease expired",
                   extra={"action": "run_rescue_ended", "state": state.value, "reason_code": reason_code,
                          **_log(row)})
    return True


def fail_undeliverable(conn: psycopg.Connection[db.Row], row: db.Row, *, handoffs: int,
                       now: datetime | None = None) -> db.Row | None:
    """``queued -> failed`` (``undeliverable``) for the locked run ``row`` that SQS accepted at least
    ``handoffs`` times since its last claim, with ``run.failed``; the row, or None when it moved on."""
    return trace.change(
        conn, "runs_fail_undeliverable",
        {"id": row["id"], "handoffs": handoffs, "diagnosis": Jsonb(diagnosis.diagnose("undeliverable"))},
        [trace.Event(EventType.RUN_FAILED, data={"reason_code": "undeliverable", "retry_eligible": True,
                                                 "handoffs": int(row["unclaimed_handoffs"])})],
        now=now)
