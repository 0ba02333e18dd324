"""Approval waits: a tool call that needs a person parks its run without holding a worker.

Role (docs/api.md "Agents that act"):

* ``request`` — the worker, for a call its agent's ``approval`` policy gates: one fenced transaction
  writes the ``approvals`` row (bound to run, attempt, step, call, tool and the canonical argument
  digest, with a bounded preview), appends ``approval.waiting``, moves the run ``running ->
  awaiting_approval`` and clears its lease (the owner's slot is free), and leaves an
  ``approval_requested`` note in the conversation's inbox.
* ``approve`` — the owner: ``pending -> approved`` (one decision wins) and the run ``->
  queued`` with ``approval.approved``; the caller hands it to SQS after commit. The new attempt folds
  the step log and applies exactly the approved call, once (``consume`` in the transaction that
  records its result; the digest must match or the run fails ``approved_call_not_applied``).
* ``deny`` — the owner, and ``expire_due`` — the tick, past ``expires_at`` (default 24 h): the run
  ends ``policy_blocked`` (``approval_denied`` / ``approval_expired``).
* A run's cancel retires its open requests (``kairos.runs.cancel``).

The run's moves (park, requeue, block) are ``kairos.runs.waits``'; this module keeps the request's row.

Guarantees: every decision is one guarded UPDATE (``pending`` and not expired), so two approvers, or
an approver and a cancel, cannot both win; another owner's request is the same ``NotFound`` as a
missing one. Lock order: the run row before its request, in every path (approve, deny, expiry, the
worker's ``consume``, a run's cancel), so a decision racing a cancel waits instead of deadlocking.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from kairos import conversations, db, tools
from kairos.errors import Conflict, FieldError, NotFound, ValidationFailed
from kairos.executors.base import ToolCall
from kairos.instants import rfc3339
from kairos.observability import logger
from kairos.runs import steps as run_steps
from kairos.runs import waits
from kairos.states import ApprovalState, StepState

EXPIRES_IN_SECONDS = 86_400
STATES = tuple(s.value for s in ApprovalState)


@dataclass(frozen=True)
class Approval:
    id: uuid.UUID
    run_id: uuid.UUID
    state: str
    tool: str
    args_digest: str
    preview: dict[str, Any]
    expires_at: datetime
    created_at: datetime
    decided_at: datetime | None

    @classmethod
    def from_row(cls, row: db.Row) -> Approval:
        return cls(row["id"], row["run_id"], row["state"], row["tool"], row["args_digest"], dict(row["preview"]),
                   row["expires_at"], row["created_at"], row["decided_at"])

    def as_json(self) -> dict[str, Any]:
        return {"id": str(self.id), "run_id": str(self.run_id), "state": self.state, "tool": self.tool,
                "args_digest": self.args_digest, "preview": self.preview, "expires_at": rfc3339(self.expires_at),
                "created_at": rfc3339(self.created_at),
                "decided_at": None if self.decided_at is None else rfc3339(self.decided_at)}


def request(conn: psycopg.Connection[db.Row], *, run_id: uuid.UUID, fence: int, attempt: int, owner: str,
            conversation_id: uuid.UUID, step: int, call: ToolCall, now: datetime | None = None) -> uuid.UUID | None:
    """Parks the run for ``call`` (see the module doc); None when the fence no longer holds or a cancel
    was requested (nothing written)."""
    approval_id = uuid.uuid4()
    moved = waits.park(conn, waits.APPROVAL, run_id=run_id, fence=fence, step=step, now=now, data={
        "approval_id": str(approval_id), "tool": call.name, "args_digest": tools.args_digest(call)})
    if moved is None:
        return None
    db.fetch_one(conn, "approvals_insert", {
        "id": approval_id, "run_id": run_id, "owner": owner, "attempt": attempt, "step": step, "call_id": call.id,
        "tool": call.name, "args_digest": tools.args_digest(call), "preview": Jsonb(tools.preview(call)),
        "expires_in": EXPIRES_IN_SECONDS, "now": now})
    conversations.note(conn, conversation_id, kind="approval_requested",
                       body={"approval_id": str(approval_id), "run_id": str(run_id), "tool": call.name}, now=now)
    logger.info("approval requested", extra={"action": "approval_requested", "run_id": str(run_id),
                                             "approval_id": str(approval_id), "tool": call.name})
    return approval_id


def for_call(conn: psycopg.Connection[db.Row], run_id: uuid.UUID, step: int, call_id: str) -> db.Row | None:
    return db.fetch_one(conn, "approvals_for_call", {"run_id": run_id, "step": step, "call_id": call_id})


def consume(conn: psycopg.Connection[db.Row], approval_id: uuid.UUID, *, now: datetime | None = None) -> bool:
    """``approved -> applied``, once; False when it was not (still) approved."""
    return db.fetch_one(conn, "approvals_apply", {"id": approval_id, "now": now}) is not None


def get(conn: psycopg.Connection[db.Row], approval_id: uuid.UUID, *, owner: str) -> Approval:
    row = db.fetch_one(conn, "approvals_get", {"id": approval_id, "owner": owner})
    if row is None:
        raise NotFound("approval")
    return Approval.from_row(row)


def check_state(state: str | None) -> None:
    """A list filter's ``state``: None or one of the approval states (422 naming the field otherwise)."""
    if state is not None and state not in STATES:
        raise ValidationFailed([FieldError("state", "enum", f"state is one of {', '.join(STATES)}")])


def list_for(conn: psycopg.Connection[db.Row], *, owner: str, state: str | None = None,
             limit: int = 100) -> list[Approval]:
    check_state(state)
    rows = db.fetch_all(conn, "approvals_list", {"owner": owner, "state": state, "limit": limit})
    return [Approval.from_row(r) for r in rows]


def approve(conn: psycopg.Connection[db.Row], approval_id: uuid.UUID, *, owner: str,
            now: datetime | None = None) -> Approval:
    """Approves a pending request and requeues its run (the caller hands the run to SQS after commit)."""
    with db.atomic(conn):
        decided = _decide(conn, _lock_run(conn, approval_id, owner), approval_id, owner, "approved", now)
        waits.requeue(conn, waits.APPROVAL, decided.run_id, data={"approval_id": str(approval_id)}, now=now)
    logger.info("approval approved", extra={"action": "approval_approved", "approval_id": str(approval_id),
                                            "run_id": str(decided.run_id)})
    return decided


def deny(conn: psycopg.Connection[db.Row], approval_id: uuid.UUID, *, owner: str,
         now: datetime | None = None) -> Approval:
    with db.atomic(conn):
        decided = _decide(conn, _lock_run(conn, approval_id, owner), approval_id, owner, "denied", now)
        waits.block(conn, decided.run_id, approval_id=approval_id, reason="approval_denied", now=now)
        run_steps.close_waiting(conn, decided.run_id, StepState.DENIED, now=now)  # the step shows it
    logger.info("approval denied", extra={"action": "approval_denied", "approval_id": str(approval_id),
                                          "run_id": str(decided.run_id)})
    return decided


def expire_due(conn: psycopg.Connection[db.Row], *, limit: int = 500, now: datetime | None = None) -> int:
    """Expires pending requests past ``expires_at`` and ends their runs ``policy_blocked`` (the tick)."""
    # The runs first, skipping any held (a cancel or a decision has it: the next tick sees the rest).
    locked = db.fetch_all(conn, "approvals_lock_due_runs", {"limit": limit, "now": now})
    if not locked:
        return 0
    expired = db.fetch_all(conn, "approvals_expire_due",
                           {"run_ids": [r["run_id"] for r in locked], "now": now})
    for row in expired:
        waits.block(conn, row["run_id"], approval_id=row["id"], reason="approval_expired", now=now)
        run_steps.close_waiting(conn, row["run_id"], StepState.FAILED, now=now)
    return len(expired)


def _lock_run(conn: psycopg.Connection[db.Row], approval_id: uuid.UUID, owner: str) -> Approval:
    """Locks the request's run (``NotFound`` for a missing or foreign request): a decision takes the run
    before the request, as a cancel does, so the two serialize instead of deadlocking."""
    current = get(conn, approval_id, owner=owner)
    waits.lock(conn, current.run_id, owner=owner)
    return current


def _decide(conn: psycopg.Connection[db.Row], current: Approval, approval_id: uuid.UUID, owner: str, state: str,
            now: datetime | None) -> Approval:
    row = db.fetch_one(conn, "approvals_decide", {"id": approval_id, "owner": owner, "state": state, "now": now})
    if row is not None:
        return Approval.from_row(row)
    current = get(conn, approval_id, owner=owner)  # as the cancel or other decision before this one left it
    why = "it expired" if current.state == "pending" else f"it is already {current.state}"
    raise Conflict(f"this request cannot be decided: {why}",
                   fields=[FieldError("state", "pending", "only a pending, unexpired request can be decided")])
