"""Limits: what one run may use — its runtime, its attempts, its tool loop's model turns — and a webhook
schedule's delivery rate, with the server's caps on each (docs/api.md "Limits").

Role: the one home of the defaults (``DEFAULTS``), of which names a schedule and an agent may set
(``RUN_NAMES``; ``rate_per_minute`` only on a webhook schedule), of the caps in force (``caps``: the
``KAIROS_MAX_*`` settings), of ``cap_problems`` (a value above its cap is refused naming
``limits.<name>`` and the rule ``server_cap``, so nothing is written) and of ``effective`` (a schedule's
limit, else its agent's, else the default — the rule ``occurrences_insert`` applies in SQL when it
records a run, with the defaults and caps this module passes it).

Where each limit is read: a run's ``runtime_limit_seconds``, ``max_attempts`` and ``max_steps`` are
written when the run is recorded, from the schedule's limits in force then (a retry made after a limit
was raised gets the raised one), and the worker (``kairos.execution``), the retry's requeue and the
tool loop read them from the run; the webhook intake reads ``rate_per_minute`` from the schedule at
each delivery. Every limit is capped when it is recorded; the runtime, the model turns and the rate
are capped again when used, so a lowered cap holds at once for them (attempts: from the next run).

Must not: import pydantic (the shapes are the request models': ``kairos.agents.RunLimits``,
``kairos.schedules.request.ScheduleLimits``) or touch the database.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kairos import runtime
from kairos.errors import FieldError
from kairos.settings import Settings

# What a run gets when neither its schedule nor its agent says otherwise.
# (kairos.executors.base's MAX_STEPS_DEFAULT is this max_steps.)
DEFAULTS: dict[str, int] = {"runtime_seconds": 600, "max_attempts": 3, "max_steps": 8, "rate_per_minute": 60}
# The limits of one run: a schedule's and an agent's. A webhook schedule also takes rate_per_minute.
RUN_NAMES: tuple[str, ...] = ("runtime_seconds", "max_attempts", "max_steps")
WEBHOOK_NAMES: tuple[str, ...] = (*RUN_NAMES, "rate_per_minute")
# The setting that caps each.
SETTINGS: dict[str, str] = {"runtime_seconds": "KAIROS_MAX_RUNTIME_SECONDS", "max_attempts": "KAIROS_MAX_ATTEMPTS",
                            "max_steps": "KAIROS_MAX_STEPS", "rate_per_minute": "KAIROS_MAX_RATE_PER_MINUTE"}


def caps(settings: Settings) -> dict[str, int]:
    """The cap in force on each limit (the ``KAIROS_MAX_*`` settings)."""
    return {"runtime_seconds": settings.max_runtime_seconds, "max_attempts": settings.max_attempts,
            "max_steps": settings.max_steps, "rate_per_minute": settings.max_rate_per_minute}


def cap_problems(limits: Mapping[str, Any] | None, *, prefix: str, settings: Settings) -> list[FieldError]:
    """One ``server_cap`` problem per limit of a well-shaped ``limits`` above its cap, named ``<prefix>.<name>``."""
    if not limits:
        return []
    bounds = caps(settings)
    return [FieldError(f"{prefix}.{name}", "server_cap",
                       f"at most {bounds[name]} on this server ({SETTINGS[name]})")
            for name, value in limits.items()
            if name in bounds and isinstance(value, int) and value > bounds[name]]


def schedule_problems(given: Mapping[str, Any] | None, *, webhook: bool,
                      settings: Settings | None = None) -> list[FieldError]:
    """A schedule's well-shaped ``limits`` checked: above a cap (``cap_problems``, the caps in force when
    ``settings`` is None), and ``rate_per_minute`` on a schedule that is not a webhook (``not_for_kind``)."""
    if not given:
        return []
    if settings is None:
        settings = runtime.settings()  # the caps in force
    problems = cap_problems(given, prefix="limits", settings=settings)
    if "rate_per_minute" in given and not webhook:
        problems.append(FieldError("limits.rate_per_minute", "not_for_kind",
                                   "limits.rate_per_minute applies only to kind webhook; remove it"))
    return problems


def effective(schedule_limits: Mapping[str, Any] | None, agent: Mapping[str, Any] | None,
              settings: Settings) -> dict[str, int]:
    """Each limit as a run gets it: the schedule's, else the agent's (its ``limits``, and for ``max_steps``
    its older ``max_steps``), else the default; never above the cap in force."""
    agent_limits = dict((agent or {}).get("limits") or {})
    if agent and agent.get("max_steps") is not None:
        agent_limits.setdefault("max_steps", agent["max_steps"])
    bounds = caps(settings)
    chosen = {name: (schedule_limits or {}).get(name) or agent_limits.get(name) or DEFAULTS[name]
              for name in WEBHOOK_NAMES}
    return {name: min(int(value), bounds[name]) for name, value in chosen.items()}


def sql_parameters(settings: Settings) -> dict[str, int]:
    """The defaults and caps ``occurrences_insert`` writes a run's limits with (``effective`` in SQL)."""
    bounds = caps(settings)
    return {"default_runtime_seconds": DEFAULTS["runtime_seconds"], "cap_runtime_seconds": bounds["runtime_seconds"],
            "default_max_attempts": DEFAULTS["max_attempts"], "cap_max_attempts": bounds["max_attempts"],
            "default_max_steps": DEFAULTS["max_steps"], "cap_max_steps": bounds["max_steps"]}
