"""The loop body, its fixed policies and caps, and the goal envelope: pure checks, no database.

Role: ``parse_loop`` turns a ``POST /v1/loops`` body (or the merge of a ``PATCH /v1/loops/{id}``) into a
schedule request with the loop's fixed policies — catch-up off, overlap ``skip``, mode ``append``, no
backfill — and the server caps (``ends_at`` at most ``MAX_HORIZON_DAYS`` ahead, ``max_occurrences``
at most ``MAX_OCCURRENCES``, both required), checked by the same ``parse_request`` as a schedule, so a
rule is refused with the same field and rule words. A field that would loosen a policy is refused with
rule ``loop_policy`` naming it (a value equal to the fixed one is accepted and changes nothing); any
other field is ``unknown_field``. Every problem is reported at once.

``envelope`` binds the normalized goal (outcome, constraints, verification) to the loop, its revision
and its agent by digests; ``safe`` is what the API shows of it: the outcome, the constraints and the
verification's digest, never the verification text (it tells the loop's runs how their work is
checked, and is seen only by them: ``kairos.execution.goal_report.instructions``).

Must not: read the database or the clock (the caller passes the database's ``now``).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr, TypeAdapter, ValidationError

from kairos.errors import FieldError, LoopPolicy, ValidationFailed, from_validation_error
from kairos.schedules.request import Instant
from kairos.states import ScheduleKind

MAX_HORIZON_DAYS = 90
MAX_OCCURRENCES = 500
OUTCOME_MAX = 2_000
CONSTRAINTS_MAX = 20
CONSTRAINT_MAX = 500
VERIFICATION_MAX = 2_000
DEFAULT_PROMPT = "Work toward the goal, then report with goal_report."

# Fields a loop body takes (create; PATCH takes them all but conversation_id).
FIELDS = frozenset({"conversation_id", "goal", "prompt", "name", "cron", "interval_seconds", "starts_at",
                    "timezone", "ends_at", "max_occurrences", "dst_gap", "dst_fold", "kind", "max_delay_seconds"})
# The fixed policies: a value other than this one would loosen the loop.
FIXED: dict[str, Any] = {"catch_up": False, "overlap": "skip", "mode": "append"}
_NEVER = {
    "backfill": "a loop never backfills past instants",
    "agent": "a loop runs its conversation's agent; change the conversation's agent instead",
    "signing": "a loop is not a webhook",
    "corpus": "a loop run is not a corpus run",
    "notify": "a loop reports through its conversation's inbox",
    "loop": "the loop marker is set by POST /v1/loops",
    "status": "a loop's status moves by pause, resume, cancel and its goal reports",
}
_WHY = {"catch_up": "a loop never catches up missed fires", "overlap": "a loop skips a fire while a run is active",
        "mode": "a loop's runs append to its conversation"}


class Goal(BaseModel):
    """``goal``: what the loop works toward."""

    model_config = ConfigDict(extra="forbid")

    outcome: StrictStr = Field(min_length=1, max_length=OUTCOME_MAX)
    constraints: list[StrictStr] = Field(default_factory=list, max_length=CONSTRAINTS_MAX)
    verification: StrictStr | None = Field(default=None, min_length=1, max_length=VERIFICATION_MAX)


@dataclass(frozen=True)
class LoopBody:
    """A checked loop body: the goal (None when a PATCH leaves it) and the schedule body to validate."""

    goal: Goal | None
    schedule_body: dict[str, Any]


def loop_refusal(action: str) -> LoopPolicy:
    """409 ``loop_policy``: a schedule route that would loosen a loop (trigger, retry, backfill, edit)."""
    return LoopPolicy(f"a goal loop cannot be {action} through the schedules API; its policies are fixed",
                      fields=[FieldError("schedule_id", "loop_policy",
                                         "a loop fires only on its rule, skips on overlap and never backfills; "
                                         "edit it with PATCH /v1/loops/{id}")])


def policy_problems(body: Mapping[str, Any], *, allowed: frozenset[str] = FIELDS) -> list[FieldError]:
    """``loop_policy`` for a field that would loosen a fixed policy, ``unknown_field`` for the rest."""
    problems: list[FieldError] = []
    for name, value in body.items():
        if name in FIXED:
            if value != FIXED[name]:
                problems.append(FieldError(name, "loop_policy", f"{_WHY[name]} ({name} is {FIXED[name]!r})"))
        elif name in _NEVER:
            problems.append(FieldError(name, "loop_policy", _NEVER[name]))
        elif name == "kind":
            if value not in (ScheduleKind.CRON, ScheduleKind.INTERVAL):
                problems.append(FieldError("kind", "loop_policy", "a loop recurs: kind is cron or interval"))
        elif name not in allowed:
            problems.append(FieldError(str(name), "unknown_field", f"{name} is not a loop field"))
    return problems


def goal_problems(raw: object) -> tuple[Goal | None, list[FieldError]]:
    try:
        return Goal.model_validate(raw), []
    except ValidationError as error:
        return None, from_validation_error(error, prefix="goal")


def cap_problems(body: Mapping[str, Any], *, now: datetime) -> list[FieldError]:
    """``ends_at`` and ``max_occurrences``: required and capped (their shapes are parse_request's)."""
    problems: list[FieldError] = []
    if body.get("ends_at") is None:
        problems.append(FieldError("ends_at", "required", "a loop needs an explicit end (at most 90 days ahead)"))
    else:
        try:
            ends = TypeAdapter(Instant).validate_python(body["ends_at"])
        except ValidationError:
            ends = None  # parse_request names the shape problem
        if ends is not None and ends > now + timedelta(days=MAX_HORIZON_DAYS):
            problems.append(FieldError("ends_at", "max_horizon",
                                       f"a loop ends at most {MAX_HORIZON_DAYS} days after now"))
    count = body.get("max_occurrences")
    if count is None:
        problems.append(FieldError("max_occurrences", "required", f"a loop needs a count (at most {MAX_OCCURRENCES})"))
    elif isinstance(count, int) and not isinstance(count, bool) and count > MAX_OCCURRENCES:
        problems.append(FieldError("max_occurrences", "max", f"a loop fires at most {MAX_OCCURRENCES} times"))
    return problems


def parse_loop(raw: object, *, now: datetime, creating: bool = True) -> LoopBody:
    """The loop body checked for policies, caps and goal (see the module doc); the rule itself is
    checked by the caller with ``parse_request`` on ``schedule_body`` so its words are the schedule's."""
    if not isinstance(raw, Mapping):
        raise ValidationFailed([FieldError("body", "type", "give the loop as a JSON object")])
    allowed = FIELDS if creating else FIELDS - {"conversation_id"}
    problems = policy_problems(raw, allowed=allowed)
    goal: Goal | None = None
    if creating or "goal" in raw:
        if raw.get("goal") is None:
            problems.append(FieldError("goal", "required", "a loop needs a goal: {\"outcome\": ...}"))
        else:
            goal, found = goal_problems(raw["goal"])
            problems.extend(found)
    if creating and "conversation_id" not in raw:
        problems.append(FieldError("conversation_id", "required", "give the conversation the loop works in"))
    problems.extend(cap_problems(raw, now=now))
    if problems:
        raise ValidationFailed(problems)
    body = {k: v for k, v in raw.items() if k in FIELDS and k != "goal"}
    body.setdefault("prompt", DEFAULT_PROMPT)
    if "kind" not in body:
        body["kind"] = "interval" if body.get("interval_seconds") is not None else "cron"
    body.update(FIXED)
    return LoopBody(goal, body)


def digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def envelope(goal: Goal, *, schedule_id: uuid.UUID, revision: int, agent: Mapping[str, Any]) -> dict[str, Any]:
    """The private goal envelope: the normalized goal bound to its loop, revision and agent."""
    outcome = " ".join(goal.outcome.split())
    constraints = [" ".join(c.split()) for c in goal.constraints if c.strip()]
    verification = None if goal.verification is None else goal.verification.strip()
    bound = {"outcome": outcome, "constraints": constraints,
             "verification_digest": None if verification is None else digest(verification),
             "schedule_id": str(schedule_id), "revision": revision, "agent_digest": digest(dict(agent))}
    return {**bound, "verification": verification, "digest": digest(bound)}


def same_goal(current: Mapping[str, Any] | None, goal: Goal) -> bool:
    """Whether ``goal`` normalizes to the goal already in force (then a PATCH does not revise it)."""
    if current is None:
        return False
    probe = envelope(goal, schedule_id=uuid.UUID(int=0), revision=0, agent={})
    return (probe["outcome"], probe["constraints"], probe["verification_digest"]) == (
        current.get("outcome"), current.get("constraints"), current.get("verification_digest"))


SAFE_FIELDS = ("outcome", "constraints", "verification_digest", "revision", "digest")


def safe(goal: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What the API shows of a goal envelope."""
    if goal is None:
        return None
    return {k: goal.get(k) for k in SAFE_FIELDS}
