"""Input requests: a goal loop run's question to its owner, parked without holding a worker.

Role (docs/api.md "Goal loops"):

* ``ask`` — the run worker, for a ``goal_report`` with disposition ``needs_input``
  (``kairos.execution.goal_report``), inside its fenced transaction: writes the ``input_requests`` row bound to
  owner, run, attempt, tool call, loop and goal revision, with the question (member-readable; it is
  also appended to the run's thread).
* ``answer`` — the owner, once: ``pending -> answered``; the answer is appended to the run's thread as a
  user entry (the row keeps only its digest and the entry's seq), ``input.answered`` and ``run.queued``
  are traced and the same run goes back to ``queued`` (``awaiting_input -> queued``, expiry lifted);
  the caller hands it to SQS after commit. Its next attempt gives the answer to the model as the
  ``goal_report`` call's result.
* ``cancel_for_run`` — a run's cancel; ``cancel_for_schedule`` — a loop's cancel or goal edit: the
  pending requests are cancelled and the runs waiting on them end ``cancelled``.

The run's moves (park, requeue, the loop's cancel) are ``kairos.runs.waits``'; this module keeps the
request's row.

Guarantees: every decision is one guarded UPDATE from ``pending``; the run row is locked before the
request in every path (answer, run cancel, loop cancel), so an answer and a cancel serialize and
exactly one wins; another owner's request is the same ``NotFound("input_request")`` as a missing one.

Must not: log a question or an answer.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from kairos import conversations, db
from kairos.errors import FieldError, NotFound, NotPending, ValidationFailed
from kairos.instants import rfc3339
from kairos.observability import logger
from kairos.runs import waits
from kairos.states import InputRequestState

QUESTION_MAX = 4_000
ANSWER_MAX = 8_000
STATES = tuple(s.value for s in InputRequestState)


@dataclass(frozen=True)
class InputRequest:
    id: uuid.UUID
    run_id: uuid.UUID
    schedule_id: uuid.UUID
    revision: int
    conversation_id: uuid.UUID
    state: InputRequestState
    question: str
    answer_entry_seq: int | None
    created_at: datetime
    decided_at: datetime | None

    @classmethod
    def from_row(cls, row: db.Row) -> InputRequest:
        return cls(row["id"], row["run_id"], row["schedule_id"], int(row["revision"]), row["conversation_id"],
                   InputRequestState(row["state"]), row["question"], row["answer_entry_seq"], row["created_at"],
                   row["decided_at"])

    def as_json(self) -> dict[str, Any]:
        return {"id": str(self.id), "run_id": str(self.run_id), "loop_id": str(self.schedule_id),
                "revision": self.revision, "conversation_id": str(self.conversation_id), "state": self.state.value,
                "question": self.question, "answer_entry_seq": self.answer_entry_seq,
                "created_at": rfc3339(self.created_at),
                "decided_at": None if self.decided_at is None else rfc3339(self.decided_at)}


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def ask(conn: psycopg.Connection[db.Row], *, run_id: uuid.UUID, owner: str, attempt: int, step: int, call_id: str,
        schedule_id: uuid.UUID, revision: int, conversation_id: uuid.UUID, question: str,
        now: datetime | None = None) -> uuid.UUID | None:
    """Writes the request (the caller holds the run row under its fence); None when this call already
    asked (a replayed step: nothing written)."""
    row = db.fetch_one(conn, "input_requests_insert", {
        "id": uuid.uuid4(), "owner": owner, "run_id": run_id, "attempt": attempt, "step": step, "call_id": call_id,
        "schedule_id": schedule_id, "revision": revision, "conversation_id": conversation_id,
        "question": question[:QUESTION_MAX], "question_digest": _digest(question), "now": now})
    return None if row is None else row["id"]


def for_call(conn: psycopg.Connection[db.Row], run_id: uuid.UUID, step: int, call_id: str) -> db.Row | None:
    return db.fetch_one(conn, "input_requests_for_call", {"run_id": run_id, "step": step, "call_id": call_id})


def get(conn: psycopg.Connection[db.Row], request_id: uuid.UUID, *, owner: str) -> InputRequest:
    row = db.fetch_one(conn, "input_requests_get", {"id": request_id, "owner": owner})
    if row is None:
        raise NotFound("input_request")
    return InputRequest.from_row(row)


def list_for(conn: psycopg.Connection[db.Row], *, owner: str, state: str | None = None,
             limit: int = 100) -> list[InputRequest]:
    check_state(state)
    rows = db.fetch_all(conn, "input_requests_list", {"owner": owner, "state": state, "limit": limit})
    return [InputRequest.from_row(r) for r in rows]


def check_state(state: str | None) -> None:
    """A list filter's ``state``: None or one of the request states (422 naming the field otherwise)."""
    if state is not None and state not in STATES:
        raise ValidationFailed([FieldError("state", "enum", f"state is one of {', '.join(STATES)}")])


def answer(conn: psycopg.Connection[db.Row], request_id: uuid.UUID, *, owner: str, text: str,
           now: datetime | None = None) -> InputRequest:
    """Answers a pending request and requeues its run (see the module doc); ``NotPending`` (409) when it
    is answered, cancelled or expired already, ``NotFound`` when missing or foreign."""
    if not isinstance(text, str) or not text.strip() or len(text) > ANSWER_MAX:
        raise ValidationFailed([FieldError("answer", "length", f"give the answer as 1 to {ANSWER_MAX} characters")])
    # Not a cycle: the API's models read this module's limits at import, and the API loads kairos.runs
    # only with its first route that needs it (tests/unit/test_api_imports.py).

    with db.atomic(conn):
        current = get(conn, request_id, owner=owner)
        # The run first, as a cancel takes it: an answer and a cancel serialize here.
        waits.lock(conn, current.run_id, owner=owner)
        if current.state is not InputRequestState.PENDING:
            raise _not_pending(current)
        entry = conversations.append(conn, current.conversation_id, role="user", content=text,
                                     run_id=current.run_id, now=now)
        row = db.fetch_one(conn, "input_requests_answer", {
            "id": request_id, "owner": owner, "answer_digest": _digest(text), "entry_seq": entry.seq, "now": now})
        if row is None:  # decided while this one waited for the run row
            raise _not_pending(get(conn, request_id, owner=owner))
        requeued = waits.requeue(conn, waits.INPUT, current.run_id, now=now,
                                 data={"input_request_id": str(request_id), "entry_seq": entry.seq})
        if requeued is None:  # the run is no longer waiting: nothing to answer (rolled back)
            raise _not_pending(current, why="its run no longer waits for it")
    decided = InputRequest.from_row(row)
    logger.info("input answered", extra={"action": "input_answered", "input_request_id": str(request_id),
                                         "run_id": str(decided.run_id)})
    return decided


def _not_pending(current: InputRequest, why: str | None = None) -> NotPending:
    return NotPending(f"this request cannot be answered: {why or f'it is already {current.state.value}'}",
                      fields=[FieldError("state", "pending", "only a pending request can be answered, once")])


def cancel_for_run(conn: psycopg.Connection[db.Row], run_id: uuid.UUID, *, now: datetime | None = None) -> int:
    """Cancels the run's pending request (the caller has locked and cancelled the run)."""
    return len(db.fetch_all(conn, "input_requests_cancel_for_run", {"run_id": run_id, "now": now}))


def lock_waiting_runs(conn: psycopg.Connection[db.Row], schedule_id: uuid.UUID, *, owner: str) -> None:
    """Locks the runs that wait on ``owner``'s loop's pending requests. A loop's cancel and goal edit call
    it before they lock the loop: one order everywhere, the run before its loop (a run's worker holds
    its run when its goal report locks the loop), so the two never wait on each other in a cycle. A
    question asked after this is asked under the loop's lock, which the caller takes next."""
    db.fetch_all(conn, "input_requests_lock_waiting_runs", {"schedule_id": schedule_id, "owner": owner})


def cancel_for_schedule(conn: psycopg.Connection[db.Row], schedule_id: uuid.UUID, *, reason: str,
                        now: datetime | None = None) -> list[uuid.UUID]:
    """Cancels a loop's pending requests and ends each waiting run ``cancelled`` (``reason``: the loop
    was cancelled, or its goal edited); the runs cancelled. The caller locked the waiting runs before
    the loop (``lock_waiting_runs``)."""

    cancelled: list[uuid.UUID] = []
    for pending in db.fetch_all(conn, "input_requests_pending_for_schedule", {"schedule_id": schedule_id}):
        run_id = pending["run_id"]
        run = db.fetch_one(conn, "runs_lock_any", {"run_id": run_id})  # the run before the request
        cancel_for_run(conn, run_id, now=now)
        if run is not None and run["state"] == "awaiting_input" and waits.cancel_for_loop(
                conn, run_id, owner=run["owner"], reason=reason, now=now):
            cancelled.append(run_id)
    if cancelled:
        logger.info("waiting loop runs cancelled", extra={"action": "input_runs_cancelled",
                                                          "schedule_id": str(schedule_id), "reason_code": reason,
                                                          "runs": [str(r) for r in cancelled]})
    return cancelled
