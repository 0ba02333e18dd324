"""The owner's queue cap at fire time (``KAIROS_OWNER_QUEUE_MAX``) and ``GET /v1/usage``, against real
PostgreSQL: the tick records ``skipped_budget``; a trigger, retry, webhook or backfill over the cap
answers 429 ``queue_full`` and records nothing (kairos.budgets, kairos.occurrences)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta

import psycopg
import pytest

from kairos import runtime
from kairos.db import Database
from kairos.execution.execute import process
from kairos.executors.base import Reply
from kairos.schedules import manual
from kairos.settings import Settings
from kairos.tick import Tick
from tests import factories
from tests.support.api import Api, ApiClient, hook, rows
from tests.support.aws import SqsQueue
from tests.support.executors import ScriptedExecutor

T = datetime(2026, 3, 2, 7, 0, tzinfo=UTC)


@pytest.fixture
def queue_max(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    monkeypatch.setenv("KAIROS_OWNER_QUEUE_MAX", "2")
    runtime.reset()
    try:
        yield 2
    finally:
        monkeypatch.delenv("KAIROS_OWNER_QUEUE_MAX")
        runtime.reset()


def _queued(url: str, owner: str) -> int:
    found = rows(url, "SELECT count(*) AS n FROM runs WHERE owner = %(o)s AND state = 'queued'", {"o": owner})
    return int(found[0]["n"])


def test_the_tick_records_fires_over_the_owners_queue_cap_skipped_budget(
        db: Database, db_url: str, sqs_queue: SqsQueue, queue_max: int) -> None:
    factories.run(db_url, schedule_row=factories.schedule(db_url), source="manual")  # alice: one queued
    alice = [factories.schedule(db_url, cron="*/5 * * * *", next_fire_at=T) for _ in range(3)]
    bob = factories.schedule(db_url, owner="bob", cron="*/5 * * * *", next_fire_at=T)

    report = Tick(db, sqs_queue.client, sqs_queue.url, metrics=None).run(now=T + timedelta(seconds=30))

    decisions = rows(db_url, "SELECT o.decision, s.owner, r.id AS run_id FROM occurrences o "
                             "JOIN schedules s ON s.id = o.schedule_id LEFT JOIN runs r ON r.occurrence_id = o.id "
                             "WHERE o.schedule_id = ANY(%(ids)s) ORDER BY s.owner, o.decision",
                     {"ids": [s["id"] for s in [*alice, bob]]})
    assert [(d["owner"], d["decision"], d["run_id"] is not None) for d in decisions] == [
        ("alice", "dispatched", True), ("alice", "skipped_budget", False), ("alice", "skipped_budget", False),
        ("bob", "dispatched", True)]
    assert _queued(db_url, "alice") == queue_max
    assert (report.dispatched, report.skipped) == (2, 2)
    # The two new runs, and alice's queued run nobody had released: her slots are free, so the repair sends it.
    assert len(sqs_queue.drain()) == 3


def test_trigger_over_the_cap_is_429_queue_full_and_records_nothing(api: Api, queue_max: int) -> None:
    conversation = api.conversation()
    made = [api.alice.post("/v1/schedules", {"conversation_id": conversation["id"], "prompt": "p",
                                             "cron": "0 7 * * *", "timezone": "UTC"}).json["schedule"]["id"]
            for _ in range(3)]
    assert [api.alice.post(f"/v1/schedules/{s}/trigger").status for s in made[:2]] == [202, 202]
    before = rows(api.url, "SELECT count(*) AS n FROM occurrences")[0]["n"]

    over = api.alice.post(f"/v1/schedules/{made[2]}/trigger")

    assert over.status == 429, over.text
    assert over.error["code"] == "queue_full"
    assert over.error["fields"] == [{"field": "owner", "rule": "queue_max",
                                     "message": "at most 2 queued runs per owner"}]
    assert over.headers.get("Retry-After") == "60"
    assert rows(api.url, "SELECT count(*) AS n FROM occurrences")[0]["n"] == before
    # Another owner's queue is its own.
    bob_conversation = api.conversation("bob")
    bob = ApiClient("bob")
    theirs = bob.post("/v1/schedules", {"conversation_id": bob_conversation["id"], "prompt": "p",
                                        "cron": "0 7 * * *", "timezone": "UTC"}).json["schedule"]["id"]
    assert bob.post(f"/v1/schedules/{theirs}/trigger").status == 202


def test_a_webhook_over_the_cap_is_429_and_the_same_delivery_is_accepted_once_the_queue_drains(
        api: Api, queue_max: int) -> None:
    _, token = api.webhook_schedule()
    for n in range(queue_max):
        assert hook(api, token, {"n": n}, headers={"Idempotency-Key": f"k{n}"}).status == 202
    over = hook(api, token, {"n": 9}, headers={"Idempotency-Key": "k9"})
    assert over.status == 429 and over.error["code"] == "queue_full"
    assert rows(api.url, "SELECT count(*) AS n FROM occurrences WHERE idempotency_key = 'k9'")[0]["n"] == 0
    assert rows(api.url, "SELECT count(*) AS n FROM webhook_receipts WHERE idempotency_key = 'k9'")[0]["n"] == 0

    queued = rows(api.url, "SELECT id FROM runs WHERE state = 'queued' LIMIT 1")[0]["id"]
    assert api.alice.post(f"/v1/runs/{queued}/cancel").status == 200
    again = hook(api, token, {"n": 9}, headers={"Idempotency-Key": "k9"})
    assert again.status == 202, again.text


def test_a_backfill_over_the_cap_is_refused_whole(api: Api, queue_max: int) -> None:
    schedule = factories.schedule(api.url, cron="0 * * * *", created_at=datetime.now(UTC) - timedelta(days=2))["id"]
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    window = {"from": (now - timedelta(hours=5)).isoformat(), "until": (now - timedelta(hours=1)).isoformat()}

    answer = api.alice.post(f"/v1/schedules/{schedule}/backfill", window)

    assert answer.status == 429 and answer.error["code"] == "queue_full", answer.text
    assert rows(api.url, "SELECT count(*) AS n FROM occurrences WHERE source = 'backfill'")[0]["n"] == 0
    small = {"from": (now - timedelta(hours=2)).isoformat(), "until": (now - timedelta(hours=1)).isoformat()}
    assert api.alice.post(f"/v1/schedules/{schedule}/backfill", small).status == 202


def test_two_triggers_for_the_last_queue_place_one_is_refused(db_url: str, queue_max: int) -> None:
    """The owner's queue lock serializes fires: without it both would count one queued run and pass."""
    factories.run(db_url, schedule_row=factories.schedule(db_url), source="manual")
    schedules = [factories.schedule(db_url) for _ in range(2)]
    database = Database(db_url, max_size=3)
    barrier = threading.Barrier(2)
    results: list[str] = []

    def trigger(schedule_id: uuid.UUID) -> None:
        barrier.wait(timeout=30)
        try:
            with database.transaction() as conn:
                manual.trigger(conn, schedule_id, owner="alice")
            results.append("accepted")
        except Exception as error:  # the refusal is the result under test
            results.append(type(error).__name__)

    threads = [threading.Thread(target=trigger, args=(s["id"],)) for s in schedules]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        database.close()
    assert sorted(results) == ["QueueFull", "accepted"]
    assert _queued(db_url, "alice") == queue_max


def test_a_chat_turn_over_the_cap_is_429_queue_full_and_records_nothing(api: Api, queue_max: int) -> None:
    for _ in range(queue_max):
        factories.run(api.url, schedule_row=factories.schedule(api.url), source="manual")
    conversation = api.conversation()
    before = {t: rows(api.url, f"SELECT count(*) AS n FROM {t}")[0]["n"] for t in ("occurrences", "runs")}

    over = api.alice.post(f"/v1/conversations/{conversation['id']}/messages", {"content": "hello"})

    assert over.status == 429, over.text
    assert over.error["code"] == "queue_full" and over.headers.get("Retry-After") == "60"
    assert {t: rows(api.url, f"SELECT count(*) AS n FROM {t}")[0]["n"] for t in ("occurrences", "runs")} == before
    assert api.messages() == []
    # Once a place is free, the same turn is accepted and queued.
    queued = rows(api.url, "SELECT id FROM runs WHERE state = 'queued' LIMIT 1")[0]["id"]
    assert api.alice.post(f"/v1/runs/{queued}/cancel").status == 200
    again = api.alice.post(f"/v1/conversations/{conversation['id']}/messages", {"content": "hello"})
    assert again.status == 202, again.text
    assert rows(api.url, "SELECT state FROM runs WHERE id = %(id)s", {"id": again.json["run_id"]}) == [
        {"state": "queued"}]


def test_two_chat_turns_of_one_owner_for_the_last_queue_place_one_is_refused(db_url: str, queue_max: int) -> None:
    """Chat turns in two conversations share the owner's queue lock: the second waits for the first's
    commit and then counts its run. The first turn's transaction stays open until the second is seen
    waiting on the lock (or has finished: without the lock it does not wait, and both would queue)."""
    from kairos import chat

    for _ in range(queue_max - 1):
        factories.run(db_url, schedule_row=factories.schedule(db_url), source="manual")
    first, second = factories.conversation(db_url), factories.conversation(db_url)
    database = Database(db_url, max_size=3)
    results: list[str] = []

    def turn() -> None:
        try:
            with database.transaction() as conn:
                chat.post(conn, second["id"], owner="alice", raw={"content": "two"})
            results.append("accepted")
        except Exception as error:  # the refusal is the result under test
            results.append(type(error).__name__)

    waiter = threading.Thread(target=turn)
    try:
        with database.transaction() as conn:
            chat.post(conn, first["id"], owner="alice", raw={"content": "one"})
            waiter.start()
            with psycopg.connect(db_url, autocommit=True) as watch:
                for _ in range(600):  # until the second turn waits on the advisory lock or is done
                    waiting = watch.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory'"
                                            ).fetchone()
                    if (waiting is not None and waiting[0] > 0) or not waiter.is_alive():
                        break
                    waiter.join(timeout=0.05)
        waiter.join(timeout=60)
    finally:
        database.close()
    assert results == ["QueueFull"]
    assert _queued(db_url, "alice") == queue_max


# --- GET /v1/usage ------------------------------------------------------------------------------------


def test_usage_answers_the_callers_tokens_cost_and_runs_per_day(api: Api) -> None:
    settings = Settings(model_prices={"*": (1.0, 2.0)})
    executor = ScriptedExecutor(on_send=lambda p, t: Reply(content="ok", usage={"prompt_tokens": 100,
                                                                                 "completion_tokens": 10}))
    database = Database(api.url)
    try:
        for owner in ("alice", "alice", "bob"):
            run = factories.run(api.url, schedule_row=factories.schedule(api.url, owner=owner), source="manual")
            assert process(database, run["id"], settings=settings,
                           executor_factory=executor.factory).result == "succeeded"
    finally:
        database.close()
    today = date.fromisoformat(rows(api.url, "SELECT (now() AT TIME ZONE 'UTC')::date::text AS d")[0]["d"])
    window = f"from={today - timedelta(days=1)}&until={today + timedelta(days=1)}"

    mine = api.alice.get(f"/v1/usage?{window}")
    theirs = api.bob.get(f"/v1/usage?{window}")

    assert mine.status == 200, mine.text
    yesterday = {"day": str(today - timedelta(days=1)), "input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0,
                 "calls": 0, "runs": 0}
    assert mine.json == {"days": [yesterday, {"day": str(today), "input_tokens": 200, "output_tokens": 20,
                                              "cost_usd": 0.00024, "calls": 2, "runs": 2}]}
    assert theirs.json["days"][1] == {"day": str(today), "input_tokens": 100, "output_tokens": 10,
                                      "cost_usd": 0.00012, "calls": 1, "runs": 1}
    # Defaults: the last 30 days, today included.
    default = api.alice.get("/v1/usage").json["days"]
    assert len(default) == 30 and default[-1]["day"] == str(today) and default[-1]["input_tokens"] == 200
