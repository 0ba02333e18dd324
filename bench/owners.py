"""One owner's runs beside the same runs dealt over many owners: what one big tenant's runs lose to its
shared rows and locks (its budget day, its slot lock). ``bench/peers.py``'s two Kairos series alone.

Per round, both series on one server (``DATABASE_URL``'s when set, databases ``kairos_bench_owners*``
recreated, else an embedded one), in alternating order: ``functions/run/app.py``'s handler, the echo
agent in fork mode, 8 processes, every run holding its slot as the tick hands it over
(``bench/run.py``'s ``handler_rate``). Prints per round each series' runs/s and CPU per run (client +
server) and one owner ÷ many; with ``--statements`` the one-owner series' slowest statements by mean
time (``pg_stat_statements``, which the server must preload), where its runs wait.

To compare two checkouts in one run, start it once per checkout with ``--rounds 1`` in turns
(``PYTHONPATH`` naming each checkout, ``KAIROS_BENCH_DATABASE_SUFFIX`` distinct).

Run: ``.venv/bin/python bench/owners.py [--units 2000] [--rounds 3] [--owners 50] [--statements]``.
"""

from __future__ import annotations

import argparse
import os
import statistics

from baseline import recreate, server
from run import handler_rate

from kairos import migrations

WORKERS = 8


def series(admin_url: str, units: int, owners: int, statements: dict[str, tuple[int, float]] | None = None
           ) -> tuple[float, float, float | None]:
    url = recreate(admin_url, "kairos_bench_owners" if owners == 1 else "kairos_bench_owners_many")
    migrations.apply(url)
    handler_rate(url, 200, WORKERS, owners=owners)  # history and statistics first, untimed
    cpu: list[tuple[float, float | None]] = []
    rate = handler_rate(url, units, WORKERS, owners=owners, cpu=cpu, statements=statements)
    return rate, cpu[0][0], cpu[0][1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--owners", type=int, default=50)
    parser.add_argument("--statements", action="store_true", help="the one-owner series' slowest statements")
    args = parser.parse_args()
    one: list[float] = []
    many: list[float] = []
    with server() as (admin_url, _):
        for r in range(args.rounds):
            times: dict[str, tuple[int, float]] | None = {} if args.statements else None
            order = [1, args.owners] if r % 2 == 0 else [args.owners, 1]
            got = {n: series(admin_url, args.units, n, times if n == 1 else None) for n in order}
            one.append(got[1][0])
            many.append(got[args.owners][0])

            def cpu(x: tuple[float, float, float | None]) -> str:
                return f"{x[1]:.2f} + {x[2]:.2f} ms" if x[2] is not None else f"{x[1]:.2f} + ? ms"

            print(f"round {r + 1}: one owner {got[1][0]:,.0f} runs/s ({cpu(got[1])}); {args.owners} owners "
                  f"{got[args.owners][0]:,.0f} runs/s ({cpu(got[args.owners])}); ratio {one[-1] / many[-1]:.2f}; "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
            if times:
                slow = sorted(times.items(), key=lambda kv: -kv[1][1])[:6]
                print("  one owner, mean ms: " + "; ".join(f"{k} {v[1]:.2f} ({v[0]})" for k, v in slow), flush=True)
    ratios = [a / b for a, b in zip(one, many, strict=True)]
    print(f"medians: one owner {statistics.median(one):,.0f} runs/s, {args.owners} owners "
          f"{statistics.median(many):,.0f} runs/s, ratio {statistics.median(ratios):.2f} "
          f"(rounds {', '.join(f'{v:.2f}' for v in ratios)})")


if __name__ == "__main__":
    main()
