"""The SQS handoff against moto: batches of ten, the exact body, failures left for repair, the stamp."""

from __future__ import annotations

import json
import logging
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from kairos import handoff
from kairos.db import Database
from tests import factories
from tests.support.aws import SqsQueue


def bodies(sqs: Any, url: str) -> list[str]:
    out: list[str] = []
    while True:
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
        if not got.get("Messages"):
            return out
        for m in got["Messages"]:
            out.append(m["Body"])
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])


def count_calls(sqs: Any) -> list[int]:
    """Entries per SendMessageBatch call, observed through botocore's own event hooks."""
    sizes: list[int] = []
    sqs.meta.events.register("provide-client-params.sqs.SendMessageBatch",
                             lambda params, **_: sizes.append(len(params["Entries"])))
    return sizes


class PartlyFailing:
    """SQS answering some entries under ``Failed`` (which moto cannot be made to do): the rest go to moto."""

    def __init__(self, client: Any, refuse: set[uuid.UUID]) -> None:
        self.client = client
        self.refuse = {r.hex for r in refuse}

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        accepted = [e for e in Entries if e["Id"] not in self.refuse]
        response = self.client.send_message_batch(QueueUrl=QueueUrl, Entries=accepted) if accepted else {}
        failed = [{"Id": e["Id"], "SenderFault": False, "Code": "InternalError", "Message": "try again"}
                  for e in Entries if e["Id"] in self.refuse]
        return {"Successful": response.get("Successful", []), "Failed": failed}


def test_ids_go_out_in_batches_of_ten_with_exactly_the_run_id_as_body(sqs_queue: SqsQueue) -> None:
    sqs, url = sqs_queue.client, sqs_queue.url
    sizes = count_calls(sqs)
    ids = [uuid.uuid4() for _ in range(23)]

    result = handoff.send_batch(sqs, url, [*ids, ids[0]])  # a repeated id is sent once

    assert sorted(sizes) == [3, 10, 10]
    assert sorted(result.sent) == sorted(ids) and result.failed == ()
    got = bodies(sqs, url)
    assert sorted(got) == sorted(json.dumps({"run_id": str(i)}) for i in ids)
    assert all(json.loads(b).keys() == {"run_id"} for b in got)


def test_nothing_to_send_makes_no_call(sqs_queue: SqsQueue) -> None:
    sqs = sqs_queue.client
    sizes = count_calls(sqs)
    assert handoff.send_batch(sqs, "https://unused", []) == handoff.HandoffResult()
    assert sizes == []


def test_a_failing_call_fails_its_chunk_only(sqs_queue: SqsQueue, caplog: pytest.LogCaptureFixture) -> None:
    sqs, url = sqs_queue.client, sqs_queue.url
    ids = [uuid.uuid4() for _ in range(5)]
    missing = url.replace("/runs", "/gone")
    caplog.set_level(logging.WARNING)
    result = handoff.send_batch(sqs, missing, ids)
    assert result.sent == () and sorted(result.failed) == sorted(ids)
    logged = [r for r in caplog.records if getattr(r, "action", None) == "handoff_failed"]
    assert len(logged) == 1 and any("NonExistentQueue" in code for code in logged[0].errors)
    assert bodies(sqs, url) == []


def test_failed_entries_are_reported_as_not_sent(sqs_queue: SqsQueue) -> None:
    sqs, url = sqs_queue.client, sqs_queue.url
    ids = [uuid.uuid4() for _ in range(12)]
    refused = {ids[1], ids[11]}
    result = handoff.send_batch(PartlyFailing(sqs, refused), url, ids)
    assert set(result.failed) == refused and set(result.sent) == set(ids) - refused
    assert sorted(json.loads(b)["run_id"] for b in bodies(sqs, url)) == sorted(str(i) for i in set(ids) - refused)


def test_send_stamps_only_what_sqs_accepted(sqs_queue: SqsQueue, db: Database, db_url: str) -> None:
    """The webhook API's entry point: send, then stamp; a refused run keeps handoff_at NULL for repair."""
    sqs, url = sqs_queue.client, sqs_queue.url
    sched = factories.schedule(db_url)
    t = datetime(2026, 3, 2, 7, 0, tzinfo=UTC)
    runs = [factories.run(db_url, schedule_row=sched, fire_at=t + timedelta(minutes=i))["id"] for i in range(3)]
    now = t + timedelta(hours=1)

    result = handoff.send(db, PartlyFailing(sqs, {runs[2]}), url, runs, now=now)

    assert set(result.sent) == set(runs[:2]) and result.failed == (runs[2],)
    with psycopg.connect(db_url) as conn:
        stamps = {r[0]: (r[1], r[2]) for r in conn.execute("SELECT id, handoff_at, handoff_count FROM runs")}
    assert stamps[runs[0]] == stamps[runs[1]] == (now, 1)
    assert stamps[runs[2]] == (None, 0)
