"""What the benchmarks share: a PostgreSQL server, fresh databases on it, and the pgbench baseline.

``server()`` yields an admin URL and a pgbench binary: ``DATABASE_URL``'s server with the system
pgbench, or an embedded server (with the pgbench its wheel ships) started and stopped here.
``pgbench_tps`` runs ``pgbench -b simple-update`` with 8 clients in its own database of the same
server, so Kairos and the baseline share the machine, the server and its settings in one run.
``held_snapshot`` holds a REPEATABLE READ snapshot open (the MVCC-pressure series). ``Meter`` reads
what a series wrote: WAL bytes, rows and commits per unit of work (the work that bounds a path);
``server_cpu`` the CPU its server backends spent.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

SYSTEM_PGBENCH = "/usr/lib/postgresql/15/bin/pgbench"
CLIENTS = 8


@contextmanager
def server() -> Iterator[tuple[str, str | None]]:
    """(admin URL, pgbench binary or None)."""
    given = os.environ.get("DATABASE_URL")
    if given:
        yield given, shutil.which("pgbench") or (SYSTEM_PGBENCH if Path(SYSTEM_PGBENCH).exists() else None)
        return
    from kairos.local.postgres import LocalPostgres

    local = LocalPostgres()
    try:
        yield local.url(), str(local.bin_dir / "pgbench")
    finally:
        local.stop()


def url_for(admin_url: str, database: str) -> str:
    params: dict[str, Any] = conninfo_to_dict(admin_url)
    params["dbname"] = database
    return make_conninfo(**params)


def recreate(admin_url: str, database: str) -> str:
    """An empty database named ``database`` (dropped first if it exists); returns its URL. With
    ``KAIROS_BENCH_DATABASE_SUFFIX`` set, the name gets ``_<suffix>``: two people benchmarking on one
    server at once then each drop and recreate only their own databases."""
    suffix = os.environ.get("KAIROS_BENCH_DATABASE_SUFFIX", "")
    if suffix:
        database = f"{database}_{suffix}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    return url_for(admin_url, database)


@dataclass(frozen=True)
class Work:
    """What one unit of work (a transaction, a run, a job) wrote, on average over a series."""

    wal_bytes: float  # WAL inserted (cluster-wide: series run one at a time)
    rows: float  # rows inserted, updated and deleted in the series' database, triggers' writes included
    commits: float  # transactions committed in that database

    def __str__(self) -> str:
        return f"{self.wal_bytes:,.0f} B WAL, {self.rows:.1f} rows, {self.commits:.1f} commits"


class Meter:
    """``start()`` before a series, ``stop(units)`` after it, once the series' connections are closed
    (a backend reports its row and commit counts when it exits, or idle up to seconds later)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._before: tuple[int, int, int] | None = None

    def _read(self) -> tuple[int, int, int]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute(
                """SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint,
                          tup_inserted + tup_updated + tup_deleted, xact_commit
                     FROM pg_stat_database WHERE datname = current_database()""").fetchone()
        assert row is not None
        return int(row[0]), int(row[1]), int(row[2])

    def start(self) -> None:
        self._before = self._read()

    def stop(self, units: int) -> Work:
        assert self._before is not None, "start() first"
        after = self._read()
        wal, rows, commits = (a - b for a, b in zip(after, self._before, strict=True))
        return Work(wal / units, rows / units, max(0, commits - 1) / units)  # less the start read's own


def pgbench_tps(binary: str | None, url: str, seconds: int, work: list[Work] | None = None) -> float | None:
    """``pgbench -b simple-update -c 8 -j 2 -T seconds`` TPS on ``url`` (initialized at scale 1); what a
    transaction wrote is appended to ``work`` when given."""
    if binary is None or not Path(binary).exists():
        print(f"pgbench not found ({binary}): baseline skipped", file=sys.stderr)
        return None
    params = conninfo_to_dict(url)
    env = dict(os.environ)
    if params.get("password"):
        env["PGPASSWORD"] = str(params["password"])
    common = ["-h", str(params.get("host", "localhost")), "-U", str(params.get("user", "postgres"))]
    if params.get("port"):
        common += ["-p", str(params["port"])]
    dbname = str(params["dbname"])
    subprocess.run([binary, "-i", "-q", "-s", "1", *common, dbname], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    meter = Meter(url)
    meter.start()
    out = subprocess.run([binary, "-b", "simple-update", "-c", str(CLIENTS), "-j", "2", "-T", str(seconds),
                          *common, dbname], check=True, env=env, capture_output=True, text=True).stdout
    done = re.search(r"number of transactions actually processed: ([0-9]+)", out)
    if work is not None and done and int(done.group(1)):
        work.append(meter.stop(int(done.group(1))))
    match = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out)
    return float(match.group(1)) if match else None


@contextmanager
def held_snapshot(url: str, table: str) -> Iterator[None]:
    """A REPEATABLE READ transaction that has read ``table``, open until the block ends: vacuum must keep
    every row version written meanwhile."""
    with psycopg.connect(url) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))).fetchone()
        try:
            yield
        finally:
            conn.rollback()


def server_cpu(url: str) -> float | None:
    """CPU seconds of the server's exited backends (the postmaster's reaped children), or None when the
    server is not a local one this process may read: a series' server CPU is the difference across it,
    once its connections are closed.

    A backend whose client has just disconnected is still exiting for a moment; read before it is
    reaped, its CPU would land in the next series (a setup's VACUUM counted as the tick's). So this
    first waits (up to 10 s) until no client backend is exiting or connected but this one. Autovacuum
    workers are counted when they exit, in whichever series that is."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SHOW data_directory").fetchone()
            assert row is not None
            pid = int((Path(str(row[0])) / "postmaster.pid").read_text().split()[0])
            _await_client_exits(conn, pid)
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")  # cutime, cstime
    except (OSError, ValueError, psycopg.Error, AssertionError):
        return None


def _await_client_exits(conn: psycopg.Connection[Any], postmaster: int) -> None:
    """Until every child of the postmaster is this connection's backend or a known non-client process
    (the auxiliary processes, autovacuum): any other child is a client backend, live or exiting."""
    listing = Path(f"/proc/{postmaster}/task/{postmaster}/children")
    if not listing.exists():  # a kernel without CONFIG_PROC_CHILDREN: read at once, as before
        return
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        children = {int(p) for p in listing.read_text().split()}
        known = {int(r[0]) for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type <> 'client backend' OR pid = pg_backend_pid()")}
        if children <= known:
            return
        time.sleep(0.01)
