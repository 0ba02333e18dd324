"""Calendar throughput: fires computed per second by ``kairos.calendar`` beside bare croniter.

Baseline (same run, same expressions, same count): croniter's own ``get_next`` on naive times, which
is what the calendar calls underneath, without zone resolution, DST policies, Vixie day semantics or
``Fire`` records. The ratio is kairos time / croniter time (target: under 2x).

Three tables:
1. streaming: one iterator, N consecutive fires (preview, backfill);
2. first fire: a fresh ``next_fire`` per call (what the tick does per due schedule) beside a fresh
   ``croniter(...).get_next()``;
3. ``min_spacing`` latency (an API call makes it on every create; target well under 50 ms).

Run: ``.venv/bin/python bench/calendar_bench.py [--fires N]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from itertools import islice

from croniter import croniter
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


def paired(repeats: int, ours: Callable[[], object], theirs: Callable[[], object]) -> tuple[float, float]:
    """Best CPU time of each, measured alternately so both see the same machine."""
    a, b = [], []
    for _ in range(repeats):
        a.append(best_of(1, ours))
        b.append(best_of(1, theirs))
    return min(a), min(b)


def streaming(count: int) -> list[tuple[str, str, str, str, str]]:
    rows = []
    for label, expr, zone, start in CASES:
        rule = Rule(ScheduleKind.CRON, cron=expr, timezone=zone)
        naive = start.replace(tzinfo=None)

        def ours(rule: Rule = rule, start: datetime = start) -> None:
            for _ in islice(iter_fires(rule, start), count):
                pass

        def theirs(expr: str = expr, naive: datetime = naive) -> None:
            it = croniter(expr, naive, ret_type=datetime)
            for _ in range(count):
                it.get_next()

        ours_s, theirs_s = paired(7, ours, theirs)
        rows.append(
            (label, f"`{expr}`", f"{count / ours_s:,.0f}", f"{count / theirs_s:,.0f}", f"{ours_s / theirs_s:.2f}x")
        )
    return rows


def first_fire(calls: int) -> list[tuple[str, str, str, str, str]]:
    rows = []
    for label, expr, zone, start in CASES:
        rule = Rule(ScheduleKind.CRON, cron=expr, timezone=zone)
        naive = start.replace(tzinfo=None)

        def ours(rule: Rule = rule, start: datetime = start) -> None:
            for _ in range(calls):
                next_fire(rule, start)

        def theirs(expr: str = expr, naive: datetime = naive) -> None:
            for _ in range(calls):
                croniter(expr, naive, ret_type=datetime).get_next()

        ours_s, theirs_s = paired(7, ours, theirs)
        rows.append(
            (
                label,
                f"`{expr}`",
                f"{ours_s / calls * 1e6:,.0f}",
                f"{theirs_s / calls * 1e6:,.0f}",
                f"{ours_s / theirs_s:.2f}x",
            )
        )
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
    parser.add_argument("--fires", type=int, default=3000, help="fires per streaming case")
    parser.add_argument("--calls", type=int, default=300, help="next_fire calls per first-fire case")
    args = parser.parse_args()

    rows = streaming(args.fires)
    print(f"### Streaming: {args.fires} consecutive fires per case\n")
    print(table(("case", "cron", "kairos fires/s", "croniter fires/s", "ratio"), rows))
    ours = [float(r[2].replace(",", "")) for r in rows]
    theirs = [float(r[3].replace(",", "")) for r in rows]
    print(
        f"\nTotal: kairos {statistics.harmonic_mean(ours):,.0f} fires/s vs croniter "
        f"{statistics.harmonic_mean(theirs):,.0f} fires/s (harmonic means)\n"
    )
    print(f"### First fire: fresh `next_fire` vs fresh `croniter(...).get_next()`, {args.calls} calls\n")
    print(table(("case", "cron", "kairos µs/call", "croniter µs/call", "ratio"), first_fire(args.calls)))
    print("\n### `min_spacing` latency (after 2026-01-01)\n")
    print(table(("cron", "zone", "min spacing", "cold ms", "warm ms (median of 5)"), spacing()))


if __name__ == "__main__":
    main()
