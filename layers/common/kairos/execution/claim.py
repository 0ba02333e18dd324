"""The start of an attempt: the claim, and what the execution starts from — or why there is none.

Role: ``claim`` turns a run id into either a ``Claimed`` attempt (the claimed row, its fence and
attempt, its target conversation with the run's prompt entry in it, and the bounded model input)
or an ``Outcome`` that says why nothing will be executed: not claimable, unknown, refused by the
claim, cancelled while queued, left queued because it holds no slot and none is free
(``slot_wait``: it waits for its release, ``kairos.budgets``), or failed before any call (a refused
target, an earlier attempt's possibly-applied mutation). The execution (``kairos.execution.execute``)
is built from a ``Claimed`` only.

Guarantees:
* The claim, the target conversation (fork / append / fresh) and the run's prompt entry commit
  together, in one transaction; a retry finds the prompt entry of an earlier attempt and does not
  write it again. A refused target (``KairosError``) rolls back to a savepoint and fails the run
  ``agent_invalid``; the claim itself stands.
* Effects an earlier fence left ``reserved`` are closed; a run with a mutation that may have
  reached the outside is never replayed: it fails ``ambiguous_effect`` without any call.
* Model input is bounded (openai, bedrock): the system prompt, the run's user turn and as many of
  the newest transcript entries as fit the agent's ``max_input_tokens`` (characters / 4), older ones
  left out behind one marker. The window is chosen in SQL (``conversations.window``).

Must not: call anything outside the database; write a claimed run without its fence.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NamedTuple
from uuid import UUID

import psycopg

from kairos import conversations, db, effects, trace
from kairos.diagnosis import diagnose
from kairos.errors import KairosError
from kairos.executors.base import (
    CHARS_PER_TOKEN,
    DEFAULT_MAX_INPUT_TOKENS,
    ENTRY_OVERHEAD_CHARS,
    ExecutorError,
    Message,
    elision_marker,
    max_input_tokens,
    user_content,
)
from kairos.observability import logger
from kairos.probes import Probes
from kairos.runs import moves
from kairos.settings import DEFAULT_OWNER_CONCURRENCY
from kairos.states import EventType, Mode, RunState

_SQS_MAX_DELAY_SECONDS = 900
# What the elision marker may cost at most (its longest text and its framing).
_MARKER_CHARS = len(elision_marker(10**9)) + ENTRY_OVERHEAD_CHARS
_REFUSAL_METRICS: dict[RunState, str] = {
    RunState.CANCELLED: "RunCancelled",
    RunState.ABANDONED: "RunAbandoned",
    RunState.EXPIRED: "RunExpired",
}


OutcomeResult = Literal[
    "succeeded",  # this call ran the run to success
    "failed",  # this call ended the run failed
    "cancelled",  # this call ended the run cancelled (seen at a boundary, or queued with a cancel request)
    "awaiting_approval",  # this call parked the run for a person's decision on a tool call (lease cleared)
    "awaiting_input",  # this call parked a loop run on its owner's answer to its question (lease cleared)
    "retry",  # back to queued for another attempt: re-send the id after retry_delay_seconds
    "paused",  # a corpus run stopped at a partition boundary: queued and paused until its resume re-sends it
    "continued",  # a corpus run's invocation ended its slice at a partition boundary: queued, re-send the id now
    "skipped",  # not claimed: another worker holds the run, it ended, or it waits behind another run
    "refused",  # the claim ended the run without any call (state and reason_code say how and why)
    "unknown",  # no such run in this database
    "lease_lost",  # claimed, then fenced out by a newer claim: nothing more was written
    "deferred",  # not claimed because the invocation has too little time left: deliver again
    "slot_wait",  # not claimed: released to no slot and none free (owner or key); it waits for its release
    "held",  # not claimed: held by its webhook flow (a window open, the rate); re-send after retry_delay_seconds
]


@dataclass(frozen=True)
class Outcome:
    """What ``process`` made of one delivery of a run id (``result``), and the run's state after it."""

    run_id: UUID
    result: OutcomeResult
    state: RunState | None = None
    reason_code: str | None = None
    retry_delay_seconds: int | None = None


@dataclass(frozen=True)
class ModelInput:
    """The bounded model input of one attempt: the window chosen, and what the trace records of it."""

    transcript: tuple[Message, ...]  # the elision marker (when entries were left out), then the newest entries
    limit: int | None  # the agent's max_input_tokens (capped); None when the agent's value is invalid
    too_large: bool  # the system prompt and the user turn alone exceed the limit
    record: dict[str, int]  # counts for effect.reserved: limit, estimate, entries sent and left out


@dataclass(frozen=True)
class Claimed:
    """A claimed attempt, ready to execute: everything the execution reads is set."""

    row: db.Row
    fence: int
    attempt: int
    conversation_id: UUID
    model_input: ModelInput

    @property
    def step(self) -> str:
        """The first step: the claim wrote its ``step.started``."""
        return str(self.row["first_step"])

    @property
    def transcript(self) -> tuple[Message, ...]:
        return self.model_input.transcript


def claim(database: db.Database, run_id: UUID, *, now: datetime | None, probes: Probes,
          owner_slots: int = DEFAULT_OWNER_CONCURRENCY) -> Claimed | Outcome:
    """Claims the run and prepares its attempt, in one transaction (see the module doc).

    A fork run's first attempt — the default, and the claim statement completes it alone (its thread
    and prompt entry) — is claimed in one round trip: the claim (which takes the owner's slot lock
    itself, only for a run nobody released: ``kairos.budgets``) and the model input's window travel
    together in pipeline mode, one implicit transaction (``Database.trip``), so that lock is held from
    the server's execution to its commit, never across a round trip to this process. Any other run is
    left queued by that statement and claimed the general way (``_claim``): one trip more for it."""
    thread_id = uuid.uuid4()
    claimed = _claim_fork(database, run_id, now=now, owner_slots=owner_slots, thread_id=thread_id)
    if claimed is None:
        claimed = _claim(database, run_id, now=now, owner_slots=owner_slots, thread_id=thread_id)
    if isinstance(claimed, Claimed):
        probes.fire("after_claim", run_id=run_id, fence=claimed.fence)
    return claimed


# What the one-trip claim reads of the window before it knows the agent: the default input limit,
# less the marker. Exact for every agent up to that limit (Window.narrowed); an agent allowed more
# whose transcript was cut at it reads its window again.
_FORK_WINDOW_CHARS = DEFAULT_MAX_INPUT_TOKENS * CHARS_PER_TOKEN - _MARKER_CHARS


def _claim_fork(database: db.Database, run_id: UUID, *, now: datetime | None, owner_slots: int,
                thread_id: UUID) -> Claimed | Outcome | None:
    """The one-trip claim of a fork run's first attempt; None when the run is not one (or is not
    claimable: ``_claim`` then tells why, as it would have)."""
    with database.explicit() as conn:
        # One statement, its own implicit transaction: the claim, the thread, the prompt entry and the
        # model input's window (read in the claim's snapshot, so exactly up to the fork point).
        row = moves.send_claim(conn, run_id, now=now, owner_slots=owner_slots, thread_id=thread_id,
                               fork_only=True, window_budget=_FORK_WINDOW_CHARS,
                               window_overhead=ENTRY_OVERHEAD_CHARS)()
        if row is None:
            return None
        if row["refusal"] is not None:
            return _refused(run_id, row)
        moves.count("Claims")
        _log_claimed(run_id, row, conversation_id=str(thread_id), parent_id=str(row["source_conversation_id"]))
        spent = conversations.claimed_window(row)
        budget = _input_budget(row)
        if budget.entries <= _FORK_WINDOW_CHARS or not spent.elided:
            window = spent.narrowed(budget.entries, ENTRY_OVERHEAD_CHARS)
        else:  # committed, and below the fork point nothing of the thread changes: read it again, wider
            window = conversations.window(conn, thread_id, budget_chars=budget.entries,
                                          entry_overhead=ENTRY_OVERHEAD_CHARS, exclude_run=run_id)
        return Claimed(row, int(row["fence"]), int(row["attempt"]), thread_id, _model_input(budget, window))


def _claim(database: db.Database, run_id: UUID, *, now: datetime | None, owner_slots: int,
           thread_id: UUID) -> Claimed | Outcome:
    """The general claim: any run (a fork's first attempt too, when the one-trip claim found it
    taken or changed), in one transaction of two round trips or more."""
    forked: tuple[db.Row, Callable[[], ModelInput]] | None = None  # the claimed row, its window's reader
    with database.explicit() as conn:
        with database.batch(conn):
            db.begin(conn)
            row = moves.claim(conn, run_id, now=now, owner_slots=owner_slots, thread_id=thread_id)
            if row is None:
                claimed: Claimed | Outcome = _not_claimed(conn, run_id, now, owner_slots)
            elif row["refusal"] is not None:
                claimed = _refused(run_id, row)
            elif row["forked"]:  # the claim wrote the thread and the prompt entry: read the window, commit
                forked = row, _send_model_input(conn, run_id, row, thread_id)
            else:
                moves.count("Claims")
                claimed = _prepare(conn, run_id, row, now)
            db.commit(conn)
        if forked is not None:  # answered by the pipeline's sync, which waited for the commit too
            row, read = forked
            claimed = Claimed(row, int(row["fence"]), int(row["attempt"]), thread_id, read())
            # Counted and logged after the commit, not while this owner's slot lock is held: one line
            # for the claim and the thread it forked.
            moves.count("Claims")
            _log_claimed(run_id, row, conversation_id=str(thread_id), parent_id=str(row["source_conversation_id"]))
    return claimed


def _log_claimed(run_id: UUID, row: db.Row, **forked: str) -> dict[str, Any]:
    """``run claimed`` (with the forked thread's ``conversation_id`` and ``parent_id`` when the claim
    forked one); returns the fields every later line of the claim repeats."""
    log = {"run_id": str(run_id), "schedule_id": str(row["schedule_id"]),
           "occurrence_id": str(row["occurrence_id"]), "fence": int(row["fence"]), "attempt": int(row["attempt"])}
    logger.info("run claimed", extra={"action": "run_claimed", **log, **forked})
    return log


def _prepare(conn: psycopg.Connection[db.Row], run_id: UUID, row: db.Row, now: datetime | None) -> Claimed | Outcome:
    """The claimed run's target conversation, prompt entry and model input; or its failure."""
    fence, attempt = int(row["fence"]), int(row["attempt"])
    log = _log_claimed(run_id, row)
    blockers: list[effects.Effect] = []
    if attempt > 1:  # effects and a prompt entry can only come from an earlier attempt
        # Effects an earlier fence left reserved can no longer be settled by anyone: close them.
        effects.close_stale(conn, run_id, fence, now=now)
        blockers = effects.replay_blockers(conn, run_id)
    conversation_id: UUID | None = None
    # A savepoint, spelled out (the transaction is, kairos.db.Database.explicit): a refused target
    # leaves the claim standing.
    conn.execute("SAVEPOINT run_target")
    try:
        conversation_id = _resolve_conversation(conn, run_id, row, fence, now)
    except KairosError:
        conn.execute("ROLLBACK TO SAVEPOINT run_target")
        logger.warning("run target refused", extra={"action": "run_target_refused", **log})
    else:
        conn.execute("RELEASE SAVEPOINT run_target")
    if conversation_id is None:
        return _fail(conn, run_id, row, "agent_invalid", now,
                     summary="The run's target conversation could not be prepared from its agent.")
    if blockers:
        # A mutation of an earlier attempt may have reached the outside: never replay it.
        logger.warning("run not replayed", extra={"action": "run_not_replayed", **log,
                                                  "effects": [str(e.id) for e in blockers]})
        return _fail(conn, run_id, row, "ambiguous_effect", now)
    retried: list[UUID] = []  # the runs a retry descends from: their entries are not its model input
    if row.get("retry_of") is not None:
        # A retry asks its message again: the transcript keeps the retried run's user entry (written once)
        # and the model sees the message once, as this run's prompt, not also as that entry.
        chain = db.fetch_row(conn, "conversation_entries_find_retried_prompt",
                             {"run_id": run_id, "conversation_id": conversation_id})
        retried, found = list(chain["run_ids"][1:]), bool(chain["prompted"])
    else:
        found = attempt > 1 and db.fetch_one(
            conn, "conversation_entries_find_for_run",
            {"conversation_id": conversation_id, "run_id": run_id, "role": "user"}) is not None
    if not found:
        seq = moves.append_entry(conn, run_id, fence, conversation_id, role="user",
                                 content=_prompt_entry(run_id, row), now=now)
        if seq is None:
            raise RuntimeError("fence changed while the run row was locked")
    return Claimed(row, fence, attempt, conversation_id,
                   _send_model_input(conn, run_id, row, conversation_id, retried)())


def _fail(conn: psycopg.Connection[db.Row], run_id: UUID, row: db.Row, reason: str, now: datetime | None, *,
          summary: str | None = None) -> Outcome:
    """Fails the just-claimed run before any call, closing the step the claim started."""
    step_failed = trace.Event(EventType.STEP_FINISHED, str(row["first_step"]),
                              {"outcome": "failed", "reason_code": reason})
    failed = moves.fail(conn, run_id, int(row["fence"]), diagnosis=diagnose(reason, summary=summary),
                        events=[step_failed], now=now)
    return Outcome(run_id, "failed", RunState.FAILED if failed else None, reason)


def _send_model_input(conn: psycopg.Connection[db.Row], run_id: UUID, row: db.Row,
                      conversation_id: UUID, retried: Sequence[UUID] = ()) -> Callable[[], ModelInput]:
    """The system prompt, the run's user turn and as many of the newest transcript entries as fit
    ``max_input_tokens`` (characters / 4); older entries are left out behind one marker. The
    window is chosen in SQL (``conversations.window``): the rest of the transcript is never read.
    Its query is sent now; the function returned reads the answer (after a pipeline's sync)."""
    budget = _input_budget(row)
    read_window = conversations.send_window(conn, conversation_id, budget_chars=budget.entries,
                                            entry_overhead=ENTRY_OVERHEAD_CHARS, exclude_run=run_id,
                                            exclude_runs=retried)
    return lambda: _model_input(budget, read_window())


class _InputBudget(NamedTuple):
    """A run's model input budget: the agent's limit (None when invalid), the budget in characters,
    and what the system prompt and the run's user turn take of it."""

    limit: int | None
    chars: int
    fixed: int

    @property
    def entries(self) -> int:
        """What the transcript entries may take: the rest, less the elision marker."""
        return self.chars - self.fixed - _MARKER_CHARS


def _input_budget(row: db.Row) -> _InputBudget:
    """The run's ``_InputBudget``, from its agent, prompt and payload."""
    agent: dict[str, Any] = dict(row["agent"] or {})
    try:
        limit: int | None = max_input_tokens(agent)
    except ExecutorError:
        limit = None  # execute() fails the run agent_invalid before any call
    budget = (limit or DEFAULT_MAX_INPUT_TOKENS) * CHARS_PER_TOKEN
    system = agent.get("system")
    fixed = (len(system) if isinstance(system, str) else 0) + len(user_content(str(row["prompt"]), row["payload"]))
    return _InputBudget(limit, budget, fixed)


def _model_input(budget_of_run: _InputBudget, window: conversations.Window) -> ModelInput:
    """The bounded model input from the window read for the run's budget (``budget_of_run.entries``)."""
    limit, budget, fixed = budget_of_run
    transcript = [Message(e.role, e.content) for e in window.entries]
    used = fixed + sum(len(e.content) + ENTRY_OVERHEAD_CHARS for e in window.entries)
    if window.elided:
        marker = elision_marker(window.elided)
        if used + len(marker) + ENTRY_OVERHEAD_CHARS <= budget:
            transcript.insert(0, Message("system", marker))
            used += len(marker) + ENTRY_OVERHEAD_CHARS
    record = {"max_input_tokens": limit or DEFAULT_MAX_INPUT_TOKENS,
              "estimated_tokens": math.ceil(used / CHARS_PER_TOKEN),
              "entries": len(window.entries), "elided": window.elided}
    return ModelInput(tuple(transcript), limit, fixed > budget, record)


def _resolve_conversation(conn: psycopg.Connection[db.Row], run_id: UUID, row: db.Row, fence: int,
                          now: datetime | None) -> UUID:
    """The target: the one the claim set (append, or kept from an earlier attempt), else a new
    fork of the source or a fresh conversation from the agent snapshot, recorded under the fence."""
    current: UUID | None = row["conversation_id"]
    if current is not None:
        return current
    if Mode(row["mode"]) is Mode.FORK:
        current = conversations.fork(conn, row["source_conversation_id"], origin_run_id=run_id,
                                     now=now).id
    else:
        current = conversations.create(conn, owner=row["owner"], agent=row["agent"],
                                       origin_run_id=run_id, now=now).id
    done = db.fetch_one(conn, "runs_set_conversation",
                        {"run_id": run_id, "fence": fence, "conversation_id": current, "now": now})
    if done is None:
        raise RuntimeError("fence changed while the run row was locked")
    return current


def _refused(run_id: UUID, row: db.Row) -> Outcome:
    """The claim ended the run instead (its statement wrote the state and the terminal event)."""
    state = RunState(row["state"])
    reason = str(row["refusal"])
    moves.count(_REFUSAL_METRICS[state])
    logger.info("run refused at claim", extra={
        "action": "run_refused", "run_id": str(run_id), "schedule_id": str(row["schedule_id"]),
        "occurrence_id": str(row["occurrence_id"]), "state": state.value, "reason_code": reason})
    return Outcome(run_id, "refused", state, reason)


def _not_claimed(conn: psycopg.Connection[db.Row], run_id: UUID, now: datetime | None, owner_slots: int) -> Outcome:
    row = db.fetch_one(conn, "runs_get", {"run_id": run_id})
    if row is None:
        logger.warning("unknown run", extra={"action": "run_unknown", "run_id": str(run_id)})
        return Outcome(run_id, "unknown")
    state = RunState(row["state"])
    log = {"run_id": str(run_id), "state": state.value, "schedule_id": str(row["schedule_id"])}
    if state is RunState.QUEUED and row["cancel_requested_at"] is not None:
        # Requeued (rescued) while its cancel was pending: finish the cancel instead of running.
        done = moves.cancel_waiting(conn, run_id, owner=None, diagnosis=diagnose("cancelled"), by="worker",
                                    now=now)
        if done is not None:
            moves.count("RunCancelled")
            logger.info("run cancelled", extra={"action": "run_cancelled", **log})
            return Outcome(run_id, "cancelled", RunState.CANCELLED, "cancelled")
    if state is RunState.QUEUED and row.get("paused_at") is not None:  # a paused corpus run: its resume re-sends it
        logger.info("run paused", extra={"action": "run_paused_skip", **log})
        return Outcome(run_id, "skipped", state)
    if state is RunState.QUEUED and row["blocked_by_run_id"] is not None:
        logger.info("run waits behind another", extra={"action": "run_blocked", **log})
        return Outcome(run_id, "skipped", state)
    if state is RunState.QUEUED and row.get("held_until") is not None:
        held = db.fetch_one(conn, "runs_held_wait", {"run_id": run_id, "now": now})
        if held is not None:  # a window still open, or deferred by the hook's rate (kairos.flow): its timer again
            delay = min(_SQS_MAX_DELAY_SECONDS, max(1, math.ceil(float(held["seconds_left"]))))
            logger.info("run held by its webhook flow", extra={"action": "run_held", **log, "delay_seconds": delay})
            return Outcome(run_id, "held", state, retry_delay_seconds=delay)
    if state is RunState.QUEUED:
        return _slots_full(run_id, owner_slots, log)
    moves.count("ClaimConflicts")
    logger.info("run not claimable", extra={"action": "claim_conflict", **log})
    return Outcome(run_id, "skipped", state)


def _slots_full(run_id: UUID, owner_slots: int, log: dict[str, str]) -> Outcome:
    """Queued, unblocked, no cancel pending, released to no slot, and the claim (holding the owner's slot
    lock) found none to spare: the run waits queued in the database. Its message is acknowledged and
    nothing is re-sent: the end of a run holding a slot releases it (``kairos.budgets``)."""
    moves.count("ClaimsDeferred")
    logger.info("no slot free; run waits for its release", extra={
        "action": "run_slot_wait", **log, "owner_slots": owner_slots})
    return Outcome(run_id, "slot_wait", RunState.QUEUED)


def _prompt_entry(run_id: UUID, row: Mapping[str, Any]) -> str:
    """The run's user entry: its prompt, and a reference to the webhook payload kept with the run."""
    prompt = str(row["prompt"])
    if row.get("payload") is None:
        return prompt
    return f"{prompt}\n\n[webhook payload: kept with run {run_id}]"
