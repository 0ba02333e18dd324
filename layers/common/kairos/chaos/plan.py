"""The rehearsal's plan: the workload and the fault schedule, both drawn from one ``random.Random(seed)``.

Role: ``make_plan(seed, minutes)`` answers the same ``Plan`` for the same arguments, byte for byte
(``Plan.digest``): which schedules exist, what arrives at each step of the simulated clock (webhook
deliveries, chat turns with tool calls, how each approval is decided) and which fault strikes at which
step and where. Every fault kind is drawn whatever ``kinds`` selects, then the plan keeps only the
selected ones, so narrowing a failing seed to a subset of kinds keeps those faults at the same points.

Must not: read the clock, the database or anything else that differs between two runs.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

# What each fault stands for in production: docs/operations.md "Fault rehearsal".
FAULT_KINDS = (
    "pg_restart",  # PostgreSQL crash-restarted (immediate) mid-tick or mid-run: an Aurora failover
    "pg_terminate",  # every other session killed with pg_terminate_backend: RDS Proxy / failover resets
    "sqs_duplicate",  # a message delivered twice: SQS at-least-once
    "sqs_delay",  # a message held back and delivered later
    "sqs_reorder",  # a batch delivered in another order
    "sqs_drop",  # a message lost (deleted unprocessed): the tick's repair must send the run again
    "deadline",  # the invocation's remaining time is short: Lambda cuts it at its deadline
    "kill",  # the worker or the tick dies at a probe point or a named statement
    "clock_skew",  # the worker's clock is minutes off the database's
)

# Where a kill strikes: a probe point of the tick or the run worker (kairos.probes), or the nth named
# statement (kairos.db.run) of the invocation.
TICK_POINTS = ("after_select", "after_cursor", "after_inserts", "after_commit", "after_send")
RUN_POINTS = ("after_claim", "heartbeat_started", "after_reserve", "after_send", "before_finish")

# The simulated clock starts half an hour before Europe's spring-forward of 2027 (01:00 UTC): a
# schedule in Europe/Berlin fires across the missing local hour.
START = datetime(2027, 3, 28, 0, 30, tzinfo=UTC)
STEP_SECONDS = 20  # simulated seconds per step

SCHEDULES = (  # name, rule, timezone, agent ("echo" or "demo": the demo model)
    ("berlin-dst", {"cron": "*/5 * * * *"}, "Europe/Berlin", "demo"),
    ("berlin-0230", {"cron": "30 2 * * *"}, "Europe/Berlin", "echo"),  # 02:30 does not exist that day
    ("new-york", {"cron": "*/10 * * * *"}, "America/New_York", "echo"),
    ("kolkata", {"cron": "*/5 * * * *"}, "Asia/Kolkata", "echo"),
    ("sydney", {"every_seconds": 420}, "Australia/Sydney", "demo"),
    ("utc-interval", {"every_seconds": 300}, "UTC", "echo"),
)


@dataclass(frozen=True)
class Action:
    """Workload at one step: a webhook delivery (``keyed``: with an Idempotency-Key, sent ``copies``
    times), a chat turn whose model calls ``http_post`` once with a unique ``mark`` (``approval``:
    whether the agent asks first, ``decision`` what the approver answers), or a corpus run's turn
    (``items`` inline items, ``copies`` per partition)."""

    step: int
    kind: str  # "webhook" | "chat"
    mark: str
    keyed: bool = False
    copies: int = 1
    approval: bool = False
    decision: str = "approve"  # "approve" | "deny"
    items: int = 0


@dataclass(frozen=True)
class Fault:
    """One fault at one step: ``target`` is "tick" or "run"; ``point`` a probe point or ``statement``
    with ``nth``; ``value`` the kind's number (seconds of delay, skew or remaining time)."""

    step: int
    kind: str
    target: str = "run"
    point: str = ""
    nth: int = 1
    value: float = 0.0


@dataclass(frozen=True)
class Plan:
    seed: int
    minutes: float
    steps: int
    kinds: tuple[str, ...]
    actions: tuple[Action, ...] = ()
    faults: tuple[Fault, ...] = ()
    schedules: tuple[tuple[str, dict[str, Any], str, str], ...] = field(default=SCHEDULES)

    def at(self, step: int) -> tuple[list[Action], list[Fault]]:
        return [a for a in self.actions if a.step == step], [f for f in self.faults if f.step == step]

    def digest(self) -> str:
        """SHA-256 of the plan as canonical JSON: equal digests, equal rehearsals (but thread timing)."""
        text = json.dumps(asdict(self), sort_keys=True, default=str)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def counts(self) -> dict[str, int]:
        return {kind: sum(1 for f in self.faults if f.kind == kind) for kind in self.kinds}


def parse_kinds(text: str | None) -> tuple[str, ...]:
    """``--faults a,b``: the kinds named (all when empty, none for ``none``); ValueError naming an unknown one."""
    if not text:
        return FAULT_KINDS
    if text.strip() == "none":
        return ()
    named = tuple(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    unknown = [k for k in named if k not in FAULT_KINDS]
    if unknown:
        raise ValueError(f"unknown fault kind {unknown[0]!r}; known: {', '.join(FAULT_KINDS)}")
    return named


def make_plan(seed: int, minutes: float, kinds: Iterable[str] = FAULT_KINDS, *, fault_rate: float = 0.35) -> Plan:
    """The plan of a rehearsal of ``minutes`` simulated minutes (see the module doc)."""
    rng = random.Random(seed)
    steps = max(3, int(minutes * 60 // STEP_SECONDS))
    actions: list[Action] = []
    faults: list[Fault] = []
    for step in range(steps):
        # Workload first, then faults: both from the same generator, in a fixed order per step.
        if rng.random() < 0.5:
            keyed = rng.random() < 0.6
            actions.append(Action(step, "webhook", _mark(rng), keyed=keyed,
                                  copies=rng.choice((1, 1, 2, 3)) if keyed else 1))
        if rng.random() < 0.4:
            actions.append(Action(step, "chat", _mark(rng), approval=rng.random() < 0.5,
                                  decision=rng.choice(("approve", "approve", "deny"))))
        for kind in FAULT_KINDS:
            if rng.random() >= fault_rate / 3:
                continue
            faults.append(_fault(rng, step, kind))
    # Drawn last, so adding it kept every earlier draw (and each seed's faults) where it was.
    actions.append(Action(rng.randrange(steps // 2 + 1), "corpus", _mark(rng), copies=rng.randint(2, 4),
                          items=rng.randint(5, 12)))
    actions.sort(key=lambda a: a.step)  # stable: within a step, the order drawn
    chosen = tuple(kinds)
    return Plan(seed=seed, minutes=minutes, steps=steps, kinds=chosen, actions=tuple(actions),
                faults=tuple(f for f in faults if f.kind in chosen))


def _mark(rng: random.Random) -> str:
    return f"{rng.getrandbits(64):016x}"


def _fault(rng: random.Random, step: int, kind: str) -> Fault:
    target = "tick" if rng.random() < 0.4 else "run"
    points = TICK_POINTS if target == "tick" else RUN_POINTS
    if kind in ("pg_restart", "pg_terminate"):
        return Fault(step, kind, target, rng.choice(points))
    if kind == "kill":
        if rng.random() < 0.5:
            return Fault(step, kind, target, "statement", nth=rng.randint(1, 12))
        return Fault(step, kind, target, rng.choice(points))
    if kind == "sqs_delay":
        return Fault(step, kind, value=float(rng.randint(1, 3)))
    if kind == "deadline":
        return Fault(step, kind, value=float(rng.choice((500, 3_000, 8_000, 20_000))))
    if kind == "clock_skew":
        return Fault(step, kind, value=float(rng.choice((-1, 1)) * rng.randint(5, 180)))
    return Fault(step, kind, value=float(rng.randint(0, 4)))  # sqs_duplicate/reorder/drop: which message
