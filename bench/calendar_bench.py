"""Calendar speed: ``kairos.calendar`` beside croniter and cronsim on the same expressions and zones.

The calendar walks each compiled expression's fields itself (croniter is only its test oracle now).
Baselines, measured in the same run, interleaved round by round, medians of ``--rounds`` rounds
(CPU time per round: robust to the shared machine):

* croniter 7.0.0 ``get_next``, given the zone-aware start (croniter resolves the zone itself, with its
  own DST handling): *parsed once* (a prototype copied and ``set_current`` per call: the fastest use
  of croniter, what the calendar did before) and *fresh* (``croniter(expr, start).get_next()``);
* cronsim 2.8 ``next(CronSim(expr, start))`` (its only API: the constructor parses), zone-aware start.

Kairos' figure is a whole ``next_fire`` (rule checks, Vixie day semantics, the DST policies, a
``Fire`` record). Tables:
1. next fire, µs per call (what the tick does per due schedule), 9 mixed cases and a *distinct*
   case cycling through 2,000 different expressions in 4 zones (target: ≥ 3x faster than croniter's
   ``get_next``, faster than cronsim);
2. streaming: N consecutive fires from one iterator (preview, backfill), fires/s;
3. ``min_spacing`` latency (an API call makes it on every create; target well under 50 ms).

Run: ``.venv/bin/python bench/calendar_bench.py [--calls N] [--fires N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from itertools import islice
from zoneinfo import ZoneInfo

from croniter import croniter
from cronsim import CronSim

from kairos import calendar
from kairos.calendar import Rule, iter_fires, min_spacing, next_fire
from kairos.states import ScheduleKind

# (label, expression, zone, start) -- starts just before a DST change where the zone has one.
CASES: list[tuple[str, str, str, datetime]] = [
    ("every 5 min, UTC", "*/5 * * * *", "UTC", datetime(2026, 3, 1, tzinfo=UTC)),
    ("every 5 min, New York (DST)", "*/5 * * * *", "America/New_York", datetime(2026, 3, 7, tzinfo=UTC)),
    ("hourly :30, Berlin (DST)", "30 * * * *", "Europe/Berlin", datetime(2026, 3, 20, tzinfo=UTC)),
    ("hourly :30, Lord Howe (DST)", "30 * * * *", "Australia/Lord_Howe", datetime(2026, 4, 1, tzinfo=UTC)),
    ("daily 02:30, New York (DST)", "30 2 * * *", "America/New_York", datetime(2026, 1, 1, tzinfo=UTC)),
    ("daily 07:00, UTC", "0 7 * * *", "UTC", datetime(2026, 1, 1, tzinfo=UTC)),
    ("weekdays 07:00, Berlin", "0 7 * * 1-5", "Europe/Berlin", datetime(2026, 1, 1, tzinfo=UTC)),
    ("monthly 1st 09:00, Lord Howe", "0 9 1 * *", "Australia/Lord_Howe", datetime(2026, 1, 1, tzinfo=UTC)),
    ("every 15 min in the fold, NY", "*/15 0-3 * * *", "America/New_York", datetime(2026, 10, 25, tzinfo=UTC)),
]


def best_of(repeats: int, run: Callable[[], object]) -> float:
    """Fastest of ``repeats`` runs in CPU seconds (process time: robust to a busy machine)."""
    times = []
    for _ in range(repeats):
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    return min(times)


def rounds_of(rounds: int, runs: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Median CPU seconds of each run over ``rounds`` rounds, the runs interleaved within each round."""
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            samples[name].append(best_of(1, run))
    return {name: statistics.median(values) for name, values in samples.items()}


def distinct_case() -> list[tuple[str, str, datetime]]:
    """2,000 different expressions in four zones: every call a different rule (the tick's worst case)."""
    zones = ("Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kathmandu")
    out = []
    for i in range(2000):
        minute, hour = i % 60, (i // 60) % 24
        day = ("*", "1-15", "*/2", "1,15")[(i // 1440) % 2 + (i % 2) * 2]
        dow = ("*", "1-5", "0,6")[i % 3]
        out.append((f"{minute} {hour} {day} * {dow}", zones[i % 4], datetime(2026, 3, 28, 12, tzinfo=UTC)))
    return out


def next_fire_table(calls: int, rounds: int) -> tuple[list[tuple[str, ...]], list[float], list[float]]:
    """µs per next fire: kairos, croniter parsed once, croniter fresh, cronsim."""
    rows = []
    ratios_croniter, ratios_cronsim = [], []
    cases: list[tuple[str, list[tuple[str, str, datetime]]]] = [
        (label, [(expr, zone, start)]) for label, expr, zone, start in CASES]
    cases.append(("distinct: 2,000 expressions x 4 zones", distinct_case()))
    for label, items in cases:
        rules = [Rule(ScheduleKind.CRON, cron=e, timezone=z) for e, z, _ in items]
        starts = [s for _, _, s in items]
        locals_ = [s.astimezone(ZoneInfo(z)) for _, z, s in items]
        protos = [croniter(e, loc) for (e, _, _), loc in zip(items, locals_, strict=True)]
        exprs = [e for e, _, _ in items]
        n = len(items)
        plan = [i % n for i in range(max(calls, n))]

        def ours(rules: list[Rule] = rules, starts: list[datetime] = starts, plan: list[int] = plan) -> None:
            for i in plan:
                next_fire(rules[i], starts[i])

        def croniter_parsed(protos: list[croniter] = protos, locals_: list[datetime] = locals_,
                            plan: list[int] = plan) -> None:
            for i in plan:
                it = copy.copy(protos[i])
                it.set_current(locals_[i], force=True)
                it.get_next(datetime)

        def croniter_fresh(exprs: list[str] = exprs, locals_: list[datetime] = locals_, plan: list[int] = plan) -> None:
            for i in plan:
                croniter(exprs[i], locals_[i]).get_next(datetime)

        def cronsim(exprs: list[str] = exprs, locals_: list[datetime] = locals_, plan: list[int] = plan) -> None:
            for i in plan:
                next(CronSim(exprs[i], locals_[i]))

        ours()  # compile caches warm, as in a container that has ticked before
        got = rounds_of(rounds, {"kairos": ours, "croniter": croniter_parsed, "fresh": croniter_fresh,
                                 "cronsim": cronsim})
        us = {name: seconds / len(plan) * 1e6 for name, seconds in got.items()}
        ratios_croniter.append(us["croniter"] / us["kairos"])
        ratios_cronsim.append(us["cronsim"] / us["kairos"])
        expr_text = f"`{items[0][0]}`" if n == 1 else "(2,000)"
        rows.append((label, expr_text, f"{us['kairos']:.1f}", f"{us['croniter']:.1f}", f"{us['fresh']:.1f}",
                     f"{us['cronsim']:.1f}", f"{us['croniter'] / us['kairos']:.1f}x",
                     f"{us['cronsim'] / us['kairos']:.1f}x"))
    return rows, ratios_croniter, ratios_cronsim


def streaming(count: int, rounds: int) -> list[tuple[str, str, str, str, str, str]]:
    rows = []
    for label, expr, zone, start in CASES:
        rule = Rule(ScheduleKind.CRON, cron=expr, timezone=zone)
        local = start.astimezone(ZoneInfo(zone))

        def ours(rule: Rule = rule, start: datetime = start) -> None:
            for _ in islice(iter_fires(rule, start), count):
                pass

        def theirs(expr: str = expr, local: datetime = local) -> None:
            it = croniter(expr, local)
            for _ in range(count):
                it.get_next(datetime)

        def sim(expr: str = expr, local: datetime = local) -> None:
            for _ in islice(CronSim(expr, local), count):
                pass

        got = rounds_of(rounds, {"kairos": ours, "croniter": theirs, "cronsim": sim})
        rows.append((label, f"`{expr}`", f"{count / got['kairos']:,.0f}", f"{count / got['croniter']:,.0f}",
                     f"{count / got['cronsim']:,.0f}", f"{got['croniter'] / got['kairos']:.1f}x"))
    return rows


def spacing() -> list[tuple[str, str, str, str, str]]:
    rows = []
    after = datetime(2026, 1, 1, tzinfo=UTC)
    for expr, zone in [
        ("*/5 * * * *", "America/New_York"),
        ("*/5 * * * *", "Australia/Lord_Howe"),
        ("* * * * *", "America/New_York"),
        ("0,58 1,3 * * *", "America/New_York"),
        ("0 7 * * 1-5", "Europe/Berlin"),
        ("0 9 * * 1", "Europe/Berlin"),
        ("0 0 29 2 *", "UTC"),
    ]:
        rule = Rule(ScheduleKind.CRON, cron=expr, timezone=zone)
        calendar._year_transitions.cache_clear()
        calendar._compile.cache_clear()
        cold = best_of(1, lambda rule=rule: min_spacing(rule, after))
        samples = [best_of(1, lambda rule=rule: min_spacing(rule, after)) for _ in range(5)]
        rows.append(
            (
                f"`{expr}`",
                zone,
                str(min_spacing(rule, after)),
                f"{cold * 1e3:.1f}",
                f"{statistics.median(samples) * 1e3:.1f}",
            )
        )
    return rows


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fires", type=int, default=2000, help="fires per streaming case")
    parser.add_argument("--calls", type=int, default=2000, help="next_fire calls per case and round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds (medians are reported)")
    args = parser.parse_args()

    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    rows, vs_croniter, vs_cronsim = next_fire_table(args.calls, args.rounds)
    print(f"### Next fire: µs per call, medians of {args.rounds} rounds of {args.calls} calls\n")
    print(table(("case", "cron", "kairos `next_fire`", "croniter get_next (parsed once)", "croniter fresh",
                 "cronsim", "vs croniter", "vs cronsim"), rows))
    print(f"\nkairos is {min(vs_croniter):.1f}-{max(vs_croniter):.1f}x faster than croniter's get_next (geometric "
          f"mean {statistics.geometric_mean(vs_croniter):.1f}x) and {min(vs_cronsim):.1f}-{max(vs_cronsim):.1f}x "
          f"faster than cronsim (geometric mean {statistics.geometric_mean(vs_cronsim):.1f}x)\n")
    print(f"### Streaming: {args.fires} consecutive fires per case, fires/s (medians of {args.rounds} rounds)\n")
    print(table(("case", "cron", "kairos", "croniter", "cronsim", "vs croniter"), streaming(args.fires, args.rounds)))
    print("\n### `min_spacing` latency (after 2026-01-01)\n")
    print(table(("cron", "zone", "min spacing", "cold ms", "warm ms (median of 5)"), spacing()))
    print(f"\nload average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
