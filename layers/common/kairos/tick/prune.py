"""Prune: the tick's cleaner — expired receipts, and run threads and payloads past retention (River's cleaner).

Role: webhook receipts (``webhook_receipts``) and idempotent-create receipts (``idempotency_receipts``)
live 24 h (docs/api.md "API", webhooks); once expired they answer nothing (a key is new again) and only take
space. Ended runs keep their thread (the fork or fresh conversation the run created), their webhook
payload and the rest of what they said or were told for ``KAIROS_RETENTION_DAYS`` (default 30) after
they end; then the thread's entries are deleted, the payload is cleared, the steps' previews and step
log (model turns, tool arguments and answers) are cleared (each step stamped ``pruned_at``), corpus
outputs and records are deleted, settled budget reservations are cleared,
approvals' argument previews and input requests' questions become a marker, and the run is stamped
``pruned_at`` (docs/architecture.md "Runs, traces and guarantees", Retention). ``Prune.run_once``
handles up to ``batch`` rows of each kind, oldest first, skipping rows another transaction holds;
the tick repeats it while a kind had a full batch and time is left.

Guarantees: only receipts whose ``expires_at`` has passed and runs that ended (and were settled) more
than the retention ago, by the database's clock, are touched. A run keeps its state, output reference,
usage, diagnosis, occurrence and whole trace: the output projection then answers ``unavailable``
(``pruned``), never rewriting ``succeeded``. Trace events are not pruned at all: their data is safe
by construction (``kairos.trace.assert_safe``: ids, codes, counts, never a prompt, a completion or a
payload), so they are the metadata that outlives the source. A thread is emptied only while it is still
the run's alone (every entry the run's, no fork of it, no schedule on it), under a lock that keeps a
schedule create or an append from interleaving; a user's own conversation (a root they created, an
append-mode target) is never touched. Concurrent ticks split the rows (SKIP LOCKED) and never wait.

Must not: delete occurrences or run events, or anything of a run that has not ended. Deletes of
conversation entries pass the append-only triggers (0004, 0008) only through
``kairos_allow_pruning()``, called in the same transaction as the delete.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import psycopg

from kairos import db
from kairos.observability import logger
from kairos.settings import DEFAULT_RETENTION_DAYS
from kairos.tick.counts import counted

DEFAULT_BATCH = 500
# What an input request's question reads once its run is past retention (the column is never empty).
FORGOTTEN = "(forgotten: past retention)"


@dataclass(frozen=True)
class PruneReport:
    """What one pass removed, and whether a kind had a full batch (more may be left)."""

    webhook_receipts: int = counted("pruned")
    idempotency_receipts: int = counted("pruned")
    runs: int = counted("runs_pruned")  # ended runs stamped pruned_at (their payload cleared, their own thread emptied)
    threads: int = counted("threads_pruned")  # run threads whose entries were deleted
    entries: int = counted("entries_pruned")
    payloads: int = counted("payloads_pruned")  # webhook payloads cleared
    steps: int = counted("steps_pruned")  # steps whose previews and log were cleared (stamped pruned_at)
    corpus_rows: int = counted("corpus_rows_pruned")  # corpus outputs and records deleted
    previews: int = counted("previews_pruned")  # approvals' argument previews replaced by a marker
    questions: int = counted("questions_pruned")  # input requests' questions replaced by FORGOTTEN
    reservations: int = counted("reservations_pruned")  # settled budget reservations cleared (the ledger keeps totals)
    full: bool = False


@dataclass(frozen=True)
class _Forgotten:
    locked: int = 0
    runs: int = 0
    threads: int = 0
    entries: int = 0
    payloads: int = 0
    content: dict[str, int] = field(default_factory=dict)  # runs_forget_content's counts


class Prune:
    """Deletes expired receipts and forgets old runs' threads in bounded batches; holds no connection."""

    def __init__(self, database: db.Database, *, batch: int = DEFAULT_BATCH,
                 retention_days: int = DEFAULT_RETENTION_DAYS) -> None:
        if retention_days < 1:
            raise ValueError("retention_days must be at least 1")
        self.db = database
        self.batch = batch
        self.retention_days = retention_days

    def run_once(self, now: datetime | None = None) -> PruneReport:
        """One batch of each kind, each in its own short transaction."""
        params = {"now": now, "limit": self.batch}
        with self.db.transaction() as conn:
            hooks = db.execute(conn, "webhook_receipts_prune", params)
        with self.db.transaction() as conn:
            creates = db.execute(conn, "idempotency_receipts_prune", params)
        forgotten = self._forget_runs(now)
        # A full batch of runs whose threads were all busy is no reason to try again at once.
        more_runs = forgotten.locked >= self.batch and forgotten.runs > 0
        return PruneReport(hooks, creates, forgotten.runs, forgotten.threads, forgotten.entries, forgotten.payloads,
                           **forgotten.content, full=max(hooks, creates) >= self.batch or more_runs)

    def _forget_runs(self, now: datetime | None) -> _Forgotten:
        """One transaction: lock a batch of runs past retention, then their threads (a thread held by a
        writer leaves its run for a later tick), empty the threads still the run's alone, stamp the runs."""
        with self.db.transaction() as conn:
            locked = db.fetch_all(conn, "runs_lock_past_retention",
                                  {"now": now, "limit": self.batch, "retention_days": self.retention_days})
            if not locked:
                return _Forgotten()
            wanted = [row["thread_id"] for row in locked if row["thread_id"] is not None]
            held = {row["id"] for row in db.fetch_all(conn, "conversations_lock_threads", {"ids": wanted})} \
                if wanted else set()
            ready = [row for row in locked if row["thread_id"] is None or row["thread_id"] in held]
            gone, content, marked = self._forget(conn, ready, now) if ready else ([], {}, [])
        forgotten = _Forgotten(locked=len(locked), runs=len(marked),
                               threads=len({row["conversation_id"] for row in gone}), entries=len(gone),
                               payloads=sum(1 for row in marked if row["had_payload"]),
                               content=content)
        logger.info("runs pruned past retention", extra={
            "action": "runs_pruned", "retention_days": self.retention_days, "runs": forgotten.runs,
            "threads": forgotten.threads, "entries": forgotten.entries, "payloads": forgotten.payloads,
            **forgotten.content, "busy_threads": len(locked) - len(ready)})
        return forgotten

    @staticmethod
    def _forget(conn: psycopg.Connection[db.Row], ready: list[db.Row], now: datetime | None) \
            -> tuple[list[db.Row], dict[str, int], list[db.Row]]:
        """Empties the threads still the runs' alone, forgets the runs' other content, stamps the runs."""
        ids = [row["id"] for row in ready]
        threads = [row for row in ready if row["thread_id"] is not None]
        db.execute(conn, "conversation_entries_allow_pruning")
        gone = db.fetch_all(conn, "conversation_entries_prune_threads",
                            {"run_ids": [row["id"] for row in threads],
                             "thread_ids": [row["thread_id"] for row in threads]}) if threads else []
        content = db.fetch_row(conn, "runs_forget_content", {"ids": ids, "now": now, "forgotten": FORGOTTEN})
        marked = db.fetch_all(conn, "runs_mark_pruned", {"ids": ids, "now": now})
        return gone, {k: int(v) for k, v in content.items()}, marked
