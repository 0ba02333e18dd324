"""Prune: the tick's cleaner for expired idempotency receipts (River's cleaner, on the tick's schedule).

Role: webhook receipts (``webhook_receipts``) and idempotent-create receipts (``idempotency_receipts``)
live 24 h (DESIGN.md "Webhooks"); once expired they answer nothing (a key is new again) and only take
space. ``Prune.run_once`` deletes up to ``batch`` expired rows of each table, oldest first, skipping
rows another transaction holds; the tick repeats it while a table had a full batch and time is left.

Guarantees: only rows whose ``expires_at`` has passed by the database's clock are deleted, so a live
receipt is never lost; concurrent ticks split the rows (SKIP LOCKED) and never wait on each other or
on a webhook request. Pruning costs no request anything: it used to run inside one webhook request in
64.

Must not: delete occurrences or run events (append-only; their retention is the steering issue's).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from kairos import db

DEFAULT_BATCH = 500


@dataclass(frozen=True)
class PruneReport:
    """Rows deleted by one pass, and whether a table had a full batch (more may be left)."""

    webhook_receipts: int = 0
    idempotency_receipts: int = 0
    full: bool = False


class Prune:
    """Deletes expired receipts in bounded batches; holds no connection of its own."""

    def __init__(self, database: db.Database, *, batch: int = DEFAULT_BATCH) -> None:
        self.db = database
        self.batch = batch

    def run_once(self, now: datetime | None = None) -> PruneReport:
        """One batch of each table, each in its own short transaction."""
        params = {"now": now, "limit": self.batch}
        with self.db.transaction() as conn:
            hooks = db.execute(conn, "webhook_receipts_prune", params)
        with self.db.transaction() as conn:
            creates = db.execute(conn, "idempotency_receipts_prune", params)
        return PruneReport(hooks, creates, full=max(hooks, creates) >= self.batch)
