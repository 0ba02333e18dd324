"""Webhook flow through the public handlers on real PostgreSQL (moto SQS): debounce and batch windows,
coalesced deliveries, idempotency inside a window, windows closed by their timer or by the tick, and
``over_rate: defer``.

Time moves the black-box way: a run's instants (``created_at``, ``held_until``, ``window_deadline``,
``handoff_at``) are moved back together, which is the database clock moving forward for that run.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest

from kairos import cli, runtime
from kairos.db import Database
from kairos.local.stack import load_function
from kairos.tick.repair import Repair
from tests.support.api import Answer, Api, count, hook, rows
from tests.support.aws import LambdaContext, run_body, sqs_event

run_app = load_function("run")


class RecordingSqs:
    """moto's client, with every message sent kept (body and delay)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.sent: list[tuple[str, int]] = []

    def send_message(self, **kwargs: Any) -> Any:
        self.sent.append((kwargs["MessageBody"], int(kwargs.get("DelaySeconds", 0))))
        return self.client.send_message(**kwargs)

    def send_message_batch(self, **kwargs: Any) -> Any:
        self.sent.extend((e["MessageBody"], int(e.get("DelaySeconds", 0))) for e in kwargs["Entries"])
        return self.client.send_message_batch(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def delays(self, run_id: str) -> list[int]:
        return [delay for body, delay in self.sent if body == run_body(uuid.UUID(run_id))]


@pytest.fixture
def sqs(api: Api, monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordingSqs]:
    recording = RecordingSqs(api.sqs)
    monkeypatch.setattr(runtime, "sqs", lambda: recording)
    yield recording


def flow_hook(api: Api, flow: dict[str, Any], *, rate: int | None = None) -> str:
    schedule, token = api.webhook_schedule(flow=flow)
    if rate is not None:
        rows(api.url, "UPDATE schedules SET rate_limit_per_minute = %(r)s WHERE id = %(id)s RETURNING id",
             {"r": rate, "id": schedule["id"]})
    return token


def run_row(api: Api, run_id: str) -> dict[str, Any]:
    (row,) = rows(api.url, "SELECT * FROM runs WHERE id = %(id)s", {"id": run_id})
    return row


def advance(api: Api, run_id: str, seconds: float) -> None:
    """The database clock moves ``seconds`` forward for this run: its instants move back."""
    rows(api.url, "UPDATE runs SET created_at = created_at - make_interval(secs => %(s)s), "
                  "held_until = held_until - make_interval(secs => %(s)s), "
                  "window_deadline = window_deadline - make_interval(secs => %(s)s), "
                  "handoff_at = handoff_at - make_interval(secs => %(s)s) WHERE id = %(id)s RETURNING id",
         {"s": seconds, "id": run_id})


def deliver_to_worker(run_id: str) -> None:
    """The run's message, as SQS hands it to the run function."""
    response = run_app.handler(sqs_event(run_body(uuid.UUID(run_id))), LambdaContext())
    assert response == {"batchItemFailures": []}


def release(api: Api, sqs: RecordingSqs) -> int:
    """The tick's release step (waiting runs into free slots, then sent), as the tick runs it."""
    database = Database(api.url)
    try:
        return Repair(database, sqs, api.queue_url).release_once().slots_released
    finally:
        database.close()


def repair(api: Api, sqs: RecordingSqs) -> int:
    """The tick's repair step, as the tick runs it."""
    database = Database(api.url)
    try:
        return Repair(database, sqs, api.queue_url).resend_once().resent
    finally:
        database.close()


# ---- debounce -----------------------------------------------------------------------------------


def test_debounce_folds_ten_deliveries_into_one_run_with_the_last_payload_and_the_count(
        api: Api, sqs: RecordingSqs) -> None:
    token = flow_hook(api, {"debounce_seconds": 60})

    answers = [hook(api, token, {"n": i}, headers={"idempotency-key": f"push-{i}"}) for i in range(10)]

    assert {a.status for a in answers} == {202}
    run_ids = {a.json["run_id"] for a in answers}
    assert len(run_ids) == 1, "every delivery is answered with the run it folded into"
    (run_id,) = run_ids
    assert count(api, "runs") == 1
    run = run_row(api, run_id)
    assert run["state"] == "queued" and run["payload"] == {"n": 9} and run["deliveries"] == 10
    assert run["flow_window"] == "debounce"
    # Quiet for 60 s after the last delivery, and never past ten windows after the first.
    assert run["created_at"] + timedelta(seconds=60) <= run["held_until"] <= run["window_deadline"]
    assert run["window_deadline"] == run["created_at"] + timedelta(seconds=600)
    occurrences = rows(api.url, "SELECT id::text, decision, coalesced_into::text FROM occurrences")
    assert sorted(o["decision"] for o in occurrences) == ["coalesced"] * 9 + ["dispatched"]
    assert {o["coalesced_into"] for o in occurrences if o["decision"] == "coalesced"} == {run_id}
    assert {a.json["occurrence_id"] for a in answers} == {o["id"] for o in occurrences}
    # One message for the whole window: its timer, delayed until the window closes.
    assert sqs.delays(run_id) == [60]
    listed = api.alice.get(f"/v1/schedules/{run['schedule_id']}/occurrences")
    assert {o["run_id"] for o in listed.json["occurrences"]} == {run_id}
    assert {o["decision"] for o in listed.json["occurrences"]} == {"coalesced", "dispatched"}
    shown = api.alice.get(f"/v1/runs/{run_id}").json["run"]
    assert shown["deliveries"] == 10 and shown["flow_window"] == "debounce" and shown["held_until"]


def test_a_debounced_run_waits_for_its_window_then_runs_and_a_later_delivery_makes_a_new_run(
        api: Api, sqs: RecordingSqs) -> None:
    token = flow_hook(api, {"debounce_seconds": 60})
    first = hook(api, token, {"n": 1}).json["run_id"]

    deliver_to_worker(first)  # the timer arrives while the window is open: sent again for the time left
    assert run_row(api, first)["state"] == "queued"
    assert 1 <= sqs.delays(first)[-1] <= 60 and len(sqs.delays(first)) == 2
    assert run_row(api, first)["unclaimed_handoffs"] <= 1, "a timer that came back is not a lost handoff"

    advance(api, first, 61)  # quiet for the whole window
    deliver_to_worker(first)
    assert run_row(api, first)["state"] == "succeeded"

    later = hook(api, token, {"n": 2})
    assert later.status == 202 and later.json["run_id"] != first
    assert run_row(api, later.json["run_id"])["deliveries"] == 1
    assert count(api, "runs") == 2


def test_debounce_closes_at_ten_windows_after_the_first_delivery(api: Api, sqs: RecordingSqs) -> None:
    token = flow_hook(api, {"debounce_seconds": 60})
    run_id = hook(api, token, {"n": 0}).json["run_id"]
    for i in range(1, 20):  # a delivery every 30 s: the window is never quiet for 60 s
        advance(api, run_id, 30)
        assert hook(api, token, {"n": i}).json["run_id"] == run_id
    run = run_row(api, run_id)
    assert run["held_until"] == run["window_deadline"] == run["created_at"] + timedelta(seconds=600)

    advance(api, run_id, 31)  # 601 s after the first: closed however recent the last delivery
    after = hook(api, token, {"n": 99})
    assert after.json["run_id"] != run_id and run_row(api, run_id)["deliveries"] == 20


def test_a_lost_window_timer_is_repaired_by_the_tick(api: Api, sqs: RecordingSqs) -> None:
    """A held run holds no slot, so once due it is a waiting run like any other: the tick's release
    gives it a slot and sends it."""
    token = flow_hook(api, {"debounce_seconds": 30})
    run_id = hook(api, token, {"n": 1}).json["run_id"]
    sqs.sent.clear()

    assert release(api, sqs) == 0 and repair(api, sqs) == 0, "an open window is left alone"
    advance(api, run_id, 31)
    assert release(api, sqs) == 1 and sqs.delays(run_id) == [0]
    assert repair(api, sqs) == 0, "released and sent: nothing left to repair"
    deliver_to_worker(run_id)
    assert run_row(api, run_id)["state"] == "succeeded"


def test_an_open_window_holds_no_slot_and_its_timer_starts_the_run_once_due(
        api: Api, sqs: RecordingSqs, monkeypatch: pytest.MonkeyPatch) -> None:
    """One slot: a debounced run's window is open for 60 s; another hook's run of the same owner is not
    kept waiting behind it. When the window closes, the timer's message starts the held run."""
    monkeypatch.setenv("KAIROS_OWNER_CONCURRENCY", "1")
    runtime.reset()
    held = hook(api, flow_hook(api, {"debounce_seconds": 60}), {"n": 1}).json["run_id"]
    assert run_row(api, held)["admitted_at"] is None
    assert sqs.delays(held) == [60], "its timer is sent though it holds no slot"
    assert api.alice.get(f"/v1/runs/{held}").json["run"]["waiting_for"] is None

    plain = hook(api, flow_hook(api, {}), {"n": 2}).json["run_id"]

    assert run_row(api, plain)["admitted_at"] is not None and sqs.delays(plain) == [0]
    deliver_to_worker(plain)
    assert run_row(api, plain)["state"] == "succeeded"
    advance(api, held, 61)
    deliver_to_worker(held)  # the timer arrives: the slot is free
    assert run_row(api, held)["state"] == "succeeded"
    claims = rows(api.url, "SELECT run_id::text, count(*) AS n FROM run_events WHERE type = 'run.claimed' "
                           "GROUP BY run_id", {})
    assert sorted((c["run_id"], c["n"]) for c in claims) == sorted([(held, 1), (plain, 1)])


# ---- batch --------------------------------------------------------------------------------------


def test_batch_of_twenty_five_with_max_events_ten_makes_runs_of_ten_ten_and_five(
        api: Api, sqs: RecordingSqs) -> None:
    token = flow_hook(api, {"batch": {"max_events": 10, "max_wait_seconds": 120}})

    answers = [hook(api, token, {"n": i}) for i in range(25)]

    assert {a.status for a in answers} == {202}
    order = list(dict.fromkeys(a.json["run_id"] for a in answers))
    assert [sum(1 for a in answers if a.json["run_id"] == r) for r in order] == [10, 10, 5]
    runs = [run_row(api, r) for r in order]
    assert [r["payload"] for r in runs] == [[{"n": i} for i in range(k, min(k + 10, 25))] for k in (0, 10, 20)]
    assert [r["deliveries"] for r in runs] == [10, 10, 5]
    # The full batches went at once (their timer, then the send at the count); the last waits.
    for full in order[:2]:
        assert sqs.delays(full) == [120, 0]
        deliver_to_worker(full)
        assert run_row(api, full)["state"] == "succeeded"
    last = order[2]
    assert sqs.delays(last) == [120]
    deliver_to_worker(last)
    assert run_row(api, last)["state"] == "queued", "held until max_wait_seconds"
    advance(api, last, 120)
    deliver_to_worker(last)
    assert run_row(api, last)["state"] == "succeeded"
    assert count(api, "occurrences") == 25


def test_concurrent_deliveries_fold_into_one_window_without_losing_any(api: Api, sqs: RecordingSqs) -> None:
    token = flow_hook(api, {"batch": {"max_events": 100, "max_wait_seconds": 300}})
    barrier = threading.Barrier(16)

    def post(i: int) -> Answer:
        barrier.wait()
        return hook(api, token, {"i": i}, headers={"idempotency-key": f"k-{i}"})

    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = list(pool.map(post, range(16)))

    assert {a.status for a in answers} == {202}
    (run_id,) = {a.json["run_id"] for a in answers}
    run = run_row(api, run_id)
    assert run["deliveries"] == 16 and sorted(p["i"] for p in run["payload"]) == list(range(16))


def test_concurrent_deliveries_fill_batches_exactly_to_max_events(api: Api, sqs: RecordingSqs) -> None:
    token = flow_hook(api, {"batch": {"max_events": 10, "max_wait_seconds": 300}})
    barrier = threading.Barrier(25)

    def post(i: int) -> Answer:
        barrier.wait()
        return hook(api, token, {"i": i})

    with ThreadPoolExecutor(max_workers=25) as pool:
        answers = list(pool.map(post, range(25)))

    assert {a.status for a in answers} == {202}
    runs = [run_row(api, r) for r in {a.json["run_id"] for a in answers}]
    assert sorted(r["deliveries"] for r in runs) == [5, 10, 10]
    assert sorted(p["i"] for r in runs for p in r["payload"]) == list(range(25)), "none lost, none twice"
    assert all(len(r["payload"]) == r["deliveries"] for r in runs)


def test_a_retried_delivery_inside_a_window_is_not_counted_twice(api: Api, sqs: RecordingSqs) -> None:
    token = flow_hook(api, {"batch": {"max_events": 3, "max_wait_seconds": 60}})
    first = hook(api, token, {"n": 1}, headers={"idempotency-key": "a"})
    second = hook(api, token, {"n": 2}, headers={"idempotency-key": "b"})
    retried = [hook(api, token, {"n": 2}, headers={"idempotency-key": "b"}) for _ in range(3)]
    reused = hook(api, token, {"n": 3}, headers={"idempotency-key": "b"})

    assert all(r.text == second.text for r in retried), "the first answer again"
    assert reused.status == 422
    run = run_row(api, first.json["run_id"])
    assert run["deliveries"] == 2 and run["payload"] == [{"n": 1}, {"n": 2}] and run["state"] == "queued"
    assert count(api, "occurrences") == 2

    debounced = flow_hook(api, {"debounce_seconds": 60})
    one = hook(api, debounced, {"n": 1}, headers={"idempotency-key": "x"})
    again = hook(api, debounced, {"n": 1}, headers={"idempotency-key": "x"})
    assert again.text == one.text and run_row(api, one.json["run_id"])["deliveries"] == 1


# ---- over_rate ----------------------------------------------------------------------------------


def test_over_rate_defer_accepts_a_burst_of_three_times_the_rate_and_dispatches_it_at_the_rate(
        api: Api, sqs: RecordingSqs, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAIROS_OWNER_CONCURRENCY", "20")  # each run gets a running slot: the rate decides
    runtime.reset()
    monkeypatch.setattr(runtime, "sqs", lambda: sqs)
    token = flow_hook(api, {"over_rate": "defer"}, rate=5)

    answers = [hook(api, token, {"n": i}) for i in range(15)]

    assert [a.status for a in answers] == [202] * 15
    runs = [run_row(api, a.json["run_id"]) for a in answers]
    due = [r["held_until"] or r["created_at"] for r in runs]
    assert [r["held_until"] is None for r in runs] == [True] * 5 + [False] * 10
    # Never more than 5 dispatchable in any 60 s, and the burst is spread over two more minutes.
    for instant in due:
        assert sum(1 for d in due if instant - timedelta(seconds=60) < d <= instant) <= 5
    assert due[5] == due[0] + timedelta(seconds=60) and due[10] == due[0] + timedelta(seconds=120)
    assert [len(sqs.delays(str(r["id"]))) for r in runs] == [1] * 15
    assert all(1 <= sqs.delays(str(r["id"]))[0] <= 60 for r in runs[5:10])
    assert all(sqs.delays(str(r["id"]))[0] == 0 for r in runs[:5])
    # A deferred run is not started before its turn.
    deliver_to_worker(str(runs[5]["id"]))
    assert run_row(api, str(runs[5]["id"]))["state"] == "queued"


def test_over_rate_defer_answers_429_beyond_the_owners_queue_cap(api: Api, sqs: RecordingSqs,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAIROS_OWNER_QUEUE_MAX", "8")
    runtime.reset()
    monkeypatch.setattr(runtime, "sqs", lambda: sqs)
    token = flow_hook(api, {"over_rate": "defer"}, rate=5)

    answers = [hook(api, token, {"n": i}) for i in range(10)]

    assert [a.status for a in answers] == [202] * 8 + [429] * 2
    assert answers[8].error["code"] == "queue_full" and "Retry-After" in answers[8].headers
    assert count(api, "runs") == 8


def test_over_rate_reject_is_the_default(api: Api, sqs: RecordingSqs) -> None:
    token = flow_hook(api, {"debounce_seconds": 5}, rate=1)
    first = hook(api, token, {"n": 1})
    folded = hook(api, token, {"n": 2})
    assert folded.status == 202 and folded.json["run_id"] == first.json["run_id"], "a fold is not a new run"
    advance(api, first.json["run_id"], 6)
    limited = hook(api, token, {"n": 3})
    assert limited.status == 429 and limited.error["code"] == "rate_limited"


# ---- the operator CLI ---------------------------------------------------------------------------


def test_the_cli_shows_a_hooks_flow_and_the_deliveries_a_run_carries(api: Api, sqs: RecordingSqs,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    token = flow_hook(api, {"debounce_seconds": 30, "concurrency": {"key": "/pr", "limit": 2}})
    run_id = [hook(api, token, {"pr": i}) for i in range(3)][-1].json["run_id"]
    schedule_id = str(run_row(api, run_id)["schedule_id"])

    assert cli.main(["schedules", "list"]) == 0
    assert "flow debounce 30s, key /pr limit 2, over rate reject" in capsys.readouterr().out
    assert cli.main(["runs", "list", "--schedule", schedule_id]) == 0
    listed = capsys.readouterr().out
    assert run_id in listed and "debounce of 3 deliveries" in listed and "held until" in listed
    assert cli.main(["schedules", "show", schedule_id, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["flow"]["concurrency"] == {"key": "/pr", "limit": 2}


# ---- concurrency --------------------------------------------------------------------------------


def test_concurrency_keys_run_one_per_key_value_in_arrival_order_and_show_what_waits(
        api: Api, sqs: RecordingSqs) -> None:
    """flow.concurrency {key: /pr/number, limit: 1}: six deliveries for two pull requests. One run per
    key is sent; the others wait unsent (waiting_for "key"); each end releases the next of its key,
    never two of one key running (sampled from the database), each key's runs in arrival order. A
    payload without the key waits only for its owner's slots."""
    token = flow_hook(api, {"concurrency": {"key": "/pr/number", "limit": 1}})
    prs = [7, 8, 7, 7, 8, 8]
    answers = [hook(api, token, {"pr": {"number": n}, "i": i}) for i, n in enumerate(prs)]
    run_ids = [a.json["run_id"] for a in answers]
    assert [run_row(api, r)["concurrency_key"] for r in run_ids] == ["7", "8", "7", "7", "8", "8"]
    assert {body for body, _ in sqs.sent} == {run_body(uuid.UUID(r)) for r in run_ids[:2]}
    waiting = api.alice.get(f"/v1/runs/{run_ids[2]}").json["run"]
    assert waiting["state"] == "queued" and waiting["waiting_for"] == "key"
    keyless = hook(api, token, {"no": "pr"}).json["run_id"]
    assert run_row(api, keyless)["concurrency_key"] is None
    assert sqs.delays(keyless) == [0]  # a free owner slot: sent at once

    started: list[str] = []
    while True:
        sent = [json.loads(body)["run_id"] for body, _ in sqs.sent]
        pending = [r for r in dict.fromkeys(sent) if r not in started and r != keyless]
        if not pending:
            break
        started.append(pending[0])
        deliver_to_worker(pending[0])
        most = rows(api.url, "SELECT coalesce(max(n), 0) AS n FROM (SELECT count(*) AS n FROM runs "
                             "WHERE state = 'running' GROUP BY concurrency_key) AS k", {})[0]["n"]
        assert most <= 1
    assert sorted(started) == sorted(run_ids)
    for n in (7, 8):
        mine = [r for r, pr in zip(run_ids, prs, strict=True) if pr == n]
        assert [r for r in started if r in mine] == mine
    assert {run_row(api, r)["state"] for r in run_ids} == {"succeeded"}
    assert all(len(sqs.delays(r)) == 1 for r in run_ids)  # each sent once
