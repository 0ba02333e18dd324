"""Probes: named points where a test observes the tick or a run worker, or simulates a crash there.

Role: ``Probes`` maps a point (``POINTS``) to handlers; the component it is given fires each point
with keyword context. A handler that raises stops the component there, as a crash (the end of a
Lambda invocation, a killed process) would. One mechanism for both components:

* the tick's fire step (``kairos.tick.fire``): ``after_select`` and ``after_cursor`` (inside the
  transaction), ``after_inserts`` (before commit), ``after_commit`` (before the send) and
  ``after_send`` (before the stamp); context: none;
* the run worker (``kairos.runs``): ``after_claim``, ``heartbeat_started``, ``heartbeat``,
  ``after_reserve``, ``after_send`` (the effect went out), ``before_finish``; context: ``run_id``,
  ``fence`` and per point ``effect``, ``heartbeat``, ``alive``, ``cancel_requested``;
* a corpus run (``kairos.corpus``): ``corpus_phase`` (a phase move committed; ``phase``),
  ``corpus_answer`` (a partition's answer checkpointed; ``partition``, ``generation``) and
  ``corpus_part`` (an export part uploaded and checkpointed; ``format``, ``part``).

Guarantees: production passes none (``NO_PROBES``), and firing a point without handlers does nothing.

Must not: change what the component writes — a probe only observes, or raises.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, get_args

Point = Literal[
    "after_select", "after_cursor", "after_inserts", "after_commit",  # the tick's fire step
    "after_claim", "heartbeat_started", "heartbeat", "after_reserve", "before_finish",  # a run
    "after_send",  # both: the tick's SendMessageBatch, a run's effect
    "corpus_phase", "corpus_answer", "corpus_part",  # a corpus run: a phase committed, an answer stored, a part
]
POINTS: frozenset[str] = frozenset(get_args(Point))


class Probes:
    """Handlers per point; ``on`` registers (chainable), ``fire`` calls them in order."""

    def __init__(self) -> None:
        self._handlers: dict[str, list[Callable[..., None]]] = {}

    def on(self, point: Point, handler: Callable[..., None]) -> Probes:
        if point not in POINTS:
            raise ValueError(f"unknown probe point {point}")
        self._handlers.setdefault(point, []).append(handler)
        return self

    def fire(self, point: Point, **context: Any) -> None:
        for handler in self._handlers.get(point, ()):
            handler(**context)


NO_PROBES = Probes()
