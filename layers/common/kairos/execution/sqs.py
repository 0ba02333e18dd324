"""SQS batches for the run function: each record is one run id, handled alone (partial batch failures).

Role: parse each record, hand the run id to ``kairos.execution.execute.process``, and tell SQS which records to
deliver again. The records of a batch execute **at once**, on a bounded pool of threads
(``KAIROS_RUN_CONCURRENCY_PER_INVOCATION``, default 10): an agent run spends most of its life waiting
on a model, and the invocation is billed for that wait once rather than once per run. Each run keeps
what it had alone — its own pooled connection (the pool is sized for a run and a heartbeat per
thread: ``kairos.runtime``), its own claim, lease, heartbeat and fence, and the invocation's remaining
time as its deadline. Then each record's stored outcome is reported in order — the response
Powertools' ``BatchProcessor`` + ``process_partial_response`` give (``{"batchItemFailures":
[{"itemIdentifier": <messageId>}, …]}``: a record whose handling raised an ``Exception``), built here
without them: the processor costs each invocation a signature inspection and deep copies, some 3 %
of a run's client CPU — so one bad or failing record never takes the good records of its
batch with it, exactly as when records ran one after another.

Per record:

* A body that is not exactly ``{"run_id": "<uuid>"}`` (not JSON, another shape, not a UUID) is
  logged (``action=bad_record``, message id only — never the body) and **acknowledged**: a malformed
  message can never succeed, so retrying it would only move it to the DLQ later. The producer of run
  ids (``kairos.handoff``) only ever writes the exact shape.
* An unknown run (deleted, or a message meant for another deployment's database) is acknowledged.
* A run that is not claimable (someone else has it, it ended) is acknowledged.
* A run that must not run (its schedule paused or cancelled, a newer fire already started, past its
  expiry) is ended by the claim itself (``process`` answers ``refused``) and acknowledged.
* A retry-safe failure puts the run back to ``queued`` (in ``process``); this module then sends a
  **new message with ``DelaySeconds``** (10 s, 20 s, 40 s … ≤ 60 s) and acknowledges the current one,
  so retries follow our backoff rather than the queue's visibility timeout and do not count towards
  its ``maxReceiveCount``. The send is stamped as a handoff. When no queue is configured or the send
  fails, the record is reported failed instead (SQS delivers it again after the visibility timeout),
  and the tick's repair re-sends the queued run once its handoff is stale: every path is safe,
  because the claim is a guarded update and a second message finds nothing to claim.
* A run that holds no slot, with none free (``process`` answers ``slot_wait``: a message nobody
  released, ``kairos.budgets``), stays ``queued`` and its message is acknowledged: nothing is re-sent;
  the run waits in the database for the end of a run holding a slot to release it.
* A run that ended or parked (succeeded, failed, cancelled, refused, awaiting a person, a paused
  corpus run) gave its slot up in that statement, which released the owner's oldest waiting run(s)
  into it: their ids are sent after the commit (``kairos.handoff.send_released``). Should that send
  fail or this invocation die first, the tick's repair sends them (they hold a slot, unsent).
* A webhook run held by its flow (a debounce or batch window still open, a delivery deferred by the
  hook's rate: ``kairos.flow``) stays ``queued`` (``process`` answers ``held``): its id is re-sent with
  ``DelaySeconds`` = the time left (at most 900 s), so the message is the window's timer.
* A corpus run whose invocation's time is nearly spent goes back to ``queued`` at a partition boundary
  (``process`` answers ``continued``): its id is re-sent at once, the same way, and the next invocation
  resumes it (``kairos.execution.corpus.phases``).
* An invocation with too little time left does not claim a run: the record is reported failed.
* An event that is not an SQS batch (no ``Records``, or none in it), and a record without a string
  ``messageId`` and ``body``, is refused with one log line (``action=bad_event`` / ``bad_record``)
  and acknowledged: it names no run, and SQS could not be told which message to deliver again.
* A database error (connection lost, server down) raises for that record only: partial failure. It
  leaves the handler as ``RecordFailed`` naming its class and SQLSTATE only: whatever reports a
  failing record may write its exception's text, and a psycopg error's text quotes the statement's
  values.

Must not: trust anything in a message but the run id; log message bodies; share a database
connection between concurrent invocations (``db.Database`` is a pool).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any
from uuid import UUID

from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from kairos import handoff, runtime
from kairos.db import Database
from kairos.execution.claim import Outcome
from kairos.execution.execute import ExecutorFactory, process
from kairos.observability import database_error, logger, withheld
from kairos.settings import Settings

RetrySender = Callable[[UUID, int], None]
ReleasedSender = Callable[[UUID], None]

# Outcomes whose statement gave the run's slot up (and released the next waiting runs into it).
GAVE_UP_SLOT = frozenset({"succeeded", "failed", "cancelled", "awaiting_approval", "awaiting_input", "paused",
                          "refused"})


class RedeliverRecord(Exception):
    """Report this record as a batch item failure so SQS delivers it again (not an error of the run)."""


class RecordFailed(Exception):
    """A record's database error as it leaves the handler: its class and SQLSTATE, never its text."""


def parse_run_id(body: str | None) -> UUID | None:
    """The run id of a body that is exactly ``{"run_id": "<canonical uuid>"}``; None otherwise."""
    if not body:
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or set(data) != {"run_id"} or not isinstance(data["run_id"], str):
        return None
    text = data["run_id"]
    try:
        value = UUID(text)
    except ValueError:
        return None
    return value if str(value) == text.lower() else None


def sqs_retry_sender(database: Database, settings: Settings, sqs: Any = None) -> RetrySender | None:
    """Sends a run id again with a delay (``SendMessage`` + ``DelaySeconds``) and stamps the handoff."""
    queue_url = settings.run_queue_url
    if not queue_url:
        return None

    def send(run_id: UUID, delay_seconds: int) -> None:
        client = sqs if sqs is not None else runtime.sqs()
        client.send_message(QueueUrl=queue_url, MessageBody=handoff.body(run_id),
                            DelaySeconds=max(0, min(900, delay_seconds)))
        with database.transaction() as conn:
            handoff.stamp(conn, [run_id])

    return send


def sqs_released_sender(database: Database, settings: Settings, sqs: Any = None) -> ReleasedSender | None:
    """Sends the runs an ended run's statement released into its slot (``kairos.handoff.send_released``)."""
    queue_url = settings.run_queue_url
    if not queue_url:
        return None

    def send(run_id: UUID) -> None:
        handoff.send_released(database, sqs if sqs is not None else runtime.sqs(), queue_url, [run_id])

    return send


def handle_record(
    record: SQSRecord,
    *,
    database: Database,
    settings: Settings,
    send_retry: RetrySender | None,
    lambda_remaining_ms: Callable[[], int] | None = None,
    executor_factory: ExecutorFactory | None = None,
    send_released: ReleasedSender | None = None,
) -> Outcome | None:
    """One record; returns the run's outcome (None for a bad record). Raises to have it redelivered."""
    run_id = parse_run_id(record.body)
    if run_id is None:
        logger.warning("bad record acknowledged", extra={"action": "bad_record", "message_id": record.message_id})
        return None
    outcome = process(database, run_id, settings=settings, executor_factory=executor_factory,
                      lambda_remaining_ms=lambda_remaining_ms)
    if outcome.result == "deferred":
        raise RedeliverRecord("too little time left in this invocation")
    if outcome.result in GAVE_UP_SLOT and send_released is not None:
        try:
            send_released(run_id)
        except Exception:  # noqa: BLE001 - the released runs hold their slots, unsent: the repair sends them
            logger.exception("released runs not sent; the repair sends them",
                             extra={"action": "released_handoff_failed", "run_id": str(run_id)})
    if outcome.result in ("retry", "continued", "held"):
        delay = outcome.retry_delay_seconds or 0
        if send_retry is None:
            raise RedeliverRecord("no queue to re-send the retry on")
        from botocore.exceptions import BotoCoreError, ClientError  # only a retry talks to SQS

        try:
            send_retry(run_id, delay)
        except (BotoCoreError, ClientError) as error:
            logger.warning("retry handoff failed; the record is redelivered instead",
                           extra={"action": "retry_handoff_failed", "run_id": str(run_id),
                                  "error": type(error).__name__})
            raise RedeliverRecord("retry handoff failed") from error
    return outcome


def _well_formed(event: Any) -> list[dict[str, Any]]:
    """The records of an SQS batch that carry a string ``messageId`` and ``body``; every other record,
    and an event that is not a batch at all (or an empty one), gets one refusal line (never its content)."""
    raw = event.get("Records") if isinstance(event, dict) else None
    if not isinstance(raw, list) or not raw:
        logger.warning("event without SQS records acknowledged",
                       extra={"action": "bad_event", "event_type": type(event).__name__,
                              "records_type": type(raw).__name__})
        return []
    kept: list[dict[str, Any]] = []
    for index, record in enumerate(raw):
        message_id = record.get("messageId") if isinstance(record, dict) else None
        if isinstance(record, dict) and isinstance(message_id, str) and message_id \
                and isinstance(record.get("body"), str):
            kept.append(record)
            continue
        logger.warning("bad record acknowledged", extra={
            "action": "bad_record", "index": index,
            "message_id": message_id if isinstance(message_id, str) else None,
            "missing": "messageId" if not isinstance(message_id, str) or not message_id else "body"})
    return kept


def handle_batch(
    event: dict[str, Any],
    context: Any,
    *,
    db: Database,
    settings: Settings,
    send_retry: RetrySender | None = None,
    executor_factory: ExecutorFactory | None = None,
    send_released: ReleasedSender | None = None,
) -> dict[str, Any]:
    """Processes one SQS batch; returns ``{"batchItemFailures": [{"itemIdentifier": …}, …]}``."""
    records = _well_formed(event)
    if not records:
        return {"batchItemFailures": []}
    sender = send_retry if send_retry is not None else sqs_retry_sender(db, settings)
    released = send_released if send_released is not None else sqs_released_sender(db, settings)
    remaining: Callable[[], int] | None = getattr(context, "get_remaining_time_in_millis", None)

    def run_record(record: SQSRecord) -> None:
        try:
            handle_record(record, database=db, settings=settings, send_retry=sender,
                          lambda_remaining_ms=remaining, executor_factory=executor_factory,
                          send_released=released)
        except RedeliverRecord:
            raise
        except Exception as error:
            logger.exception("record failed; SQS will deliver it again",
                             extra={"action": "record_failed", "message_id": record.message_id})
            if database_error(error):
                raise RecordFailed(withheld(error).strip()) from None
            raise

    failures: list[dict[str, Any]] = []
    workers = min(settings.run_concurrency_per_invocation, len(records))
    if workers > 1:
        # Every record executes at once first; then each stored outcome is reported, in order.
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kairos-run") as pool:
            done = [(record["messageId"], pool.submit(run_record, SQSRecord(record))) for record in records]
        for message_id, future in done:
            if _failed(future):
                failures.append({"itemIdentifier": message_id})
    else:
        for record in records:
            try:
                run_record(SQSRecord(record))
            except Exception:  # noqa: BLE001 - reported: SQS delivers this record again
                failures.append({"itemIdentifier": record["messageId"]})
    return {"batchItemFailures": failures}


def _failed(future: Future[None]) -> bool:
    """Whether a record's run raised an ``Exception`` (anything else — ``KeyboardInterrupt``,
    ``SystemExit`` — leaves the handler, as from a record run alone)."""
    error = future.exception()
    if error is not None and not isinstance(error, Exception):
        raise error
    return error is not None
