"""The tick's cleaner (``kairos.tick.prune``): expired receipts go, live ones stay, requests never prune.

Receipts are made through the API handler (webhook deliveries and idempotent creates); time moves by
editing ``expires_at``, the way a black-box test can move it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kairos import identity
from kairos.db import Database
from kairos.states import Source
from kairos.tick import Tick
from kairos.tick.prune import Prune
from tests.support.api import Api, count, hook, rows
from tests.support.aws import SqsQueue

AGENT = {"executor": "echo", "model": "echo"}


@pytest.fixture
def database(api: Api) -> Iterator[Database]:
    database = Database(api.url)
    yield database
    database.close()


def expire(api: Api, table: str, where: str = "true") -> None:
    rows(api.url, f"UPDATE {table} SET expires_at = now() - interval '1 second' WHERE {where} RETURNING expires_at")


def deliveries(api: Api, token: str, keys: list[str]) -> None:
    for key in keys:
        answer = hook(api, token, {"k": key}, headers={"idempotency-key": key})
        assert answer.status == 202, answer.text


def create(api: Api, key: str, body: dict[str, Any]) -> None:
    answer = api.alice.post("/v1/schedules", body, headers={"Idempotency-Key": key})
    assert answer.status == 201, answer.text


def test_prune_deletes_expired_receipts_of_both_tables_and_keeps_live_ones(api: Api, database: Database) -> None:
    _, token = api.webhook_schedule()
    deliveries(api, token, ["old-1", "old-2", "live"])
    conversation = api.conversation()
    for key in ("c-old", "c-live"):
        create(api, key, {"conversation_id": conversation["id"], "prompt": key, "kind": "webhook"})
    expire(api, "webhook_receipts", "left(idempotency_key, 4) = 'old-'")
    expire(api, "idempotency_receipts", "created_at = (SELECT min(created_at) FROM idempotency_receipts)")

    report = Prune(database).run_once()

    assert (report.webhook_receipts, report.idempotency_receipts, report.full) == (2, 1, False)
    assert [r["idempotency_key"] for r in rows(api.url, "SELECT idempotency_key FROM webhook_receipts")] == ["live"]
    assert count(api, "idempotency_receipts") == 1
    assert count(api, "runs") == 3, "pruning touches receipts only"
    assert Prune(database).run_once() == (again := Prune(database).run_once()) and again.webhook_receipts == 0


def test_prune_works_in_bounded_batches_and_says_when_more_is_left(api: Api, database: Database) -> None:
    _, token = api.webhook_schedule()
    deliveries(api, token, [f"k{i}" for i in range(5)])
    expire(api, "webhook_receipts")
    prune = Prune(database, batch=2)

    passes = [prune.run_once() for _ in range(4)]

    assert [(p.webhook_receipts, p.full) for p in passes] == [(2, True), (2, True), (1, False), (0, False)]
    assert count(api, "webhook_receipts") == 0


def test_a_key_used_again_after_its_receipt_was_pruned_makes_the_next_generation(api: Api, database: Database) -> None:
    schedule, token = api.webhook_schedule()
    first = hook(api, token, {"v": 1}, headers={"idempotency-key": "nightly"})
    expire(api, "webhook_receipts")
    assert Prune(database).run_once().webhook_receipts == 1

    again = hook(api, token, {"v": 2}, headers={"idempotency-key": "nightly"})

    assert again.status == 202, again.text
    expected = identity.occurrence_id(uuid.UUID(schedule["id"]), Source.WEBHOOK, key="nightly", generation=1)
    assert again.json["occurrence_id"] == str(expected) != first.json["occurrence_id"]
    assert [r["payload"] for r in rows(api.url, "SELECT payload FROM runs ORDER BY created_at")] == [{"v": 1}, {"v": 2}]


def test_deliveries_never_prune_and_the_tick_does(api: Api, database: Database, sqs_queue: SqsQueue) -> None:
    _, token = api.webhook_schedule()
    deliveries(api, token, ["a", "b"])
    expire(api, "webhook_receipts")
    for n in range(3):  # 132 deliveries, twice the old 1-in-64 request prune, under each hook's 60/min
        _, more = api.webhook_schedule()
        deliveries(api, more, [f"more-{n}-{i}" for i in range(44)])
    assert count(api, "webhook_receipts") == 134, "a webhook request deletes nothing"

    report = Tick(database, sqs_queue.client, sqs_queue.url).run()

    assert report.pruned == 2
    assert count(api, "webhook_receipts") == 132
