"""Runs: one execution of a prompt, as its owner reads it — the record, its output, and cancel.

Role: what the API (and the operator's CLI) needs of a run without loading the worker: ``Run`` (the
API shape; prompt, payload and agent are deliberately not part of it), ``get``, ``page`` and
``output`` (owner-scoped reads: a missing and a foreign run are the same ``NotFound``; a list holds
only the owner's runs) and ``cancel``.

The package's other modules hold every statement that moves ``runs.state`` (no module outside this
package runs one: ``tests/unit/test_state_moves.py``), so the run state machine is read in
``sql/runs.sql`` plus this package:

* ``moves`` — the worker's fenced statements (every state move of a run is one guarded statement),
  the cancel of a waiting run, and the overlap's block of a run that may not replace its predecessor;
* ``waits`` — a run parked for a person, for approvals and input requests alike: park, requeue,
  block, and the loop's cancel of a run awaiting its answer (``kairos.approvals``,
  ``kairos.input_requests`` and ``kairos.execution.goal_report`` keep the request rows);
* ``rescue`` — the tick's moves: runs of vanished workers requeued or ended, runs nobody claimed failed;
* ``corpus_control`` — pause and resume of a corpus run; ``corpus_progress`` — its progress as the API shows it.

The worker itself (claim, heartbeat, the execution, the tool loop, the SQS adapter) is
``kairos.execution``, a layer above.

Guarantees: ``cancel`` is durable first and idempotent — a waiting run ends ``cancelled`` at once,
a running one is marked and its worker stops at its next heartbeat or step; a cancelled run can
never publish success. ``output`` never returns more than ``OUTPUT_PREVIEW_CHARS`` of the answer.

Must not: import the worker, the executors or the heartbeat (the API reads a row without them).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from kairos import db, pages, trace
from kairos.diagnosis import diagnose, for_loop_run, with_actions
from kairos.errors import NotFound
from kairos.observability import logger
from kairos.runs import moves, steps
from kairos.states import RunState, Source

OUTPUT_PREVIEW_CHARS = 2000
PAGE = "runs"  # the list kairos.pages cursors of GET /v1/runs name


@dataclass(frozen=True)
class Run:
    """A run as the API shows it. Prompt, payload and agent are deliberately not part of it."""

    id: UUID
    occurrence_id: UUID
    schedule_id: UUID | None  # None for a chat turn
    owner: str
    source: str
    test: bool  # a test run (source test): mutations recorded, never sent
    mode: str
    state: RunState
    attempt: int
    max_attempts: int
    fence: int
    conversation_id: UUID | None
    source_conversation_id: UUID
    retry_of: UUID | None  # the run a retry made this one from; None for any other run
    resumed_from: int | None  # a retry from the last step: the last old step it took over
    cancel_requested_at: datetime | None
    output: dict[str, Any] | None
    usage: dict[str, Any] | None
    diagnosis: dict[str, Any] | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    # A webhook run's flow (kairos.flow): not started before held_until; a window's kind and deliveries.
    held_until: datetime | None = None
    flow_window: str | None = None
    deliveries: int | None = None
    # What produced the answer: the schedule revision executed (None: a chat turn) and the agent's digest
    # (``agent_digest``; None for a run recorded before they were kept). And the run's limits.
    schedule_revision: int | None = None
    agent_digest: str | None = None
    limits: dict[str, int] | None = None
    # A queued run that holds no running slot yet: "slot" (its owner's are all taken) or "key" (its
    # concurrency key's are); None otherwise (kairos.budgets). Read where the row says (owner reads).
    waiting_for: str | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Run:
        return cls(
            id=row["id"],
            occurrence_id=row["occurrence_id"],
            schedule_id=row["schedule_id"],
            owner=row["owner"],
            source=row["source"],
            test=bool(row["test"]),
            mode=row["mode"],
            state=RunState(row["state"]),
            attempt=int(row["attempt"]),
            max_attempts=int(row["max_attempts"]),
            fence=int(row["fence"]),
            conversation_id=row["conversation_id"],
            source_conversation_id=row["source_conversation_id"],
            retry_of=row["retry_of"],
            resumed_from=row["resumed_from"],
            cancel_requested_at=row["cancel_requested_at"],
            output=row["output"],
            usage=row["usage"],
            # A loop's run is not retried by hand (its loop fires the next one): not offered. The
            # owner's reads carry ``loop`` (runs_get_owned, runs_list_owned, the cancel's statements).
            diagnosis=for_loop_run(row["diagnosis"]) if row.get("loop") else row["diagnosis"],
            created_at=row["created_at"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            held_until=row.get("held_until"),
            flow_window=row.get("flow_window"),
            deliveries=row.get("deliveries"),
            schedule_revision=row.get("schedule_revision"),
            agent_digest=row.get("agent_digest"),
            limits=None if "max_steps" not in row else {
                "runtime_seconds": int(row["runtime_limit_seconds"]), "max_attempts": int(row["max_attempts"]),
                "max_steps": int(row["max_steps"])},
            waiting_for=row.get("waiting_for"),
        )

    def as_json(self) -> dict[str, Any]:
        """The API shape: ids (``retry_of``: the run a retry made this one from, else null), state, attempt,
        target conversation, times (RFC 3339 UTC), usage, diagnosis, the output reference
        (``{"conversation_id", "entry_seq", "attempt"}``) and what a queued run waits for
        (``waiting_for``: ``"slot"``, ``"key"`` or null)."""
        return {
            "id": str(self.id),
            "schedule_id": None if self.schedule_id is None else str(self.schedule_id),
            "occurrence_id": str(self.occurrence_id),
            "source": self.source,
            "test": self.test,
            "mode": self.mode,
            "state": self.state.value,
            "attempt": self.attempt,
            "max_attempts": self.max_attempts,
            # The thread the run wrote to (a fork's or fresh run's own conversation, an append run's
            # source); null until a claim sets it. The source is the conversation it was scheduled from.
            "conversation_id": None if self.conversation_id is None else str(self.conversation_id),
            "source_conversation_id": str(self.source_conversation_id),
            "retry_of": None if self.retry_of is None else str(self.retry_of),
            "resumed_from": self.resumed_from,
            "cancel_requested": self.cancel_requested_at is not None,
            "created_at": trace.rfc3339(self.created_at),
            "started_at": trace.rfc3339(self.started_at),
            "finished_at": trace.rfc3339(self.finished_at),
            "usage": self.usage,
            "diagnosis": None if self.diagnosis is None else with_actions(
                self.diagnosis, run_id=self.id, schedule_id=self.schedule_id),
            "output": self.output,
            # A webhook flow's hold (a window still collecting, or a delivery deferred by the rate): the
            # run starts no earlier; with a window, its kind and the deliveries it carries.
            "held_until": None if self.held_until is None else trace.rfc3339(self.held_until),
            "flow_window": self.flow_window,
            "deliveries": self.deliveries,
            "schedule_revision": self.schedule_revision,
            "agent_digest": self.agent_digest,
            "limits": self.limits,
            "waiting_for": self.waiting_for,
        }


def get(conn: psycopg.Connection[db.Row], run_id: UUID, *, owner: str) -> Run:
    """One run of ``owner``; ``NotFound("run")`` for a missing or foreign one alike."""
    row = db.fetch_one(conn, "runs_get_owned", {"run_id": run_id, "owner": owner})
    if row is None:
        raise NotFound("run")
    return Run.from_row(row)


def page(conn: psycopg.Connection[db.Row], *, owner: str, schedule_id: UUID | None = None,
         conversation_id: UUID | None = None, state: RunState | None = None, source: Source | None = None,
         before: str | None = None, limit: int = pages.LIMIT_DEFAULT) -> tuple[list[Run], str | None]:
    """One page of ``owner``'s runs, newest first (``created_at``, then id), below the cursor ``before``,
    and the cursor of the next page (None at the end). ``conversation_id`` matches a run's target
    thread or the conversation it was scheduled from, so a conversation's runs and a fork thread's
    run are both found by it. A filter naming another owner's object matches nothing (an empty page,
    not a 404: a filter is not a lookup). A bad cursor or limit is ``ValidationFailed``."""
    key = pages.decode(PAGE, before)
    limit = pages.check_limit(limit)
    rows = db.fetch_all(conn, "runs_list_owned", {
        "owner": owner, "schedule_id": schedule_id, "conversation_id": conversation_id,
        "state": None if state is None else state.value, "source": None if source is None else source.value,
        "before_at": None if key is None else key.at, "before_id": None if key is None else key.id,
        "limit": limit + 1})
    found, next_before = pages.cut(PAGE, rows, limit, lambda r: pages.Key(r["created_at"], r["id"]))
    return [Run.from_row(r) for r in found], next_before


def cancel(conn: psycopg.Connection[db.Row], run_id: UUID, *, owner: str, now: datetime | None = None) -> Run:
    """Cancels a run, durably first. ``queued`` (or awaiting approval or input) becomes ``cancelled`` at once;
    ``running`` gets ``cancel_requested`` and its worker stops at the next heartbeat or step; a run
    already cancelling or terminal is returned unchanged (idempotent)."""
    row = db.fetch_one(conn, "runs_lock_owned", {"run_id": run_id, "owner": owner})
    if row is None:
        raise NotFound("run")
    state = RunState(row["state"])
    if state in (RunState.QUEUED, RunState.AWAITING_APPROVAL, RunState.AWAITING_INPUT):
        done = moves.cancel_waiting(conn, run_id, owner=owner, by="owner", now=now,
                                    diagnosis=diagnose("cancelled", summary="The run was cancelled before it ran."))
        if done is not None:
            # Its open approval requests are retired: nobody can approve a cancelled run's tool call.
            db.fetch_all(conn, "approvals_retire_for_run", {"run_id": run_id, "now": now})
            # And its pending question: an answer after the cancel finds it cancelled (one of the two wins).
            db.fetch_all(conn, "input_requests_cancel_for_run", {"run_id": run_id, "now": now})
            # And a call that waited for approval ends with it (failed: never sent).
            steps.end_with_run(conn, run_id, now=now)
            moves.count("RunCancelled")
            logger.info("run cancelled", extra={"action": "run_cancelled", "run_id": str(run_id)})
            return Run.from_row(done)
    elif state is RunState.RUNNING and row["cancel_requested_at"] is None:
        marked = moves.request_cancel(conn, run_id, owner=owner, now=now)
        if marked is not None:
            logger.info("run cancel requested", extra={"action": "run_cancel_requested", "run_id": str(run_id)})
            return Run.from_row(marked)
    return Run.from_row(row)


def agent_digest(agent: Mapping[str, Any]) -> str:
    """SHA-256 hex of an agent JSON's canonical text (keys sorted, no whitespace, UTF-8): what a run's
    ``agent_digest`` is, computed by the database when the run is recorded (``kairos_agent_digest``)."""
    text = json.dumps(agent, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def output(conn: psycopg.Connection[db.Row], run_id: UUID, *, owner: str) -> dict[str, Any]:
    """The output projection: ``available`` (bounded preview and the producer's correlations),
    ``empty`` (why: queued, running, failed — with its diagnosis — or no_output) or ``unavailable``
    (the answer's source is no longer readable: ``pruned`` by retention, with when, or ``source_gone``).
    The run's state is read, never rewritten: a pruned run still says ``succeeded``. Each carries what
    produced the answer: ``schedule_revision`` and ``agent_digest``."""
    row = db.fetch_one(conn, "runs_get_owned", {"run_id": run_id, "owner": owner})
    if row is None:
        raise NotFound("run")
    run = Run.from_row(row)
    projection = _output(conn, run, row, owner=owner)
    if projection.get("diagnosis") is not None:
        projection["diagnosis"] = with_actions(projection["diagnosis"], run_id=run.id, schedule_id=run.schedule_id)
    return {**projection, "schedule_revision": run.schedule_revision, "agent_digest": run.agent_digest}


def _output(conn: psycopg.Connection[db.Row], run: Run, row: db.Row, *, owner: str) -> dict[str, Any]:
    if run.state is RunState.QUEUED:
        return {"state": "empty", "reason": "queued"}
    if run.state in (RunState.RUNNING, RunState.AWAITING_APPROVAL, RunState.AWAITING_INPUT):
        return {"state": "empty", "reason": "running"}
    if run.state is not RunState.SUCCEEDED or not run.output:
        failed = run.state in (RunState.FAILED, RunState.ABANDONED)
        projection: dict[str, Any] = {"state": "empty", "reason": "failed" if failed else "no_output"}
        if run.diagnosis is not None:
            projection["diagnosis"] = run.diagnosis
        return projection
    reference = run.output
    if "corpus" in reference:  # a corpus run's output: coverage and export handles (kairos.corpus)
        return {"state": "available", "corpus": reference["corpus"], "attempt": reference.get("attempt", run.attempt),
                **{k: reference[k] for k in ("conversation_id", "entry_seq") if k in reference}}
    entry = None
    try:
        entry = db.fetch_one(conn, "conversation_entries_get_output",
                             {"conversation_id": UUID(str(reference["conversation_id"])),
                              "entry_seq": int(reference["entry_seq"]), "owner": owner})
    except (KeyError, ValueError, TypeError):
        entry = None
    if entry is None and row.get("pruned_at") is not None:
        return {"state": "unavailable", "reason": "pruned", "pruned_at": trace.rfc3339(row["pruned_at"])}
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
