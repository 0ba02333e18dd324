"""Operator views and actions behind the ``kairos`` CLI: every owner's rows, read-only by default.

Reads here are deliberately not owner-scoped (an operator holds the database credentials anyway);
actions (pause, resume, cancel) look up the row's owner and then go through the same owner-scoped
library functions the API uses, so an operator cannot move a row in a way a user could not.
Nothing here prints prompts, payloads, outputs' text or token hashes. The one exception to "every
owner" is ``owner_status``, the console's operator status (``GET /v1/status``): the same figures for
one owner's rows, and the run queue's dead-letter depth (which belongs to no owner).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from kairos import approvals, db, input_requests, runs, schedules
from kairos.errors import NotFound
from kairos.instants import rfc3339
from kairos.runs import steps as run_steps
from kairos.schedules import backfill, edit, loops, manual


@dataclass(frozen=True)
class Status:
    now: datetime
    due: int
    oldest_due_at: datetime | None
    queued: int
    running: int
    oldest_queued_at: datetime | None
    lease_expired: int
    handoff_pending: int
    dlq_depth: int | None  # None when no queue is configured or it cannot be read

    def as_json(self) -> dict[str, Any]:
        def iso(value: datetime | None) -> str | None:
            return None if value is None else value.isoformat()

        return {
            "now": iso(self.now),
            "due_backlog": self.due,
            "oldest_due_at": iso(self.oldest_due_at),
            "queued": self.queued,
            "running": self.running,
            "oldest_queued_at": iso(self.oldest_queued_at),
            "stuck_lease_expired": self.lease_expired,
            "stuck_handoff_pending": self.handoff_pending,
            "dlq_depth": self.dlq_depth,
        }


def status(conn: psycopg.Connection[db.Row], *, sqs: Any = None, queue_url: str | None = None,
           now: datetime | None = None) -> Status:
    sched = db.fetch_one(conn, "schedules_ops_status", {"now": now}) or {}
    run = db.fetch_one(conn, "runs_ops_status", {"now": now}) or {}
    return Status(
        now=sched["now"],
        due=int(sched["due"]),
        oldest_due_at=sched["oldest_due_at"],
        queued=int(run["queued"]),
        running=int(run["running"]),
        oldest_queued_at=run["oldest_queued_at"],
        lease_expired=int(run["lease_expired"]),
        handoff_pending=int(run["handoff_pending"]),
        dlq_depth=dlq_depth(sqs, queue_url) if sqs is not None and queue_url else None,
    )


@dataclass(frozen=True)
class OwnerStatus:
    now: datetime
    due: int
    oldest_due_at: datetime | None
    queued: int
    running: int
    awaiting_approval: int
    awaiting_input: int
    oldest_queued_at: datetime | None
    dlq_depth: int | None  # None when RUN_DLQ_URL is not set (the local stack) or it cannot be read

    def as_json(self) -> dict[str, Any]:
        def iso(value: datetime | None) -> str | None:
            return None if value is None else rfc3339(value)

        lag = 0.0 if self.oldest_due_at is None else max(0.0, (self.now - self.oldest_due_at).total_seconds())
        return {
            "now": iso(self.now), "due_backlog": self.due, "oldest_due_at": iso(self.oldest_due_at),
            "fire_lag_seconds": round(lag, 3), "queued": self.queued, "running": self.running,
            "awaiting_approval": self.awaiting_approval, "awaiting_input": self.awaiting_input,
            "oldest_queued_at": iso(self.oldest_queued_at), "dlq_depth": self.dlq_depth,
        }


def owner_status(conn: psycopg.Connection[db.Row], *, owner: str, dlq_depth: int | None,
                 now: datetime | None = None) -> OwnerStatus:
    """One owner's due backlog (active schedules whose next fire has passed; the fire lag is how long
    the oldest of them has waited) and runs in flight, with the DLQ depth the caller read."""
    sched = db.fetch_one(conn, "schedules_owner_status", {"owner": owner, "now": now}) or {}
    run = db.fetch_one(conn, "runs_owner_status", {"owner": owner}) or {}
    return OwnerStatus(
        now=sched["now"], due=int(sched["due"]), oldest_due_at=sched["oldest_due_at"],
        queued=int(run["queued"]), running=int(run["running"]),
        awaiting_approval=int(run["awaiting_approval"]), awaiting_input=int(run["awaiting_input"]),
        oldest_queued_at=run["oldest_queued_at"], dlq_depth=dlq_depth,
    )


def dlq_messages(sqs: Any, dlq_url: str) -> int:
    """Visible messages in the dead-letter queue at ``dlq_url``."""
    depth = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["ApproximateNumberOfMessages"])
    return int(depth["Attributes"]["ApproximateNumberOfMessages"])


def dlq_depth(sqs: Any, queue_url: str) -> int | None:
    """Visible messages in the run queue's dead-letter queue, found through its redrive policy."""
    attrs = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["RedrivePolicy"]).get("Attributes", {})
    policy = attrs.get("RedrivePolicy")
    if not policy:
        return None
    dlq_name = json.loads(policy)["deadLetterTargetArn"].rsplit(":", 1)[-1]
    dlq_url = sqs.get_queue_url(QueueName=dlq_name)["QueueUrl"]
    depth = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["ApproximateNumberOfMessages"])
    return int(depth["Attributes"]["ApproximateNumberOfMessages"])


def list_schedules(conn: psycopg.Connection[db.Row], *, owner: str | None = None, include_cancelled: bool = False,
                   limit: int = 100) -> list[schedules.Schedule]:
    rows = db.fetch_all(conn, "schedules_ops_list", {"owner": owner, "all": include_cancelled, "limit": limit})
    return [schedules.Schedule.from_row(r) for r in rows]


def get_schedule(conn: psycopg.Connection[db.Row], schedule_id: UUID) -> schedules.Schedule:
    row = db.fetch_one(conn, "schedules_ops_get", {"id": schedule_id})
    if row is None:
        raise NotFound("schedule")
    return schedules.Schedule.from_row(row)


def list_runs(conn: psycopg.Connection[db.Row], *, schedule_id: UUID | None = None, state: str | None = None,
              limit: int = 50) -> list[runs.Run]:
    rows = db.fetch_all(conn, "runs_ops_list", {"schedule_id": schedule_id, "state": state, "limit": limit})
    return [runs.Run.from_row(r) for r in rows]


def get_run(conn: psycopg.Connection[db.Row], run_id: UUID) -> runs.Run:
    row = db.fetch_one(conn, "runs_ops_get", {"id": run_id})
    if row is None:
        raise NotFound("run")
    return runs.Run.from_row(row)


def steps(conn: psycopg.Connection[db.Row], run_id: UUID, *, after: int = 0,
          limit: int = run_steps.MAX_PAGE) -> tuple[list[run_steps.Row], int]:
    """A page of any run's steps (``kairos.runs.steps.page``); ``NotFound`` for a run that does not exist."""
    get_run(conn, run_id)
    return run_steps.page(conn, run_id, after=after, limit=limit)


def events(conn: psycopg.Connection[db.Row], run_id: UUID) -> list[dict[str, Any]]:
    """A run's whole trace (progress events included) as JSON objects shaped like the API's events:
    ``seq``, ``type``, ``at`` (RFC 3339), ``attempt``, ``step``, ``data``."""
    return [{"seq": int(e["seq"]), "type": e["type"], "at": rfc3339(e["at"]), "attempt": int(e["attempt"]),
             "step": e["step"], "data": e["data"]}
            for e in db.fetch_all(conn, "runs_ops_events", {"id": run_id})]


def timeline(conn: psycopg.Connection[db.Row], run_id: UUID) -> list[str]:
    """A run's trace as readable lines: offset from the first event, type, attempt, step, safe data."""
    events = db.fetch_all(conn, "runs_ops_events", {"id": run_id})
    if not events:
        return []
    start: datetime = events[0]["at"]
    lines = []
    for e in events:
        offset = (e["at"] - start).total_seconds()
        step = f" [{e['step']}]" if e["step"] else ""
        data = f"  {json.dumps(e['data'], sort_keys=True)}" if e["data"] else ""
        lines.append(f"{e['seq']:>4}  +{offset:9.3f}s  {e['type']:<22} attempt {e['attempt']}{step}{data}")
    return lines


def pause_schedule(conn: psycopg.Connection[db.Row], schedule_id: UUID, *,
                   reason: str | None = None) -> schedules.Schedule:
    return schedules.pause(conn, schedule_id, owner=get_schedule(conn, schedule_id).owner, reason=reason)


def resume_schedule(conn: psycopg.Connection[db.Row], schedule_id: UUID) -> schedules.Schedule:
    return schedules.resume(conn, schedule_id, owner=get_schedule(conn, schedule_id).owner)


def cancel_schedule(conn: psycopg.Connection[db.Row], schedule_id: UUID) -> schedules.Schedule:
    return schedules.cancel(conn, schedule_id, owner=get_schedule(conn, schedule_id).owner)


def cancel_run(conn: psycopg.Connection[db.Row], run_id: UUID) -> runs.Run:
    return runs.cancel(conn, run_id, owner=get_run(conn, run_id).owner)


def edit_schedule(conn: psycopg.Connection[db.Row], schedule_id: UUID, *, patch: object,
                  if_match: int | None = None) -> schedules.Schedule:

    return edit.edit(conn, schedule_id, owner=get_schedule(conn, schedule_id).owner, patch=patch, if_match=if_match)


def trigger_schedule(conn: psycopg.Connection[db.Row], schedule_id: UUID) -> Any:

    return manual.trigger(conn, schedule_id, owner=get_schedule(conn, schedule_id).owner)


def test_schedule(conn: psycopg.Connection[db.Row], schedule_id: UUID, *, payload: Any = None) -> Any:

    return manual.test(conn, schedule_id, owner=get_schedule(conn, schedule_id).owner, payload=payload)


def backfill_schedule(conn: psycopg.Connection[db.Row], schedule_id: UUID, *, raw: object) -> Any:

    return backfill.backfill(conn, schedule_id, owner=get_schedule(conn, schedule_id).owner, raw=raw)


def retry_run(conn: psycopg.Connection[db.Row], run_id: UUID, *, from_last_step: bool = False) -> Any:

    return manual.retry(conn, run_id, owner=get_run(conn, run_id).owner, from_last_step=from_last_step)


def list_approvals(conn: psycopg.Connection[db.Row], *, owner: str | None = None, state: str | None = None,
                   limit: int = 50) -> list[Any]:

    approvals.check_state(state)
    rows = db.fetch_all(conn, "approvals_ops_list", {"owner": owner, "state": state, "limit": limit})
    return [approvals.Approval.from_row(r) for r in rows]


def decide_approval(conn: psycopg.Connection[db.Row], approval_id: UUID, *, approve: bool) -> Any:
    """Approves or denies on the owner's behalf (the decision is recorded as the owner's)."""

    row = db.fetch_one(conn, "approvals_ops_get", {"id": approval_id})
    if row is None:
        raise NotFound("approval")
    decide = approvals.approve if approve else approvals.deny
    return decide(conn, approval_id, owner=row["owner"])


def create_loop(conn: psycopg.Connection[db.Row], *, owner: str, raw: object) -> schedules.Schedule:
    """A goal loop for ``owner``, through the same checks as ``POST /v1/loops``."""

    return loops.create(conn, owner=owner, raw=raw)


def get_loop(conn: psycopg.Connection[db.Row], loop_id: UUID) -> schedules.Schedule:
    row = db.fetch_one(conn, "schedules_ops_get", {"id": loop_id})
    if row is None or not row["loop"]:
        raise NotFound("loop")
    return schedules.Schedule.from_row(row)


def list_input_requests(conn: psycopg.Connection[db.Row], *, owner: str | None = None, state: str | None = None,
                        limit: int = 50) -> list[Any]:

    input_requests.check_state(state)
    rows = db.fetch_all(conn, "input_requests_ops_list", {"owner": owner, "state": state, "limit": limit})
    return [input_requests.InputRequest.from_row(r) for r in rows]


def answer_input(conn: psycopg.Connection[db.Row], request_id: UUID, *, text: str) -> Any:
    """Answers on the owner's behalf (the answer is recorded as the owner's), once."""

    row = db.fetch_one(conn, "input_requests_ops_get", {"id": request_id})
    if row is None:
        raise NotFound("input_request")
    return input_requests.answer(conn, request_id, owner=row["owner"], text=text)
