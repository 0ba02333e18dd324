"""The corpus run's working context: the claimed run it executes under, and its fenced transaction.

Role: ``Corpus`` is what every phase module is given: the worker's ``Execution`` (its database,
fence, heartbeat, settings, probes, executor factory) and the checked spec (a lock for what
partitions running at once share). ``fenced`` opens the one kind of transaction
a corpus write may use: it locks the run row under the fence first (``runs_corpus_lock``) and raises
``LeaseLost`` when the fence no longer holds, so a worker that lost its lease writes nothing.
``events`` appends trace events (``corpus.phase``, ``corpus.partition``, …) in that transaction.

Must not: hold a transaction across an external call (S3, the model); write content into events.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

import psycopg

from kairos import db, trace
from kairos.execution.claim import Claimed
from kairos.execution.heartbeat import Heartbeat
from kairos.execution.stops import LeaseLost
from kairos.probes import Probes
from kairos.settings import Settings


class Execution(Protocol):
    """What a corpus run needs of the worker's execution (``kairos.execution.execute.Execution``); a protocol,
    so this package never imports the worker that calls it."""

    database: db.Database
    run_id: UUID
    settings: Settings
    now: datetime | None
    probes: Probes
    claimed: Claimed
    heartbeat: Heartbeat

    @property
    def executor_factory(self) -> Callable[..., Any]: ...

    def check_stop(self) -> None: ...

    def remaining(self) -> float: ...


@dataclass
class Corpus:
    run: Execution
    spec: dict[str, Any]
    lock: threading.Lock = field(default_factory=threading.Lock)
    mapped: int = 0  # partitions this invocation mapped (a slice ends only after one: kairos.execution.corpus.mapping)

    @property
    def run_id(self) -> Any:
        return self.run.run_id

    @property
    def fence(self) -> int:
        return self.run.claimed.fence

    @property
    def owner(self) -> str:
        return str(self.run.claimed.row["owner"])

    @contextmanager
    def fenced(self) -> Iterator[tuple[psycopg.Connection[db.Row], db.Row]]:
        """A transaction holding the run row under the fence, and that row (cancel / pause requests)."""
        with self.run.database.transaction() as conn:
            row = db.fetch_one(conn, "runs_corpus_lock", {"run_id": self.run_id, "fence": self.fence})
            if row is None:
                raise LeaseLost()
            yield conn, row

    def events(self, conn: psycopg.Connection[db.Row], events: Sequence[trace.Event]) -> None:
        if not events:
            return
        if trace.change(conn, "runs_step_events", {"run_id": self.run_id, "fence": self.fence}, events,
                        now=self.run.now) is None:
            raise LeaseLost()
