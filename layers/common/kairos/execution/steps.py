"""The step log of a run's tool loop: what each completed step did, so no attempt does it twice.

Role: a model turn that asked for tools (its text and calls) and each tool's answer are recorded as
``run_steps`` rows, bounded, under the run's fence, in the transaction that settles the step's
effect (``record``). A later attempt — after an approval, a rescue, or a retry-safe failure —
``load``s them and ``fold``s them into the turns the model sees again, and continues with the calls
still ``unanswered``: a completed step is never called again.

Must not: keep secrets (a tool's arguments and answers are the model's own words and the peers'
bounded answers; headers are never recorded).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from kairos import db
from kairos.executors.base import ModelTurn, ToolCall, ToolResult


@dataclass(frozen=True)
class Step:
    n: int
    kind: str  # "model" | "tool"
    name: str
    call_id: str | None
    record: dict[str, Any]


def load(conn: psycopg.Connection[db.Row], run_id: UUID) -> list[Step]:
    return [Step(int(r["n"]), r["kind"], r["name"], r["call_id"], dict(r["record"]))
            for r in db.fetch_all(conn, "run_steps_list", {"run_id": run_id})]


def model_record(turn: ModelTurn) -> dict[str, Any]:
    return {"content": turn.content,
            "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in turn.tool_calls]}


def tool_record(result: ToolResult) -> dict[str, Any]:
    return {"content": result.content, "is_error": result.is_error}


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
           now: datetime | None = None) -> bool:
    """Writes ``step`` for the fence holder; False when the fence no longer holds (nothing written)."""
    row = db.fetch_one(conn, "run_steps_record", {
        "run_id": run_id, "fence": fence, "n": step.n, "kind": step.kind, "name": step.name,
        "call_id": step.call_id, "record": Jsonb(step.record), "now": now})
    return row is not None
