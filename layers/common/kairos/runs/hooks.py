"""Test hooks of the run worker: named points where a test observes a run or simulates a crash.

Role: ``Hooks`` maps a point (``HOOK_POINTS``) to handlers; the worker and its heartbeat fire each
point with keyword context. A handler that raises stops the worker there, as a crash would.

Guarantees: production passes none (``NO_HOOKS``), and firing a point without handlers does nothing.

Must not: change what the worker writes — a hook only observes, or raises.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

HookPoint = Literal["after_claim", "heartbeat_started", "heartbeat", "after_reserve", "after_send", "before_finish"]
HOOK_POINTS: frozenset[str] = frozenset(
    {"after_claim", "heartbeat_started", "heartbeat", "after_reserve", "after_send", "before_finish"}
)


class Hooks:
    """Named points inside ``process`` where tests observe or simulate a crash (a hook that raises).

    Production passes none. A hook receives keyword context (``run_id``, ``fence``, and per point:
    ``effect``, ``heartbeat``, ``alive``, ``cancel_requested``).
    """

    def __init__(self) -> None:
        self._handlers: dict[str, list[Callable[..., None]]] = {}

    def on(self, point: HookPoint, handler: Callable[..., None]) -> Hooks:
        if point not in HOOK_POINTS:
            raise ValueError(f"unknown hook point {point}")
        self._handlers.setdefault(point, []).append(handler)
        return self

    def fire(self, point: HookPoint, **context: Any) -> None:
        for handler in self._handlers.get(point, ()):
            handler(**context)


NO_HOOKS = Hooks()
