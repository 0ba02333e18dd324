"""The due-schedule query's plan under dead tuples: a full scan from the oldest key vs the keyset resume.

Setup (a fresh database on the bench server, ``baseline.server()``): ``--schedules`` active schedules
all due at the same instant; another connection opens a REPEATABLE READ transaction and reads
``schedules`` (a long-running snapshot); then the first ``--fired`` of them, in key order, get their
cursor moved an hour ahead, as fire batches do — every move leaves a dead row version that the held
snapshot keeps from being pruned, and its old index entry in ``schedules_due_key_idx`` in place.

Printed: ``EXPLAIN (ANALYZE, BUFFERS)`` of ``schedules_lock_due`` (one batch of 500, inside a
transaction rolled back afterwards) from the start (``after`` = the smallest key: what every batch did
before the keyset cursor) and resumed after the last key fired, with the shared buffers each touched.
The baseline is the same query's plan on the same rows without dead tuples (before the moves).

Run: ``.venv/bin/python bench/tick_plan.py [--schedules N] [--fired N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import uuid
from datetime import UTC, datetime

import psycopg
from baseline import recreate, server

from kairos import db, migrations

AGENT = {"executor": "echo", "model": "echo", "system": "bench"}
START = (datetime(1, 1, 1, tzinfo=UTC), uuid.UUID(int=0))


def explain(conn: psycopg.Connection[tuple[object, ...]], after: tuple[datetime, uuid.UUID]) -> list[str]:
    # Every owner (one part): the schedules here are one owner's (tests/db/test_tick_parts.py holds a
    # part's plan to the same ordered walk).
    params = {"now": None, "limit": 500, "after_at": after[0], "after_id": after[1], "part": 0, "parts": 1}
    with conn.transaction(force_rollback=True):
        rows = conn.execute(b"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + db.q("schedules_lock_due").encode(),
                            params).fetchall()
    return [str(r[0]) for r in rows]


def summary(plan: list[str]) -> str:
    buffers = next((line.strip() for line in plan if "Buffers:" in line), "")
    timing = next((line.strip() for line in plan if line.startswith("Execution Time")), "")
    return f"{buffers}; {timing}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--fired", type=int, default=9_500)
    args = parser.parse_args()
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with server() as (admin_url, _):
        url = recreate(admin_url, "kairos_bench_tick_plan")
        migrations.apply(url)
        with psycopg.connect(url, autocommit=True) as conn:
            conversation = uuid.uuid4()
            conn.execute("INSERT INTO conversations (id, owner, agent) VALUES (%s, 'plan', %s)",
                         (conversation, json.dumps(AGENT)))
            conn.execute(
                """INSERT INTO schedules (id, owner, conversation_id, prompt, kind, cron, timezone, next_fire_at)
                   SELECT gen_random_uuid(), 'plan', %s, 'p', 'cron', '0 7 * * *', 'UTC', now() - interval '1 minute'
                     FROM generate_series(1, %s)""", (conversation, args.schedules))
            conn.execute("VACUUM ANALYZE schedules")
            clean = explain(conn, START)
            keys = conn.execute("SELECT next_fire_at, id FROM schedules ORDER BY next_fire_at, id LIMIT %s",
                                (args.fired,)).fetchall()
            with psycopg.connect(url) as holder:
                holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
                holder.execute("SELECT count(*) FROM schedules").fetchone()
                for i in range(0, len(keys), 500):  # as fire batches move cursors, 500 at a time
                    conn.execute("UPDATE schedules SET next_fire_at = next_fire_at + interval '1 hour'"
                                 " WHERE id = ANY(%s)", ([k[1] for k in keys[i : i + 500]],))
                conn.execute("ANALYZE schedules")
                full = explain(conn, START)
                resumed = explain(conn, (keys[-1][0], keys[-1][1]))
                holder.rollback()
    print(f"\n{args.schedules:,} due schedules, {args.fired:,} of them fired under a held snapshot\n")
    print("| scan | shared buffers, time |")
    print("|---|---|")
    print(f"| baseline: from the start, no dead tuples | {summary(clean)} |")
    print(f"| from the start (every batch before the keyset cursor) | {summary(full)} |")
    print(f"| resumed after the last key fired (keyset) | {summary(resumed)} |")
    print("\nPlan, from the start under dead tuples:\n\n```\n" + "\n".join(full) + "\n```")
    print("\nPlan, resumed after the last key:\n\n```\n" + "\n".join(resumed) + "\n```")


if __name__ == "__main__":
    main()
