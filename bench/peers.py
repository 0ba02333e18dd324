"""The run path beside its peers: Kairos's run handler, a DBOS Transact workflow, a Procrastinate job and
pgbench, all on one PostgreSQL server, 8 workers each, the same number of units, rounds interleaved.

Each peer in its fastest realistic shape:

* **Kairos** — ``functions/run/app.py``'s handler with its decorators, the echo agent in fork mode,
  one SQS-shaped event per run, 8 processes (8 Lambda containers); SQS itself not involved
  (``bench/run.py``'s ``handler_rate``). Twice: every run of one owner (its slots, its day's ledger
  row), and the runs dealt over 50 owners (``--owners``); the one-owner figure over the other says
  what one big tenant's runs lose to its shared rows.
* **DBOS Transact** — a workflow with one step, ``DBOS.start_workflow`` + ``get_result`` from 8 threads
  of one process (DBOS's in-process executor; its system database on this server).
* **Procrastinate 3.10** — ``defer`` → ``fetch_job`` → ``finish_job`` from 8 coroutines of one process
  (its ``JobManager`` without the worker's polling sleeps; ``bench/run.py``'s ``procrastinate_rates``).
* **pgbench** ``-b simple-update -c 8 -j 2``, ``units / 8`` transactions per client: the server's own
  rate for a small update transaction.

Per peer and round: units/s; CPU per unit, client (the peer's processes, pgbench's included) + server
(the exited backends' CPU, read from /proc through the postmaster's reaped children: ``baseline.server_cpu``);
rows written and WAL per unit (``pg_stat_database`` and ``pg_current_wal_insert_lsn`` differences, each
series alone on the server). Medians over rounds and each round's ratio of Kairos to each peer.

The server is ``DATABASE_URL``'s when set (databases ``kairos_bench_peers*`` recreated), else an embedded one.

Run: ``.venv/bin/python bench/peers.py [--units 2000] [--rounds 3] [--owners 50]``.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import resource
import statistics
import subprocess
import time
from typing import Any

from baseline import Meter, Work, recreate, server, server_cpu
from psycopg.conninfo import conninfo_to_dict
from run import handler_rate, procrastinate_rates

from kairos import migrations

WORKERS = 8
Result = tuple[float, float, float | None, Work]  # units/s, client ms, server ms, what a unit wrote


def kairos(url: str, units: int, owners: int = 1) -> Result:
    work: list[Work] = []
    cpu: list[tuple[float, float | None]] = []
    rate = handler_rate(url, units, WORKERS, owners=owners, work=work, cpu=cpu)
    return rate, cpu[0][0], cpu[0][1], work[0]


def _sqlalchemy_url(url: str) -> str:
    p = conninfo_to_dict(url)
    auth = f"{p.get('user', 'postgres')}" + (f":{p['password']}" if p.get("password") else "")
    return (f"postgresql+psycopg://{auth}@/{p['dbname']}?host={p.get('host', 'localhost')}"
            f"&port={p.get('port', 5432)}")


def _dbos_child(url: str, units: int, out: Any) -> None:
    import logging
    import threading

    from dbos import DBOS, DBOSConfig

    logging.disable(logging.WARNING)
    config: DBOSConfig = {"name": "bench", "system_database_url": _sqlalchemy_url(url),
                          "sys_db_pool_size": WORKERS + 4, "log_level": "ERROR"}
    DBOS(config=config)

    @DBOS.step()
    def step(i: int) -> int:
        return i + 1

    @DBOS.workflow()
    def workflow(i: int) -> int:
        return step(i)

    DBOS.launch()
    DBOS.start_workflow(workflow, 0).get_result()  # warm: schema, pools
    share = [units // WORKERS + (1 if i < units % WORKERS else 0) for i in range(WORKERS)]

    def worker(n: int) -> None:
        for i in range(n):
            assert DBOS.start_workflow(workflow, i).get_result() == i + 1

    threads = [threading.Thread(target=worker, args=(n,)) for n in share]
    cpu = time.process_time()
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu
    DBOS.destroy()
    out.put((elapsed, cpu))


def dbos(url: str, units: int) -> Result:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    # A first process creates DBOS's schema (untimed); the measured one starts on it.
    for measured in (False, True):
        if measured:
            meter = Meter(url)
            meter.start()
            server_before = server_cpu(url)
        proc = ctx.Process(target=_dbos_child, args=(url, units if measured else WORKERS, out))
        proc.start()
        elapsed, client = out.get(timeout=900)
        proc.join(60)
    work = meter.stop(units)
    server_after = server_cpu(url)
    server_ms = None if server_before is None or server_after is None else 1000 * (server_after - server_before) / units
    return units / elapsed, 1000 * client / units, server_ms, work


def procrastinate(url: str, units: int) -> Result:
    work: list[Work] = []
    cpu: list[tuple[float, float | None]] = []
    rate = asyncio.run(procrastinate_rates(url, units, WORKERS, work, cpu))[0]
    return rate, cpu[0][0], cpu[0][1], work[0]


def pgbench(binary: str, url: str, units: int) -> Result:
    p = conninfo_to_dict(url)
    env = {**os.environ, **({"PGPASSWORD": str(p["password"])} if p.get("password") else {})}
    common = ["-h", str(p.get("host", "localhost")), "-U", str(p.get("user", "postgres")),
              *(["-p", str(p["port"])] if p.get("port") else [])]
    subprocess.run([binary, "-i", "-q", "-s", "1", *common, str(p["dbname"])], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    meter = Meter(url)
    meter.start()
    server_before = server_cpu(url)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([binary, "-b", "simple-update", "-c", str(WORKERS), "-j", "2", "-t", str(units // WORKERS),
                    *common, str(p["dbname"])], check=True, env=env, capture_output=True)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    work = meter.stop(units)
    server_after = server_cpu(url)
    client = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
    server_ms = None if server_before is None or server_after is None else 1000 * (server_after - server_before) / units
    return units / elapsed, 1000 * client / units, server_ms, work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--owners", type=int, default=50, help="owners of the second Kairos series")
    args = parser.parse_args()
    names = ["Kairos run handler", "DBOS workflow", "Procrastinate job", "pgbench simple-update",
             f"Kairos run handler, {args.owners} owners"]
    results: dict[str, list[Result]] = {n: [] for n in names}
    with server() as (admin_url, pgbench_bin):
        assert pgbench_bin is not None, "pgbench not found"
        for r in range(args.rounds):
            kairos_url = recreate(admin_url, "kairos_bench_peers")
            migrations.apply(kairos_url)
            handler_rate(kairos_url, 200, WORKERS)  # history and statistics first, untimed
            results[names[0]].append(kairos(kairos_url, args.units))
            many_url = recreate(admin_url, "kairos_bench_peers_owners")
            migrations.apply(many_url)
            handler_rate(many_url, 200, WORKERS, owners=args.owners)
            results[names[4]].append(kairos(many_url, args.units, args.owners))
            results[names[1]].append(dbos(recreate(admin_url, "kairos_bench_peers_dbos"), args.units))
            results[names[2]].append(procrastinate(recreate(admin_url, "kairos_bench_peers_procrastinate"), args.units))
            results[names[3]].append(pgbench(pgbench_bin, recreate(admin_url, "kairos_bench_peers_pgbench"),
                                             args.units))
            k = results[names[0]][-1][0]
            print(f"round {r + 1}: " + "; ".join(f"{n} {results[n][-1][0]:,.0f}/s" for n in names)
                  + f"; Kairos / DBOS {k / results[names[1]][-1][0]:.2f}x, / Procrastinate "
                  f"{k / results[names[2]][-1][0]:.2f}x, / pgbench {k / results[names[3]][-1][0]:.3f}"
                  f", one owner / {args.owners} owners {k / results[names[4]][-1][0]:.2f}", flush=True)

    def med(values: list[float | None]) -> str:
        known = [v for v in values if v is not None]
        return f"{statistics.median(known):.2f}" if known else "?"

    print(f"\n{args.units} units, 8 workers each, medians of {args.rounds} rounds; load {os.getloadavg()[0]:.1f}")
    print("| system | units/s | CPU per unit, client + server (ms) | rows written per unit | WAL per unit |")
    print("|---|---:|---:|---:|---:|")
    for n in names:
        rs = results[n]
        print(f"| {n} | {statistics.median(x[0] for x in rs):,.0f} | {med([x[1] for x in rs])} + "
              f"{med([x[2] for x in rs])} | {statistics.median(x[3].rows for x in rs):.1f} | "
              f"{statistics.median(x[3].wal_bytes for x in rs) / 1024:.1f} KiB |")
    kr = [x[0] for x in results[names[0]]]
    for n in names[1:]:  # the last: one owner over many (target ≥ 0.9)
        ratios = [k / x[0] for k, x in zip(kr, results[n], strict=True)]
        print(f"Kairos / {n}: rounds {', '.join(f'{v:.3f}' for v in ratios)}; median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
