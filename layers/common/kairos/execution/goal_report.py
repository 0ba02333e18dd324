"""The ``goal_report`` tool: how a loop run ends, with one closed disposition, and what each one does.

Role: the tool loop (``kairos.execution.tool_loop``) offers ``SPEC`` to every loop run and hands each
``goal_report`` call here (``handle``). Arguments are checked (``check``): ``disposition`` one of
``continue``, ``complete``, ``blocked``, ``needs_input``; ``summary`` (required, bounded); ``question``
required for ``needs_input``. A refused call is answered to the model as a tool error it can correct.
A valid one, in one fenced transaction with the run row locked first, then the loop row:

* ``continue`` — the run succeeds (its summary is the published answer); the loop keeps its next
  occurrence, and a loop paused for this run's question is resumed at its next future occurrence
  (``completed`` when nothing is left to fire).
* ``complete`` — the run succeeds; the loop becomes ``completed`` (no more fires); note ``goal_completed``.
* ``blocked`` — the run succeeds; the loop pauses; note ``goal_blocked``.
* ``needs_input`` — an ``input_requests`` row (``kairos.input_requests.ask``), the question appended to
  the run's thread, ``input.waiting``, the run ``awaiting_input`` with its lease cleared (no worker, no
  owner slot held), the loop paused and waiting on this run, note ``input_required``. The owner's
  answer requeues the same run; its next attempt finds the request answered and gives the model the
  answer as this call's result (recorded in the step log like any tool result).

A loop run whose model answers without calling ``goal_report`` fails ``goal_report_missing``
(``kairos.execution.tool_loop``). A loop that was cancelled meanwhile ends the run ``cancelled``.

Must not: log the summary, the question or the answer; write without the run's fence.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg

from kairos import conversations, db, input_requests, trace
from kairos.executors.base import ToolCall, ToolResult, ToolSpec
from kairos.observability import logger
from kairos.runs import moves, waits
from kairos.schedules import loops

NAME = "goal_report"
DISPOSITIONS = ("continue", "complete", "blocked", "needs_input")
SUMMARY_MAX = 4_000
SPEC = ToolSpec(
    NAME,
    "Report this run's result toward the loop's goal and end the run. disposition: continue (more work "
    "at the next occurrence), complete (the goal is reached), blocked (it cannot go on without a change), "
    "needs_input (ask the owner one question; the run resumes with the answer).",
    {"type": "object",
     "properties": {"disposition": {"type": "string", "enum": list(DISPOSITIONS)},
                    "summary": {"type": "string"}, "question": {"type": "string"}},
     "required": ["disposition", "summary"], "additionalProperties": False})


@dataclass(frozen=True)
class Report:
    disposition: str
    summary: str
    question: str | None


@dataclass(frozen=True)
class Goal:
    """The goal a loop run works toward: its loop, the run's revision, the envelope it recorded."""

    schedule_id: uuid.UUID
    revision: int
    envelope: dict[str, Any]


def goal_of(conn: psycopg.Connection[db.Row], run_id: uuid.UUID) -> Goal | None:
    row = db.fetch_one(conn, "schedule_revisions_goal_of_run", {"run_id": run_id})
    if row is None or row["goal"] is None:
        return None
    return Goal(row["schedule_id"], int(row["revision"]), dict(row["goal"]))


def instructions(goal: Mapping[str, Any]) -> str:
    """The goal as the loop run's model reads it (appended to its system prompt)."""
    lines = ["You are working in a bounded loop toward this goal.", f"Outcome: {goal.get('outcome')}"]
    for constraint in goal.get("constraints") or ():
        lines.append(f"Constraint: {constraint}")
    if goal.get("verification"):
        lines.append(f"Verification: {goal['verification']}")
    lines.append("End this run by calling goal_report exactly once with disposition continue (more work "
                 "next time), complete (the outcome is reached and verified), blocked (you cannot go on), or "
                 "needs_input (ask the owner one question).")
    return "\n".join(lines)


def check(arguments: dict[str, Any]) -> Report | list[dict[str, str]]:
    """The report, or the problems (field, rule, message) the model is told."""
    problems: list[dict[str, str]] = []
    extra = sorted(set(arguments) - {"disposition", "summary", "question"})
    for name in extra:
        problems.append({"field": name, "rule": "unknown_field", "message": f"{name} is not an argument"})
    disposition = arguments.get("disposition")
    if disposition not in DISPOSITIONS:
        problems.append({"field": "disposition", "rule": "enum",
                         "message": f"disposition is one of {', '.join(DISPOSITIONS)}"})
    summary = arguments.get("summary")
    if not isinstance(summary, str) or not summary.strip() or len(summary) > SUMMARY_MAX:
        problems.append({"field": "summary", "rule": "required",
                         "message": f"give a summary of 1 to {SUMMARY_MAX} characters"})
    question = arguments.get("question")
    if disposition == "needs_input" and (not isinstance(question, str) or not question.strip()
                                         or len(question) > input_requests.QUESTION_MAX):
        problems.append({"field": "question", "rule": "required",
                         "message": f"needs_input asks one question of 1 to {input_requests.QUESTION_MAX} characters"})
    elif question is not None and not isinstance(question, str):
        problems.append({"field": "question", "rule": "type", "message": "question is a string"})
    if problems:
        return problems
    assert isinstance(disposition, str) and isinstance(summary, str)
    return Report(disposition, summary.strip(), question.strip() if isinstance(question, str) else None)


def answer_result(conn: psycopg.Connection[db.Row], call: ToolCall, request: db.Row) -> ToolResult:
    """The answered request as the ``goal_report`` call's result the model reads on its next attempt."""
    entry = db.fetch_one(conn, "conversation_entries_find_seq",
                         {"conversation_id": request["conversation_id"], "seq": request["answer_entry_seq"]})
    text = "" if entry is None else str(entry["content"])
    body = {"status": "answered", "question": request["question"], "answer": text}
    return ToolResult(call.id, call.name, json.dumps(body, ensure_ascii=False)[:8_192])


def _note(conn: psycopg.Connection[db.Row], conversation_id: uuid.UUID, kind: str, body: dict[str, Any],
          now: Any) -> None:
    conversations.note(conn, conversation_id, kind=kind, body=body, now=now)


def apply_final(conn: psycopg.Connection[db.Row], *, run_id: uuid.UUID, goal: Goal, report: Report,
                conversation_id: uuid.UUID, now: Any) -> str | None:
    """The loop's move for ``continue`` / ``complete`` / ``blocked`` (the caller holds the run row under
    its fence, and ends the run succeeded in this transaction); the loop's status after it, or None
    when the loop is gone."""
    row = loops.lock(conn, goal.schedule_id, now=now)
    if row is None:
        return None
    status = str(row["status"])
    note_body = {"loop_id": str(goal.schedule_id), "run_id": str(run_id)}
    if report.disposition == "continue":
        status = loops.continue_(conn, row, run_id=run_id, now=now) or status
    elif report.disposition == "complete":
        status = loops.complete(conn, goal.schedule_id, run_id=run_id, now=now) or status
        _note(conn, conversation_id, "goal_completed", note_body, now)
    elif report.disposition == "blocked":
        status = loops.block(conn, goal.schedule_id, run_id=run_id, now=now) or status
        _note(conn, conversation_id, "goal_blocked", note_body, now)
    logger.info("goal reported", extra={"action": "goal_reported", "run_id": str(run_id),
                                        "schedule_id": str(goal.schedule_id), "disposition": report.disposition,
                                        "loop_status": status})
    return status


def park(conn: psycopg.Connection[db.Row], *, run_id: uuid.UUID, fence: int, attempt: int, owner: str, goal: Goal,
         step: int, call: ToolCall, report: Report, conversation_id: uuid.UUID,
         events: list[trace.Event], now: Any) -> uuid.UUID | None:
    """``needs_input`` (see the module doc), in the caller's transaction holding the run row; the
    request's id, or None when the fence no longer holds or a cancel was requested (the caller rolls
    back), or when the loop was cancelled meanwhile (``LoopGone``)."""
    loop = db.fetch_one(conn, "schedules_lock_loop", {"schedule_id": goal.schedule_id, "now": now})
    if loop is None or loop["status"] == "cancelled":
        raise LoopGone()
    if report.question is None:  # the goal_report tool refuses needs_input without a question
        raise RuntimeError("a needs_input report has no question")
    request_id = input_requests.ask(conn, run_id=run_id, owner=owner, attempt=attempt, step=step, call_id=call.id,
                                    schedule_id=goal.schedule_id, revision=goal.revision,
                                    conversation_id=conversation_id, question=report.question, now=now)
    if request_id is None:
        return None
    seq = moves.append_entry(conn, run_id, fence, conversation_id, role="assistant", content=report.question,
                             now=now)
    if seq is None:
        return None
    moved = waits.park(conn, waits.INPUT, run_id=run_id, fence=fence, step=step, events=events, now=now,
                       data={"input_request_id": str(request_id), "entry_seq": seq})
    if moved is None:
        return None
    loops.wait(conn, goal.schedule_id, run_id=run_id, now=now)
    _note(conn, conversation_id, "input_required",
          {"input_request_id": str(request_id), "run_id": str(run_id), "loop_id": str(goal.schedule_id)}, now)
    logger.info("input requested", extra={"action": "input_requested", "run_id": str(run_id),
                                          "schedule_id": str(goal.schedule_id), "input_request_id": str(request_id)})
    return request_id


class LoopGone(Exception):
    """The loop was cancelled while its run worked: the run ends cancelled instead of asking."""

