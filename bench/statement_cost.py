"""What the database machinery alone costs: one prepared statement, one commit, one explicit transaction.

Why: a run makes about ten statements and three commits (``bench/run.py``). Batching runs (sharing
statements and commits across the records of an SQS batch) or folding statements together can only win
back what those statements and commits cost *as such* — their protocol messages, psycopg's work for
each, the transaction starts and the WAL flushes — not what each run writes. This measures that
machinery on the same server, so ``bench/run.py`` can say how much of a run it is, and what is left
that no batching shares.

Series (one process, one connection, statements prepared and sent through ``kairos.db`` as the run path
sends them, ``--statements`` each; CPU per statement, the client's own and the server backend's):

* a one-row read (``SELECT`` of two parameters), autocommit: one statement with a round trip of its
  own, no write, no flush;
* the same read, alone in an explicit transaction: its excess over autocommit is the ``BEGIN`` and
  ``COMMIT`` round of psycopg's ``transaction()``;
* a one-row ``UPDATE``, autocommit: one statement and one commit that flushes the WAL;
* the same update, ten to an explicit transaction: the autocommit update's excess over it is nine
  tenths of a flushing commit, less a tenth of the ``BEGIN`` and ``COMMIT`` round.

Run: ``.venv/bin/python bench/statement_cost.py [--statements N]`` (``DATABASE_URL`` or an embedded
server, as the other benches).
"""

from __future__ import annotations

import argparse
import contextlib
import time
import uuid
from dataclasses import dataclass

import psycopg
from baseline import recreate, server, server_cpu
from psycopg.rows import dict_row

from kairos import db

_READ = db.compile_query("SELECT %(a)s::uuid AS a, %(b)s::int AS b")
_WRITE = db.compile_query("UPDATE statement_cost SET n = n + 1 WHERE id = %(b)s RETURNING n")
_ROWS = 1000


@dataclass(frozen=True)
class Cost:
    """CPU µs per unit: the client process's, and the server backend's (None: not a local server)."""

    client: float
    server: float | None

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.client + other.client,
                    None if self.server is None or other.server is None else self.server + other.server)

    def __sub__(self, other: Cost) -> Cost:
        return self + other * -1.0

    def __mul__(self, factor: float) -> Cost:
        return Cost(self.client * factor, None if self.server is None else self.server * factor)


@dataclass(frozen=True)
class Machinery:
    """The parts: a statement (the read, autocommit), a commit that flushes the WAL beyond its statement,
    and an explicit transaction's BEGIN/COMMIT beyond autocommit."""

    statement: Cost
    commit: Cost
    explicit: Cost

    def of(self, statements: float, commits: float, explicit: float) -> Cost:
        """The machinery of a unit of work with these counts (``statements`` without BEGIN and COMMIT;
        ``commits`` that flush, autocommit ones included; ``explicit`` transactions among them)."""
        return self.statement * statements + self.commit * commits + self.explicit * explicit


def _series(url: str, query: db.Compiled, count: int, per_transaction: int, explicit: bool) -> Cost:
    before = server_cpu(url)
    with psycopg.connect(url, autocommit=True, row_factory=dict_row, prepare_threshold=0) as conn:
        cpu = time.process_time()
        for done in range(0, count, per_transaction):
            with conn.transaction() if explicit else contextlib.nullcontext():
                for i in range(done, done + per_transaction):
                    db.run(conn, query, {"a": uuid.uuid4(), "b": i % _ROWS + 1}, prepare=True).fetchone()
        client = time.process_time() - cpu
    after = server_cpu(url)  # once the connection is closed: its backend has exited and been reaped
    server_us = None if before is None or after is None else 1e6 * (after - before) / count
    return Cost(1e6 * client / count, server_us)


def measure(admin_url: str, count: int = 20_000) -> Machinery:
    """The machinery's parts on ``admin_url``'s server (a database ``kairos_bench_statement_cost``)."""
    url = recreate(admin_url, "kairos_bench_statement_cost")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE statement_cost (id int PRIMARY KEY, n bigint NOT NULL DEFAULT 0)")
        conn.execute("INSERT INTO statement_cost (id) SELECT generate_series(1, %s)", (_ROWS,))
    _series(url, _READ, count // 10, 10, True)  # warm: the server's caches, the client's code paths
    read_autocommit = _series(url, _READ, count, 1, False)
    read_alone = _series(url, _READ, count, 1, True)
    write_autocommit = _series(url, _WRITE, count, 1, False)
    write_in_ten = _series(url, _WRITE, count, 10, True)
    explicit = read_alone - read_autocommit
    # An update of ten carries a tenth of its transaction's flushing commit and BEGIN/COMMIT:
    # write_autocommit - write_in_ten = 0.9 commit - explicit / 10.
    commit = (write_autocommit - write_in_ten + explicit * 0.1) * (1 / 0.9)
    return Machinery(statement=read_autocommit, commit=commit, explicit=explicit)


def describe(m: Machinery) -> str:
    def us(cost: Cost) -> str:
        return f"{cost.client:.0f} µs client + {'n/a' if cost.server is None else f'{cost.server:.0f}'} µs server"

    return (f"a statement {us(m.statement)}; a commit that flushes the WAL {us(m.commit)} more; an explicit "
            f"transaction's BEGIN and COMMIT {us(m.explicit)} more than autocommit")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--statements", type=int, default=20_000, help="statements per series")
    args = parser.parse_args()
    with server() as (admin_url, _):
        machinery = measure(admin_url, args.statements)
    print(f"Machinery (one process, prepared statements through kairos.db): {describe(machinery)}.")


if __name__ == "__main__":
    main()
