"""One rehearsal (``kairos chaos``): plan, run, check, and the table it prints.

Role: ``main(args)`` builds the plan (``kairos.chaos.plan``: the workload and the faults from one
``random.Random(seed)``), runs it (``kairos.chaos.driver``: the local stack on a simulated database
clock), checks the invariants (``kairos.chaos.invariants``) and prints one table: each fault kind
planned and struck, what happened, each invariant with its count. Exit status 0 when every invariant
held, 1 with the seed and the first violating run's timeline otherwise, 2 for bad arguments.

Guarantees: the same seed and ``--minutes`` (and ``--faults``) replay the same workload and the same
faults at the same points (docs/operations.md "Fault rehearsal" says what stays nondeterministic and
how a failing seed is narrowed down).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from kairos.chaos import invariants
from kairos.chaos.driver import Rehearsal, quiet_logs
from kairos.chaos.plan import FAULT_KINDS, make_plan, parse_kinds

__all__ = ["FAULT_KINDS", "main", "rehearse"]


def rehearse(seed: int, minutes: float, kinds: tuple[str, ...] = FAULT_KINDS, *,
             verbose: bool = False) -> dict[str, Any]:
    """Runs one rehearsal; its plan, counters and checks (and the first violation's timeline)."""
    plan = make_plan(seed, minutes, kinds)
    rehearsal = Rehearsal(plan, verbose=verbose)
    started = time.monotonic()
    with rehearsal.stack():
        rehearsal.run()
        sink = dict(rehearsal.model._server.sink.counts)
        usage = rehearsal.model._server.tally.totals()
        checks = invariants.check(rehearsal.url, sink, usage)
        failing = next((c for c in checks if not c.held and c.first_run), None)
        events = invariants.timeline(rehearsal.url, failing.first_run) if failing and failing.first_run else []
    return {"plan": plan, "counters": rehearsal.counters, "checks": checks, "timeline": events,
            "wall_seconds": time.monotonic() - started, "drained_at": rehearsal.drained_at}


def report(result: dict[str, Any]) -> list[str]:
    plan, counters, checks = result["plan"], result["counters"], result["checks"]
    lines = [f"kairos chaos  seed {plan.seed}  {plan.minutes:g} simulated minutes ({plan.steps} steps)  "
             f"plan {plan.digest()[:16]}  wall {result['wall_seconds']:.0f}s",
             "", f"{'fault':<16}{'planned':>9}{'struck':>9}"]
    for kind in plan.kinds:
        lines.append(f"{kind:<16}{counters.planned[kind]:>9}{counters.struck[kind]:>9}")
    lines += ["", f"{'what happened':<44}{'count':>9}"]
    for name, count in sorted(counters.events.items()):
        lines.append(f"{name:<44}{count:>9}")
    lines += ["", f"{'invariant':<48}{'counted':>9}{'violated':>10}  detail"]
    for c in checks:
        lines.append(f"{c.name:<48}{c.counted:>9}{c.violations:>10}  {'ok' if c.held else 'VIOLATED'}"
                     f"{'  ' + c.detail if c.detail else ''}")
    if not all(c.held for c in checks):
        lines += ["", f"VIOLATED with seed {plan.seed} (replay: kairos chaos --seed {plan.seed} "
                      f"--minutes {plan.minutes:g} --faults {','.join(plan.kinds) or 'none'})"]
        failing = next((c for c in checks if not c.held), None)
        if failing is not None and failing.first_run:
            lines.append(f"first violating run ({failing.name}): {failing.first_run}")
            for e in result["timeline"]:
                lines.append(f"  {e['seq']:>3} {e['type']:<22} attempt {e['attempt']} fence {e['fence']} "
                             f"{e['at'].isoformat()} {e['step'] or ''}")
    return lines


def main(args: argparse.Namespace) -> int:
    try:
        kinds = parse_kinds(args.faults)
    except ValueError as error:
        print(f"kairos chaos: --faults: {error}", file=sys.stderr)
        return 2
    if args.minutes <= 0:
        print("kairos chaos: --minutes must be above 0", file=sys.stderr)
        return 2
    with quiet_logs(args.log_level):
        result = rehearse(args.seed, args.minutes, kinds, verbose=args.verbose)
    for line in report(result):
        print(line)
    return 0 if all(c.held for c in result["checks"]) else 1
