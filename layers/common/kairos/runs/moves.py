"""The run's fenced statements: each state move of a run is one guarded statement, and says so.

Role: the data-access layer of the run worker — the claim (``queued -> running``, or the refusal
that ends a run that must not run), the step boundary's lock, the fenced conversation append, the
terminal moves (``succeeded``, ``failed``, ``cancelled`` by the worker), the retry's requeue, and
the cancel of a waiting run (owner, worker or loop), a corpus run's pause and slice boundaries
(``kairos.execution.corpus.phases``), and the block of a new run that may not replace its predecessor
(``kairos.overlap``). ``kairos.execution.claim`` and ``kairos.execution.execute`` decide which to
call; ``kairos.runs.cancel`` uses the cancel statements.

Guarantees:
* Every statement is guarded: by the run's fence (a worker that lost its lease writes nothing and
  learns so from ``None`` / ``False``), and by the state the move leaves from (``kairos.states``).
* A state change and the trace events that go with it are one statement (``kairos.trace.change``):
  a move writes the run row once. Of the worker's transactions only the claim's may write the row
  more than once: the claim of a fork or fresh run records its new target (``runs_set_conversation``)
  in a second write, and a claim whose target or replay is refused then fails the run (``fail``).
* Each terminal move counts its metric (``RunSucceeded``, ``RunFailed``, ``RunCancelled``).

Must not: decide which move applies (the worker and the API do); call anything outside the database.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from aws_lambda_powertools.metrics import MetricUnit
from psycopg.types.json import Jsonb

from kairos import db, trace
from kairos.diagnosis import diagnose
from kairos.observability import metrics
from kairos.settings import DEFAULT_OWNER_CONCURRENCY
from kairos.states import EventType, RunState

LEASE_SECONDS = 120
RETRY_BASE_SECONDS = 10
RETRY_MAX_SECONDS = 60

# reason code -> the state the claim ends a refused run in (runs_claim decides which applies).
CLAIM_REFUSALS: dict[str, RunState] = {
    "schedule_paused": RunState.CANCELLED,
    "schedule_cancelled": RunState.CANCELLED,
    "superseded": RunState.ABANDONED,
    "expired": RunState.EXPIRED,
    "goal_revised": RunState.CANCELLED,  # a loop run of a goal its owner has since edited (kairos.schedules.loops)
}

# The diagnoses of the claim's refusals as one JSON document, serialized once and sent with every
# claim: runs_claim picks the one its verdict names.
_REFUSALS_JSON = json.dumps({code: diagnose(code) for code in CLAIM_REFUSALS}, separators=(",", ":"))


def count(name: str) -> None:
    """One unit of the run metric ``name``."""
    metrics.add_metric(name=name, unit=MetricUnit.Count, value=1)


def claim(conn: psycopg.Connection[db.Row], run_id: UUID, *, now: datetime | None = None,
          owner_slots: int = DEFAULT_OWNER_CONCURRENCY, thread_id: UUID | None = None) -> db.Row | None:
    """``queued -> running`` for exactly one caller, with ``run.claimed`` and the first step's
    ``step.started`` (the row's ``first_step``); the claimed row, or None (not claimable).

    The same statement refuses a run that must not run (its schedule paused or cancelled, a newer
    fire already started, past ``expires_at``): it ends the run ``cancelled`` / ``abandoned`` /
    ``expired`` with its diagnosis and terminal event, and the row comes back in that state with
    ``refusal`` set to the reason code (``refusal`` is None on a claim).

    Only a run that holds a slot (released to it, ``kairos.budgets``), or one its owner has a slot to
    spare for (``owner_slots``); for such an unreleased run the statement takes the owner's slot lock
    before it counts (``kairos_claim_slot_free``, to the transaction's end) so that count is exact.

    With ``thread_id``, a fork run's first attempt gets that thread (a fork of its source) and its
    prompt entry from the same statement; the row then says ``forked``."""
    return send_claim(conn, run_id, now=now, owner_slots=owner_slots, thread_id=thread_id)()


def send_claim(conn: psycopg.Connection[db.Row], run_id: UUID, *, now: datetime | None = None,
               owner_slots: int = DEFAULT_OWNER_CONCURRENCY, thread_id: UUID | None = None,
               fork_only: bool = False, window_budget: int | None = None,
               window_overhead: int = 1) -> Callable[[], db.Row | None]:
    """``claim`` sent now (queued, in a pipeline); the function returned reads the row. With
    ``fork_only`` it claims (or refuses) only a fork run's first attempt, which the statement
    completes alone, and leaves any other run queued (None). With ``window_budget`` (characters, each
    entry costing its length plus ``window_overhead``) a forked row carries its thread's model input
    window too (``window_entries``, ``window_elided``: ``kairos.conversations.claimed_window``)."""
    return db.send(conn, "runs_claim", {"run_id": run_id, "lease_seconds": LEASE_SECONDS, "now": now,
                                        "refusals": _REFUSALS_JSON, "owner_slots": owner_slots,
                                        "thread_id": thread_id, "fork_only": fork_only,
                                        "window_budget": window_budget,
                                        "window_overhead": window_overhead}).fetchone


def lock(conn: psycopg.Connection[db.Row], run_id: UUID, fence: int) -> db.Row | None:
    """The step boundary: locks the run while ``fence`` holds; the row tells of a cancel request."""
    return db.fetch_one(conn, "runs_lock_fenced", {"run_id": run_id, "fence": fence})


def send_lock_conversation(conn: psycopg.Connection[db.Row], run_id: UUID, fence: int,
                           conversation_id: UUID) -> Callable[[], db.Row | None]:
    """The lock of the run (fence held) and then of its conversation, sent now (queued, in a pipeline);
    the function returned reads its row (with the run's ``cancel_requested_at``), None when fenced out."""
    return db.send(conn, "conversations_lock_fenced",
                   {"run_id": run_id, "fence": fence, "conversation_id": conversation_id}).fetchone


def send_publish(conn: psycopg.Connection[db.Row], run_id: UUID, fence: int, conversation_id: UUID, *,
                 content: str, effect_id: UUID, usage: Mapping[str, Any], step: str, truncated: bool,
                 now: datetime | None = None) -> Callable[[], int | None]:
    """``runs_publish`` sent now (queued, in a pipeline, behind ``send_lock_conversation``): the answer
    entry, its effect settled with ``usage``, ``running -> succeeded`` and their four events in one
    statement; the function returned reads the answer's seq, None when nothing was written (fenced out,
    or a cancel was requested)."""
    cursor = db.send(conn, "runs_publish", {
        "run_id": run_id, "fence": fence, "conversation_id": conversation_id, "content": content,
        "effect_id": effect_id, "usage": Jsonb(dict(usage)), "step": step, "truncated": truncated, "now": now})

    def read() -> int | None:
        row = cursor.fetchone()
        if row is None:
            return None
        count("RunSucceeded")
        return int(row["seq"])

    return read


def append_entry(
    conn: psycopg.Connection[db.Row],
    run_id: UUID,
    fence: int,
    conversation_id: UUID,
    *,
    role: str,
    content: str,
    now: datetime | None = None,
) -> int | None:
    """Appends one entry to the run's target conversation under the fence; its seq, or None."""
    # Two statements on purpose: the insert's fresh snapshot (READ COMMITTED) sees entries that an
    # earlier holder of the conversation lock committed while this one waited.
    locked = db.fetch_one(conn, "conversations_lock_fenced",
                          {"run_id": run_id, "fence": fence, "conversation_id": conversation_id})
    if locked is None:
        return None
    row = db.fetch_one(
        conn,
        "conversation_entries_append_fenced",
        {"run_id": run_id, "fence": fence, "conversation_id": conversation_id, "role": role, "content": content,
         "now": now},
    )
    return None if row is None else int(row["seq"])


def _end(
    conn: psycopg.Connection[db.Row],
    query: str,
    run_id: UUID,
    fence: int,
    values: Mapping[str, Any],
    events: Sequence[trace.Event],
    ending: trace.Event,
    metric: str,
    now: datetime | None,
) -> bool:
    """One terminal update of the fence holder with ``events`` and then its ``run.<state>`` event,
    in one statement; False (nothing written) when fenced out or refused by the query's guard. The
    statement writes the run's usage itself: the sum of its settled effects (``kairos.budgets``)."""
    row = trace.change(conn, query, {"run_id": run_id, "fence": fence, **values}, [*events, ending], now=now)
    if row is None:
        return False
    count(metric)
    return True


def succeed(
    conn: psycopg.Connection[db.Row],
    run_id: UUID,
    fence: int,
    *,
    output: Mapping[str, Any],
    events: Sequence[trace.Event] = (),
    now: datetime | None = None,
    settled: UUID | None = None,
) -> bool:
    """``running -> succeeded`` unless fenced out, a cancel was requested or the effect ``settled``
    names is still reserved; ``events`` and then ``run.succeeded`` are written by the same statement."""
    return send_succeed(conn, run_id, fence, output=output, events=events, now=now, settled=settled)()


def send_succeed(
    conn: psycopg.Connection[db.Row],
    run_id: UUID,
    fence: int,
    *,
    output: Mapping[str, Any],
    events: Sequence[trace.Event] = (),
    now: datetime | None = None,
    settled: UUID | None = None,
) -> Callable[[], bool]:
    """``succeed`` sent now (queued, in a pipeline, with the ``COMMIT`` after it); the function
    returned reads whether it was written."""
    ending = trace.Event(EventType.RUN_SUCCEEDED, data={"entry_seq": output.get("entry_seq")})
    read = trace.send_change(conn, "runs_succeed",
                             {"run_id": run_id, "fence": fence, "output": Jsonb(dict(output)), "effect_id": settled},
                             [*events, ending], now=now)

    def done() -> bool:
        if read() is None:
            return False
        count("RunSucceeded")
        return True

    return done


def fail(
    conn: psycopg.Connection[db.Row],
    run_id: UUID,
    fence: int,
    *,
    diagnosis: Mapping[str, Any],
    events: Sequence[trace.Event] = (),
    now: datetime | None = None,
) -> bool:
    """``running -> failed`` with a closed diagnosis, unless fenced out; ``events`` and then
    ``run.failed`` are written by the same statement."""
    ending = trace.Event(EventType.RUN_FAILED, data={"reason_code": diagnosis["reason_code"],
                                                     "retry_eligible": diagnosis["retry_eligible"]})
    return _end(conn, "runs_fail", run_id, fence, {"diagnosis": Jsonb(dict(diagnosis))}, events, ending,
                "RunFailed", now)


def finish_cancelled(
    conn: psycopg.Connection[db.Row],
    run_id: UUID,
    fence: int,
    *,
    events: Sequence[trace.Event] = (),
    now: datetime | None = None,
) -> bool:
    """``running -> cancelled`` by the fence holder after a cancel request; ``events`` and then
    ``run.cancelled`` are written by the same statement."""
    return _end(conn, "runs_finish_cancelled", run_id, fence, {"diagnosis": Jsonb(diagnose("cancelled"))}, events,
                trace.Event(EventType.RUN_CANCELLED, data={"by": "worker"}), "RunCancelled", now)


def requeue(
    conn: psycopg.Connection[db.Row],
    run_id: UUID,
    fence: int,
    *,
    attempt: int,
    delay_seconds: int,
    events: Sequence[trace.Event] = (),
    now: datetime | None = None,
) -> bool:
    """``running -> queued`` for another attempt, only while attempts remain and no mutation may
    have happened. ``handoff_at`` is set to now: the caller re-sends the id with a delay, and the
    tick's repair re-sends it once that handoff is stale if the caller could not. ``events`` (the
    open step's ``step.finished`` among them) and then ``run.queued`` are written by the same
    statement."""
    queued = trace.Event(EventType.RUN_QUEUED, data={"reason": "retry", "next_attempt": attempt + 1,
                                                     "delay_seconds": delay_seconds})
    return trace.change(conn, "runs_requeue_retry", {"run_id": run_id, "fence": fence}, [*events, queued],
                        now=now) is not None


def retry_delay(attempt: int) -> int:
    """Seconds before attempt ``attempt + 1``: 10, 20, 40, … capped at 60."""
    return int(min(RETRY_MAX_SECONDS, RETRY_BASE_SECONDS * 2 ** max(0, attempt - 1)))


def cancel_waiting(
    conn: psycopg.Connection[db.Row],
    run_id: UUID,
    *,
    owner: str | None,
    diagnosis: Mapping[str, Any],
    by: str,
    reason_code: str | None = None,
    now: datetime | None = None,
) -> db.Row | None:
    """``queued`` / ``awaiting_approval`` / ``awaiting_input -> cancelled`` with ``run.cancelled`` (``by``,
    and ``reason_code`` when given): by its owner or its loop (``owner`` given), or by a worker that
    finds a queued run whose cancel is pending (``owner`` None: only a run with ``cancel_requested_at``
    set moves). The row, or None when it had already moved on."""
    data = {"by": by} if reason_code is None else {"by": by, "reason_code": reason_code}
    return trace.change(conn, "runs_cancel_waiting",
                        {"run_id": run_id, "owner": owner, "requested_only": owner is None,
                         "diagnosis": Jsonb(dict(diagnosis))},
                        [trace.Event(EventType.RUN_CANCELLED, data=data)], now=now)


def request_cancel(conn: psycopg.Connection[db.Row], run_id: UUID, *, owner: str,
                   now: datetime | None = None) -> db.Row | None:
    """Marks ``owner``'s running run ``cancel_requested`` with ``run.cancel_requested``; its worker
    stops at the next heartbeat or step. The row, or None when it is no longer running."""
    return trace.change(conn, "runs_request_cancel", {"run_id": run_id, "owner": owner},
                        [trace.Event(EventType.RUN_CANCEL_REQUESTED, data={"by": "owner"})], now=now)


def corpus_pause(conn: psycopg.Connection[db.Row], run_id: UUID, fence: int, *, step: str, phase: str | None,
                 now: datetime | None = None) -> bool:
    """``running -> queued`` and paused, by the fence holder of a corpus run asked to pause, at a
    partition or phase boundary (``kairos.execution.corpus.phases``): the claim's step closed
    ``paused`` and ``run.paused`` (by the worker, at ``phase``) in the same statement; False when
    fenced out or a cancel was requested."""
    return trace.change(conn, "runs_corpus_pause", {"run_id": run_id, "fence": fence}, [
        trace.Event(EventType.STEP_FINISHED, step, {"outcome": "paused"}),
        trace.Event(EventType.RUN_PAUSED, None, {"phase": phase, "by": "worker"})], now=now) is not None


def corpus_continue(conn: psycopg.Connection[db.Row], run_id: UUID, fence: int, *, step: str, pending: int,
                    now: datetime | None = None) -> bool:
    """``running -> queued`` at the end of a corpus run's slice (its invocation's time nearly spent), by
    the fence holder: the claim's step closed ``continued`` and ``run.queued`` (reason ``continue``,
    ``pending`` partitions left) in the same statement; False when fenced out, or a pause or cancel
    request is there to be honoured."""
    return trace.change(conn, "runs_corpus_continue", {"run_id": run_id, "fence": fence}, [
        trace.Event(EventType.STEP_FINISHED, step, {"outcome": "continued"}),
        trace.Event(EventType.RUN_QUEUED, None, {"reason": "continue", "phase": "map",
                                                 "partitions_pending": pending})], now=now) is not None


def block_not_replace_safe(conn: psycopg.Connection[db.Row], run_id: UUID, *, replaces: UUID,
                           now: datetime | None = None) -> db.Row | None:
    """``queued -> policy_blocked`` at once (``not_replace_safe``) with ``run.policy_blocked``: the new
    run of a ``cancel_replace`` fire whose predecessor ``replaces`` already reserved an external change
    (``kairos.overlap``). The row, or None when it was no longer queued."""
    return trace.change(conn, "runs_block_not_replace_safe",
                        {"run_id": run_id, "diagnosis": Jsonb(diagnose("not_replace_safe"))},
                        [trace.Event(EventType.RUN_POLICY_BLOCKED, data={"replaces": str(replaces)})], now=now)
