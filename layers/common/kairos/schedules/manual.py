"""Run now and retry: ``manual`` occurrences an owner asks for (docs/api.md "Steering runs").

Role: ``trigger`` records a ``manual`` occurrence of the schedule's current revision at the
database's now; ``retry`` records one for a run that ended ``failed``, ``abandoned``, ``expired`` or
``cancelled``, re-executing that run's revision (its prompt, agent and payload) as a new run whose
``retry_of`` names it — the old run stays as it ended. A chat turn (no schedule) retries into its
conversation: a new ``chat`` run asking the same message again, behind any unfinished turn (its claim
writes no second user entry when the retried turn wrote one, ``kairos.execution.claim``). Both go
through ``kairos.occurrences`` (the one way a fire is recorded) and ``kairos.overlap`` (the one overlap
rule; a chat turn's retry queues behind instead): a fire the policy would skip
answers ``OverlapConflict`` (409 ``overlap``) naming the run in the way, and records nothing; a fire
over the owner's queue cap answers ``QueueFull`` (429 ``queue_full``) and records nothing.

Rules:
* only an active schedule runs (a run of a paused or cancelled one would be refused at its claim):
  ``Conflict`` otherwise (a chat turn's retry has no schedule: its conversation must still be the owner's);
* a retry refuses (``not_retryable``, 409) a run in any other state, a run that reserved an
  external change not known to have failed (a mutation reserved, settled or ambiguous: repeating it
  could repeat the change), and a run whose inputs retention already forgot;
* a retry from the last step (``from_last_step``) takes over the old run's completed steps instead:
  its new run's step log starts as a copy of them (``run_steps_seed``; ``resumed_from``: the last one), so
  its tool loop folds them — no model turn or settled tool call is sent again — and continues with the
  step that did not complete. A settled mutation is then no obstacle (its step is in the log), but a
  mutation left reserved or ambiguous, or settled outside the log, answers ``AmbiguousEffect`` (409
  ``ambiguous_effect``) naming its step;
* a retry is idempotent per run and kind: its occurrence key is ``retry:<run id>`` (from the last step:
  ``retry:<run id>:last_step``), so retrying the same run again answers the run the first retry made.
  A trigger has a fresh key each time; the API's ``Idempotency-Key`` makes a retried request answer
  its first response.

``test`` records a ``test`` occurrence of the schedule's current revision (active or paused, not a
loop): its run is dispatched at once whatever the overlap policy, calls models for real and sends no
mutation (``kairos.execution.tool_loop``); it never counts toward failures or pause, never notifies and
is never the schedule's ``last_run`` (``kairos.tick.settle``, ``kairos.schedules.last_run``). A test
run's retry is a test run again.

Handing the run to SQS is the caller's, after commit (the tick's repair sends what it missed).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg

from kairos import calendar, conversations, db, identity, occurrences, overlap
from kairos.errors import (
    AmbiguousEffect,
    Conflict,
    FieldError,
    NotFound,
    NotRetryable,
    OverlapConflict,
    ValidationFailed,
)
from kairos.observability import logger
from kairos.schedules.loop_policy import loop_refusal
from kairos.states import Decision, Overlap, RunState, ScheduleStatus, Source

TEST_PAYLOAD_MAX_BYTES = 65_536  # a test run's payload, as a webhook delivery's body is bounded
RETRYABLE = frozenset({RunState.FAILED, RunState.ABANDONED, RunState.EXPIRED, RunState.CANCELLED})


@dataclass(frozen=True)
class Manual:
    schedule_id: uuid.UUID | None  # None for a chat turn's retry
    occurrence_id: uuid.UUID
    run_id: uuid.UUID
    decision: Decision
    sendable: bool  # dispatched now (not queued behind another run, not blocked, not an earlier retry)
    replaced: uuid.UUID | None = None  # cancel_replace: the run this one's transaction cancelled for it

    def as_json(self) -> dict[str, Any]:
        return {"run_id": str(self.run_id), "occurrence_id": str(self.occurrence_id)}


def trigger(conn: psycopg.Connection[db.Row], schedule_id: uuid.UUID, *, owner: str,
            now: datetime | None = None) -> Manual:
    """A run of the schedule's current revision now (see the module doc)."""
    with db.atomic(conn):
        schedule = _lock_active(conn, schedule_id, owner, now)
        manual = _record(conn, schedule, revision=int(schedule["revision"]), key=uuid.uuid4().hex, now=now)
    logger.info("schedule triggered", extra={"action": "schedule_triggered", "schedule_id": str(schedule_id),
                                             "run_id": str(manual.run_id), "decision": manual.decision.value})
    return manual


def test(conn: psycopg.Connection[db.Row], schedule_id: uuid.UUID, *, owner: str, payload: Any = None,
         now: datetime | None = None) -> Manual:
    """A test run of the schedule's current revision with ``payload`` (see the module doc)."""
    if payload is not None and len(json.dumps(payload, ensure_ascii=False).encode("utf-8")) > TEST_PAYLOAD_MAX_BYTES:
        raise ValidationFailed([FieldError("payload", "max_bytes",
                                           f"at most {TEST_PAYLOAD_MAX_BYTES} bytes of JSON")])
    with db.atomic(conn):
        schedule = db.fetch_one(conn, "schedules_lock_owned", {"schedule_id": schedule_id, "owner": owner, "now": now})
        if schedule is None:
            raise NotFound("schedule")
        if schedule["loop"]:

            raise loop_refusal("test-run")
        if schedule["status"] == ScheduleStatus.CANCELLED.value:
            raise Conflict("the schedule is cancelled; a test run needs a schedule that is not",
                           fields=[FieldError("status", "not_cancelled", "a cancelled schedule never runs")])
        manual = _record_test(conn, schedule, key=uuid.uuid4().hex, payload=payload, now=now)
    logger.info("schedule test run", extra={"action": "schedule_tested", "schedule_id": str(schedule_id),
                                            "run_id": str(manual.run_id)})
    return manual


def _record_test(conn: psycopg.Connection[db.Row], schedule: db.Row, *, key: str, payload: Any,
                 now: datetime | None, retry_of: uuid.UUID | None = None, revision: int | None = None) -> Manual:
    """A ``test`` occurrence and its run: dispatched at once whatever the overlap policy (a test run stands in
    no one's way and waits for no one)."""
    schedule_id: uuid.UUID = schedule["id"]
    occurrence_id = identity.occurrence_id(schedule_id, Source.TEST, key=key)
    run_id = identity.run_id(occurrence_id)
    existing = db.fetch_one(conn, "occurrences_of_run", {"run_id": run_id})
    if existing is not None:  # an earlier retry of the same test run made it
        return Manual(schedule_id, occurrence_id, run_id, Decision(existing["decision"]), sendable=False)
    fire = calendar.describe(schedule["db_now"], schedule["timezone"])
    occurrences.refuse_over_cap(occurrences.record(conn, [occurrences.planned(
        occurrence_id=occurrence_id, schedule_id=schedule_id, source=Source.TEST, fire=fire,
        revision=int(schedule["revision"]) if revision is None else revision, decision=Decision.DISPATCHED,
        run_id=run_id, idempotency_key=key, retry_of=retry_of, payload=payload)], now=now))  # 429 queue_full
    return Manual(schedule_id, occurrence_id, run_id, Decision.DISPATCHED, sendable=True)


def retry(conn: psycopg.Connection[db.Row], run_id: uuid.UUID, *, owner: str, from_last_step: bool = False,
          now: datetime | None = None) -> Manual:
    """A new run re-executing ``run_id``'s revision and payload; ``from_last_step``: taking over its
    completed steps (see the module doc)."""
    with db.atomic(conn):
        run = db.fetch_one(conn, "runs_lock_owned", {"run_id": run_id, "owner": owner})
        if run is None:
            raise NotFound("run")
        state = RunState(run["state"])
        if state not in RETRYABLE:
            raise NotRetryable(f"a {state.value} run cannot be retried",
                               fields=[FieldError("state", "retryable", "only failed, abandoned, expired and "
                                                  "cancelled runs can be retried")])
        if run.get("pruned_at") is not None:
            instead = "post the message again" if run["schedule_id"] is None else "trigger the schedule"
            raise NotRetryable(f"this run's thread and payload were forgotten (retention); {instead} instead",
                               fields=[FieldError("run", "not_pruned", "the run's inputs are gone")])
        if from_last_step:
            crossing = db.fetch_one(conn, "run_steps_ambiguous", {"run_id": run_id})
            if crossing is not None:
                raise AmbiguousEffect(
                    f"step {crossing['step']} may or may not have changed something outside; retrying from the "
                    "last step would have to repeat it", fields=[FieldError(
                        "step", "ambiguous", f"{crossing['step']}: its external change is not known to have "
                        "happened or not")])
        else:
            kept = db.fetch_one(conn, "effects_mutation_kept", {"run_id": run_id})
            if kept is not None and kept["kept"]:
                raise NotRetryable("this run reserved an external change that may have happened; retrying could "
                                   "repeat it (retry from the last step keeps what its completed steps did)",
                                   fields=[FieldError("run", "replay_safe", "the run made or may have made an "
                                                      "external change")])
        key = f"retry:{run_id}:last_step" if from_last_step else f"retry:{run_id}"
        manual = _retried(conn, run, key=key, owner=owner, now=now)
        resumed = _take_over_steps(conn, run_id, manual.run_id, now=now) if from_last_step else None
    logger.info("run retried", extra={"action": "run_retried", "run_id": str(manual.run_id), "retry_of": str(run_id),
                                      "decision": manual.decision.value, "resumed_from": resumed})
    return manual


def _retried(conn: psycopg.Connection[db.Row], run: db.Row, *, key: str, owner: str, now: datetime | None) -> Manual:
    """The retry's occurrence and run, by the old run's source: a chat turn into its conversation, a test
    run as a test run, any other run as a ``manual`` one of the old run's revision."""
    run_id: uuid.UUID = run["id"]
    if run["schedule_id"] is None:  # a chat turn: retried into its conversation
        return _retry_turn(conn, run, key=key, owner=owner, now=now)
    origin = db.fetch_row(conn, "occurrences_of_run", {"run_id": run_id})  # runs.occurrence_id: NOT NULL REFERENCES
    if run["test"]:  # a test run retries as a test run, the schedule paused or not
        schedule = db.fetch_row(conn, "schedules_lock_owned", {"schedule_id": run["schedule_id"], "owner": owner,
                                                               "now": now})
        if schedule["status"] == ScheduleStatus.CANCELLED.value:
            raise Conflict("the schedule is cancelled; a test run needs a schedule that is not",
                           fields=[FieldError("status", "not_cancelled", "a cancelled schedule never runs")])
        revision = int(origin["schedule_revision"] if origin["revision_kept"] else schedule["revision"])
        return _record_test(conn, schedule, key=key, payload=run["payload"], now=now, retry_of=run_id,
                            revision=revision)
    schedule = _lock_active(conn, run["schedule_id"], owner, now)
    revision = int(origin["schedule_revision"] if origin["revision_kept"] else schedule["revision"])
    return _record(conn, schedule, revision=revision, key=key, now=now, retry_of=run_id, payload=run["payload"])


def _take_over_steps(conn: psycopg.Connection[db.Row], old_run_id: uuid.UUID, new_run_id: uuid.UUID, *,
                     now: datetime | None) -> int | None:
    """Seeds the new run's step log with the old run's completed steps and records how many it took
    (``resumed_from``); None when an earlier request already made the run (nothing changes)."""
    seeded = db.fetch_all(conn, "run_steps_seed", {"run_id": new_run_id, "old_run_id": old_run_id, "now": now})
    steps = max((int(r["n"]) for r in seeded), default=0)
    marked = db.fetch_one(conn, "runs_mark_resumed", {"run_id": new_run_id, "steps": steps})
    return None if marked is None else steps


def _retry_turn(conn: psycopg.Connection[db.Row], run: db.Row, *, key: str, owner: str,
                now: datetime | None) -> Manual:
    """A failed chat turn's retry: the same message (and corpus) asked again in the same conversation as a
    new ``chat`` run, ``retry_of`` the old one, queued behind the conversation's unfinished turn if any (turns
    run one at a time, ``kairos.chat``). The run is locked before the conversation, as a worker takes them."""
    run_id: uuid.UUID = run["id"]
    conversation = conversations.lock(conn, run["source_conversation_id"], owner=owner)
    occurrence_id = identity.occurrence_id(conversation.id, Source.CHAT, key=key)
    new_run_id = identity.run_id(occurrence_id)
    existing = db.fetch_one(conn, "occurrences_of_run", {"run_id": new_run_id})
    if existing is not None:  # an earlier retry of the same turn made it
        return Manual(None, occurrence_id, new_run_id, Decision(existing["decision"]), sendable=False)
    last = db.fetch_one(conn, "runs_last_chat_turn", {"conversation_id": conversation.id})
    blocker = None if last is None else last["id"]
    clock = db.fetch_row(conn, "schedules_clock", {"now": now})
    decision = Decision.DISPATCHED if blocker is None else Decision.QUEUED_BEHIND
    occurrences.refuse_over_cap(occurrences.record(conn, [occurrences.planned(
        occurrence_id=occurrence_id, schedule_id=None, source=Source.CHAT,
        fire=calendar.describe(clock["now"].astimezone(UTC), "UTC"), revision=0, decision=decision,
        run_id=new_run_id, blocked_by=blocker, idempotency_key=key, retry_of=run_id,
        chat=(conversation.id, str(run["prompt"])), corpus=run.get("corpus"))], now=now))  # 429 queue_full
    return Manual(None, occurrence_id, new_run_id, decision, sendable=blocker is None)


def _lock_active(conn: psycopg.Connection[db.Row], schedule_id: uuid.UUID, owner: str,
                 now: datetime | None) -> db.Row:
    schedule = db.fetch_one(conn, "schedules_lock_owned", {"schedule_id": schedule_id, "owner": owner, "now": now})
    if schedule is None:
        raise NotFound("schedule")
    if schedule["loop"]:
        raise loop_refusal("run on demand or retried")
    if schedule["status"] != ScheduleStatus.ACTIVE.value:
        raise Conflict(f"the schedule is {schedule['status']}; only an active schedule runs",
                       fields=[FieldError("status", "active", "resume the schedule first")])
    return schedule


def _record(conn: psycopg.Connection[db.Row], schedule: db.Row, *, revision: int, key: str, now: datetime | None,
            retry_of: uuid.UUID | None = None, payload: Any = None) -> Manual:
    schedule_id: uuid.UUID = schedule["id"]
    occurrence_id = identity.occurrence_id(schedule_id, Source.MANUAL, key=key)
    run_id = identity.run_id(occurrence_id)
    existing = db.fetch_one(conn, "occurrences_of_run", {"run_id": run_id})
    if existing is not None:  # an earlier retry of the same run made it
        return Manual(schedule_id, occurrence_id, run_id, Decision(existing["decision"]), sendable=False)
    active = db.fetch_row(conn, "runs_overlap_of_schedule", {"schedule_id": schedule_id})
    verdict = overlap.decide(Overlap(schedule["overlap"]), active["active_run_id"], active["waiting_run_id"])
    if verdict.decision is Decision.SKIPPED_OVERLAP:
        blocking = active["waiting_run_id"] or active["active_run_id"]
        raise OverlapConflict(
            f"run {blocking} of this schedule is still queued or running, and its overlap policy is "
            f"{schedule['overlap']}", fields=[FieldError("overlap", "overlap", f"run {blocking} is in the way")])
    fire = calendar.describe(schedule["db_now"], schedule["timezone"])
    recorded = occurrences.record(conn, [occurrences.planned(
        occurrence_id=occurrence_id, schedule_id=schedule_id, source=Source.MANUAL, fire=fire, revision=revision,
        decision=verdict.decision, run_id=run_id, blocked_by=verdict.blocked_by, idempotency_key=key,
        retry_of=retry_of, payload=payload)], now=now)
    occurrences.refuse_over_cap(recorded)  # 429 queue_full; the caller's transaction records nothing
    sendable = verdict.blocked_by is None
    if verdict.replaces is not None:
        sendable = overlap.replace(conn, old_run_id=verdict.replaces, new_run_id=run_id, now=now)
    return Manual(schedule_id, occurrence_id, run_id, verdict.decision, sendable=sendable,
                  replaced=verdict.replaces if sendable else None)
