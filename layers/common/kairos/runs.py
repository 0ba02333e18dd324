"""The run worker — claim, lease, fence, execute, trace — and the run reads the API serves.

Role: ``process`` turns one opaque run id (an SQS message) into at most one execution of the run's
prompt, however often the id is delivered; ``get``, ``output`` and ``cancel`` are the owner-scoped
reads and the cancel the API calls.

Guarantees:
* Claim is one guarded update (``queued -> running``, fence + 1, attempt + 1, a new 120 s lease) that
  also writes ``run.claimed`` and the first step's ``step.started``. The claim, the target
  conversation (fork / append / fresh) and the run's prompt entry commit together. Zero rows:
  someone else holds the run or it ended; the message is acknowledged.
* The same statement refuses a run that must not run, from the same reading of the run and its
  schedule, and ends it without any call: ``cancelled`` when its schedule is paused (or in draft)
  or cancelled (``schedule_paused`` / ``schedule_cancelled``), ``abandoned`` (``superseded``) when a
  newer scheduled fire of its schedule has already been claimed, ``expired`` past ``expires_at``.
  Each writes its diagnosis and one ``run.<state>`` event; the message is acknowledged. None of
  these ends counts toward the schedule's failures.
* Each worker transaction writes the run row once: a state change and its trace events are one
  statement (``kairos.trace.change``); a second write would re-check all of the row's foreign keys.
* Every later write of the running run — events, conversation entries, effects, output, terminal
  state — is guarded by its fence and locks the run row first, so a worker that lost its lease (a
  new claim after a rescue) writes nothing; it learns so from an empty result and stops.
* No transaction is open during an external call. Before the call an ``effects`` row is reserved
  (committed), after it the row is closed. A mutation whose outcome is unknown ends ``ambiguous``;
  a run with a possibly-applied mutation is never replayed, by a retry or by a re-claim.
* Automatic retries stay on the same run with a new attempt, only for retry-safe failures with no
  external mutation, within ``max_attempts``: the run goes back to ``queued`` under the fence and the
  caller (``kairos.worker``) re-sends its id with a delay.
* A heartbeat thread (own pooled connection per beat) extends the lease every 20 s under the fence
  and reads the cancel flag; a cancel request or a lost lease aborts the HTTP call in flight at that
  beat (its socket is shut down; the run then ends ``cancelled``, or writes nothing when fenced out)
  rather than waiting up to the 300 s call timeout. It writes ``step.progress`` (no content) at most
  once per 10 s per step. The lease extension commits without waiting for the WAL flush (see ``runs_heartbeat``).
* A run whose cancel was requested can never publish success (the success statement requires
  ``cancel_requested_at IS NULL``); its worker ends it ``cancelled`` at the next boundary.
* Model input is bounded (openai, bedrock): the system prompt, the run's user turn and as many of the
  newest transcript entries as fit the agent's ``max_input_tokens`` (characters / 4), older ones left
  out behind one marker; the window is chosen in SQL (``conversations.window``) and its counts are
  traced on ``effect.reserved`` (``input``). A system prompt and user turn that alone exceed the
  limit fail ``input_too_large`` before any call.
* A run's runtime is bounded by ``runtime_limit_seconds`` (server-capped below the Lambda timeout,
  and by the invocation's remaining time); exceeding it fails the run with ``runtime_limit``.
* Failures end in a closed diagnosis (``diagnose``): summary, scope, reason code, retry eligibility
  and recovery actions from fixed lists.

Must not: log or trace prompts, completions, payloads, headers or secrets; hold a transaction across
a call; write a running run without its fence; decide anything from SQS or a local clock (the
database owns state and time; the local monotonic clock only bounds this process's own waiting).
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

import psycopg
from aws_lambda_powertools.metrics import MetricUnit
from psycopg.types.json import Jsonb

from kairos import conversations, db, effects, trace
from kairos.errors import KairosError, NotFound
from kairos.executors.base import (
    CHARS_PER_TOKEN,
    DEFAULT_MAX_INPUT_TOKENS,
    ENTRY_OVERHEAD_CHARS,
    REASON_CODES,
    Abort,
    ExecutionRequest,
    Executor,
    ExecutorError,
    Message,
    Reply,
    elision_marker,
    max_input_tokens,
    user_content,
)
from kairos.observability import logger, metrics
from kairos.settings import Settings
from kairos.states import EventType, Mode, RunState

LEASE_SECONDS = 120
HEARTBEAT_SECONDS = 20.0
PROGRESS_MIN_SECONDS = 10.0
# Lambda's hard maximum is 900 s; a run stops well before so it can still write its failure.
RUNTIME_CAP_SECONDS = 840
# Time kept back from the invocation's remaining time to fail the run cleanly and answer SQS.
LAMBDA_MARGIN_SECONDS = 15.0
# A record with less invocation time than this left is not claimed: SQS delivers it again.
MIN_CLAIM_BUDGET_SECONDS = 30.0
CALL_TIMEOUT_CAP_SECONDS = 300.0
RETRY_BASE_SECONDS = 10
RETRY_MAX_SECONDS = 60
OUTPUT_PREVIEW_CHARS = 2000

# The closed list of recovery actions a diagnosis may offer (the tick uses resume_schedule).
RECOVERY_ACTIONS: frozenset[str] = frozenset(
    {
        "retry_run",
        "resume_schedule",
        "check_agent_config",
        "check_secret",
        "check_egress_allow",
        "check_target",
        "raise_runtime_limit",
        "report_issue",
    }
)
Scope = Literal["run", "step", "target"]

# reason_code -> (scope, retry eligible, recovery actions, plain-language summary). Summaries are
# written for the owner and carry no provider text, prompt or secret.
_DIAGNOSES: dict[str, tuple[Scope, bool, tuple[str, ...], str]] = {
    "agent_invalid": ("target", False, ("check_agent_config",), "The agent configuration cannot be executed."),
    "egress_refused": ("target", False, ("check_agent_config", "check_egress_allow"),
                       "The agent's endpoint is not an allowed destination."),
    # Not retry-eligible (DESIGN.md "Credentials"): the reference is refused or names nothing until the
    # owner fixes it; a Secrets Manager outage is retried on the same run without this entry's say.
    "secret_unavailable": ("target", False, ("check_secret",),
                           "The agent's API key could not be read, or the agent may not use it."),
    "connect_failed": ("target", True, ("retry_run", "check_target"),
                       "The agent's endpoint could not be reached; nothing was sent."),
    "timeout": ("step", True, ("retry_run", "check_target"), "The agent's endpoint did not answer in time."),
    "peer_error": ("target", True, ("retry_run", "check_target"), "The agent's endpoint answered with an error."),
    "rate_limited": ("target", True, ("retry_run",), "The agent's endpoint is rate limiting requests."),
    "malformed_reply": ("step", True, ("retry_run", "check_agent_config"),
                        "The agent's endpoint answered something that is not a usable reply."),
    "reply_too_large": ("step", False, ("check_agent_config",), "The agent's reply exceeded the size limit."),
    "input_too_large": ("step", False, ("check_agent_config",),
                        "The run's prompt and the agent's system prompt alone exceed the agent's input limit."),
    "ambiguous_effect": ("step", False, ("check_target",),
                         "An external call may or may not have taken effect, so the run is not replayed."),
    "runtime_limit": ("run", False, ("raise_runtime_limit", "check_target"), "The run exceeded its runtime limit."),
    "lease_lost": ("run", True, ("retry_run",), "The worker lost its lease on the run."),
    "restart_limit": ("run", True, ("retry_run",), "The run was interrupted and restarted too often."),
    "abandoned_late": ("run", False, (), "The run was interrupted and is not delivered late (catch-up is off)."),
    "cancelled": ("run", False, (), "The run was cancelled."),
    "internal": ("run", True, ("retry_run", "report_issue"), "The run failed because of an internal error."),
    # The run machinery's own endings (RUN_REASON_CODES): the claim's refusals and the tick's give-up.
    "schedule_paused": ("run", False, ("resume_schedule",),
                        "The run was not started: its schedule is paused."),
    "schedule_cancelled": ("run", False, (), "The run was not started: its schedule was cancelled."),
    "superseded": ("run", False, (), "The run was not started: a newer fire of its schedule had already started."),
    "expired": ("run", False, (), "The run was not started in time: it waited past its expiry (catch-up is off), "
                                  "so it is not delivered late."),
    "undeliverable": ("run", True, ("retry_run", "report_issue"),
                      "The run was handed to the queue five times and no worker claimed it."),
}

# Reasons only the run machinery gives (the claim's refusals, the tick's repair), beside the
# executors' REASON_CODES; ``diagnose`` accepts both.
RUN_REASON_CODES: frozenset[str] = frozenset(
    {"schedule_paused", "schedule_cancelled", "superseded", "expired", "undeliverable"}
)
# reason code -> the state the claim ends a refused run in (runs_claim decides which applies).
CLAIM_REFUSALS: dict[str, RunState] = {
    "schedule_paused": RunState.CANCELLED,
    "schedule_cancelled": RunState.CANCELLED,
    "superseded": RunState.ABANDONED,
    "expired": RunState.EXPIRED,
}

HookPoint = Literal["after_claim", "heartbeat_started", "heartbeat", "after_reserve", "after_send", "before_finish"]
HOOK_POINTS: frozenset[str] = frozenset(
    {"after_claim", "heartbeat_started", "heartbeat", "after_reserve", "after_send", "before_finish"}
)

ExecutorFactory = Callable[..., Executor]

# The executors that send the transcript to a model: their input is bounded by max_input_tokens.
MODEL_EXECUTORS: frozenset[str] = frozenset({"openai", "bedrock"})
# What the elision marker may cost at most (its longest text and its framing).
_MARKER_CHARS = len(elision_marker(10**9)) + ENTRY_OVERHEAD_CHARS


def diagnose(
    reason_code: str,
    *,
    summary: str | None = None,
    retry_eligible: bool | None = None,
    scope: Scope | None = None,
) -> dict[str, Any]:
    """The closed diagnosis of an ended run for one reason code of ``REASON_CODES`` or
    ``RUN_REASON_CODES``."""
    if reason_code not in REASON_CODES and reason_code not in RUN_REASON_CODES:
        raise ValueError(f"unknown reason code {reason_code}")
    default_scope, default_eligible, actions, default_summary = _DIAGNOSES[reason_code]
    eligible = default_eligible if retry_eligible is None else retry_eligible
    return {
        "summary": summary or default_summary,
        "scope": scope or default_scope,
        "reason_code": reason_code,
        "retry_eligible": eligible,
        "recovery_actions": [a for a in actions if eligible or a != "retry_run"],
    }


# The diagnoses of the claim's refusals as one JSON document, serialized once and sent with every
# claim: runs_claim picks the one its verdict names.
_REFUSALS_JSON = json.dumps({code: diagnose(code) for code in CLAIM_REFUSALS}, separators=(",", ":"))


# --- Records ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """A run as the API shows it. Prompt, payload and agent are deliberately not part of it."""

    id: UUID
    occurrence_id: UUID
    schedule_id: UUID
    owner: str
    source: str
    mode: str
    state: RunState
    attempt: int
    max_attempts: int
    fence: int
    conversation_id: UUID | None
    source_conversation_id: UUID
    cancel_requested_at: datetime | None
    output: dict[str, Any] | None
    usage: dict[str, Any] | None
    diagnosis: dict[str, Any] | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Run:
        return cls(
            id=row["id"],
            occurrence_id=row["occurrence_id"],
            schedule_id=row["schedule_id"],
            owner=row["owner"],
            source=row["source"],
            mode=row["mode"],
            state=RunState(row["state"]),
            attempt=int(row["attempt"]),
            max_attempts=int(row["max_attempts"]),
            fence=int(row["fence"]),
            conversation_id=row["conversation_id"],
            source_conversation_id=row["source_conversation_id"],
            cancel_requested_at=row["cancel_requested_at"],
            output=row["output"],
            usage=row["usage"],
            diagnosis=row["diagnosis"],
            created_at=row["created_at"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
        )

    def as_json(self) -> dict[str, Any]:
        """The API shape: ids, state, attempt, target conversation, times (RFC 3339 UTC), usage,
        diagnosis and the output reference (``{"conversation_id", "entry_seq", "attempt"}``)."""
        return {
            "id": str(self.id),
            "schedule_id": str(self.schedule_id),
            "occurrence_id": str(self.occurrence_id),
            "source": self.source,
            "mode": self.mode,
            "state": self.state.value,
            "attempt": self.attempt,
            "max_attempts": self.max_attempts,
            "conversation_id": None if self.conversation_id is None else str(self.conversation_id),
            "cancel_requested": self.cancel_requested_at is not None,
            "created_at": trace.rfc3339(self.created_at),
            "started_at": trace.rfc3339(self.started_at),
            "finished_at": trace.rfc3339(self.finished_at),
            "usage": self.usage,
            "diagnosis": self.diagnosis,
            "output": self.output,
        }


OutcomeResult = Literal[
    "succeeded",  # this call ran the run to success
    "failed",  # this call ended the run failed
    "cancelled",  # this call ended the run cancelled (seen at a boundary, or queued with a cancel request)
    "retry",  # back to queued for another attempt: re-send the id after retry_delay_seconds
    "skipped",  # not claimed: another worker holds the run, it ended, or it waits behind another run
    "refused",  # the claim ended the run without any call (state and reason_code say how and why)
    "unknown",  # no such run in this database
    "lease_lost",  # claimed, then fenced out by a newer claim: nothing more was written
    "deferred",  # not claimed because the invocation has too little time left: deliver again
]


@dataclass(frozen=True)
class Outcome:
    run_id: UUID
    result: OutcomeResult
    state: RunState | None = None
    reason_code: str | None = None
    retry_delay_seconds: int | None = None


class Hooks:
    """Named points inside ``process`` where tests observe or simulate a crash (a hook that raises).

    Production passes none. A hook receives keyword context (``run_id``, ``fence``, and per point:
    ``effect``, ``heartbeat``, ``alive``, ``cancel_requested``).
    """

    def __init__(self) -> None:
        self._handlers: dict[str, list[Callable[..., None]]] = {}

    def on(self, point: HookPoint, handler: Callable[..., None]) -> Hooks:
        if point not in HOOK_POINTS:
            raise ValueError(f"unknown hook point {point}")
        self._handlers.setdefault(point, []).append(handler)
        return self

    def fire(self, point: HookPoint, **context: Any) -> None:
        for handler in self._handlers.get(point, ()):
            handler(**context)


_NO_HOOKS = Hooks()
_REFUSAL_METRICS: dict[RunState, str] = {
    RunState.CANCELLED: "RunCancelled",
    RunState.ABANDONED: "RunAbandoned",
    RunState.EXPIRED: "RunExpired",
}


def _count(name: str) -> None:
    metrics.add_metric(name=name, unit=MetricUnit.Count, value=1)


# --- Heartbeat ---------------------------------------------------------------------------------------


class Heartbeat:
    """Keeps one claimed run's lease alive and watches for a lost lease or a cancel request.

    ``beat_once`` is one beat (tests call it directly); ``start`` runs it every ``interval`` seconds
    on a daemon thread until ``stop``. Each beat borrows a pooled connection, so it never shares one
    with the worker. A beat also writes ``step.progress`` for the step in flight when at least
    ``PROGRESS_MIN_SECONDS`` passed since that step started or last reported.
    """

    def __init__(
        self,
        database: db.Database,
        run_id: UUID,
        fence: int,
        *,
        interval: float = HEARTBEAT_SECONDS,
        now: datetime | None = None,
        clock: Callable[[], float] = time.monotonic,
        hooks: Hooks = _NO_HOOKS,
    ) -> None:
        self.database = database
        self.run_id = run_id
        self.fence = fence
        self.interval = interval
        self.lost = threading.Event()
        self.cancel_requested = threading.Event()
        # Fired with either event: stops the run's call in flight (kairos.executors.base.Abort).
        self.abort = Abort()
        self._now = now
        self._clock = clock
        self._hooks = hooks
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._step: str | None = None
        self._step_mark = 0.0  # clock of the step's start or its last progress event
        self._step_started = 0.0
        self._thread: threading.Thread | None = None

    @property
    def should_stop(self) -> bool:
        return self.lost.is_set() or self.cancel_requested.is_set()

    def step_started(self, step: str) -> None:
        with self._lock:
            self._step = step
            self._step_started = self._step_mark = self._clock()

    def step_finished(self) -> None:
        with self._lock:
            self._step = None

    def beat_once(self) -> bool:
        """Extends the lease under the fence; False once the lease is lost (another fence holds)."""
        with self._lock:
            step = self._step
            due = step is not None and self._clock() - self._step_mark >= PROGRESS_MIN_SECONDS
            elapsed_ms = int((self._clock() - self._step_started) * 1000)
        # Autocommit: the lease extension and the progress event are each one fenced statement,
        # atomic on its own, so a beat costs one round trip (two when progress is due).
        with self.database.connection() as conn:
            row = db.fetch_one(
                conn,
                "runs_heartbeat",
                {"run_id": self.run_id, "fence": self.fence, "lease_seconds": LEASE_SECONDS, "now": self._now},
            )
            if row is None:
                self.lost.set()
            else:
                if row["cancel_requested_at"] is not None:
                    self.cancel_requested.set()
                if due and step is not None:
                    seq = trace.append(conn, self.run_id, EventType.STEP_PROGRESS, data={"elapsed_ms": elapsed_ms},
                                       fence=self.fence, step=step, now=self._now)
                    if seq is not None:
                        with self._lock:
                            self._step_mark = self._clock()
        if self.lost.is_set():
            logger.warning("lease lost", extra={"action": "lease_lost", "run_id": str(self.run_id),
                                                 "fence": self.fence, "by": "heartbeat"})
        if self.should_stop and not self.abort.fired:
            self.abort.fire()
            logger.info("call in flight aborted", extra={"action": "call_aborted", "run_id": str(self.run_id),
                                                         "fence": self.fence,
                                                         "by": "lease_lost" if self.lost.is_set() else "cancel"})
        self._hooks.fire("heartbeat", run_id=self.run_id, fence=self.fence, alive=not self.lost.is_set(),
                         cancel_requested=self.cancel_requested.is_set())
        return not self.lost.is_set()

    def start(self) -> Heartbeat:
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{self.run_id}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _loop(self) -> None:
        while not self._stopped.wait(self.interval):
            try:
                if not self.beat_once():
                    return
            except Exception:  # noqa: BLE001 - logged; the thread must outlive one bad beat
                # A failed beat (database unreachable) is retried next interval; the fence keeps a
                # lease that expired meanwhile safe.
                logger.exception("heartbeat failed", extra={"action": "heartbeat_failed",
                                                             "run_id": str(self.run_id), "fence": self.fence})


# --- Fenced statements (each one guarded; None/False means the fence no longer holds) ----------------


def claim(conn: psycopg.Connection[db.Row], run_id: UUID, *, now: datetime | None = None) -> db.Row | None:
    """``queued -> running`` for exactly one caller, with ``run.claimed`` and the first step's
    ``step.started`` (the row's ``first_step``); the claimed row, or None (not claimable).

    The same statement refuses a run that must not run (its schedule paused or cancelled, a newer
    fire already started, past ``expires_at``): it ends the run ``cancelled`` / ``abandoned`` /
    ``expired`` with its diagnosis and terminal event, and the row comes back in that state with
    ``refusal`` set to the reason code (``refusal`` is None on a claim)."""
    return db.fetch_one(conn, "runs_claim", {"run_id": run_id, "lease_seconds": LEASE_SECONDS, "now": now,
                                             "refusals": _REFUSALS_JSON})


def lock(conn: psycopg.Connection[db.Row], run_id: UUID, fence: int) -> db.Row | None:
    """The step boundary: locks the run while ``fence`` holds; the row tells of a cancel request."""
    return db.fetch_one(conn, "runs_lock_fenced", {"run_id": run_id, "fence": fence})


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
    usage: Mapping[str, Any] | None,
    events: Sequence[trace.Event],
    ending: trace.Event,
    metric: str,
    now: datetime | None,
) -> bool:
    """One terminal update of the fence holder with ``events`` and then its ``run.<state>`` event,
    in one statement; False (nothing written) when fenced out or refused by the query's guard."""
    row = trace.change(conn, query,
                       {"run_id": run_id, "fence": fence, **values,
                        "usage": None if usage is None else Jsonb(dict(usage))},
                       [*events, ending], now=now)
    if row is None:
        return False
    _count(metric)
    return True


def succeed(
    conn: psycopg.Connection[db.Row],
    run_id: UUID,
    fence: int,
    *,
    output: Mapping[str, Any],
    usage: Mapping[str, Any] | None,
    events: Sequence[trace.Event] = (),
    now: datetime | None = None,
) -> bool:
    """``running -> succeeded`` unless fenced out or a cancel was requested; ``events`` and then
    ``run.succeeded`` are written by the same statement."""
    return _end(conn, "runs_succeed", run_id, fence, {"output": Jsonb(dict(output))}, usage, events,
                trace.Event(EventType.RUN_SUCCEEDED, data={"entry_seq": output.get("entry_seq")}), "RunSucceeded",
                now)


def fail(
    conn: psycopg.Connection[db.Row],
    run_id: UUID,
    fence: int,
    *,
    diagnosis: Mapping[str, Any],
    usage: Mapping[str, Any] | None = None,
    events: Sequence[trace.Event] = (),
    now: datetime | None = None,
) -> bool:
    """``running -> failed`` with a closed diagnosis, unless fenced out; ``events`` and then
    ``run.failed`` are written by the same statement."""
    ending = trace.Event(EventType.RUN_FAILED, data={"reason_code": diagnosis["reason_code"],
                                                     "retry_eligible": diagnosis["retry_eligible"]})
    return _end(conn, "runs_fail", run_id, fence, {"diagnosis": Jsonb(dict(diagnosis))}, usage, events, ending,
                "RunFailed", now)


def finish_cancelled(
    conn: psycopg.Connection[db.Row],
    run_id: UUID,
    fence: int,
    *,
    usage: Mapping[str, Any] | None = None,
    events: Sequence[trace.Event] = (),
    now: datetime | None = None,
) -> bool:
    """``running -> cancelled`` by the fence holder after a cancel request; ``events`` and then
    ``run.cancelled`` are written by the same statement."""
    return _end(conn, "runs_finish_cancelled", run_id, fence, {"diagnosis": Jsonb(diagnose("cancelled"))}, usage,
                events, trace.Event(EventType.RUN_CANCELLED, data={"by": "worker"}), "RunCancelled", now)


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


# --- Reads and cancel (owner-scoped) ---------------------------------------------------------------------


def get(conn: psycopg.Connection[db.Row], run_id: UUID, *, owner: str) -> Run:
    """One run of ``owner``; ``NotFound("run")`` for a missing or foreign one alike."""
    row = db.fetch_one(conn, "runs_get_owned", {"run_id": run_id, "owner": owner})
    if row is None:
        raise NotFound("run")
    return Run.from_row(row)


def cancel(conn: psycopg.Connection[db.Row], run_id: UUID, *, owner: str, now: datetime | None = None) -> Run:
    """Cancels a run, durably first. ``queued`` (or awaiting approval) becomes ``cancelled`` at once;
    ``running`` gets ``cancel_requested`` and its worker stops at the next heartbeat or step; a run
    already cancelling or terminal is returned unchanged (idempotent)."""
    row = db.fetch_one(conn, "runs_lock_owned", {"run_id": run_id, "owner": owner})
    if row is None:
        raise NotFound("run")
    state = RunState(row["state"])
    if state in (RunState.QUEUED, RunState.AWAITING_APPROVAL):
        done = trace.change(conn, "runs_cancel_waiting",
                            {"run_id": run_id, "owner": owner, "requested_only": False,
                             "diagnosis": Jsonb(diagnose("cancelled", summary="The run was cancelled before it ran."))},
                            [trace.Event(EventType.RUN_CANCELLED, data={"by": "owner"})], now=now)
        if done is not None:
            _count("RunCancelled")
            logger.info("run cancelled", extra={"action": "run_cancelled", "run_id": str(run_id)})
            return Run.from_row(done)
    elif state is RunState.RUNNING and row["cancel_requested_at"] is None:
        marked = trace.change(conn, "runs_request_cancel", {"run_id": run_id, "owner": owner},
                              [trace.Event(EventType.RUN_CANCEL_REQUESTED, data={"by": "owner"})], now=now)
        if marked is not None:
            logger.info("run cancel requested", extra={"action": "run_cancel_requested", "run_id": str(run_id)})
            return Run.from_row(marked)
    return Run.from_row(row)


def output(conn: psycopg.Connection[db.Row], run_id: UUID, *, owner: str) -> dict[str, Any]:
    """The output projection: ``available`` (bounded preview and the producer's correlations),
    ``empty`` (why: queued, running, failed — with its diagnosis — or no_output) or ``unavailable``
    (the answer's source is no longer readable)."""
    run = get(conn, run_id, owner=owner)
    if run.state is RunState.QUEUED:
        return {"state": "empty", "reason": "queued"}
    if run.state in (RunState.RUNNING, RunState.AWAITING_APPROVAL):
        return {"state": "empty", "reason": "running"}
    if run.state is not RunState.SUCCEEDED or not run.output:
        failed = run.state in (RunState.FAILED, RunState.ABANDONED)
        projection: dict[str, Any] = {"state": "empty", "reason": "failed" if failed else "no_output"}
        if run.diagnosis is not None:
            projection["diagnosis"] = run.diagnosis
        return projection
    reference = run.output
    entry = None
    try:
        entry = db.fetch_one(conn, "conversation_entries_get_output",
                             {"conversation_id": UUID(str(reference["conversation_id"])),
                              "entry_seq": int(reference["entry_seq"]), "owner": owner})
    except (KeyError, ValueError, TypeError):
        entry = None
    if entry is None:
        return {"state": "unavailable", "reason": "source_gone"}
    text: str = entry["content"]
    return {
        "state": "available",
        "text": text[:OUTPUT_PREVIEW_CHARS],
        "truncated": len(text) > OUTPUT_PREVIEW_CHARS,
        "conversation_id": str(reference["conversation_id"]),
        "entry_seq": int(reference["entry_seq"]),
        "attempt": reference.get("attempt", run.attempt),
    }


# --- The worker ------------------------------------------------------------------------------------------


class _LeaseLost(Exception):
    """A fenced write matched nothing: another claim holds the run now."""


class _Cancelled(Exception):
    """The run's cancel was requested (seen at a boundary or by the heartbeat)."""


class _Failure(Exception):
    """The run fails (or retries) with a reason code; raised inside the execution steps."""

    def __init__(self, reason_code: str, *, retry_safe: bool = False, summary: str | None = None) -> None:
        super().__init__(reason_code)
        self.reason_code = reason_code
        self.retry_safe = retry_safe
        self.summary = summary


@dataclass(frozen=True)
class _ModelInput:
    """The bounded model input of one attempt: the window chosen, and what the trace records of it."""

    transcript: tuple[Message, ...]  # the elision marker (when entries were left out), then the newest entries
    limit: int | None  # the agent's max_input_tokens (capped); None when the agent's value is invalid
    too_large: bool  # the system prompt and the user turn alone exceed the limit
    record: dict[str, int]  # counts for effect.reserved: limit, estimate, entries sent and left out


@dataclass
class _Claimed:
    row: db.Row
    fence: int
    attempt: int
    conversation_id: UUID
    model_input: _ModelInput

    @property
    def transcript(self) -> tuple[Message, ...]:
        return self.model_input.transcript


@dataclass
class _Execution:
    database: db.Database
    run_id: UUID
    settings: Settings
    executor_factory: ExecutorFactory
    now: datetime | None
    clock: Callable[[], float]
    hooks: Hooks
    heartbeat_interval: float
    deadline: float = 0.0
    claimed: _Claimed | None = None
    heartbeat: Heartbeat | None = None
    step: str | None = None  # the step whose step.started is written and step.finished is not
    open_effect: effects.Effect | None = None
    call_started: bool = False
    usage: dict[str, Any] = field(default_factory=dict)

    # -- claim -------------------------------------------------------------------------------------

    def claim(self) -> Outcome | None:
        with self.database.transaction() as conn:
            row = claim(conn, self.run_id, now=self.now)
            if row is None:
                return self._not_claimed(conn)
            if row["refusal"] is not None:
                return self._refused(row)
            _count("Claims")
            fence, attempt = int(row["fence"]), int(row["attempt"])
            log = {"run_id": str(self.run_id), "schedule_id": str(row["schedule_id"]),
                   "occurrence_id": str(row["occurrence_id"]), "fence": fence, "attempt": attempt}
            logger.info("run claimed", extra={"action": "run_claimed", **log})
            self.step = str(row["first_step"])  # started by the claim itself
            blockers: list[effects.Effect] = []
            if attempt > 1:  # effects and a prompt entry can only come from an earlier attempt
                # Effects an earlier fence left reserved can no longer be settled by anyone: close them.
                effects.close_stale(conn, self.run_id, fence, now=self.now)
                blockers = effects.replay_blockers(conn, self.run_id)
            try:
                with conn.transaction():  # a savepoint: a refused target leaves the claim standing
                    conversation_id = self._resolve_conversation(conn, row, fence)
            except KairosError:
                logger.warning("run target refused", extra={"action": "run_target_refused", **log})
                conversation_id = None
            if conversation_id is None:
                failed = fail(conn, self.run_id, fence, diagnosis=diagnose("agent_invalid", summary=(
                    "The run's target conversation could not be prepared from its agent.")),
                    events=self._step_failed("agent_invalid"), now=self.now)
                return Outcome(self.run_id, "failed", RunState.FAILED if failed else None, "agent_invalid")
            if blockers:
                # A mutation of an earlier attempt may have reached the outside: never replay it.
                logger.warning("run not replayed", extra={"action": "run_not_replayed", **log,
                                                          "effects": [str(e.id) for e in blockers]})
                failed = fail(conn, self.run_id, fence, diagnosis=diagnose("ambiguous_effect"),
                              events=self._step_failed("ambiguous_effect"), now=self.now)
                return Outcome(self.run_id, "failed", RunState.FAILED if failed else None, "ambiguous_effect")
            found = attempt > 1 and db.fetch_one(
                conn, "conversation_entries_find_for_run",
                {"conversation_id": conversation_id, "run_id": self.run_id, "role": "user"}) is not None
            if not found:
                seq = append_entry(conn, self.run_id, fence, conversation_id, role="user",
                                   content=_prompt_entry(self.run_id, row), now=self.now)
                if seq is None:
                    raise RuntimeError("fence changed while the run row was locked")
            model_input = self._model_input(conn, row, conversation_id)
        self.claimed = _Claimed(row, fence, attempt, conversation_id, model_input)
        self.hooks.fire("after_claim", run_id=self.run_id, fence=fence)
        return None

    def _model_input(self, conn: psycopg.Connection[db.Row], row: db.Row, conversation_id: UUID) -> _ModelInput:
        """The system prompt, the run's user turn and as many of the newest transcript entries as fit
        ``max_input_tokens`` (characters / 4); older entries are left out behind one marker. The
        window is chosen in SQL (``conversations.window``): the rest of the transcript is never read."""
        agent: dict[str, Any] = dict(row["agent"] or {})
        try:
            limit: int | None = max_input_tokens(agent)
        except ExecutorError:
            limit = None  # execute() fails the run agent_invalid before any call
        budget = (limit or DEFAULT_MAX_INPUT_TOKENS) * CHARS_PER_TOKEN
        system = agent.get("system")
        fixed = (len(system) if isinstance(system, str) else 0) + len(user_content(str(row["prompt"]), row["payload"]))
        window = conversations.window(conn, conversation_id, budget_chars=budget - fixed - _MARKER_CHARS,
                                      entry_overhead=ENTRY_OVERHEAD_CHARS, exclude_run=self.run_id)
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
        return _ModelInput(tuple(transcript), limit, fixed > budget, record)

    def _resolve_conversation(self, conn: psycopg.Connection[db.Row], row: db.Row, fence: int) -> UUID:
        """The target: the one the claim set (append, or kept from an earlier attempt), else a new
        fork of the source or a fresh conversation from the agent snapshot, recorded under the fence."""
        current: UUID | None = row["conversation_id"]
        if current is not None:
            return current
        if Mode(row["mode"]) is Mode.FORK:
            current = conversations.fork(conn, row["source_conversation_id"], origin_run_id=self.run_id,
                                         now=self.now).id
        else:
            current = conversations.create(conn, owner=row["owner"], agent=row["agent"],
                                           origin_run_id=self.run_id, now=self.now).id
        done = db.fetch_one(conn, "runs_set_conversation",
                            {"run_id": self.run_id, "fence": fence, "conversation_id": current, "now": self.now})
        if done is None:
            raise RuntimeError("fence changed while the run row was locked")
        return current

    def _refused(self, row: db.Row) -> Outcome:
        """The claim ended the run instead (its statement wrote the state and the terminal event)."""
        state = RunState(row["state"])
        reason = str(row["refusal"])
        _count(_REFUSAL_METRICS[state])
        logger.info("run refused at claim", extra={
            "action": "run_refused", "run_id": str(self.run_id), "schedule_id": str(row["schedule_id"]),
            "occurrence_id": str(row["occurrence_id"]), "state": state.value, "reason_code": reason})
        return Outcome(self.run_id, "refused", state, reason)

    def _not_claimed(self, conn: psycopg.Connection[db.Row]) -> Outcome:
        row = db.fetch_one(conn, "runs_get", {"run_id": self.run_id})
        if row is None:
            logger.warning("unknown run", extra={"action": "run_unknown", "run_id": str(self.run_id)})
            return Outcome(self.run_id, "unknown")
        state = RunState(row["state"])
        log = {"run_id": str(self.run_id), "state": state.value, "schedule_id": str(row["schedule_id"])}
        if state is RunState.QUEUED and row["cancel_requested_at"] is not None:
            # Requeued (rescued) while its cancel was pending: finish the cancel instead of running.
            done = trace.change(conn, "runs_cancel_waiting",
                                {"run_id": self.run_id, "owner": None, "requested_only": True,
                                 "diagnosis": Jsonb(diagnose("cancelled"))},
                                [trace.Event(EventType.RUN_CANCELLED, data={"by": "worker"})], now=self.now)
            if done is not None:
                _count("RunCancelled")
                logger.info("run cancelled", extra={"action": "run_cancelled", **log})
                return Outcome(self.run_id, "cancelled", RunState.CANCELLED, "cancelled")
        if state is RunState.QUEUED and row["blocked_by_run_id"] is not None:
            logger.info("run waits behind another", extra={"action": "run_blocked", **log})
            return Outcome(self.run_id, "skipped", state)
        _count("ClaimConflicts")
        logger.info("run not claimable", extra={"action": "claim_conflict", **log})
        return Outcome(self.run_id, "skipped", state)

    # -- execute -----------------------------------------------------------------------------------

    def execute(self) -> Outcome:
        claimed = self.claimed
        assert claimed is not None
        row = claimed.row
        agent: dict[str, Any] = dict(row["agent"] or {})
        step = str(row["first_step"])  # the claim wrote its step.started
        self._check_stop()
        model_call = str(agent.get("executor", "")) in MODEL_EXECUTORS
        if model_call and claimed.model_input.limit is None:
            raise _Failure("agent_invalid", summary="The agent's max_input_tokens is not a positive integer.")
        if model_call and claimed.model_input.too_large:
            raise _Failure("input_too_large")
        request = ExecutionRequest(run_id=str(self.run_id), attempt=claimed.attempt, owner=str(row["owner"]),
                                   agent=agent, transcript=claimed.transcript, prompt=row["prompt"],
                                   payload=row["payload"])
        try:
            executor = self.executor_factory(str(agent.get("executor", "")), settings=self.settings)
            prepared = executor.prepare(request)
        except ExecutorError as error:
            raise _Failure(error.reason_code, retry_safe=error.retry_safe) from error
        remaining = self._remaining()
        if remaining <= 0:
            raise _Failure("runtime_limit")
        with self.database.connection() as conn:  # one statement: its own transaction
            effect = effects.reserve(conn, self.run_id, claimed.fence, claimed.attempt, step, prepared.kind,
                                     prepared.mutation, prepared.url, prepared.digest, now=self.now,
                                     data={"input": claimed.model_input.record} if model_call else None)
            if effect is None:  # the fence moved on, or a cancel was requested: which one decides the end
                current = db.fetch_one(conn, "runs_get", {"run_id": self.run_id})
                if (current is not None and current["state"] == RunState.RUNNING
                        and int(current["fence"]) == claimed.fence and current["cancel_requested_at"] is not None):
                    raise _Cancelled()
                raise _LeaseLost()
        self.open_effect = effect
        self.hooks.fire("after_reserve", run_id=self.run_id, fence=claimed.fence, effect=effect)
        self._check_stop()
        assert self.heartbeat is not None
        # The heartbeat aborts the call when it reads a cancel request or finds the lease lost.
        prepared = dataclasses.replace(prepared, abort=self.heartbeat.abort)
        self.heartbeat.step_started(step)
        started = time.monotonic()
        self.call_started = True
        try:
            reply = executor.send(prepared, timeout=max(0.001, min(remaining, CALL_TIMEOUT_CAP_SECONDS)))
        except ExecutorError as error:
            self.heartbeat.step_finished()
            self.usage = {"calls": 1, "duration_ms": int((time.monotonic() - started) * 1000)}
            return self._call_failed(step, effect, prepared.mutation, error)
        self.heartbeat.step_finished()
        self.usage = _usage(reply, time.monotonic() - started)
        self.hooks.fire("after_send", run_id=self.run_id, fence=claimed.fence, effect=effect)
        return self._publish(step, effect, reply)

    def _publish(self, step: str, effect: effects.Effect, reply: Reply) -> Outcome:
        claimed = self.claimed
        assert claimed is not None
        fence = claimed.fence
        # One update of the run row: the effect's settlement, the answer and the terminal state are
        # traced by the terminal statement itself (kairos.trace.change).
        events: list[trace.Event] = []
        with self.database.transaction() as conn:
            locked = self._lock(conn)
            if effects.settle(conn, effect, fence=fence, usage=self.usage, trace_into=events, now=self.now) is None:
                raise _LeaseLost()
            self.open_effect = None
            if locked["cancel_requested_at"] is not None:
                return self._end_cancelled(conn, events)
            seq = append_entry(conn, self.run_id, fence, claimed.conversation_id, role="assistant",
                               content=reply.content, now=self.now)
            if seq is None:
                raise _LeaseLost()
            events.append(trace.Event(EventType.OUTPUT_PUBLISHED, step, {
                "conversation_id": str(claimed.conversation_id), "entry_seq": seq, "truncated": reply.truncated}))
            events.append(trace.Event(EventType.STEP_FINISHED, step, {"outcome": "succeeded"}))
            self.hooks.fire("before_finish", run_id=self.run_id, fence=fence)
            done = succeed(conn, self.run_id, fence, now=self.now, usage=self.usage, events=events,
                           output={"conversation_id": str(claimed.conversation_id), "entry_seq": seq,
                                   "attempt": claimed.attempt})
            if not done:  # cannot happen while the row is locked; never publish without it
                raise _LeaseLost()
        logger.info("run succeeded", extra={"action": "run_succeeded", "run_id": str(self.run_id),
                                            "attempt": claimed.attempt, "entry_seq": seq})
        return Outcome(self.run_id, "succeeded", RunState.SUCCEEDED)

    def _call_failed(self, step: str, effect: effects.Effect, mutation: bool, error: ExecutorError) -> Outcome:
        claimed = self.claimed
        assert claimed is not None
        fence = claimed.fence
        over_time = self._remaining() <= 0
        reason = "runtime_limit" if over_time and error.reason_code in ("timeout", "ambiguous_effect") else (
            error.reason_code)
        events: list[trace.Event] = []
        with self.database.transaction() as conn:
            locked = self._lock(conn)
            if error.outcome_unknown and mutation:
                closed = effects.mark_ambiguous(conn, effect, fence=fence, error_code=error.reason_code,
                                                trace_into=events, now=self.now)
                if reason != "runtime_limit":
                    reason = "ambiguous_effect"
            else:
                closed = effects.fail(conn, effect, fence=fence, error_code=error.reason_code, trace_into=events,
                                      now=self.now)
            if closed is None:
                raise _LeaseLost()
            self.open_effect = None
            if locked["cancel_requested_at"] is not None:
                return self._end_cancelled(conn, events)
            retry_safe = error.retry_safe and not error.outcome_unknown and not over_time
            return self._end_failed(conn, reason, events, retry_safe=retry_safe)

    # -- endings -----------------------------------------------------------------------------------

    def fail_or_retry(self, failure: _Failure) -> Outcome:
        events: list[trace.Event] = []
        with self.database.transaction() as conn:
            locked = self._lock(conn)
            if self.open_effect is not None:
                self._close_open_effect(conn, failure.reason_code, events)
            if locked["cancel_requested_at"] is not None:
                return self._end_cancelled(conn, events)
            return self._end_failed(conn, failure.reason_code, events, retry_safe=failure.retry_safe,
                                    summary=failure.summary)

    def cancelled(self) -> Outcome:
        events: list[trace.Event] = []
        with self.database.transaction() as conn:
            self._lock(conn)
            if self.open_effect is not None:
                self._close_open_effect(conn, "cancelled", events)
            return self._end_cancelled(conn, events)

    def _close_open_effect(self, conn: psycopg.Connection[db.Row], reason_code: str,
                           events: list[trace.Event]) -> None:
        effect = self.open_effect
        claimed = self.claimed
        assert effect is not None and claimed is not None
        if self.call_started and effect.mutation:
            effects.mark_ambiguous(conn, effect, fence=claimed.fence, error_code=reason_code, trace_into=events,
                                   now=self.now)
        else:
            effects.fail(conn, effect, fence=claimed.fence, error_code=reason_code, trace_into=events, now=self.now)
        self.open_effect = None

    def _end_failed(self, conn: psycopg.Connection[db.Row], reason: str, events: list[trace.Event], *,
                    retry_safe: bool, summary: str | None = None) -> Outcome:
        """Requeues for another attempt when allowed, else fails the run; ``events`` (already
        collected in this transaction) are written by that one statement."""
        claimed = self.claimed
        assert claimed is not None
        fence = claimed.fence
        events = [*events, *self._step_failed(reason)]
        if retry_safe:
            delay = retry_delay(claimed.attempt)
            again = requeue(conn, self.run_id, fence, attempt=claimed.attempt, delay_seconds=delay, events=events,
                            now=self.now)
            if again:
                logger.info("run will retry", extra={"action": "run_retry", "run_id": str(self.run_id),
                                                     "attempt": claimed.attempt, "reason_code": reason,
                                                     "delay_seconds": delay})
                return Outcome(self.run_id, "retry", RunState.QUEUED, reason, delay)
        self.hooks.fire("before_finish", run_id=self.run_id, fence=fence)
        # Retry-safe but out of attempts: a manual retry may still help.
        diagnosis = diagnose(reason, summary=summary, retry_eligible=True if retry_safe else None)
        done = fail(conn, self.run_id, fence, diagnosis=diagnosis, usage=self.usage or None, events=events,
                    now=self.now)
        if not done:
            raise _LeaseLost()
        logger.info("run failed", extra={"action": "run_failed", "run_id": str(self.run_id),
                                         "attempt": claimed.attempt, "reason_code": reason})
        return Outcome(self.run_id, "failed", RunState.FAILED, reason)

    def _end_cancelled(self, conn: psycopg.Connection[db.Row], events: Sequence[trace.Event] = ()) -> Outcome:
        claimed = self.claimed
        assert claimed is not None
        step = self.step
        if step is not None:
            events = [*events, trace.Event(EventType.STEP_FINISHED, step,
                                           {"outcome": "cancelled", "reason_code": "cancelled"})]
        self.hooks.fire("before_finish", run_id=self.run_id, fence=claimed.fence)
        done = finish_cancelled(conn, self.run_id, claimed.fence, usage=self.usage or None, events=events,
                                now=self.now)
        if not done:
            raise _LeaseLost()
        logger.info("run cancelled", extra={"action": "run_cancelled", "run_id": str(self.run_id),
                                            "attempt": claimed.attempt})
        return Outcome(self.run_id, "cancelled", RunState.CANCELLED, "cancelled")

    # -- boundaries --------------------------------------------------------------------------------

    def _lock(self, conn: psycopg.Connection[db.Row]) -> db.Row:
        assert self.claimed is not None
        locked = lock(conn, self.run_id, self.claimed.fence)
        if locked is None:
            raise _LeaseLost()
        return locked

    def _step_failed(self, reason: str) -> list[trace.Event]:
        """``step.finished`` (failed) for the open step, if one is open."""
        if self.step is None:
            return []
        return [trace.Event(EventType.STEP_FINISHED, self.step, {"outcome": "failed", "reason_code": reason})]

    def _check_stop(self) -> None:
        if self.heartbeat is not None:
            if self.heartbeat.lost.is_set():
                raise _LeaseLost()
            if self.heartbeat.cancel_requested.is_set():
                raise _Cancelled()

    def _remaining(self) -> float:
        return self.deadline - self.clock()


def process(
    database: db.Database,
    run_id: UUID,
    *,
    settings: Settings,
    executor_factory: ExecutorFactory | None = None,
    now: datetime | None = None,
    clock: Callable[[], float] = time.monotonic,
    lambda_remaining_ms: Callable[[], int] | None = None,
    hooks: Hooks | None = None,
    heartbeat_interval: float = HEARTBEAT_SECONDS,
) -> Outcome:
    """Claims and executes one run (see the module doc); never raises for the run's own failures.

    Raises only when the database fails (the caller reports the SQS record as failed, and the claim
    guard makes the redelivery safe) or when a hook raises (tests simulating a crash).
    """
    if executor_factory is None:
        from kairos import executors

        executor_factory = executors.get
    hooks = hooks or _NO_HOOKS
    started = clock()
    lambda_deadline: float | None = None
    if lambda_remaining_ms is not None:
        budget = lambda_remaining_ms() / 1000.0 - LAMBDA_MARGIN_SECONDS
        if budget < MIN_CLAIM_BUDGET_SECONDS:
            logger.info("run deferred", extra={"action": "run_deferred", "run_id": str(run_id)})
            return Outcome(run_id, "deferred")
        lambda_deadline = started + budget
    run = _Execution(database, run_id, settings, executor_factory, now, clock, hooks, heartbeat_interval)
    not_claimed = run.claim()
    if not_claimed is not None:
        return not_claimed
    claimed = run.claimed
    assert claimed is not None
    limit = min(int(claimed.row["runtime_limit_seconds"]), RUNTIME_CAP_SECONDS)
    run.deadline = started + limit if lambda_deadline is None else min(started + limit, lambda_deadline)
    heartbeat = Heartbeat(database, run_id, claimed.fence, interval=heartbeat_interval, now=now, hooks=hooks)
    run.heartbeat = heartbeat.start()
    hooks.fire("heartbeat_started", run_id=run_id, fence=claimed.fence, heartbeat=heartbeat)
    try:
        try:
            return run.execute()
        except _Failure as failure:
            return run.fail_or_retry(failure)
        except _Cancelled:
            return run.cancelled()
    except _LeaseLost:
        _count("LeasesLost")
        logger.warning("lease lost; nothing more is written", extra={
            "action": "lease_lost", "run_id": str(run_id), "fence": claimed.fence, "attempt": claimed.attempt})
        return Outcome(run_id, "lease_lost")
    except psycopg.Error:
        # The database is unreachable or refused: leave the run running; its lease expires and the
        # tick's rescuer decides (the effects ledger tells it whether a restart is safe).
        logger.exception("run interrupted by a database error", extra={
            "action": "run_db_error", "run_id": str(run_id), "fence": claimed.fence})
        raise
    except Exception:  # noqa: BLE001 - logged, and the run ends failed with reason "internal"
        logger.exception("run failed by an internal error", extra={
            "action": "run_internal_error", "run_id": str(run_id), "fence": claimed.fence})
        try:
            return run.fail_or_retry(_Failure("internal"))
        except _LeaseLost:
            _count("LeasesLost")
            return Outcome(run_id, "lease_lost")
    finally:
        heartbeat.stop()


def _prompt_entry(run_id: UUID, row: Mapping[str, Any]) -> str:
    """The run's user entry: its prompt, and a reference to the webhook payload kept with the run."""
    prompt = str(row["prompt"])
    if row.get("payload") is None:
        return prompt
    return f"{prompt}\n\n[webhook payload: kept with run {run_id}]"


def _usage(reply: Reply, seconds: float) -> dict[str, Any]:
    usage: dict[str, Any] = {
        k: v for k, v in reply.usage.items() if isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
    }
    usage["calls"] = 1
    usage["duration_ms"] = int(seconds * 1000)
    return usage
