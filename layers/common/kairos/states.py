"""State sets and the moves allowed between them.

Each state set is a StrEnum whose values are exactly those of the schema's check constraints (on the
run path's tables the column's domain's check, migration 0049; a test reads them back from
PostgreSQL). Each state's comment says which component moves a row out of
it. Moves are applied by single guarded ``UPDATE … WHERE state = …`` statements in the SQL files;
``RUN_MOVES`` and ``SCHEDULE_MOVES`` are the tables those statements follow; docs/architecture.md draws
them, and ``EventType``'s list, and tests/unit/test_docs_architecture.py holds the drawings equal to them.

tests/unit/test_state_moves.py scans every named query and every Python string of the package that
updates ``runs`` or ``schedules``; for each one assigning ``runs.state`` / ``schedules.status`` it
reads the states written (a literal, each branch of a ``CASE``, or for a parameter the states its
callers pass, declared in that test) and the states moved from (the top-level ``WHERE`` guard, which
must exist), and fails on any pair these tables do not declare. It checks what statements may write,
not that every declared move has a statement.
"""

from __future__ import annotations

from enum import StrEnum
from functools import cache
from typing import TypeVar

S = TypeVar("S", bound=StrEnum)


def parse(kind: type[S], value: str) -> S:
    """``kind(value)``, remembered: the member whose value is ``value`` (or ``value`` itself when it is
    one), else the ``ValueError`` ``kind(value)`` raises (never remembered). An enum's call costs
    microseconds and the tick's fire step makes about ten a fire; a remembered one costs a tuple hash."""
    try:
        found: S = _parse(kind, value)
    except TypeError:  # unhashable, so not a value of kind: kind(value) raises what it raises
        return kind(value)
    return found


@cache
def _parse(kind: type[S], value: str) -> S:
    return kind(value)


class ScheduleStatus(StrEnum):
    DRAFT = "draft"  # a loop whose goal changed; out by: API resume (active) or cancel
    ACTIVE = "active"  # out by: tick fire (completed; paused when its rule no longer evaluates), settle (paused), API
    # out by: API resume (active) or cancel; a loop also by its goal edit (draft) and by the goal report of
    # the run it waits on (active: continue; completed: complete, or continue with nothing left to fire)
    PAUSED = "paused"
    CANCELLED = "cancelled"  # final
    COMPLETED = "completed"  # final: a once-schedule fired, ends_at / max_occurrences reached, a loop's goal done


class ScheduleKind(StrEnum):
    CRON = "cron"
    INTERVAL = "interval"
    ONCE = "once"
    WEBHOOK = "webhook"


class Source(StrEnum):
    SCHEDULED = "scheduled"
    MANUAL = "manual"
    BACKFILL = "backfill"
    WEBHOOK = "webhook"
    CHAT = "chat"  # a turn posted to a conversation: no schedule
    TEST = "test"  # POST /v1/schedules/{id}/test: mutations recorded, never sent; never counted or notified


class Decision(StrEnum):
    DISPATCHED = "dispatched"
    SKIPPED_LATE = "skipped_late"
    SKIPPED_OVERLAP = "skipped_overlap"
    QUEUED_BEHIND = "queued_behind"
    EXPIRED = "expired"
    SKIPPED_BUDGET = "skipped_budget"  # the owner's queue was full (KAIROS_OWNER_QUEUE_MAX): no run
    SKIPPED_PAUSED = "skipped_paused"  # recorded at resume: the fires that fell while paused (covers_*), no run
    COALESCED = "coalesced"  # a webhook delivery folded into another run's debounce or batch window (kairos.flow)


class OverRate(StrEnum):
    """A webhook's ``flow.over_rate``: what a delivery over the hook's rate gets (kairos.flow)."""

    REJECT = "reject"  # 429 with Retry-After
    DEFER = "defer"  # accepted; its run waits until the rate allows (within the owner's queue cap)


class FlowWindow(StrEnum):
    """``runs.flow_window``: the kind of window a webhook run collects deliveries in (kairos.flow)."""

    DEBOUNCE = "debounce"
    BATCH = "batch"


class Mode(StrEnum):
    FORK = "fork"
    APPEND = "append"
    FRESH = "fresh"


class Overlap(StrEnum):
    ALLOW = "allow"
    SKIP = "skip"
    QUEUE_ONE = "queue_one"
    CANCEL_REPLACE = "cancel_replace"


class DstGap(StrEnum):
    AUTO = "auto"
    SHIFT_FORWARD = "shift_forward"
    SKIP = "skip"


class DstFold(StrEnum):
    AUTO = "auto"
    FIRST = "first"
    LAST = "last"
    BOTH = "both"


class RunState(StrEnum):
    # out by: run claim (running; or abandoned, expired, cancelled when it refuses), cancel (cancelled),
    # repair (failed: SQS accepted it too often with no worker claiming it)
    QUEUED = "queued"
    RUNNING = "running"  # out by: its fenced worker (terminal, queued for a retry), tick rescue
    AWAITING_APPROVAL = "awaiting_approval"  # out by: approve (queued), deny/expiry (policy_blocked), cancel
    AWAITING_INPUT = "awaiting_input"  # out by: the owner's answer (queued), cancel (run, loop, goal edit)
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    ABANDONED = "abandoned"
    POLICY_BLOCKED = "policy_blocked"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_RUN_STATES


TERMINAL_RUN_STATES: frozenset[RunState] = frozenset(
    {
        RunState.SUCCEEDED,
        RunState.FAILED,
        RunState.CANCELLED,
        RunState.EXPIRED,
        RunState.ABANDONED,
        RunState.POLICY_BLOCKED,
    }
)

RUN_MOVES: dict[RunState, frozenset[RunState]] = {
    RunState.QUEUED: frozenset(
        {
            RunState.RUNNING,
            RunState.CANCELLED,
            RunState.ABANDONED,
            RunState.EXPIRED,
            RunState.FAILED,  # repair: undeliverable (runs_fail_undeliverable)
            RunState.POLICY_BLOCKED,  # cancel_replace could not replace a run that is not replace-safe
        }
    ),
    RunState.RUNNING: frozenset(
        {
            RunState.QUEUED,  # rescue after an expired lease, or a retry-safe retry
            RunState.AWAITING_APPROVAL,
            RunState.AWAITING_INPUT,  # a loop run's goal_report: needs_input
            RunState.SUCCEEDED,
            RunState.FAILED,
            RunState.CANCELLED,
            RunState.ABANDONED,
        }
    ),
    RunState.AWAITING_APPROVAL: frozenset(
        {RunState.QUEUED, RunState.POLICY_BLOCKED, RunState.CANCELLED, RunState.EXPIRED}
    ),
    RunState.AWAITING_INPUT: frozenset({RunState.QUEUED, RunState.CANCELLED}),
    **{state: frozenset() for state in TERMINAL_RUN_STATES},
}

SCHEDULE_MOVES: dict[ScheduleStatus, frozenset[ScheduleStatus]] = {
    ScheduleStatus.DRAFT: frozenset({ScheduleStatus.ACTIVE, ScheduleStatus.CANCELLED}),
    ScheduleStatus.ACTIVE: frozenset(
        {ScheduleStatus.PAUSED, ScheduleStatus.CANCELLED, ScheduleStatus.COMPLETED, ScheduleStatus.DRAFT}
    ),
    ScheduleStatus.PAUSED: frozenset(
        {ScheduleStatus.ACTIVE, ScheduleStatus.CANCELLED, ScheduleStatus.DRAFT, ScheduleStatus.COMPLETED}
    ),
    ScheduleStatus.CANCELLED: frozenset(),
    ScheduleStatus.COMPLETED: frozenset(),
}


class InputRequestState(StrEnum):
    PENDING = "pending"  # out by: the owner's answer (answered), a cancel of its run or loop or a goal edit
    ANSWERED = "answered"  # final
    CANCELLED = "cancelled"  # final
    EXPIRED = "expired"  # final (reserved: no expiry yet; a loop waiting for input holds nothing)


class ApprovalState(StrEnum):
    """``approvals.state`` (kairos.approvals)."""

    PENDING = "pending"  # out by: the owner (approved, denied), the tick past expires_at (expired), a cancel (retired)
    APPROVED = "approved"  # out by: the worker applying the approved call, once (applied)
    APPLIED = "applied"  # final
    DENIED = "denied"  # final
    EXPIRED = "expired"  # final
    RETIRED = "retired"  # final: its run was cancelled


class NotifyDeliveryState(StrEnum):
    """``notify_deliveries.state`` (kairos.notify, the tick's deliver step)."""

    PENDING = "pending"  # out by: the tick's deliver step (delivered, or gave_up after its last attempt)
    DELIVERED = "delivered"  # final
    GAVE_UP = "gave_up"  # final


class CorpusPhase(StrEnum):
    """``corpus_runs.phase``, in the order a corpus run moves through them (kairos.execution.corpus.phases)."""

    ENUMERATE = "enumerate"
    MAP = "map"
    RECONCILE = "reconcile"
    REDUCE = "reduce"
    EXPORT = "export"
    PUBLISH = "publish"
    COMPLETE = "complete"  # final


class CorpusPartitionState(StrEnum):
    """``corpus_partitions.state`` (kairos.execution.corpus.mapping)."""

    PENDING = "pending"  # out by: the map phase's lease (running)
    # out by: its answer (succeeded), a repair (pending with the next generation, or failed once spent),
    # a release (pause, cancel, retry-safe failure) or a new attempt's release_stale (pending)
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class EffectState(StrEnum):
    RESERVED = "reserved"  # out by: the reserving worker (settled, failed, ambiguous), rescue (ambiguous)
    SETTLED = "settled"
    AMBIGUOUS = "ambiguous"
    FAILED = "failed"
    NOT_SENT_TEST = "not_sent_test"  # final at once: a test run's mutation, recorded and never sent


class StepState(StrEnum):
    """A run step's state (``run_steps.state``; ``kairos.runs.steps``)."""

    # out by: the worker that opened it (succeeded, failed, ambiguous) or, when that attempt ended
    # without it, the failure or cancel that ends the attempt, or the next attempt (failed, ambiguous)
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    AMBIGUOUS = "ambiguous"  # its mutation may have been applied: never sent again
    # out by: the attempt after the approval (running), a denial (denied), the request's expiry (failed)
    WAITING_APPROVAL = "waiting_approval"
    DENIED = "denied"
    NOT_SENT_TEST = "not_sent_test"  # a test run's mutation: recorded with its arguments, never sent


class EventType(StrEnum):
    RUN_QUEUED = "run.queued"
    RUN_CLAIMED = "run.claimed"
    STEP_STARTED = "step.started"
    STEP_PROGRESS = "step.progress"
    STEP_FINISHED = "step.finished"
    EFFECT_RESERVED = "effect.reserved"
    EFFECT_SETTLED = "effect.settled"
    OUTPUT_PUBLISHED = "output.published"
    RUN_RESCUED = "run.rescued"
    RUN_CANCEL_REQUESTED = "run.cancel_requested"
    APPROVAL_WAITING = "approval.waiting"
    APPROVAL_APPROVED = "approval.approved"
    APPROVAL_DENIED = "approval.denied"
    RUN_DEFERRED = "run.deferred"  # a claim found the owner's running slots full; the run stays queued
    INPUT_WAITING = "input.waiting"
    INPUT_ANSWERED = "input.answered"
    CORPUS_PHASE = "corpus.phase"
    CORPUS_PARTITION = "corpus.partition"
    RUN_PAUSED = "run.paused"
    RUN_RESUMED = "run.resumed"
    RUN_SUCCEEDED = "run.succeeded"
    RUN_FAILED = "run.failed"
    RUN_CANCELLED = "run.cancelled"
    RUN_EXPIRED = "run.expired"
    RUN_ABANDONED = "run.abandoned"
    RUN_POLICY_BLOCKED = "run.policy_blocked"


def terminal_event(state: RunState) -> EventType:
    """The one terminal event of a terminal state: ``run.<state>``."""
    if not state.terminal:
        raise ValueError(f"{state} is not terminal")
    return EventType(f"run.{state.value}")
