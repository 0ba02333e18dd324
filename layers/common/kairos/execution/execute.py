"""The run worker: ``process`` turns one run id into at most one execution of the run's prompt.

Role: however often a run id is delivered, ``process`` claims the run (``kairos.execution.claim``),
and only a claimed attempt is executed: an ``Execution`` is built from the ``Claimed`` attempt, its
heartbeat and its deadline, prepares the executor's call, reserves its effect, makes the call, and
ends the run — published, failed, requeued for a retry, or cancelled. The SQS adapter
(``kairos.execution.sqs``) calls it once per record.

Guarantees:
* Every write of the running run — events, conversation entries, effects, output, terminal state —
  is guarded by its fence and locks the run row first (``kairos.runs.moves``), so a worker that
  lost its lease (a new claim after a rescue) writes nothing; it learns so from an empty result and
  stops (``lease_lost``).
* No transaction is open during an external call. Before the call an ``effects`` row is reserved
  (committed), after it the row is closed. A mutation whose outcome is unknown ends ``ambiguous``;
  a run with a possibly-applied mutation is never replayed, by a retry or by a re-claim.
* Automatic retries stay on the same run with a new attempt, only for retry-safe failures with no
  external mutation, within ``max_attempts``: the run goes back to ``queued`` under the fence and the
  caller (``kairos.execution.sqs``) re-sends its id with a delay.
* The heartbeat (``kairos.execution.heartbeat``) extends the lease during the call and aborts the call
  in flight on a cancel request or a lost lease.
* A run whose cancel was requested can never publish success (the success statement requires
  ``cancel_requested_at IS NULL``); its worker ends it ``cancelled`` at the next boundary.
* A model input over the agent's limit fails ``input_too_large`` before any call.
* A run's runtime is bounded by ``runtime_limit_seconds`` (its ``limits``, capped by
  ``KAIROS_MAX_RUNTIME_SECONDS`` below the Lambda timeout,
  and by the invocation's remaining time); exceeding it fails the run with ``runtime_limit``.
* Failures end in a closed diagnosis (``kairos.diagnosis``).

Must not: log or trace prompts, completions, payloads, headers or secrets; hold a transaction across
a call; write a running run without its fence; decide anything from SQS or a local clock (the
database owns state and time; the local monotonic clock only bounds this process's own waiting).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from kairos import budgets, db, effects, redact, trace
from kairos.diagnosis import diagnose
from kairos.execution.claim import Claimed, Outcome, claim
from kairos.execution.corpus.phases import execute as execute_corpus
from kairos.execution.heartbeat import HEARTBEAT_SECONDS, Heartbeat
from kairos.execution.live import LiveOutput, Opening
from kairos.execution.stops import Cancelled, Failure, LeaseLost
from kairos.execution.tool_loop import run_loop
from kairos.executors import registry
from kairos.executors.base import (
    DEFAULT_MAX_TOKENS,
    TOOL_EXECUTORS,
    ExecutionRequest,
    Executor,
    ExecutorError,
    PreparedCall,
    Reply,
    max_tokens,
)
from kairos.executors.catalog import MODEL_EXECUTORS
from kairos.observability import logger
from kairos.probes import NO_PROBES, Probes
from kairos.runs import moves
from kairos.runs import steps as run_steps
from kairos.settings import RUNTIME_CAP_SECONDS as RUNTIME_CAP_SECONDS  # Lambda's 900 s less time to fail
from kairos.settings import Settings
from kairos.states import EventType, RunState, Source

# Time kept back from the invocation's remaining time to fail the run cleanly and answer SQS.
LAMBDA_MARGIN_SECONDS = 15.0
# A record with less invocation time than this left is not claimed: SQS delivers it again.
MIN_CLAIM_BUDGET_SECONDS = 30.0
CALL_TIMEOUT_CAP_SECONDS = 300.0

ExecutorFactory = Callable[..., Executor]
# Opens a step's record in the transaction that reserves its effect (``Execution.call``).
BeginStep = Callable[[psycopg.Connection[db.Row], effects.Effect], bool]
# Sends a step's end in the pipeline that settles its effect, given the usage it settles with.
FinishStep = Callable[[psycopg.Connection[db.Row], Mapping[str, Any]], Callable[[], bool]]
# Given a model call's reserved effect: the ``on_text`` that grows its step's preview (``kairos.execution.live``).
Live = Callable[[effects.Effect], LiveOutput]



@dataclass
class Execution:
    """One claimed attempt being executed. Everything it starts from is set when it is built; only
    the effect in flight, whether its call started, and the usage of calls answered but not yet
    settled change as it runs."""

    database: db.Database
    run_id: UUID
    settings: Settings
    executor_factory: ExecutorFactory
    now: datetime | None
    clock: Callable[[], float]
    probes: Probes
    claimed: Claimed
    heartbeat: Heartbeat
    deadline: float
    open_effect: effects.Effect | None = None  # reserved and not yet closed
    call_started: bool = False
    # Each answered call's own usage by its effect's id, until that effect is settled with it
    # (``usage_of``). A run's usage is the sum of its settled effects' (kairos.budgets): nothing here
    # is summed, so an attempt that parks, requeues or vanishes loses nothing it spent.
    answered: dict[UUID, dict[str, Any]] = field(default_factory=dict)
    # The step in flight: None while it is the one the claim opened; a tool loop names the steps it
    # opens, and "" once it has closed one and not opened the next (nothing left to close).
    current_step: str | None = None

    def execute(self) -> Outcome:
        claimed = self.claimed
        row = claimed.row
        agent: dict[str, Any] = dict(row["agent"] or {})
        step = claimed.step  # the claim wrote its step.started
        self.check_stop()
        if row.get("corpus"):  # a corpus run: partitioned child work under this one run (kairos.corpus)
            return execute_corpus(self)
        model_call = str(agent.get("executor", "")) in MODEL_EXECUTORS  # its input is bounded by max_input_tokens
        if model_call and claimed.model_input.limit is None:
            raise Failure("agent_invalid", summary="The agent's max_input_tokens is not a positive integer.")
        if model_call and claimed.model_input.too_large:
            raise Failure("input_too_large")
        request = ExecutionRequest(run_id=str(self.run_id), attempt=claimed.attempt, owner=str(row["owner"]),
                                   agent=agent, transcript=claimed.transcript, prompt=row["prompt"],
                                   payload=row["payload"])
        try:
            executor = self.executor_factory(str(agent.get("executor", "")), settings=self.settings)
            if row.get("loop") and str(agent.get("executor", "")) not in TOOL_EXECUTORS:
                raise Failure("agent_invalid", summary="A loop run needs an agent that can call tools.")
            # A goal loop's run always runs the tool loop: it must end with goal_report (kairos.schedules.loops).
            if (agent.get("tools") or row.get("loop")) and str(agent.get("executor", "")) in TOOL_EXECUTORS:
                return run_loop(self, executor, request)
            prepared = executor.prepare(request)
        except ExecutorError as error:
            raise Failure(error.reason_code, retry_safe=error.retry_safe) from error
        if prepared.mutation and row["source"] == Source.TEST:  # a test run sends no mutation, ever
            raise Failure("agent_invalid", summary="A test run does not send this agent's request: it is an "
                                                   "external change. Test runs call models and record tool calls.")
        model = str(agent.get("model") or agent.get("executor"))
        sent = self.call(executor.send, prepared, step,
                         data={"input": claimed.model_input.record} if model_call else None,
                         live=_live_step(self, prepared, model, step) if model_call and agent.get("stream") is not False
                         else None)
        if isinstance(sent, Outcome):
            return sent
        # A model's answer is the run's one step, recorded with its previews as the answer is published.
        finish = _model_step(self, prepared, model, *sent) if model_call else None
        return self.publish(step, *sent, finish_step=finish)

    def call(self, send: Callable[..., Reply], prepared: PreparedCall, step: str, *,
             data: dict[str, Any] | None = None, begin: BeginStep | None = None, live: Live | None = None,
             ) -> tuple[effects.Effect, Reply] | Outcome:
        """Reserves the call's effect (with ``begin``, a step's record, in one transaction), makes the
        call under the heartbeat's abort (with ``live``: ``kairos.execution.live``) and answers the open
        effect with the reply; a failed call ends the run here (its Outcome)."""
        claimed = self.claimed
        agent: dict[str, Any] = dict(claimed.row["agent"] or {})
        self.call_started = False
        remaining = self.remaining()
        if remaining <= 0:
            raise Failure("runtime_limit")
        # One statement on an autocommit connection: the effect and, for a model call, its budget
        # charge commit together, in one round trip (effects_reserve_charged); ``begin`` joins them.
        opened = self.database.transaction() if begin is not None else self.database.connection()
        with opened as conn:
            if prepared.kind == "model_call":
                # A tool loop's later turns carry more than the claim's window: estimate from what is sent.
                estimate = max(int(claimed.model_input.record["estimated_tokens"]), len(prepared.body) // 4)
                charge = budgets.charge(run_id=self.run_id, model=agent.get("model"), input_tokens=estimate,
                                        max_output_tokens=_output_tokens(agent), settings=self.settings)
                authorized, effect = effects.reserve_charged(
                    conn, self.run_id, claimed.fence, claimed.attempt, step, prepared.kind, prepared.mutation,
                    prepared.url, prepared.digest, effect_id=uuid.uuid4(), charge=charge, data=data, now=self.now)
                if authorized and effect is None:
                    self._budget_exhausted(agent, estimate)  # raises: nothing was reserved or charged
            else:
                effect = effects.reserve(conn, self.run_id, claimed.fence, claimed.attempt, step, prepared.kind,
                                         prepared.mutation, prepared.url, prepared.digest, now=self.now, data=data)
            if effect is None:  # the fence moved on, or a cancel was requested: which one decides the end
                current = db.fetch_one(conn, "runs_get", {"run_id": self.run_id})
                if (current is not None and current["state"] == RunState.RUNNING
                        and int(current["fence"]) == claimed.fence and current["cancel_requested_at"] is not None):
                    raise Cancelled()
                raise LeaseLost()
            if begin is not None and not begin(conn, effect):
                raise LeaseLost()
        self.open_effect = effect
        self.probes.fire("after_reserve", run_id=self.run_id, fence=claimed.fence, effect=effect)
        self.check_stop()
        # The heartbeat aborts the call when it reads a cancel request or finds the lease lost.
        prepared = dataclasses.replace(prepared, abort=self.heartbeat.abort, on_text=live and live(effect))
        self.heartbeat.step_started(step)
        started = time.monotonic()
        self.call_started = True
        try:
            reply = send(prepared, timeout=max(0.001, min(remaining, CALL_TIMEOUT_CAP_SECONDS)))
        except ExecutorError as error:  # no answer: nothing used (its reservation is given back) ...
            self.heartbeat.step_finished()
            if error.usage is not None and prepared.kind == "model_call":  # ... unless one came, refused
                self.answered[effect.id] = budgets.priced(
                    _counted(error.usage, time.monotonic() - started), agent.get("model"), self.settings)
            return self._call_failed(step, effect, prepared.mutation, error)
        self.heartbeat.step_finished()
        seconds = time.monotonic() - started
        self.answered[effect.id] = (
            budgets.priced(_usage(reply, seconds), agent.get("model"), self.settings) if prepared.kind == "model_call"
            else {"steps": 1, "duration_ms": int(seconds * 1000)})
        self.probes.fire("after_send", run_id=self.run_id, fence=claimed.fence, effect=effect)
        return effect, reply

    def live_output(self, n: int, step: str, secrets: Iterable[str], *,
                    opening: Opening | None = None) -> LiveOutput:
        """The ``on_text`` of model step ``n`` (trace step ``step``) of this attempt (``kairos.execution.live``)."""
        return LiveOutput(self.database, self.run_id, self.claimed.fence, n, step, heartbeat=self.heartbeat,
                          secrets=secrets, opening=opening, now=self.now, clock=self.clock)

    def usage_of(self, effect: effects.Effect) -> dict[str, Any]:
        """The usage ``effect`` is settled with: its call's own (``kairos.budgets.priced`` for a model
        call), empty for an effect that made no call through ``call``."""
        return self.answered.pop(effect.id, {})

    def _budget_exhausted(self, agent: dict[str, Any], input_tokens: int) -> None:
        logger.info("daily budget exhausted", extra={"action": "budget_exhausted", "run_id": str(self.run_id),
                                                     "estimated_tokens": input_tokens + _output_tokens(agent)})
        raise Failure("budget_exhausted")

    def publish(self, step: str, effect: effects.Effect, reply: Reply, *,
                finish_step: FinishStep | None = None) -> Outcome:
        """Publishes ``reply`` and ends the run succeeded; ``finish_step`` (the answering model step's
        record: ``kairos.runs.steps.send_finish`` with ``answered``, given the call's usage) is sent in the
        same transaction."""
        claimed = self.claimed
        fence = claimed.fence
        usage = self.usage_of(effect)
        self.probes.fire("before_finish", run_id=self.run_id, fence=fence)
        # One round trip: the run's and then the conversation's lock (which reads the cancel request),
        # then one statement that writes the answer entry, settles the effect, ends the run and traces
        # all four events — each part only behind the one before it and only while no cancel is
        # requested (runs_publish); a step record goes between them (written only while no cancel is
        # requested either). Without one, the two statements are the pipeline's implicit transaction
        # (Database.trip: its one prefix, the locks alone, is whole); with one, BEGIN and COMMIT travel
        # in the same trip. The settlement updates a stripe of the owner's day in the budget ledger (its
        # trigger, at commit), which other model calls of the owner may wait for: held within the trip.
        def send_publish(conn: psycopg.Connection[db.Row]) -> Callable[[], int | None]:
            return moves.send_publish(conn, self.run_id, fence, claimed.conversation_id, content=reply.content,
                                      effect_id=effect.id, usage=usage, step=step, truncated=reply.truncated,
                                      now=self.now)

        with self.database.explicit() as conn:
            if finish_step is None:
                with self.database.trip(conn):
                    read_lock = moves.send_lock_conversation(conn, self.run_id, fence, claimed.conversation_id)
                    read_seq = send_publish(conn)
                finished: Callable[[], bool] | None = None
            else:
                with self.database.batch(conn):
                    db.begin(conn)
                    read_lock = moves.send_lock_conversation(conn, self.run_id, fence, claimed.conversation_id)
                    finished = finish_step(conn, usage)
                    read_seq = send_publish(conn)
                    db.commit(conn)
            locked = read_lock()
            if locked is None:
                raise LeaseLost()
            seq = read_seq()
            step_finished = finished is None or finished()
        if locked["cancel_requested_at"] is not None:  # nothing was written: end it cancelled instead
            return self._cancelled_with_answer(effect, usage)
        # Cannot fail while the row is locked under the fence with no cancel request.
        if seq is None or not step_finished:
            raise LeaseLost()
        self.open_effect = None
        logger.info("run succeeded", extra={"action": "run_succeeded", "run_id": str(self.run_id),
                                            "attempt": claimed.attempt, "entry_seq": seq})
        return Outcome(self.run_id, "succeeded", RunState.SUCCEEDED)

    def _cancelled_with_answer(self, effect: effects.Effect, usage: Mapping[str, Any]) -> Outcome:
        """A cancel requested while the call answered: the answer is not published; its effect settles
        with the call's usage (it was spent) and the run ends cancelled, in one transaction."""
        events: list[trace.Event] = []
        with self.database.transaction() as conn:
            self.lock(conn)
            if effects.settle(conn, effect, fence=self.claimed.fence, usage=usage, trace_into=events,
                              now=self.now) is None:
                raise LeaseLost()
            self.open_effect = None
            return self._end_cancelled(conn, events)

    def _call_failed(self, step: str, effect: effects.Effect, mutation: bool, error: ExecutorError) -> Outcome:
        claimed = self.claimed
        fence = claimed.fence
        over_time = self.remaining() <= 0
        reason = "runtime_limit" if over_time and error.reason_code in ("timeout", "ambiguous_effect") else (
            error.reason_code)
        events: list[trace.Event] = []
        with self.database.transaction() as conn:
            locked = self.lock(conn)
            if error.outcome_unknown and mutation:
                closed = effects.mark_ambiguous(conn, effect, fence=fence, error_code=error.reason_code,
                                                trace_into=events, now=self.now)
                if reason != "runtime_limit":
                    reason = "ambiguous_effect"
            elif effect.id in self.answered:  # the model answered (billed), its reply refused: counted
                closed = effects.settle(conn, effect, fence=fence, usage=self.usage_of(effect),
                                        error_code=error.reason_code, trace_into=events, now=self.now)
            else:
                closed = effects.fail(conn, effect, fence=fence, error_code=error.reason_code, trace_into=events,
                                      now=self.now)
            if closed is None:
                raise LeaseLost()
            self.open_effect = None
            if locked["cancel_requested_at"] is not None:
                return self._end_cancelled(conn, events)
            retry_safe = error.retry_safe and not error.outcome_unknown and not over_time
            return self._end_failed(conn, reason, events, retry_safe=retry_safe)

    # -- endings -----------------------------------------------------------------------------------

    def fail_or_retry(self, failure: Failure) -> Outcome:
        events: list[trace.Event] = []
        with self.database.transaction() as conn:
            locked = self.lock(conn)
            if self.open_effect is not None:
                self._close_open_effect(conn, self.open_effect, failure.reason_code, events)
            if locked["cancel_requested_at"] is not None:
                return self._end_cancelled(conn, events)
            return self._end_failed(conn, failure.reason_code, events, retry_safe=failure.retry_safe,
                                    summary=failure.summary)

    def cancelled(self) -> Outcome:
        events: list[trace.Event] = []
        with self.database.transaction() as conn:
            self.lock(conn)
            if self.open_effect is not None:
                self._close_open_effect(conn, self.open_effect, "cancelled", events)
            return self._end_cancelled(conn, events)

    def _close_open_effect(self, conn: psycopg.Connection[db.Row], effect: effects.Effect, reason_code: str,
                           events: list[trace.Event]) -> None:
        claimed = self.claimed
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
        fence = claimed.fence
        events = [*events, *self._step_failed(reason)]
        run_steps.close_open(conn, self.run_id, fence, now=self.now)
        if retry_safe:
            delay = moves.retry_delay(claimed.attempt)
            again = moves.requeue(conn, self.run_id, fence, attempt=claimed.attempt, delay_seconds=delay,
                                  events=events, now=self.now)
            if again:
                logger.info("run will retry", extra={"action": "run_retry", "run_id": str(self.run_id),
                                                     "attempt": claimed.attempt, "reason_code": reason,
                                                     "delay_seconds": delay})
                return Outcome(self.run_id, "retry", RunState.QUEUED, reason, delay)
        self.probes.fire("before_finish", run_id=self.run_id, fence=fence)
        # Retry-safe but out of attempts: a manual retry may still help.
        diagnosis = diagnose(reason, summary=summary, retry_eligible=True if retry_safe else None)
        done = moves.fail(conn, self.run_id, fence, diagnosis=diagnosis, events=events, now=self.now)
        if not done:
            raise LeaseLost()
        logger.info("run failed", extra={"action": "run_failed", "run_id": str(self.run_id),
                                         "attempt": claimed.attempt, "reason_code": reason})
        return Outcome(self.run_id, "failed", RunState.FAILED, reason)

    def _end_cancelled(self, conn: psycopg.Connection[db.Row], events: Sequence[trace.Event] = ()) -> Outcome:
        claimed = self.claimed
        events = [*events, *self._close_step({"outcome": "cancelled", "reason_code": "cancelled"})]
        run_steps.close_open(conn, self.run_id, claimed.fence, now=self.now)
        self.probes.fire("before_finish", run_id=self.run_id, fence=claimed.fence)
        done = moves.finish_cancelled(conn, self.run_id, claimed.fence, events=events, now=self.now)
        if not done:
            raise LeaseLost()
        logger.info("run cancelled", extra={"action": "run_cancelled", "run_id": str(self.run_id),
                                            "attempt": claimed.attempt})
        return Outcome(self.run_id, "cancelled", RunState.CANCELLED, "cancelled")

    # -- boundaries --------------------------------------------------------------------------------

    def lock(self, conn: psycopg.Connection[db.Row]) -> db.Row:
        locked = moves.lock(conn, self.run_id, self.claimed.fence)
        if locked is None:
            raise LeaseLost()
        return locked

    def _step_failed(self, reason: str) -> list[trace.Event]:
        """``step.finished`` (failed) for the step in flight."""
        return self._close_step({"outcome": "failed", "reason_code": reason})

    def _close_step(self, data: dict[str, Any]) -> list[trace.Event]:
        """``step.finished`` for the step in flight, if one is open."""
        if self.current_step == "":
            return []
        return [trace.Event(EventType.STEP_FINISHED, self.current_step or self.claimed.step, data)]

    def check_stop(self) -> None:
        """Raises ``LeaseLost`` / ``Cancelled`` when the heartbeat saw the lease lost or a cancel requested."""
        if self.heartbeat.lost.is_set():
            raise LeaseLost()
        if self.heartbeat.cancel_requested.is_set():
            raise Cancelled()

    def remaining(self) -> float:
        """Seconds left before this attempt's deadline (the runtime limit or the invocation's time)."""
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
    probes: Probes | None = None,
    heartbeat_interval: float = HEARTBEAT_SECONDS,
) -> Outcome:
    """Claims and executes one run (see the module doc); never raises for the run's own failures.

    Raises only when the database fails (the caller reports the SQS record as failed, and the claim
    guard makes the redelivery safe) or when a probe raises (tests simulating a crash; ``kairos.probes``).
    """
    if executor_factory is None:

        executor_factory = registry.get
    probes = probes or NO_PROBES
    started = clock()
    lambda_deadline: float | None = None
    if lambda_remaining_ms is not None:
        budget = lambda_remaining_ms() / 1000.0 - LAMBDA_MARGIN_SECONDS
        if budget < MIN_CLAIM_BUDGET_SECONDS:
            logger.info("run deferred", extra={"action": "run_deferred", "run_id": str(run_id)})
            return Outcome(run_id, "deferred")
        lambda_deadline = started + budget
    claimed = claim(database, run_id, now=now, probes=probes, owner_slots=settings.owner_concurrency)
    if isinstance(claimed, Outcome):
        return claimed
    # The run's limit (kairos.limits: recorded with the run), never above the cap in force now.
    limit = min(int(claimed.row["runtime_limit_seconds"]), settings.max_runtime_seconds, RUNTIME_CAP_SECONDS)
    deadline = started + limit if lambda_deadline is None else min(started + limit, lambda_deadline)
    heartbeat = Heartbeat(database, run_id, claimed.fence, interval=heartbeat_interval, now=now, clock=clock,
                          probes=probes)
    run = Execution(database, run_id, settings, executor_factory, now, clock, probes, claimed, heartbeat.start(),
                    deadline)
    probes.fire("heartbeat_started", run_id=run_id, fence=claimed.fence, heartbeat=heartbeat)
    try:
        return _run(run)
    finally:
        heartbeat.stop()


def _run(run: Execution) -> Outcome:
    """Executes the claimed run and ends it; a lost lease writes nothing more, a database error
    raises (the run stays running until its lease expires), any other error fails it ``internal``."""
    run_id, fence = run.run_id, run.claimed.fence
    try:
        try:
            return run.execute()
        except Failure as failure:
            return run.fail_or_retry(failure)
        except Cancelled:
            return run.cancelled()
    except LeaseLost:
        moves.count("LeasesLost")
        logger.warning("lease lost; nothing more is written", extra={
            "action": "lease_lost", "run_id": str(run_id), "fence": fence, "attempt": run.claimed.attempt})
        return Outcome(run_id, "lease_lost")
    except psycopg.Error:
        # The database is unreachable or refused: leave the run running; its lease expires and the
        # tick's rescuer decides (the effects ledger tells it whether a restart is safe).
        logger.exception("run interrupted by a database error", extra={
            "action": "run_db_error", "run_id": str(run_id), "fence": fence})
        raise
    except Exception:  # noqa: BLE001 - logged, and the run ends failed with reason "internal"
        logger.exception("run failed by an internal error", extra={
            "action": "run_internal_error", "run_id": str(run_id), "fence": fence})
        try:
            return run.fail_or_retry(Failure("internal"))
        except LeaseLost:
            moves.count("LeasesLost")
            return Outcome(run_id, "lease_lost")


def _live_step(run: Execution, prepared: PreparedCall, model: str, step: str) -> Live:
    """The live output of a run's single model call: step 1, opened at its first preview (a call that
    does not stream writes its step only with the answer, ``_model_step``)."""
    secrets = redact.secrets_of(prepared.headers)

    def live(effect: effects.Effect) -> LiveOutput:
        def opening(conn: psycopg.Connection[db.Row]) -> bool:
            return run_steps.begin(
                conn, run.run_id, run.claimed.fence, n=1, kind="model", name=model,
                input=run_steps.preview(run_steps.model_input(prepared.body), secrets),
                target=run_steps.target(prepared.method, prepared.url, secrets), effect_id=effect.id,
                now=effect.created_at)

        return run.live_output(1, step, secrets, opening=opening)

    return live


def _model_step(run: Execution, prepared: PreparedCall, model: str, effect: effects.Effect,
                reply: Reply) -> FinishStep:
    """The single model call of a run without tools as step 1 (``kairos.runs.steps``), redacted and bounded."""
    secrets = redact.secrets_of(prepared.headers)
    input_preview = run_steps.preview(run_steps.model_input(prepared.body), secrets)
    output = run_steps.preview({"content": reply.content, "tool_calls": []}, secrets)
    target = run_steps.target(prepared.method, prepared.url, secrets)
    record = {"content": redact.redact(reply.content, secrets), "tool_calls": []}
    return lambda conn, usage: run_steps.send_finish(
        conn, run.run_id, run.claimed.fence, n=1, kind="model", name=model, record=record, input=input_preview,
        output=output, target=target, usage=dict(usage), effect_id=effect.id, now=run.now, answered=True)


def _output_tokens(agent: dict[str, Any]) -> int:
    try:
        return max_tokens(agent)
    except ExecutorError:
        return DEFAULT_MAX_TOKENS


def _usage(reply: Reply, seconds: float) -> dict[str, Any]:
    return _counted(reply.usage, seconds)


def _counted(counts: Mapping[str, Any], seconds: float) -> dict[str, Any]:
    """One answered call's usage: the provider's integer counts, ``calls`` 1 and its duration."""
    usage: dict[str, Any] = {
        k: v for k, v in counts.items() if isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
    }
    usage["calls"] = 1
    usage["duration_ms"] = int(seconds * 1000)
    return usage
