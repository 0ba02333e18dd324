"""Waits for a person: a run parked without a worker until its owner decides, for approvals and input alike.

Role: the run's side of the two waits — the state moves ``kairos.approvals`` (a tool call its agent's
policy gates) and ``kairos.input_requests`` / ``kairos.execution.goal_report`` (a loop run's question)
call; each wait's own row (``approvals``, ``input_requests``) stays with its module. A wait is named by
``APPROVAL`` or ``INPUT``, which say its statements and events:

* ``park`` — the worker, under its fence: ``running -> awaiting_approval`` / ``awaiting_input``, the
  lease cleared (no worker holds the run, the owner's slot is free), the open step finished with that
  outcome and the wait's event (``approval.waiting`` / ``input.waiting``), one statement;
* ``lock`` — a decision's first statement: the owner's run row, before its request;
* ``requeue`` — the decision that lets the run go on (approved / answered): back to ``queued`` with
  the decision's event and ``run.queued``, its expiry lifted (waiting for a person is not lateness);
  the caller hands it to SQS after commit;
* ``block`` — an approval denied or expired: the run ends ``policy_blocked``;
* ``cancel_for_loop`` — a loop cancelled or its goal edited: a run awaiting its owner's answer ends
  ``cancelled``.

Guarantees: every move is one guarded statement with its events (``kairos.trace.change``), from the
waiting state only, so a decision and a cancel cannot both move the run. Lock order: the run row
before its request, in every path (the callers lock the run through ``lock`` or hold it already).

Must not: touch a wait's own row (its module does); log a question, an answer or a tool's arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from kairos import db, trace
from kairos.diagnosis import diagnose
from kairos.runs import moves
from kairos.states import EventType, RunState


class Wait(NamedTuple):
    """One kind of wait: the state a run waits in, its statements and its events."""

    state: RunState  # the waiting state (also the parked step's outcome)
    park_query: str
    requeue_query: str
    waiting: EventType  # the park's event
    decided: EventType  # the requeue's event, before run.queued
    queued_reason: str  # run.queued's reason


APPROVAL = Wait(RunState.AWAITING_APPROVAL, "runs_await_approval", "runs_requeue_approved",
                EventType.APPROVAL_WAITING, EventType.APPROVAL_APPROVED, "approved")
INPUT = Wait(RunState.AWAITING_INPUT, "runs_await_input", "runs_requeue_answered",
             EventType.INPUT_WAITING, EventType.INPUT_ANSWERED, "answered")


def park(conn: psycopg.Connection[db.Row], wait: Wait, *, run_id: UUID, fence: int, step: int,
         data: Mapping[str, Any], events: Sequence[trace.Event] = (), now: datetime | None = None) -> db.Row | None:
    """``running -> wait.state`` for the fence holder, with ``events``, the step ``tool:<step>``
    finished with the wait as its outcome, and the wait's event carrying ``data``; the row, or None
    when the fence no longer holds or a cancel was requested (nothing written)."""
    return trace.change(conn, wait.park_query, {"run_id": run_id, "fence": fence}, [
        *events,
        trace.Event(EventType.STEP_FINISHED, f"tool:{step}", {"outcome": wait.state.value}),
        trace.Event(wait.waiting, f"tool:{step}", data)], now=now)


def lock(conn: psycopg.Connection[db.Row], run_id: UUID, *, owner: str) -> db.Row | None:
    """Locks ``owner``'s run: a decision takes the run before its request, as a cancel does, so the two
    serialize instead of deadlocking."""
    return db.fetch_one(conn, "runs_lock_owned", {"run_id": run_id, "owner": owner})


def requeue(conn: psycopg.Connection[db.Row], wait: Wait, run_id: UUID, *, data: Mapping[str, Any],
            now: datetime | None = None) -> db.Row | None:
    """``wait.state -> queued`` with the decision's event (``data``) and ``run.queued``; the row, or
    None when the run no longer waits (nothing written)."""
    return trace.change(conn, wait.requeue_query, {"run_id": run_id}, [
        trace.Event(wait.decided, data=data),
        trace.Event(EventType.RUN_QUEUED, data={"reason": wait.queued_reason})], now=now)


def block(conn: psycopg.Connection[db.Row], run_id: UUID, *, approval_id: UUID, reason: str,
          now: datetime | None = None) -> db.Row | None:
    """``awaiting_approval -> policy_blocked`` (``reason``: ``approval_denied`` / ``approval_expired``)
    with ``approval.denied`` and ``run.policy_blocked``; None when the run no longer waits."""
    return trace.change(conn, "runs_block_approval", {"run_id": run_id, "diagnosis": Jsonb(diagnose(reason))}, [
        trace.Event(EventType.APPROVAL_DENIED, data={"approval_id": str(approval_id), "reason_code": reason}),
        trace.Event(EventType.RUN_POLICY_BLOCKED, data={"reason_code": reason})], now=now)


def cancel_for_loop(conn: psycopg.Connection[db.Row], run_id: UUID, *, owner: str, reason: str,
                    now: datetime | None = None) -> bool:
    """``awaiting_input -> cancelled`` by its loop (``reason``: the loop cancelled or its goal edited),
    with ``run.cancelled``, counted; False when the run had already moved on. The caller holds the run."""
    done = moves.cancel_waiting(conn, run_id, owner=owner, by="loop", reason_code=reason, now=now,
                                diagnosis=diagnose(reason))
    if done is None:
        return False
    moves.count("RunCancelled")
    return True
