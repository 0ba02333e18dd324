"""Where the run path's server share goes, per run: the run handler (``bench/run.py``'s echo runs in fork
mode, one SQS-shaped event per run) in ``--processes`` processes, and per run what the server did for it.

* **CPU**: the handler connections' own backends, read from ``/proc/<pid>/stat`` (user and system) before
  and after the series while the connections stay open; other databases' work on the server is not in it.
* **Statements**: ``pg_stat_statements`` of this database (calls, executor ms, WAL bytes per run); the
  server must preload it. Nested statements (triggers, functions) are listed too, so the column does
  not add up to the CPU: what is left is protocol, executor start-up and commits.
* **Functions**: ``pg_stat_user_functions`` (``track_functions = 'all'`` is set on the database).
* **Rows**: ``pg_stat_user_tables`` per table: inserted, updated, of which HOT, deleted.
* **WAL**: ``pg_waldump`` over the series' WAL range, the records of this database by relation (heap
  and each index) and by record type, full-page images apart, plus the commit records of its
  transactions. Needs the server's ``pg_wal`` directory readable (run as root or postgres) and
  ``pg_waldump`` (``--waldump``).

The database (``kairos_bench_share``, with ``KAIROS_BENCH_DATABASE_SUFFIX``) is recreated and warmed by one
untimed series first, so that the measured one plans from statistics of a database with history.

Run: ``DATABASE_URL=... .venv/bin/python bench/server_share.py [--runs 1000] [--processes 1] [--owners 1]``.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import re
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from baseline import recreate, server
from psycopg import sql
from run import _handler_env, _quiet, handle_shared, seed_runs

from kairos import migrations

WALDUMP = "/usr/lib/postgresql/15/bin/pg_waldump"
_RECORD = re.compile(r"rmgr: (\S+)\s+len \(rec/tot\):\s*(\d+)/\s*(\d+), tx:\s*(\d+), lsn: \S+, prev \S+, "
                     r"desc: (\S+)(.*)")


def _cpu(pid: int) -> tuple[float, float] | None:
    """(user, system) CPU seconds of one process, or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _worker(ids: list[uuid.UUID], next_index: Any, ready: Any, go: Any, finished: Any, release: Any,
            url: str) -> None:
    """One Lambda container running the run function's handler; keeps its connection open until released."""
    _quiet()
    _handler_env(url)
    from kairos.local.stack import load_function

    app = load_function("run")
    database = app.runtime.database()
    with database.connection() as conn:
        conn.execute("SELECT 1")
    ready.put(os.getpid())
    go.wait()
    cpu = time.process_time()
    handle_shared(app.handler, ids, next_index)
    finished.put(time.process_time() - cpu)
    release.wait()
    database.close()


def _backends(conn: psycopg.Connection[Any]) -> set[int]:
    return {int(r[0]) for r in conn.execute(
        """SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
              AND backend_type = 'client backend'""")}


def _tables(conn: psycopg.Connection[Any]) -> dict[str, tuple[int, ...]]:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return {str(r[0]): tuple(int(v) for v in r[1:]) for r in conn.execute(
        "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables")}


def _functions(conn: psycopg.Connection[Any]) -> dict[str, tuple[float, ...]]:
    return {str(r[0]): tuple(float(v) for v in r[1:]) for r in conn.execute(
        "SELECT funcname, calls, self_time, total_time FROM pg_stat_user_functions")}


def _wal(conn: psycopg.Connection[Any], start: str, end: str, waldump: str) -> tuple[
        collections.Counter[str], collections.Counter[str], collections.Counter[str], collections.Counter[str],
        int, int]:
    """This database's WAL between two LSNs: bytes by relation, by record type and by both (full-page
    images apart, by relation), the commit records' bytes of its transactions, and how many there were."""
    data_directory = str(conn.execute("SHOW data_directory").fetchone()[0])  # type: ignore[index]
    database = int(conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()")
                   .fetchone()[0])  # type: ignore[index]
    dump = subprocess.run([waldump, "-p", f"{data_directory}/pg_wal", "-s", start, "-e", end],
                          capture_output=True, text=True, check=False).stdout
    by_relfile: collections.Counter[int] = collections.Counter()
    images_by_relfile: collections.Counter[int] = collections.Counter()
    by_record: collections.Counter[str] = collections.Counter()
    by_relfile_record: collections.Counter[tuple[int, str]] = collections.Counter()
    commits: dict[int, int] = {}
    mine: set[int] = set()
    for line in dump.splitlines():
        match = _RECORD.match(line)
        if match is None:
            continue
        rmgr, record, total, xid, desc, rest = (match.group(1), int(match.group(2)), int(match.group(3)),
                                                int(match.group(4)), match.group(5), match.group(6))
        if rmgr == "Transaction":
            commits[xid] = commits.get(xid, 0) + record
            continue
        blocks = re.findall(r"rel (\d+)/(\d+)/(\d+)", rest)
        if not blocks or int(blocks[0][1]) != database:
            continue
        mine.add(xid)
        by_relfile[int(blocks[0][2])] += record
        images_by_relfile[int(blocks[0][2])] += total - record
        by_record[f"{rmgr}/{desc}"] += record
        by_relfile_record[(int(blocks[0][2]), f"{rmgr}/{desc}")] += record
    names: dict[int, str] = {}
    for relfile in by_relfile:
        row = conn.execute("SELECT pg_filenode_relation(0, %s)::text", (relfile,)).fetchone()
        names[relfile] = str(row[0]) if row and row[0] else str(relfile)
    by_relation: collections.Counter[str] = collections.Counter()
    images: collections.Counter[str] = collections.Counter()
    for relfile, size in by_relfile.items():
        by_relation[names[relfile]] += size
        images[names[relfile]] += images_by_relfile[relfile]
    by_both: collections.Counter[str] = collections.Counter()
    for (relfile, record_type), size in by_relfile_record.items():
        by_both[f"{names[relfile]} {record_type}"] += size
    return by_relation, by_record, by_both, images, sum(commits.get(x, 0) for x in mine), len(mine)


def measure(url: str, runs: int, processes: int, owners: int, waldump: str) -> None:
    ids = seed_runs(url, runs, "fork", owners)
    context = multiprocessing.get_context("spawn")
    ready, finished = context.Queue(), context.Queue()
    go, release = context.Event(), context.Event()
    next_index = context.Value("i", 0)
    children = [context.Process(target=_worker, args=(ids, next_index, ready, go, finished, release, url),
                                daemon=True) for _ in range(processes)]
    for child in children:
        child.start()
    for _ in children:
        ready.get(timeout=120)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database "
                     "WHERE datname = current_database()), 0)")
        tables, functions = _tables(conn), _functions(conn)
        before = {pid: _cpu(pid) for pid in _backends(conn)}
        start = str(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])  # type: ignore[index]
        started = time.monotonic()
        go.set()
        client = sum(finished.get(timeout=3600) for _ in children)
        elapsed = time.monotonic() - started
        end = str(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])  # type: ignore[index]
        user = system = 0.0
        for pid in _backends(conn):
            now, then = _cpu(pid), before.get(pid) or (0.0, 0.0)
            if now is not None:
                user, system = user + now[0] - then[0], system + now[1] - then[1]
        release.set()
        for child in children:
            child.join()
        time.sleep(1.0)  # the backends report their counts as they exit
        tables_after, functions_after = _tables(conn), _functions(conn)
        statements = conn.execute(
            """SELECT query, calls, total_exec_time, wal_bytes FROM pg_stat_statements
                WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND calls > 0
                  AND query NOT LIKE '%%pg_stat%%' AND query NOT LIKE '%%pg_current_wal%%'
                ORDER BY total_exec_time DESC""").fetchall()
        by_relation, by_record, by_both, images, commit_bytes, transactions = _wal(conn, start, end, waldump)
    load = os.getloadavg()[0]
    print(f"{runs} runs, {processes} processes, {owners} owner(s): {runs / elapsed:.0f} runs/s, "
          f"load average {load:.1f}")
    print(f"CPU per run: client {1000 * client / runs:.2f} ms; server {1000 * (user + system) / runs:.2f} ms "
          f"(user {1000 * user / runs:.2f}, system {1000 * system / runs:.2f})")
    wal = sum(by_relation.values()) + commit_bytes
    print(f"WAL per run: {wal / runs:,.0f} B ({commit_bytes / runs:.0f} B of commit records, "
          f"{transactions / runs:.2f} transactions); full-page images {sum(images.values()) / runs:,.0f} B apart")
    print("rows per run (inserted, updated, of which HOT, deleted):")
    for table, after in sorted(tables_after.items()):
        change = [a - b for a, b in zip(after, tables.get(table, (0, 0, 0, 0)), strict=True)]
        if any(change):
            print(f"  {table:32} " + "  ".join(f"{v / runs:5.2f}" for v in change))
    print("WAL per run by relation (bytes; full-page images):")
    for relation, size in by_relation.most_common():
        print(f"  {relation:44} {size / runs:7.0f}  {images[relation] / runs:6.0f}")
    print("WAL per run by record type:")
    for record, size in by_record.most_common(16):
        print(f"  {record:44} {size / runs:7.0f}")
    print("WAL per run by relation and record type:")
    for both, size in by_both.most_common(24):
        print(f"  {both:60} {size / runs:7.0f}")
    print("statements per run (calls, executor ms, WAL bytes; nested ones included):")
    for query, calls, total, wal_bytes in statements:
        text = " ".join(line for line in str(query).splitlines() if not line.strip().startswith("--"))
        head = next((line.strip() for line in str(query).splitlines() if line.strip().startswith("-- name")), "")
        print(f"  {calls / runs:5.2f} {total / runs:7.4f} {float(wal_bytes) / runs:7.0f}  "
              f"{(head or ' '.join(text.split()))[:110]}")
    print("functions per run (calls, self ms, total ms):")
    for name, after in sorted(functions_after.items()):
        change = [a - b for a, b in zip(after, functions.get(name, (0.0, 0.0, 0.0)), strict=True)]
        if change[0]:
            print(f"  {name:40} {change[0] / runs:5.2f} {change[1] / runs:7.4f} {change[2] / runs:7.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000, help="runs in the measured series")
    parser.add_argument("--processes", type=int, default=1, help="handler processes (containers)")
    parser.add_argument("--owners", type=int, default=1, help="owners the runs are dealt over")
    parser.add_argument("--waldump", default=WALDUMP, help="the server's pg_waldump")
    args = parser.parse_args()
    with server() as (admin_url, _):
        url = recreate(admin_url, "kairos_bench_share")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER DATABASE {} SET track_functions = 'all'").format(
                sql.Identifier(conn.info.dbname)))
        migrations.apply(url)
        print("warm-up series (a database with history, statistics taken from it):")
        measure(url, args.runs, args.processes, args.owners, args.waldump)
        print("\nmeasured series:")
        measure(url, args.runs, args.processes, args.owners, args.waldump)

if __name__ == "__main__":
    main()
