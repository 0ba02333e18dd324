"""Runs wait in PostgreSQL, not in SQS, through the public handlers (TickFunction, RunFunction) with moto:
an owner's backlog never stands in front of another owner's run, no message is sent for a run that
cannot be claimed (every send is counted), and a release lost to a crash is repaired, once."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from kairos import db as kairos_db
from kairos import handoff, runtime
from kairos.local.stack import load_function
from tests import factories
from tests.support.api import TOKENS, ApiClient
from tests.support.aws import LambdaContext, SqsQueue, run_body, scheduled_event, sqs_event

run_app = load_function("run")
tick_app = load_function("tick")


class CountingSqs:
    """moto's client, with every run id it was asked to send counted (single and batch sends)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.sent: Counter[uuid.UUID] = Counter()
        self.order: list[uuid.UUID] = []
        # Set: messages stay here instead of reaching moto (whose SQS scans the whole queue on every
        # call), for a test that delivers thousands of them itself.
        self.pending: list[str] | None = None

    def _count(self, body: str) -> None:
        run_id = uuid.UUID(json.loads(body)["run_id"])
        self.sent[run_id] += 1
        self.order.append(run_id)

    def send_message(self, **kwargs: Any) -> Any:
        self._count(kwargs["MessageBody"])
        if self.pending is not None:
            self.pending.append(kwargs["MessageBody"])
            return {"MessageId": str(uuid.uuid4())}
        return self.client.send_message(**kwargs)

    def send_message_batch(self, **kwargs: Any) -> Any:
        for entry in kwargs["Entries"]:
            self._count(entry["MessageBody"])
        if self.pending is not None:
            self.pending.extend(entry["MessageBody"] for entry in kwargs["Entries"])
            return {"Successful": [{"Id": e["Id"], "MessageId": str(uuid.uuid4())} for e in kwargs["Entries"]],
                    "Failed": []}
        return self.client.send_message_batch(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def _stack(db_url: str, sqs_queue: SqsQueue, monkeypatch: pytest.MonkeyPatch, slots: int) -> Iterator[CountingSqs]:
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("RUN_QUEUE_URL", sqs_queue.url)
    monkeypatch.setenv("KAIROS_OWNER_CONCURRENCY", str(slots))
    monkeypatch.setenv("KAIROS_OWNER_QUEUE_MAX", "10000")
    runtime.reset()
    counting = CountingSqs(sqs_queue.client)
    monkeypatch.setattr(runtime, "sqs", lambda: counting)
    try:
        yield counting
    finally:
        runtime.database().close()
        kairos_db._databases.pop(db_url, None)
        runtime.reset()


@pytest.fixture
def four_slots(db_url: str, sqs_queue: SqsQueue, monkeypatch: pytest.MonkeyPatch) -> Iterator[CountingSqs]:
    yield from _stack(db_url, sqs_queue, monkeypatch, 4)


@pytest.fixture
def one_slot(db_url: str, sqs_queue: SqsQueue, monkeypatch: pytest.MonkeyPatch) -> Iterator[CountingSqs]:
    yield from _stack(db_url, sqs_queue, monkeypatch, 1)


def _rows(url: str, sql: str, *params: Any) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def _backlog(url: str, n: int, *, owner: str) -> list[uuid.UUID]:
    """``n`` queued manual runs of one schedule of ``owner``, one second apart, nobody released yet (as
    the intake records them: with the deployment's slot limit)."""
    sched = factories.schedule(url, owner=owner, next_fire_at=datetime.now(UTC) + timedelta(days=1))
    params = {"schedule_id": sched["id"], "n": n, "owner": owner, "conversation_id": sched["conversation_id"],
              "agent": json.dumps(factories.ECHO_AGENT), "slots": runtime.settings().owner_concurrency}
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        rows = conn.execute("""
            WITH o AS (
                INSERT INTO occurrences (id, schedule_id, source, fire_at, local_time, utc_offset, fold, timezone,
                                         tzdata_version, schedule_revision, decision, idempotency_key)
                SELECT gen_random_uuid(), %(schedule_id)s, 'manual', now() - interval '3 hours' + g * interval '1 s',
                       (now() - interval '3 hours' + g * interval '1 s')::timestamp, interval '0', 0, 'UTC', 'test',
                       1, 'dispatched', 'k' || g
                  FROM generate_series(1, %(n)s) AS g
                RETURNING id, fire_at)
            INSERT INTO runs (id, occurrence_id, schedule_id, owner, source, source_conversation_id, mode, prompt,
                              agent, state, last_seq, slot_limit, created_at, updated_at)
            SELECT gen_random_uuid(), o.id, %(schedule_id)s, %(owner)s, 'manual', %(conversation_id)s, 'fork', 'hi',
                   %(agent)s, 'queued', 0, %(slots)s, o.fire_at, o.fire_at
              FROM o
            RETURNING id, created_at""", params).fetchall()
    return [r["id"] for r in sorted(rows, key=lambda r: r["created_at"])]


def _tick(context: LambdaContext) -> dict[str, Any]:
    report: dict[str, Any] = tick_app.handler(scheduled_event("2026-01-01T00:00:00Z"), context)
    return report


def _deliver(sqs_queue: SqsQueue, context: LambdaContext) -> int:
    """One receive of up to 10 messages, handed to RunFunction as one batch, then deleted: how many."""
    got = sqs_queue.client.receive_message(QueueUrl=sqs_queue.url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
    messages = got.get("Messages", [])
    if not messages:
        return 0
    response = run_app.handler(sqs_event(*(m["Body"] for m in messages)), context)
    assert response == {"batchItemFailures": []}
    for m in messages:
        sqs_queue.client.delete_message(QueueUrl=sqs_queue.url, ReceiptHandle=m["ReceiptHandle"])
    return len(messages)


def _fairness(db_url: str, sqs_queue: SqsQueue, counting: CountingSqs, lambda_context: LambdaContext,
              backlog: int) -> tuple[list[uuid.UUID], list[str]]:
    """Owner A's ``backlog`` queued runs and four slots; owner B's schedule comes due. One tick sends
    A's four oldest and B's run, nothing else; B's run is claimed (and runs) from that message. Returns
    A's runs and the messages for them still to deliver."""
    a_runs = _backlog(db_url, backlog, owner="owner-a")
    b_schedule = factories.schedule(db_url, owner="owner-b")

    report = _tick(lambda_context)

    (b_run,) = _rows(db_url, "SELECT id FROM runs WHERE schedule_id = %s", b_schedule["id"])
    assert report["dispatched"] == 1 and report["slots_released"] == 4
    assert sorted(counting.sent) == sorted([*a_runs[:4], b_run["id"]])  # no message for a waiting run
    bodies = sqs_queue.drain()
    assert sorted(bodies) == sorted(run_body(r) for r in [*a_runs[:4], b_run["id"]])
    assert run_app.handler(sqs_event(run_body(b_run["id"])), lambda_context) == {"batchItemFailures": []}
    assert _rows(db_url, "SELECT state FROM runs WHERE id = %s", b_run["id"]) == [{"state": "succeeded"}]
    return a_runs, [b for b in bodies if b != run_body(b_run["id"])]


def test_one_owners_backlog_never_stands_in_front_of_another_owners_run(
        db_url: str, sqs_queue: SqsQueue, four_slots: CountingSqs, lambda_context: LambdaContext) -> None:
    _fairness(db_url, sqs_queue, four_slots, lambda_context, 500)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_five_thousand_queued_runs_of_one_owner_each_sent_once_and_run_once_beside_another_owner(
        db_url: str, sqs_queue: SqsQueue, four_slots: CountingSqs, lambda_context: LambdaContext) -> None:
    """The whole backlog drains through RunFunction alone: each end releases and sends the next run
    (no tick needed), never more than four of A's held, every run sent exactly once and run once."""
    a_runs, bodies = _fairness(db_url, sqs_queue, four_slots, lambda_context, 5000)
    four_slots.pending = bodies  # A's four; from here on messages stay in memory
    delivered = 0
    while four_slots.pending:
        batch, four_slots.pending[:] = four_slots.pending[:10], four_slots.pending[10:]
        assert run_app.handler(sqs_event(*batch), lambda_context) == {"batchItemFailures": []}
        delivered += len(batch)
        held = _rows(db_url, "SELECT count(*) AS n FROM runs WHERE owner = 'owner-a' "
                              "AND (state = 'running' OR admitted_at IS NOT NULL)")[0]["n"]
        assert held <= 4
    assert delivered == len(a_runs)
    assert set(four_slots.sent.values()) == {1} and len(four_slots.sent) == len(a_runs) + 1
    assert _rows(db_url, "SELECT state, count(*) AS n FROM runs WHERE owner = 'owner-a' GROUP BY state") == [
        {"state": "succeeded", "n": len(a_runs)}]
    claims = _rows(db_url, "SELECT count(*) AS n FROM run_events WHERE type = 'run.claimed'")[0]["n"]
    assert claims == len(a_runs) + 1  # each run claimed once
    # Released oldest first: A's runs were sent in the order they were queued, up to the runs of one batch
    # that end at once (they execute together; whichever releases second may send first).
    sent = [r for r in four_slots.order if r in set(a_runs)]
    assert sorted(sent) == sorted(a_runs)
    position = {r: i for i, r in enumerate(sent)}
    assert max(abs(position[r] - i) for i, r in enumerate(a_runs)) < 10


class Killed(BaseException):
    """The invocation dies: not an error the handler reports, the process is gone."""


def test_a_crash_between_a_runs_end_and_the_send_of_the_run_it_released_is_repaired_once(
        db_url: str, sqs_queue: SqsQueue, one_slot: CountingSqs, lambda_context: LambdaContext,
        monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = _backlog(db_url, 2, owner="alice")
    _tick(lambda_context)
    assert list(one_slot.sent) == [first]

    def die(*_: Any, **__: Any) -> None:
        raise Killed

    # The first run ends (its statement released the second), then the invocation dies before the send.
    with monkeypatch.context() as patched:
        patched.setattr(handoff, "send_released", die)
        with pytest.raises(Killed):
            _deliver(sqs_queue, lambda_context)
    assert _rows(db_url, "SELECT state, admitted_at IS NOT NULL AS holds, handoff_at FROM runs WHERE id = %s",
                 second) == [{"state": "queued", "holds": True, "handoff_at": None}]
    assert _rows(db_url, "SELECT state FROM runs WHERE id = %s", first) == [{"state": "succeeded"}]
    # A tick within the release's freshness leaves it to its releaser; once it is older, sends it once.
    _tick(lambda_context)
    assert one_slot.sent[second] == 0
    _rows(db_url, "UPDATE runs SET admitted_at = admitted_at - %s WHERE id = %s RETURNING id",
          timedelta(minutes=1), second)
    _tick(lambda_context)
    assert one_slot.sent[second] == 1
    # The dead invocation's message is in flight (its redelivery would find the first run ended).
    assert _deliver(sqs_queue, lambda_context) == 1
    assert _rows(db_url, "SELECT state FROM runs ORDER BY created_at") == [{"state": "succeeded"}] * 2
    _tick(lambda_context)
    assert one_slot.sent == Counter({first: 1, second: 1})
    claimed = _rows(db_url, "SELECT run_id, count(*) AS n FROM run_events WHERE type = 'run.claimed' "
                            "GROUP BY run_id ORDER BY min(at)")
    assert claimed == [{"run_id": first, "n": 1}, {"run_id": second, "n": 1}]


def test_a_stray_message_for_a_waiting_run_is_acknowledged_and_nothing_is_re_sent(
        db_url: str, sqs_queue: SqsQueue, one_slot: CountingSqs, lambda_context: LambdaContext) -> None:
    """A message for a run nobody released (sent before an upgrade, or by hand) while the owner's one
    slot is held: acknowledged, the run stays waiting, no message goes out; the holder's end sends it."""
    holder, waiting = _backlog(db_url, 2, owner="alice")
    _tick(lambda_context)
    assert list(one_slot.sent) == [holder]

    assert run_app.handler(sqs_event(run_body(waiting)), lambda_context) == {"batchItemFailures": []}
    assert list(one_slot.sent) == [holder]
    assert _rows(db_url, "SELECT state, admitted_at FROM runs WHERE id = %s", waiting) == [
        {"state": "queued", "admitted_at": None}]
    assert _rows(db_url, "SELECT type FROM run_events WHERE run_id = %s AND seq > 0 AND type <> 'run.queued'",
                 waiting) == []

    assert _deliver(sqs_queue, lambda_context) == 1  # the holder runs; its end sends the waiting run
    assert one_slot.sent == Counter({holder: 1, waiting: 1})
    assert _deliver(sqs_queue, lambda_context) == 1
    assert _rows(db_url, "SELECT state FROM runs ORDER BY created_at") == [{"state": "succeeded"}] * 2


def test_cancelling_a_run_that_holds_the_slot_sends_the_run_its_cancel_let_in(
        db_url: str, sqs_queue: SqsQueue, one_slot: CountingSqs, lambda_context: LambdaContext,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The cancel's statement frees the owner's one slot and admits the next waiting run; the route
    sends it after its commit, not the tick's repair minutes later."""
    monkeypatch.setenv("KAIROS_AUTH", "dev")
    monkeypatch.setenv("KAIROS_DEV_TOKENS", ",".join(f"{t}={who}" for who, t in TOKENS.items()))
    runtime.reset()
    holder, waiting = _backlog(db_url, 2, owner="alice")
    _tick(lambda_context)
    assert list(one_slot.sent) == [holder]

    answer = ApiClient("alice").post(f"/v1/runs/{holder}/cancel")

    assert answer.status == 200 and answer.json["run"]["state"] == "cancelled", answer.text
    assert one_slot.sent == Counter({holder: 1, waiting: 1})
    assert _rows(db_url, "SELECT handoff_at IS NOT NULL AS stamped FROM runs WHERE id = %s", waiting) == [
        {"stamped": True}]
    assert _deliver(sqs_queue, lambda_context) == 2  # the holder's message finds it cancelled; the other runs
    assert _rows(db_url, "SELECT state FROM runs WHERE id = %s", waiting) == [{"state": "succeeded"}]
    _tick(lambda_context)
    assert one_slot.sent == Counter({holder: 1, waiting: 1})  # and the repair sends nothing again
