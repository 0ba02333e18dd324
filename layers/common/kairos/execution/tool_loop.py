"""The tool loop: an ``openai`` or ``bedrock`` agent with ``tools`` answers in bounded steps.

Role: ``run_loop`` drives one claimed attempt. It folds the run's step log (``kairos.execution.steps``),
answers the tool calls of the last model turn that no step answered yet, then asks the model again
with every earlier turn, until the model answers without tools (published like any run) or
``max_steps`` model turns were made (the run fails ``step_limit``). Each model turn and each tool call
is an effect under the run's fence (``Execution.call``), and each completed one is recorded in the
step log in the transaction that settles its effect, so an attempt after an approval, a rescue or a
retry never calls a completed step again.

Tool calls (``kairos.tools``): a call the agent's ``approval`` policy gates parks the run
(``kairos.approvals.request``: ``awaiting_approval``, lease cleared) and this attempt ends; the
attempt after an approval applies exactly the approved call, once (``approvals.consume`` in the
transaction that records its result; a call whose arguments no longer match its approval fails
``approved_call_not_applied``). A ``schedules_*`` call runs in the transaction that records it; an
``http_post`` call is sent like an executor's mutation (an unknown outcome leaves its effect
``ambiguous`` and the run is never replayed). In a test run (source ``test``) no mutation is done:
each is recorded ``not_sent_test`` with its would-be arguments and answered to the model as not sent.

Goal loops (``kairos.schedules.loops``): a loop run is offered ``goal_report`` besides its agent's tools and reads
its revision's goal in its system prompt; its ``goal_report`` calls are handled by ``_goal_step``
(``kairos.execution.goal_report``: a ``needs_input`` parks the run ``awaiting_input``, lease cleared; the attempt
after the owner's answer records the answer as that call's result and asks the model again; the other
dispositions end the run). A loop run whose model answers without it fails ``goal_report_missing``.

Trace: the claim opened the attempt's first step (``model``); a step after it opens its own
(``model:<n>`` or ``tool:<n>``) and closes it when recorded; an attempt that resumes with a tool call
closes the claim's step as ``folded``.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, Protocol

import psycopg

from kairos import approvals, db, effects, input_requests, redact, tools, trace
from kairos.execution import goal_report, steps
from kairos.execution.claim import Claimed, Outcome
from kairos.execution.live import LiveOutput, Opening
from kairos.execution.stops import Cancelled, Failure, LeaseLost
from kairos.executors.base import (
    MAX_STEPS_DEFAULT,
    ExecutionRequest,
    Executor,
    ExecutorError,
    ModelTurn,
    PreparedCall,
    Reply,
    ToolCall,
    ToolResult,
    canonical_json,
    digest,
    recorded_target,
)
from kairos.runs import moves
from kairos.runs import steps as run_steps
from kairos.settings import Settings
from kairos.states import EventType, RunState, Source, StepState


class Execution(Protocol):
    """What the loop needs of the worker's execution (``kairos.execution.execute.Execution``)."""

    database: db.Database
    run_id: uuid.UUID
    settings: Settings
    now: datetime | None
    claimed: Claimed
    open_effect: effects.Effect | None
    current_step: str | None

    def call(self, send: Callable[..., Reply], prepared: PreparedCall, step: str, *,
             data: dict[str, Any] | None = None,
             begin: Callable[[psycopg.Connection[db.Row], effects.Effect], bool] | None = None,
             live: Callable[[effects.Effect], LiveOutput] | None = None,
             ) -> tuple[effects.Effect, Reply] | Outcome: ...

    def live_output(self, n: int, step: str, secrets: Iterable[str], *,
                    opening: Opening | None = None) -> LiveOutput: ...

    def publish(self, step: str, effect: effects.Effect, reply: Reply, *,
                finish_step: Callable[[psycopg.Connection[db.Row], Mapping[str, Any]], Callable[[], bool]] | None
                = None) -> Outcome: ...

    def usage_of(self, effect: effects.Effect) -> dict[str, Any]: ...

    def lock(self, conn: psycopg.Connection[db.Row]) -> db.Row: ...


def _max_steps(run: Execution, agent: Mapping[str, Any]) -> int:
    """The run's max_steps (kairos.limits: recorded with the run), never above the cap in force now."""
    recorded = run.claimed.row.get("max_steps") or agent.get("max_steps") or MAX_STEPS_DEFAULT
    return min(int(recorded), run.settings.max_steps)


def run_loop(run: Execution, executor: Executor, request: ExecutionRequest) -> Outcome:

    row = run.claimed.row
    agent = request.agent
    context = tools.Context(run.run_id, str(row["owner"]), str(row["source"]), row["source_conversation_id"])
    limit = _max_steps(run, agent)
    specs = tools.specs(agent)
    goal: goal_report.Goal | None = None
    with run.database.connection() as conn:
        # Steps an earlier attempt left running (it was lost) end first: failed, or ambiguous with their effect.
        run_steps.close_open(conn, run.run_id, run.claimed.fence, now=run.now)
        rows = steps.load(conn, run.run_id)
        if row.get("loop"):
            goal = goal_report.goal_of(conn, run.run_id)
    if row.get("loop"):
        if goal is None:  # a loop run always has its revision's goal; refuse to run without one
            raise Failure("agent_invalid", summary="The loop run's goal could not be read.")
        # The goal travels in the system prompt; goal_report is offered whatever the agent's tools.
        system = str(agent.get("system") or "")
        request = dataclasses.replace(request, agent={
            **agent, "system": f"{system}\n\n{goal_report.instructions(goal.envelope)}".strip()})
        specs = (*specs, goal_report.SPEC)
    request = dataclasses.replace(request, tools=specs)
    log = steps.completed(rows)
    parked = steps.parked(rows)  # a call parked for approval keeps its step number
    number = steps.next_number(rows)
    model = str(agent.get("model") or "model")
    # The secret values this run resolved (the model call's headers), redacted out of what is stored.
    secrets: set[str] = set()
    fresh = True  # the step the claim opened is still open and unused
    while True:
        pending = steps.unanswered(log)
        if pending:
            if not secrets:
                secrets |= _secrets(executor, dataclasses.replace(request, turns=steps.fold(log)))
            opening = [trace.Event(EventType.STEP_FINISHED, run.claimed.step,
                                   {"outcome": "folded", "steps": len(log)})] if fresh else []
            fresh = False
            n = parked.pop(pending[0].id, number)
            number = max(number, n + 1)
            if goal is not None and pending[0].name == goal_report.NAME:
                ended = _goal_step(run, goal, pending[0], n, opening, frozenset(secrets))
            else:
                ended = _tool_step(run, agent, context, pending[0], n, opening, frozenset(secrets))
            if isinstance(ended, Outcome):
                return ended
            log.append(ended)
            continue
        if steps.model_turns(log) >= limit:
            raise Failure("step_limit")
        n, number = number, number + 1
        name = run.claimed.step if fresh else f"model:{n}"
        if not fresh:
            _open(run, name, {"step": n})
        fresh = False
        ended = _model_step(run, executor, dataclasses.replace(request, turns=steps.fold(log)), n, name, model,
                            secrets, looped=goal is not None)
        if isinstance(ended, Outcome):
            return ended
        log.append(ended)


def _model_step(run: Execution, executor: Executor, request: ExecutionRequest, n: int, name: str, model: str,
                secrets: set[str], *, looped: bool) -> steps.Step | Outcome:
    """One model turn: its step opened with its effect, the call, and the step recorded (a turn that
    asked for tools) or the answer published with the step ended (the run's end)."""
    try:
        prepared = executor.prepare(request)
    except ExecutorError as error:
        raise Failure(error.reason_code, retry_safe=error.retry_safe) from error
    secrets |= redact.secrets_of(prepared.headers)
    known = frozenset(secrets)
    opened = _begin(run, n, "model", model, None, run_steps.preview(run_steps.model_input(prepared.body), known),
                    run_steps.target(prepared.method, prepared.url, known))
    follow = request.agent.get("stream") is not False  # the agent may say not to stream (kairos.agents)
    sent = run.call(executor.send, prepared, name, begin=opened,
                    live=(lambda _: run.live_output(n, name, known)) if follow else None)
    if isinstance(sent, Outcome):
        return sent
    effect, reply = sent
    answer = run_steps.preview({"content": reply.content, "tool_calls": [
        {"id": c.id, "name": c.name, "arguments": c.arguments} for c in reply.tool_calls]}, known)
    step = steps.Step(n, "model", model, None, steps.model_record(ModelTurn(reply.content, reply.tool_calls)))
    if not reply.tool_calls and looped:
        # A loop run must end with goal_report: the answer is recorded, the run fails.
        _record(run, effect, name, step, output=answer, secrets=known)
        raise Failure("goal_report_missing")
    if not reply.tool_calls:
        return run.publish(name, effect, reply,
                           finish_step=_finish(run, n, model, steps.stored(step, known), answer, effect))
    _record(run, effect, name, step, output=answer, secrets=known)
    return step


def _finish(run: Execution, n: int, model: str, record: dict[str, Any], output: Any, effect: effects.Effect,
            ) -> Callable[[psycopg.Connection[db.Row], Mapping[str, Any]], Callable[[], bool]]:
    """Ends the answering model step in the pipeline that publishes the answer (``Execution.publish``)."""
    return lambda conn, usage: run_steps.send_finish(
        conn, run.run_id, run.claimed.fence, n=n, kind="model", name=model, record=record, output=output,
        usage=dict(usage), effect_id=effect.id, now=run.now, answered=True)


def _secrets(executor: Executor, request: ExecutionRequest) -> set[str]:
    """The secret values the model call would resolve (its prepared headers; nothing is sent)."""
    try:
        return set(redact.secrets_of(executor.prepare(request).headers))
    except ExecutorError as error:
        raise Failure(error.reason_code, retry_safe=error.retry_safe) from error


def _parsed(text: str) -> Any:
    """A tool's JSON answer as a value (text that is not JSON as itself)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _begin(run: Execution, n: int, kind: str, name: str, call_id: str | None, input: Any,
           target: Any) -> Callable[[psycopg.Connection[db.Row], effects.Effect], bool]:
    """Opens step ``n`` in the transaction that reserves its effect (``Execution.call``)."""
    return lambda conn, effect: run_steps.begin(conn, run.run_id, run.claimed.fence, n=n, kind=kind, name=name,
                                                call_id=call_id, input=input, target=target, effect_id=effect.id,
                                                now=run.now)


def _open(run: Execution, name: str, data: dict[str, Any], before: list[trace.Event] | None = None) -> None:
    """Opens step ``name`` (after closing what ``before`` closes); the worker's failure paths close it."""

    run.current_step = name
    with run.database.transaction() as conn:
        moved = trace.change(conn, "runs_step_events", {"run_id": run.run_id, "fence": run.claimed.fence},
                             [*(before or []), trace.Event(EventType.STEP_STARTED, name, data)], now=run.now)
        if moved is None:
            raise LeaseLost()


def _record(run: Execution, effect: effects.Effect | None, name: str, step: steps.Step, *,
            approval_id: Any = None, conn: Any = None, events: list[trace.Event] | None = None,
            output: Any = None, input: Any = None, target: Any = None, secrets: frozenset[str] = frozenset(),
            state: StepState = StepState.SUCCEEDED, effect_id: Any = None) -> None:
    """Settles the step's effect with its call's usage (a tool step's counts one of ``tool_calls``),
    records the step with its previews and usage and closes it, in one transaction (or the caller's)."""

    def write(c: Any) -> None:
        collected = list(events or [])
        usage: dict[str, Any] | None = None
        if effect is not None:
            usage = run.usage_of(effect)
            if step.kind == "tool":
                usage = {**usage, "tool_calls": 1, "steps": 1}
            if effects.settle(c, effect, fence=run.claimed.fence, usage=usage, trace_into=collected,
                              now=run.now) is None:
                raise LeaseLost()
            run.open_effect = None
        if approval_id is not None and not approvals.consume(c, approval_id, now=run.now):
            raise Failure("approved_call_not_applied")
        if not steps.record(c, run.run_id, run.claimed.fence, step, secrets=secrets, output=output, input=input,
                            target=target, usage=usage, effect_id=effect_id if effect is None else effect.id,
                            state=state, now=run.now):
            raise LeaseLost()
        collected.append(trace.Event(EventType.STEP_FINISHED, name, {"outcome": "succeeded", "step": step.n}))
        if trace.change(c, "runs_step_events", {"run_id": run.run_id, "fence": run.claimed.fence}, collected,
                        now=run.now) is None:
            raise LeaseLost()
        run.current_step = ""  # closed: a failure before the next step opens closes nothing

    if conn is not None:
        write(conn)
        return
    with run.database.transaction() as c:
        run.lock(c)
        write(c)


def _tool_step(run: Execution, agent: dict[str, Any], context: tools.Context, call: ToolCall, n: int,
               opening: list[trace.Event], secrets: frozenset[str]) -> steps.Step | Outcome:

    name = f"tool:{n}"
    arguments = run_steps.preview(call.arguments, secrets)
    refused = tools.allowed(call, agent)
    approval_id = None
    if refused is None and call.name in tools.MUTATIONS and run.claimed.row["source"] == Source.TEST:
        if call.name == "http_post":  # a URL the egress check refuses is refused as in a real run
            checked = tools.prepare_http(call, allow=run.settings.egress_allow)
            if not isinstance(checked, PreparedCall):
                _open(run, name, {"step": n, "tool": call.name}, before=opening)
                step = steps.Step(n, "tool", call.name, call.id, steps.tool_record(checked))
                _record(run, None, name, step, input=arguments, secrets=secrets,
                        output=run_steps.preview(_parsed(checked.content), secrets))
                return step
        return _not_sent(run, call, n, name, opening, arguments, secrets)
    if refused is None and tools.needs_approval(agent, call.name):
        with run.database.connection() as conn:
            asked = approvals.for_call(conn, run.run_id, n, call.id)
        if asked is None:
            return _park(run, call, n, name, opening, arguments, secrets)
        if asked["state"] != "approved" or asked["args_digest"] != tools.args_digest(call):
            raise Failure("approved_call_not_applied")
        approval_id = asked["id"]
    _open(run, name, {"step": n, "tool": call.name}, before=opening)
    if refused is not None:
        step = steps.Step(n, "tool", call.name, call.id, steps.tool_record(refused))
        _record(run, None, name, step, input=arguments,
                output=run_steps.preview(_parsed(refused.content), secrets), secrets=secrets)
        return step
    if call.name in tools.LOCAL:
        return _local(run, call, context, n, name, approval_id, arguments, secrets)
    prepared = tools.prepare_http(call, allow=run.settings.egress_allow)
    if not isinstance(prepared, PreparedCall):
        step = steps.Step(n, "tool", call.name, call.id, steps.tool_record(prepared))
        _record(run, None, name, step, approval_id=approval_id, input=arguments,
                output=run_steps.preview(_parsed(prepared.content), secrets), secrets=secrets)
        return step
    sent = run.call(_http_send, prepared, name, begin=_begin(
        run, n, "tool", call.name, call.id, arguments, run_steps.target(prepared.method, prepared.url, secrets)))
    if isinstance(sent, Outcome):
        return sent
    effect, reply = sent
    answer = json.loads(reply.content)
    result = tools.http_result(call, int(answer["status"]), str(answer["body"]).encode("utf-8"))
    step = steps.Step(n, "tool", call.name, call.id, steps.tool_record(result))
    # The preview shows the whole answer as read (up to the read limit), cut to its bound with its digest.
    _record(run, effect, name, step, approval_id=approval_id,
            output=run_steps.preview({"status": answer["status"], "body": _parsed(answer["body"])}, secrets),
            secrets=secrets)
    return step


def _http_send(prepared: PreparedCall, *, timeout: float) -> Reply:
    # The whole body read (at most READ_LIMIT): the model gets http_result's cut, the step's preview its own.
    status, body = tools.send_http(prepared, timeout=timeout)
    return Reply(content=json.dumps({"status": status, "body": body.decode("utf-8", errors="replace")}))


def _local(run: Execution, call: ToolCall, context: tools.Context, n: int, name: str, approval_id: Any,
           arguments: Any, secrets: frozenset[str]) -> steps.Step:

    with run.database.transaction() as conn:
        locked = run.lock(conn)
        if locked["cancel_requested_at"] is not None:
            raise Cancelled()
        body = json.dumps({"tool": call.name, "arguments": call.arguments}, sort_keys=True).encode("utf-8")
        effect = effects.reserve(conn, run.run_id, run.claimed.fence, run.claimed.attempt, name, "tool_call",
                                 call.name in tools.MUTATIONS, f"kairos:{call.name}", digest(body), now=run.now)
        if effect is None:
            raise LeaseLost()
        result = tools.run_local(conn, call, context)
        step = steps.Step(n, "tool", call.name, call.id, steps.tool_record(result))
        _record(run, effect, name, step, approval_id=approval_id, conn=conn, input=arguments,
                output=run_steps.preview(_parsed(result.content), secrets), secrets=secrets)
    return step


def _not_sent(run: Execution, call: ToolCall, n: int, name: str, opening: list[trace.Event], arguments: Any,
              secrets: frozenset[str]) -> steps.Step:
    """A test run's mutation: its effect reserved and closed ``not_sent_test`` and its step recorded with
    the would-be arguments, in one transaction; the model is answered that it was not sent. No approval
    is asked (nothing is done) and nothing leaves the worker."""

    _open(run, name, {"step": n, "tool": call.name}, before=opening)
    result = tools.not_sent_test(call)
    step = steps.Step(n, "tool", call.name, call.id, {**steps.tool_record(result), "state": "not_sent_test",
                                                       "arguments": call.arguments})
    with run.database.transaction() as conn:
        locked = run.lock(conn)
        if locked["cancel_requested_at"] is not None:
            raise Cancelled()
        body = canonical_json({"tool": call.name, "arguments": call.arguments})
        effect = effects.reserve(conn, run.run_id, run.claimed.fence, run.claimed.attempt, name, "tool_call",
                                 True, f"kairos:{call.name}", digest(body), now=run.now)
        if effect is None:
            raise LeaseLost()
        events: list[trace.Event] = []
        if effects.not_sent_test(conn, effect, fence=run.claimed.fence, trace_into=events, now=run.now) is None:
            raise LeaseLost()
        _record(run, None, name, step, conn=conn, events=events, state=StepState.NOT_SENT_TEST, input=arguments,
                output=run_steps.preview(_parsed(result.content), secrets), secrets=secrets, effect_id=effect.id)
    return step


def _park(run: Execution, call: ToolCall, n: int, name: str, opening: list[trace.Event], arguments: Any,
          secrets: frozenset[str]) -> Outcome:

    with run.database.transaction() as conn:
        locked = run.lock(conn)
        if locked["cancel_requested_at"] is not None:
            raise Cancelled()
        run.current_step = name
        trace.change(conn, "runs_step_events", {"run_id": run.run_id, "fence": run.claimed.fence},
                     [*opening, trace.Event(EventType.STEP_STARTED, name, {"step": n, "tool": call.name})], now=run.now)
        # The step shows what waits for a person (written while the run is still running: the request parks it).
        url = call.arguments.get("url")
        target = run_steps.target("POST", recorded_target(url), secrets) \
            if call.name == "http_post" and isinstance(url, str) else None
        if not run_steps.begin(conn, run.run_id, run.claimed.fence, n=n, kind="tool", name=call.name,
                               call_id=call.id, input=arguments, target=target, state=StepState.WAITING_APPROVAL,
                               now=run.now):
            raise LeaseLost()
        approval_id = approvals.request(
            conn, run_id=run.run_id, fence=run.claimed.fence, attempt=run.claimed.attempt,
            owner=str(run.claimed.row["owner"]), conversation_id=run.claimed.row["source_conversation_id"],
            step=n, call=call, now=run.now)
        if approval_id is None:
            raise Cancelled()
    return Outcome(run.run_id, "awaiting_approval", RunState.AWAITING_APPROVAL)


def _goal_step(run: Execution, goal: goal_report.Goal, call: ToolCall, n: int,
               opening: list[trace.Event], secrets: frozenset[str]) -> steps.Step | Outcome:
    """A ``goal_report`` call of a loop run (``kairos.execution.goal_report``): a tool error for bad arguments,
    the owner's answer on the attempt after a ``needs_input``, or the run's end."""

    name = f"tool:{n}"
    checked = goal_report.check(call.arguments)
    if isinstance(checked, list):
        _open(run, name, {"step": n, "tool": call.name}, before=opening)
        refused = tools.error(call, "validation_failed", "goal_report was called with invalid arguments", checked)
        step = steps.Step(n, "tool", call.name, call.id, steps.tool_record(refused))
        _record(run, None, name, step, input=run_steps.preview(call.arguments, secrets),
                output=run_steps.preview(_parsed(refused.content), secrets), secrets=secrets)
        return step
    if checked.disposition == "needs_input":
        with run.database.connection() as conn:
            asked = input_requests.for_call(conn, run.run_id, n, call.id)
        if asked is None:
            return _ask(run, goal, call, checked, n, name, opening)
        if asked["state"] != "answered":  # cancelled with its run: this attempt should not exist
            raise Cancelled()
        _open(run, name, {"step": n, "tool": call.name, "answered": True}, before=opening)
        with run.database.transaction() as conn:
            run.lock(conn)
            result = goal_report.answer_result(conn, call, asked)
            step = steps.Step(n, "tool", call.name, call.id, steps.tool_record(result))
            _record(run, None, name, step, conn=conn, input=run_steps.preview(call.arguments, secrets),
                    output=run_steps.preview(_parsed(result.content), secrets), secrets=secrets)
        return step
    return _report(run, goal, call, checked, n, name, opening, secrets)


def _ask(run: Execution, goal: goal_report.Goal, call: ToolCall, checked: goal_report.Report, n: int, name: str,
         opening: list[trace.Event]) -> Outcome:

    claimed = run.claimed
    with run.database.transaction() as conn:
        locked = run.lock(conn)
        if locked["cancel_requested_at"] is not None:
            raise Cancelled()
        run.current_step = name
        trace.change(conn, "runs_step_events", {"run_id": run.run_id, "fence": claimed.fence},
                     [*opening, trace.Event(EventType.STEP_STARTED, name, {"step": n, "tool": call.name})],
                     now=run.now)
        try:
            request_id = goal_report.park(
                conn, run_id=run.run_id, fence=claimed.fence, attempt=claimed.attempt, owner=str(claimed.row["owner"]),
                goal=goal, step=n, call=call, report=checked, conversation_id=claimed.conversation_id, events=[],
                now=run.now)
        except goal_report.LoopGone:
            raise Cancelled() from None
        if request_id is None:
            raise LeaseLost()
    return Outcome(run.run_id, "awaiting_input", RunState.AWAITING_INPUT)


def _report(run: Execution, goal: goal_report.Goal, call: ToolCall, checked: goal_report.Report, n: int, name: str,
            opening: list[trace.Event], secrets: frozenset[str]) -> Outcome:
    """``continue`` / ``complete`` / ``blocked``: the step recorded, the summary published, the loop
    moved and the run succeeded, in one transaction."""

    claimed = run.claimed
    _open(run, name, {"step": n, "tool": call.name}, before=opening)
    with run.database.transaction() as conn:
        locked = run.lock(conn)
        if locked["cancel_requested_at"] is not None:
            raise Cancelled()
        result = ToolResult(call.id, call.name, json.dumps({"status": "recorded", "disposition": checked.disposition}))
        if not steps.record(conn, run.run_id, claimed.fence, steps.Step(n, "tool", call.name, call.id,
                                                                        steps.tool_record(result)),
                            secrets=secrets, input=run_steps.preview(call.arguments, secrets),
                            output=run_steps.preview(_parsed(result.content), secrets), now=run.now):
            raise LeaseLost()
        seq = moves.append_entry(conn, run.run_id, claimed.fence, claimed.conversation_id, role="assistant",
                                 content=checked.summary, now=run.now)
        if seq is None:
            raise LeaseLost()
        status = goal_report.apply_final(conn, run_id=run.run_id, goal=goal, report=checked,
                                    conversation_id=claimed.conversation_id, now=run.now)
        events = [
            trace.Event(EventType.OUTPUT_PUBLISHED, name, {"conversation_id": str(claimed.conversation_id),
                                                           "entry_seq": seq, "truncated": False}),
            trace.Event(EventType.STEP_FINISHED, name, {"outcome": "succeeded", "step": n,
                                                        "disposition": checked.disposition, "loop_status": status}),
        ]
        done = moves.succeed(conn, run.run_id, claimed.fence, now=run.now, events=events,
                             output={"conversation_id": str(claimed.conversation_id), "entry_seq": seq,
                                     "attempt": claimed.attempt, "disposition": checked.disposition})
        if not done:
            raise LeaseLost()
        run.current_step = ""
    return Outcome(run.run_id, "succeeded", RunState.SUCCEEDED)
