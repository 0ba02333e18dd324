"""The run handler's client CPU per run, two checkouts side by side in interleaved blocks (and their server CPU).

Each checkout gets one process (a warm Lambda container: ``functions/run/app.py``'s ``handler`` with
its decorators, echo agent, fork mode, one SQS-shaped event per run, logs and EMF metrics written to
/dev/null) and its own database on ``DATABASE_URL``'s server (``kairos_bench_client_old`` / ``_new``,
recreated; ``--databases`` names another prefix). The two processes take turns: block after block of
``--runs`` handler calls each, the
order swapped every block, so load from elsewhere on the machine falls on both alike. Reported: each
side's median process CPU (user + system) per run, and the median of the per-block ratios; and the same
of the server CPU of each side's own backends (``/proc/<pid>/stat`` of the database's connections: a
server on this machine, run as root or postgres), when readable.

Run: ``.venv/bin/python bench/run_client.py OLD_CHECKOUT NEW_CHECKOUT [--blocks 30] [--runs 100]``
(e.g. a ``git worktree`` of the commit before a change, and this checkout).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

WARM = 100


def serve(root: str, database: str, total: int) -> None:
    """One side: seed ``total`` runs, warm up, then for each line N on stdin run N handler calls and
    print the process CPU milliseconds per run."""
    sys.path[:0] = [f"{root}/layers/common", root, f"{root}/bench"]
    os.chdir(root)
    import run as bench_run
    from baseline import recreate

    from kairos import migrations

    url = recreate(os.environ["DATABASE_URL"], database)
    migrations.apply(url)
    ids = iter(bench_run.seed_runs(url, total, "fork", 1))
    out = os.fdopen(os.dup(1), "w")
    bench_run._quiet()
    bench_run._handler_env(url)
    from kairos.local.stack import load_function

    app = load_function("run")
    for _ in range(WARM):
        assert app.handler(bench_run._sqs_event(next(ids)), bench_run._Context()) == {"batchItemFailures": []}
    out.write("ready\n")
    out.flush()
    import psycopg

    admin = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
    for line in sys.stdin:
        n = int(line)
        events = [(bench_run._sqs_event(next(ids)), bench_run._Context()) for _ in range(n)]
        backends = _backends(admin, database)
        before = _server_cpu(backends)
        cpu = time.process_time()
        for event, context in events:
            if app.handler(event, context) != {"batchItemFailures": []}:
                raise RuntimeError("a record failed")
        client = 1000 * (time.process_time() - cpu) / n
        after = _server_cpu(backends)
        server = float("nan") if before is None or after is None else 1000 * (after - before) / n
        out.write(f"{client:.4f} {server:.4f}\n")
        out.flush()


def _backends(admin: Any, database: str) -> list[int]:
    """The pids of the server backends connected to ``database`` (this side's pool)."""
    rows = admin.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (database,)).fetchall()
    return [int(r[0]) for r in rows]


def _server_cpu(pids: list[int]) -> float | None:
    """The CPU seconds (user + system) these backends have used, from /proc: None when the server is not
    on this machine or its processes are not readable."""
    total = 0.0
    try:
        for pid in pids:
            if b"postgres" not in Path(f"/proc/{pid}/cmdline").read_bytes():  # a server elsewhere: not its pid
                return None
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return None
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--runs", type=int, default=100, help="handler calls per block")
    parser.add_argument("--databases", default="kairos_bench_client",
                        help="the two databases' name prefix (another bench running beside this one needs its own)")
    args = parser.parse_args()
    if "DATABASE_URL" not in os.environ:
        raise SystemExit("set DATABASE_URL (an admin URL of the server to create the two databases on)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    total = WARM + args.blocks * args.runs
    sides = {}
    for name, root in (("old", args.old), ("new", args.new)):
        sides[name] = subprocess.Popen(
            [sys.executable, __file__, "--serve", os.path.abspath(root), f"{args.databases}_{name}", str(total)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    for side in sides.values():
        assert side.stdout is not None and side.stdout.readline().strip() == "ready"
    cpu: dict[str, list[float]] = {"old": [], "new": []}
    server: dict[str, list[float]] = {"old": [], "new": []}
    for block in range(args.blocks):
        for name in ("old", "new") if block % 2 == 0 else ("new", "old"):
            side = sides[name]
            assert side.stdin is not None and side.stdout is not None
            side.stdin.write(f"{args.runs}\n")
            side.stdin.flush()
            client, backend = side.stdout.readline().split()
            cpu[name].append(float(client))
            server[name].append(float(backend))
    for side in sides.values():
        assert side.stdin is not None
        side.stdin.close()
        side.wait()
    old, new = statistics.median(cpu["old"]), statistics.median(cpu["new"])
    ratio = statistics.median(n / o for o, n in zip(cpu["old"], cpu["new"], strict=True))
    print(f"client CPU per run, median of {args.blocks} blocks of {args.runs}: old {old:.3f} ms, new {new:.3f} ms "
          f"({new / old:.3f}x; median block ratio {ratio:.3f}x); load average {os.getloadavg()[0]:.2f}")
    if all(v == v for v in server["old"] + server["new"]) and any(server["old"]):  # read, and not all zero
        old, new = statistics.median(server["old"]), statistics.median(server["new"])
        ratio = statistics.median(n / o for o, n in zip(server["old"], server["new"], strict=True) if o > 0)
        print(f"server CPU per run (the side's own backends, /proc), median of {args.blocks} blocks: old {old:.3f} ms, "
              f"new {new:.3f} ms ({new / old:.3f}x; median block ratio {ratio:.3f}x)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main()
