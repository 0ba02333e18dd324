"""Overlap: what a new fire of a schedule does when its previous run is still queued or running.

Role: one rule for every source that makes a run of a schedule — the tick's scheduled fires, a
trigger, a retry. ``decide`` is pure: the schedule's policy and its newest active run (and a run
already waiting behind it) give the occurrence's decision, the run it waits for (``queue_one``) and
the run it replaces (``cancel_replace``). ``replace`` applies a replacement inside the caller's
transaction, after the new run is recorded.

Policies: ``allow`` dispatches; ``skip`` records ``skipped_overlap`` (a trigger answers 409 instead);
``queue_one`` records ``queued_behind`` with a run blocked by the active one, unless one is already
waiting (then ``skipped_overlap``); ``cancel_replace`` dispatches and cancels the active run when it
is replace-safe — no mutation reserved, settled or ambiguous — else the new run ends
``policy_blocked`` (``not_replace_safe``) at once and the active one keeps going.

Guarantees: the replaced run is locked before its effects are read, and its worker reserves effects
by updating that same row and refuses to once a cancel is requested; so a mutation is either seen
here (the new run is blocked) or never reserved (the old run is cancelled). Never both, never neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import psycopg

from kairos import db
from kairos.diagnosis import diagnose
from kairos.observability import logger
from kairos.runs import moves
from kairos.states import Decision, Overlap, RunState


@dataclass(frozen=True, slots=True)
class Verdict:
    decision: Decision
    blocked_by: UUID | None = None  # queue_one: the run this one waits for
    replaces: UUID | None = None  # cancel_replace: the run this one replaces (if replace-safe)


def decide(policy: Overlap, active_run_id: UUID | None, waiting_run_id: UUID | None) -> Verdict:
    """The decision for a fire that would create a run (see the module doc)."""
    if active_run_id is None or policy is Overlap.ALLOW:
        return Verdict(Decision.DISPATCHED)
    if policy is Overlap.CANCEL_REPLACE:
        return Verdict(Decision.DISPATCHED, replaces=active_run_id)
    if policy is Overlap.QUEUE_ONE and waiting_run_id is None:
        return Verdict(Decision.QUEUED_BEHIND, blocked_by=active_run_id)
    return Verdict(Decision.SKIPPED_OVERLAP)


def lock_holding(conn: psycopg.Connection[db.Row], run_ids: list[UUID]) -> None:
    """Locks those of these runs (the runs a batch may replace) that hold a slot, in id order: before
    the caller takes its owners' slot locks (``kairos.tick.fire``), as a statement ending such a run
    does (its row, then its trigger's slot lock)."""
    if run_ids:
        db.fetch_all(conn, "runs_lock_holding", {"ids": run_ids})


def replace(conn: psycopg.Connection[db.Row], *, old_run_id: UUID, new_run_id: UUID,
            now: datetime | None = None) -> bool:
    """Cancels ``old_run_id`` for ``new_run_id`` when replace-safe and answers True; else ends the new
    run ``policy_blocked`` and answers False. An old run that already ended needs nothing: True."""
    old = db.fetch_one(conn, "runs_lock_any", {"run_id": old_run_id})
    if old is None or RunState(old["state"]) not in (RunState.QUEUED, RunState.RUNNING, RunState.AWAITING_APPROVAL):
        return True
    kept = db.fetch_one(conn, "effects_mutation_kept", {"run_id": old_run_id})
    if kept is not None and kept["kept"]:
        moves.block_not_replace_safe(conn, new_run_id, replaces=old_run_id, now=now)
        logger.info("replacement blocked", extra={"action": "run_replace_blocked", "run_id": str(new_run_id),
                                                  "active_run_id": str(old_run_id)})
        return False
    if RunState(old["state"]) is RunState.RUNNING:
        if old["cancel_requested_at"] is None:
            moves.request_cancel(conn, old_run_id, owner=old["owner"], now=now)
    else:
        moves.cancel_waiting(conn, old_run_id, owner=old["owner"], by="replaced", now=now,
                             diagnosis=diagnose("replaced"))
    logger.info("run replaced", extra={"action": "run_replaced", "run_id": str(old_run_id),
                                       "replaced_by": str(new_run_id)})
    return True

