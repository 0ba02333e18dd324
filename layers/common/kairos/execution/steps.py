"""The step log of a run's tool loop: what each completed step did, so no attempt does it twice.

Role: every model turn and tool call is a ``run_steps`` row (``kairos.runs.steps``: opened when its
effect is reserved, ended in the transaction that settles it, with redacted, bounded previews for the
owner). A completed one also keeps its ``record``: a model turn that asked for tools (its text and
calls) and each tool's answer. A later attempt — after an approval, a rescue, or a retry-safe
failure — ``load``s the rows, ``fold``s the succeeded ones into the turns the model sees again, and
continues with the calls still ``unanswered``: a completed step is never called again. Step numbers
run on across attempts (``next_number``); a call parked for approval keeps the number its approval is
bound to (``parked``).

What the row keeps (``stored``): a model turn's calls' arguments exactly (a later attempt must send
exactly what the model asked for, and an approval is bound to their digest); its text and a tool's
answer redacted (``kairos.redact``), so a peer echoing a credential does not store it — the attempt
that made a step goes on with the whole answer, a later attempt folds the redacted one. Headers are
never recorded.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from kairos import db, redact
from kairos.executors.base import ModelTurn, ToolCall, ToolResult
from kairos.runs import steps as run_steps
from kairos.states import StepState


@dataclass(frozen=True)
class Step:
    n: int
    kind: str  # "model" | "tool"
    name: str
    call_id: str | None
    record: dict[str, Any]
    state: str = StepState.SUCCEEDED.value


def load(conn: psycopg.Connection[db.Row], run_id: UUID) -> list[Step]:
    """Every step of the run in order, whatever its state (``completed`` keeps the folded ones)."""
    return [Step(int(r["n"]), r["kind"], r["name"], r["call_id"], dict(r["record"] or {}), r["state"])
            for r in db.fetch_all(conn, "run_steps_list", {"run_id": run_id})]


FOLDED = frozenset({StepState.SUCCEEDED.value, StepState.NOT_SENT_TEST.value})  # answered to the model


def completed(rows: list[Step]) -> list[Step]:
    """The steps a later attempt folds: those answered to the model that still hold their record."""
    return [s for s in rows if s.state in FOLDED and s.record]


def next_number(rows: list[Step]) -> int:
    """The number of the run's next new step: after every step of every attempt."""
    return max((s.n for s in rows), default=0) + 1


def parked(rows: list[Step]) -> dict[str, int]:
    """The numbers of the calls parked for approval, by call id."""
    return {s.call_id: s.n for s in rows if s.state == StepState.WAITING_APPROVAL and s.call_id}


def model_record(turn: ModelTurn) -> dict[str, Any]:
    return {"content": turn.content,
            "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in turn.tool_calls]}


def tool_record(result: ToolResult) -> dict[str, Any]:
    return {"content": result.content, "is_error": result.is_error}


def stored(step: Step, secrets: Iterable[str] = ()) -> dict[str, Any]:
    """What the row keeps of ``step``'s record: its text redacted (a model turn's calls exactly, see the
    module doc). The attempt that made the step goes on with the whole record in memory."""
    return {**step.record, "content": redact.redact(step.record.get("content"), secrets)}


def fold(log: list[Step]) -> tuple[ModelTurn | ToolResult, ...]:
    turns: list[ModelTurn | ToolResult] = []
    for step in log:
        if step.kind == "model":
            turns.append(_model_turn(step))
        else:
            turns.append(ToolResult(step.call_id or "", step.name, str(step.record.get("content", "")),
                                    bool(step.record.get("is_error"))))
    return tuple(turns)


def _model_turn(step: Step) -> ModelTurn:
    calls = tuple(ToolCall(str(c["id"]), str(c["name"]), dict(c["arguments"]))
                  for c in step.record.get("tool_calls") or ())
    return ModelTurn(str(step.record.get("content") or ""), calls)


def unanswered(log: list[Step]) -> list[ToolCall]:
    """The calls of the last model turn that no tool step has answered yet, in order."""
    last = next((i for i in range(len(log) - 1, -1, -1) if log[i].kind == "model"), None)
    if last is None:
        return []
    answered = {s.call_id for s in log[last + 1:] if s.kind == "tool"}
    return [c for c in _model_turn(log[last]).tool_calls if c.id not in answered]


def model_turns(log: list[Step]) -> int:
    return sum(1 for s in log if s.kind == "model")


def record(conn: psycopg.Connection[db.Row], run_id: UUID, fence: int, step: Step, *,
           secrets: Iterable[str] = (), state: StepState = StepState.SUCCEEDED, output: Any = None,
           input: Any = None, target: Any = None, usage: Any = None,
           effect_id: UUID | None = None, now: datetime | None = None) -> bool:
    """Ends ``step`` (succeeded, or not_sent_test) for the fence holder with its record and previews (already
    ``kairos.runs.steps.preview``-ed); False when the fence no longer holds (nothing written)."""
    return run_steps.finish(conn, run_id, fence, n=step.n, kind=step.kind, name=step.name, call_id=step.call_id,
                            record=stored(step, secrets), state=state, input=input, output=output, target=target,
                            usage=usage,
                            effect_id=effect_id, now=now)
