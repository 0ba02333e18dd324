"""The handoff: committed queued runs reach SQS as opaque run ids, then the row records it.

Role: the only code that puts run ids on the run queue. Intake (the tick's fire, the webhook API, a
trigger, an approval's requeue) calls ``send(database, sqs, queue_url, run_ids)`` after the transaction
that created or requeued the runs has committed: it releases the owners' free slots to their oldest
waiting runs (``kairos.budgets``) and sends only runs that hold a slot (then stamps them); the run
worker calls ``send_released`` with the run it ended or parked, whose statement released the next
ones; the tick's repair uses the two halves, ``send_batch`` and ``stamp``, around its own transactions.

Guarantees:
* A message body is exactly ``{"run_id": "<uuid>"}``; possessing it grants nothing (the worker must
  claim the run). Messages go out with ``SendMessageBatch`` in chunks of 10, entry ``Id`` = the run
  id's hex (unique within a chunk).
* ``send_batch`` never raises for SQS trouble: an exception for a chunk, or an entry listed under
  ``Failed``, puts those runs in ``HandoffResult.failed`` (logged, counted as ``HandoffFailures``);
  the other chunks' outcomes are kept whatever one chunk does.
* The chunks of a send go out overlapped on one bounded pool per container (``MAX_PARALLEL_CALLS``
  threads, shared by every caller, so the two fire workers together never have more calls in
  flight): SQS latency is paid once per ``MAX_PARALLEL_CALLS`` chunks, not once per chunk. The pool
  holds threads, never connections (the SQS client's own pool, sized to match, holds those);
  ``close_pool`` ends it (SnapStart's before-snapshot hook, ``kairos.snapstart``) and the next send
  builds a new one.
* ``stamp`` records ``handoff_at`` / ``handoff_count`` only for runs SQS accepted, so a run whose send
  failed keeps ``handoff_at`` NULL and the tick's repair step sends it again. Sending twice is
  harmless: the worker's claim is a guarded update and a second message finds nothing to claim.

Must not: send a run that holds no slot (it could not be claimed: it waits in the database); send
a run id before the transaction that created the run has committed (the caller's
duty: a worker could otherwise see an unknown run and drop the message); decide anything from SQS
(PostgreSQL is the authority); log anything but ids and counts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from aws_lambda_powertools.metrics import MetricUnit

from kairos import budgets, db, sqs_batch
from kairos.observability import logger, metrics

BATCH = 10  # SendMessageBatch's own limit
# SendMessageBatch calls in flight at once per container (the SQS client's connection pool matches:
# kairos.runtime); a fire batch of 500 runs is 50 calls, so at 20 ms a call it waits ~4 round trips.
MAX_PARALLEL_CALLS = 16
MAX_DELAY_SECONDS = 900  # SQS's own limit on DelaySeconds

_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def pool() -> ThreadPoolExecutor:
    """The container's bounded pool for SQS calls (built on first use, or by the SnapStart hook)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=MAX_PARALLEL_CALLS, thread_name_prefix="kairos-handoff")
        return _pool


def close_pool() -> None:
    """Ends the pool's threads (waiting for calls in flight); the next send builds a new pool."""
    global _pool
    with _pool_lock:
        old, _pool = _pool, None
    if old is not None:
        old.shutdown(wait=True)


@dataclass(frozen=True)
class HandoffResult:
    sent: tuple[UUID, ...] = ()
    failed: tuple[UUID, ...] = ()
    seconds: float = 0.0  # wall time spent in SQS calls (benchmarks split DB and SQS time)


def body(run_id: UUID) -> str:
    """The message body: the run id and nothing else. Exactly ``json.dumps({"run_id": str(run_id)})``
    (a UUID's text needs no escaping), without the encoder's cost: ten of these go into every call."""
    return f'{{"run_id": "{run_id}"}}'


def _send_chunk(sqs: Any, queue_url: str, chunk: Sequence[UUID],
                delay_seconds: int = 0) -> tuple[list[UUID], list[UUID], str | None]:
    # Imported here, not at the top: a caller with nothing to send (most ticks) never loads botocore.
    from botocore.exceptions import ClientError

    by_entry = {run_id.hex: run_id for run_id in chunk}
    entries: list[dict[str, Any]] = [{"Id": key, "MessageBody": body(run_id)} for key, run_id in by_entry.items()]
    if delay_seconds > 0:  # a held run's timer (kairos.flow): SQS delivers it when the run is due
        for entry in entries:
            entry["DelaySeconds"] = min(delay_seconds, MAX_DELAY_SECONDS)
    try:
        response = sqs_batch.send_message_batch(sqs, queue_url, entries)
    except ClientError as exc:
        return [], list(chunk), str(exc.response.get("Error", {}).get("Code", "ClientError"))
    except Exception as exc:  # noqa: BLE001 - BotoCoreError or anything else: this chunk fails, repair resends it
        return [], list(chunk), type(exc).__name__
    ok = [by_entry[e["Id"]] for e in response.get("Successful", []) if e.get("Id") in by_entry]
    failed_entries = response.get("Failed", [])
    failed = [by_entry[e["Id"]] for e in failed_entries if e.get("Id") in by_entry]
    # An entry SQS neither accepted nor refused is treated as not sent: repair will send it again.
    answered = set(ok) | set(failed)
    failed.extend(run_id for run_id in chunk if run_id not in answered)
    code: str | None = None
    if failed_entries:
        code = str(failed_entries[0].get("Code", "Failed"))
    elif failed:
        code = "Unanswered"
    return ok, failed, code


def _overlapped(sqs: Any, queue_url: str, chunks: list[list[UUID]], width: int,
                delay_seconds: int = 0) -> list[tuple[list[UUID], list[UUID], str | None]]:
    """Each chunk sent on the pool, at most ``width`` of them in flight; results in chunk order."""
    gate = threading.BoundedSemaphore(width)

    def one(chunk: list[UUID]) -> tuple[list[UUID], list[UUID], str | None]:
        with gate:
            return _send_chunk(sqs, queue_url, chunk, delay_seconds)

    executor = pool()
    futures = [executor.submit(one, chunk) for chunk in chunks]
    return [future.result() for future in futures]


def send_batch(sqs: Any, queue_url: str, run_ids: Sequence[UUID], *,
               parallel: int = MAX_PARALLEL_CALLS, delay_seconds: int = 0) -> HandoffResult:
    """Sends each run id once, in chunks of 10 (no database): returns which ones SQS accepted.
    ``delay_seconds`` (at most 900) holds the messages back that long."""
    unique = list(dict.fromkeys(run_ids))
    if not unique:
        return HandoffResult()
    chunks = [unique[i : i + BATCH] for i in range(0, len(unique), BATCH)]
    started = time.perf_counter()
    if len(chunks) == 1 or parallel <= 1:
        results = [_send_chunk(sqs, queue_url, chunk, delay_seconds) for chunk in chunks]
    else:
        # botocore clients are thread-safe. The shared pool bounds the calls in flight per container;
        # ``parallel`` (at most the pool's size) bounds this send's share of it.
        results = _overlapped(sqs, queue_url, chunks, min(parallel, MAX_PARALLEL_CALLS), delay_seconds)
    elapsed = time.perf_counter() - started
    sent = [run_id for ok, _, _ in results for run_id in ok]
    failed = [run_id for _, bad, _ in results for run_id in bad]
    errors = tuple(sorted({code for _, bad, code in results if bad and code}))
    if failed:
        logger.warning(
            "handoff failed for some runs; repair will send them again",
            extra={"action": "handoff_failed", "failed": len(failed), "sent": len(sent), "errors": list(errors),
                   "run_ids": [str(r) for r in failed[:20]]},
        )
        metrics.add_metric(name="HandoffFailures", unit=MetricUnit.Count, value=len(failed))
    return HandoffResult(sent=tuple(sent), failed=tuple(failed), seconds=elapsed)


def stamp(conn: psycopg.Connection[db.Row], run_ids: Sequence[UUID], *, now: datetime | None = None) -> int:
    """Records that SQS accepted these runs (``handoff_at``, ``handoff_count``); returns rows stamped."""
    if not run_ids:
        return 0
    return db.execute(conn, "runs_stamp_handoff", {"ids": list(run_ids), "now": now})


def send(database: db.Database, sqs: Any, queue_url: str, run_ids: Sequence[UUID], *,
         now: datetime | None = None, delay_seconds: int = 0, ended: Sequence[UUID] = ()) -> HandoffResult:
    """The whole handoff of committed runs. Their owners' free slots are handed out first, to the oldest
    waiting runs (``kairos.budgets.release``: these runs or older ones); the runs just released are
    sent (with ``delay_seconds``: a webhook flow's timer), and those SQS accepted stamped. A run still
    without a slot is not sent: it waits queued for its release. ``ended``: runs the caller's own
    committed transaction ended (a ``cancel_replace``), whose statements released these or others.
    With ``delay_seconds`` the runs given are held ones (a window, a deferral) and their messages are
    their timers: sent held or not holding a slot (a held run is not released before it is due); the
    older runs this call released go at once."""
    if not delay_seconds:
        return _send_stamped(database, sqs, queue_url, admit(database, run_ids, now=now, ended=ended), now=now)
    given = set(run_ids)
    with database.transaction() as conn:  # one transaction: the held runs are read beside the release
        ready = _admit(conn, run_ids, now=now, ended=ended)
        timers = [*[r for r in ready if r in given], *budgets.held(conn, [r for r in run_ids if r not in ready],
                                                                    now=now)]
    timed = _send_stamped(database, sqs, queue_url, timers, now=now, delay_seconds=delay_seconds)
    at_once = _send_stamped(database, sqs, queue_url, [r for r in ready if r not in given], now=now)
    return HandoffResult(timed.sent + at_once.sent, timed.failed + at_once.failed, timed.seconds + at_once.seconds)


def admit(database: db.Database, run_ids: Sequence[UUID], *, now: datetime | None = None,
          ended: Sequence[UUID] = ()) -> list[UUID]:
    """``send``'s first half, in its own transaction: releases the owners of these runs' free slots to
    their oldest waiting runs, and answers exactly those: what this call released is this call's to
    send. A run someone else released (a concurrent intake, an ending run's statement) is theirs to
    send, so no run is sent twice by two releasers. A run given that holds its slot and was sent
    before is sent again (a webhook flow's window closing: the message is its timer). The runs that
    ``ended`` (ended or cancelled in the caller's own transaction) released are the caller's too: a
    ``cancel_replace`` whose cancel let the new run into the old one's slot sends it at once."""
    if not run_ids and not ended:
        return []
    with database.transaction() as conn:
        return _admit(conn, run_ids, now=now, ended=ended)


def _admit(conn: psycopg.Connection[db.Row], run_ids: Sequence[UUID], *, now: datetime | None,
           ended: Sequence[UUID]) -> list[UUID]:
    """``admit`` inside the caller's transaction."""
    freed = budgets.unsent(conn, ended)
    released = budgets.release(conn, budgets.owners_of(conn, run_ids), now=now) if run_ids else []
    again = budgets.resent(conn, run_ids)
    return list(dict.fromkeys([*freed, *released, *again]))


def send_released(database: db.Database, sqs: Any, queue_url: str, ended: Sequence[UUID], *,
                  now: datetime | None = None) -> HandoffResult:
    """After the commit that ended (or parked) these runs: sends the runs their statements released
    into the slots they gave up (``released_by``), then stamps them."""
    if not ended:
        return HandoffResult()
    with database.transaction() as conn:
        ready = budgets.unsent(conn, ended)
    return _send_stamped(database, sqs, queue_url, ready, now=now)


def _send_stamped(database: db.Database, sqs: Any, queue_url: str, run_ids: Sequence[UUID], *,
                  now: datetime | None = None, delay_seconds: int = 0) -> HandoffResult:
    """Sends the runs, then stamps those SQS accepted (own transaction)."""
    result = send_batch(sqs, queue_url, run_ids, delay_seconds=delay_seconds)
    if result.sent:
        with database.transaction() as conn:
            stamp(conn, result.sent, now=now)
    return result
