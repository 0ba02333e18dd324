"""Reduce: the succeeded partitions' lines merged into canonical records, one per (``kind``, ``id``).

Role: ``reduce`` runs ``corpus_records_reduce`` in the caller's fenced transaction (the one that
moves the phase on): fields merge with later partitions (then later lines) winning field by field;
each record's lineage lists the partitions it came from with their item ranges. Only succeeded
partitions contribute: a failed partition's lines were never committed.

Guarantees: idempotent (a restarted reduce finds the records written and adds nothing), done by the
database in one statement (no records pass through this process, so memory stays bounded).

Must not: run outside a transaction holding the run's fence (``Corpus.fenced``).
"""

from __future__ import annotations

from uuid import UUID

import psycopg

from kairos import db


def reduce(conn: psycopg.Connection[db.Row], run_id: UUID) -> int:
    """Writes the canonical records; how many the run has."""
    db.execute(conn, "corpus_records_reduce", {"run_id": run_id})
    row = db.fetch_one(conn, "corpus_records_count", {"run_id": run_id})
    return 0 if row is None else int(row["records"])
