"""Runs that must not run (issue 10, items 2, 6 and 9): the public handlers end to end.

Schedules are made through the API handler, fired by the tick handler, and their run ids reach the
run handler as the SQS messages the tick really sent (moto). Time moves the way a black-box
test can move it: by editing ``next_fire_at``, ``runs.expires_at`` and ``runs.handoff_at``.

* The claim refuses a run whose schedule was paused (by its owner or by the three-failure pause) or
  cancelled (``cancelled``), an older fire delivered after a newer one started (``abandoned``,
  ``superseded``), and a run past ``expires_at`` (``expired``) — one terminal event, no call, the
  message acknowledged, and a redelivery changes nothing.
* A once schedule is ``completed`` as soon as its occurrence is recorded, dispatched or expired.
* A run SQS took five times without a claim ends ``failed`` (``undeliverable``) and counts toward the
  three-failure pause.
"""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

import pytest

from kairos.local.stack import load_function
from tests import factories
from tests.support.api import Api, rows
from tests.support.aws import LambdaContext, run_body, scheduled_event, sqs_event

run_app = load_function("run")
tick_app = load_function("tick")


# --- helpers ---------------------------------------------------------------------------------------


def db_now(api: Api) -> datetime:
    now: datetime = rows(api.url, "SELECT now() AS now")[0]["now"]
    return now


def iso(instant: datetime) -> str:
    return instant.isoformat().replace("+00:00", "Z")


def tick() -> dict[str, Any]:
    report: dict[str, Any] = tick_app.handler(scheduled_event("2026-03-02T07:00:00Z"), LambdaContext())
    return report


def deliver(*run_ids: uuid.UUID) -> dict[str, Any]:
    """The run handler with one SQS record per id, as the queue delivers them."""
    response: dict[str, Any] = run_app.handler(sqs_event(*[run_body(r) for r in run_ids]), LambdaContext())
    return response


def sent(api: Api) -> list[uuid.UUID]:
    """The run ids the tick put on the queue since the last call."""
    return [uuid.UUID(body["run_id"]) for body in api.messages()]


def interval_schedule(api: Api, *, anchor: datetime, **fields: Any) -> dict[str, Any]:
    """An hourly schedule made through the API, anchored in the past (its next fire is an hour on)."""
    conversation = api.conversation()
    answer = api.alice.post("/v1/schedules", {"conversation_id": conversation["id"], "prompt": "brief me",
                                              "kind": "interval", "interval_seconds": 3600,
                                              "starts_at": iso(anchor), **fields})
    assert answer.status == 201, answer.text
    return dict(answer.json["schedule"])


def move_cursor(api: Api, schedule_id: str, to: datetime) -> None:
    rows(api.url, "UPDATE schedules SET next_fire_at = %(t)s WHERE id = %(id)s RETURNING id",
         {"t": to, "id": schedule_id})


def fire(api: Api, schedule_id: str, at: datetime) -> uuid.UUID:
    """Moves the schedule's cursor to ``at``, ticks, and returns the one run id the tick sent."""
    move_cursor(api, schedule_id, at)
    report = tick()
    assert report["dispatched"] == 1, report
    [run_id] = sent(api)
    return run_id


def run_row(api: Api, run_id: uuid.UUID) -> dict[str, Any]:
    [row] = rows(api.url, "SELECT * FROM runs WHERE id = %(id)s", {"id": run_id})
    return row


def trace(api: Api, run_id: uuid.UUID) -> list[tuple[str, int, dict[str, Any]]]:
    return [(e["type"], e["attempt"], e["data"]) for e in
            rows(api.url, "SELECT type, attempt, data FROM run_events WHERE run_id = %(id)s ORDER BY seq",
                 {"id": run_id})]


def schedule_row(api: Api, schedule_id: str) -> dict[str, Any]:
    [row] = rows(api.url, "SELECT * FROM schedules WHERE id = %(id)s", {"id": schedule_id})
    return row


def assert_refused_without_a_call(api: Api, run_id: uuid.UUID, state: str, reason: str) -> None:
    """Ended in ``state`` with ``reason`` by the claim: never claimed, one terminal event, nothing written
    anywhere a run writes when it runs (no target conversation, no entry, no effect)."""
    run = run_row(api, run_id)
    assert (run["state"], run["attempt"], run["fence"], run["started_at"]) == (state, 0, 0, None)
    assert run["finished_at"] is not None and run["lease_token"] is None
    assert run["diagnosis"]["reason_code"] == reason
    events = trace(api, run_id)  # after run.queued (when the tick made the run), the terminal event alone
    assert [(t, attempt) for t, attempt, _ in events if t != "run.queued"] == [(f"run.{state}", 0)]
    assert events[-1][2] == {"reason_code": reason, "by": "claim"}
    assert rows(api.url, "SELECT 1 FROM conversation_entries WHERE run_id = %(id)s", {"id": run_id}) == []
    assert rows(api.url, "SELECT 1 FROM effects WHERE run_id = %(id)s", {"id": run_id}) == []
    assert rows(api.url, "SELECT 1 FROM conversations WHERE origin_run_id = %(id)s", {"id": run_id}) == []
    shown = api.alice.get(f"/v1/runs/{run_id}")
    assert shown.status == 200 and shown.json["run"]["state"] == state
    assert shown.json["run"]["diagnosis"]["reason_code"] == reason


def assert_redelivery_changes_nothing(api: Api, run_id: uuid.UUID) -> None:
    before = (run_row(api, run_id), trace(api, run_id))
    assert deliver(run_id, run_id) == {"batchItemFailures": []}  # acknowledged, twice
    assert (run_row(api, run_id), trace(api, run_id)) == before


# --- the claim refuses ----------------------------------------------------------------------------------


def test_a_queued_run_of_a_paused_schedule_is_cancelled_at_its_claim(api: Api) -> None:
    now = db_now(api)
    schedule = interval_schedule(api, anchor=now - timedelta(seconds=90))
    run_id = fire(api, schedule["id"], now - timedelta(seconds=90))
    assert api.alice.post(f"/v1/schedules/{schedule['id']}/pause").status == 200

    assert deliver(run_id) == {"batchItemFailures": []}  # the message is acknowledged

    assert_refused_without_a_call(api, run_id, "cancelled", "schedule_paused")
    assert_redelivery_changes_nothing(api, run_id)
    tick()  # settled: a refusal is no failure
    after = schedule_row(api, schedule["id"])
    assert (after["status"], after["consecutive_failures"]) == ("paused", 0)


def test_after_the_automatic_pause_at_three_failures_a_queued_run_is_cancelled(api: Api) -> None:
    now = db_now(api)
    schedule = interval_schedule(api, anchor=now - timedelta(seconds=90))
    run_id = fire(api, schedule["id"], now - timedelta(seconds=90))
    row = schedule_row(api, schedule["id"])
    for hours in (3, 2, 1):  # three older fires that failed, not yet settled
        factories.run(api.url, schedule_row=row, state="failed", fire_at=now - timedelta(hours=hours))

    report = tick()
    assert report["paused"] == 1 and schedule_row(api, schedule["id"])["status"] == "paused"
    assert deliver(run_id) == {"batchItemFailures": []}

    assert_refused_without_a_call(api, run_id, "cancelled", "schedule_paused")
    tick()
    assert schedule_row(api, schedule["id"])["consecutive_failures"] == 3  # the refusal counted nothing
    notes = api.alice.get(f"/v1/conversations/{row['conversation_id']}/inbox").json["notes"]
    assert [n["kind"] for n in notes if n["kind"] != "run_ended"] == ["schedule_paused"]  # and one per failure


def test_a_queued_run_of_a_cancelled_schedule_is_cancelled_at_its_claim(api: Api) -> None:
    now = db_now(api)
    schedule = interval_schedule(api, anchor=now - timedelta(seconds=90))
    run_id = fire(api, schedule["id"], now - timedelta(seconds=90))
    assert api.alice.delete(f"/v1/schedules/{schedule['id']}").status == 200

    assert deliver(run_id) == {"batchItemFailures": []}

    assert_refused_without_a_call(api, run_id, "cancelled", "schedule_cancelled")
    assert_redelivery_changes_nothing(api, run_id)


def test_copies_of_a_refused_runs_message_handled_at_once_refuse_it_once(api: Api) -> None:
    now = db_now(api)
    schedule = interval_schedule(api, anchor=now - timedelta(seconds=90))
    run_id = fire(api, schedule["id"], now - timedelta(seconds=90))
    assert api.alice.delete(f"/v1/schedules/{schedule['id']}").status == 200
    start = threading.Barrier(4)

    def handle(_: int) -> dict[str, Any]:
        start.wait()
        return deliver(run_id)

    with ThreadPoolExecutor(max_workers=4) as pool:  # four invocations of the run function at once
        answers = list(pool.map(handle, range(4)))

    assert answers == [{"batchItemFailures": []}] * 4
    assert_refused_without_a_call(api, run_id, "cancelled", "schedule_cancelled")


def test_an_older_fire_delivered_after_a_newer_one_started_is_abandoned_as_superseded(api: Api) -> None:
    now = db_now(api)
    schedule = interval_schedule(api, anchor=now - timedelta(seconds=100))
    oldest = fire(api, schedule["id"], now - timedelta(seconds=100))
    middle = fire(api, schedule["id"], now - timedelta(seconds=60))
    newest = fire(api, schedule["id"], now - timedelta(seconds=20))

    # Delivered out of order: the oldest first (nothing newer started yet: it runs), then the newest.
    assert deliver(oldest) == {"batchItemFailures": []}
    assert deliver(newest) == {"batchItemFailures": []}
    assert run_row(api, oldest)["state"] == run_row(api, newest)["state"] == "succeeded"

    # The middle fire arrives last: a newer fire already ran, so it never runs.
    assert deliver(middle) == {"batchItemFailures": []}
    assert_refused_without_a_call(api, middle, "abandoned", "superseded")
    assert_redelivery_changes_nothing(api, middle)


def test_a_run_claimed_past_its_expiry_is_expired_and_expiry_comes_from_max_delay_seconds(api: Api) -> None:
    now = db_now(api)
    schedule = interval_schedule(api, anchor=now - timedelta(seconds=90), max_delay_seconds=300)
    assert schedule["max_delay_seconds"] == 300
    run_id = fire(api, schedule["id"], now - timedelta(seconds=90))
    [occurrence] = rows(api.url, "SELECT fire_at FROM occurrences WHERE schedule_id = %(id)s", {"id": schedule["id"]})
    assert run_row(api, run_id)["expires_at"] == occurrence["fire_at"] + timedelta(seconds=300)

    # Time moves past the expiry while the message waits in the queue.
    rows(api.url, "UPDATE runs SET expires_at = now() - interval '1 second' WHERE id = %(id)s RETURNING id",
         {"id": run_id})
    assert deliver(run_id) == {"batchItemFailures": []}

    assert_refused_without_a_call(api, run_id, "expired", "expired")
    assert_redelivery_changes_nothing(api, run_id)


def test_only_a_scheduled_run_without_catch_up_has_an_expiry(api: Api) -> None:
    now = db_now(api)
    plain = interval_schedule(api, anchor=now - timedelta(seconds=90))
    catching_up = interval_schedule(api, anchor=now - timedelta(seconds=90), catch_up=True)
    plain_run = fire(api, plain["id"], now - timedelta(seconds=90))
    caught_up_run = fire(api, catching_up["id"], now - timedelta(seconds=90))
    _, token = api.webhook_schedule()
    hooked = api.anonymous.post(f"/v1/hooks/{token}", {"n": 1})
    assert hooked.status == 202, hooked.text

    assert plain["max_delay_seconds"] == 600  # the default
    assert run_row(api, plain_run)["expires_at"] == now - timedelta(seconds=90) + timedelta(seconds=600)
    assert run_row(api, caught_up_run)["expires_at"] is None
    assert run_row(api, uuid.UUID(hooked.json["run_id"]))["expires_at"] is None


def test_a_run_released_from_behind_a_long_blocker_expires_instead_of_running_late(api: Api) -> None:
    now = db_now(api)
    schedule = interval_schedule(api, anchor=now - timedelta(hours=3), overlap="queue_one")
    move_cursor(api, schedule["id"], now + timedelta(hours=1))
    row = schedule_row(api, schedule["id"])
    # The 07:00 fire waited behind a run that took an hour and has just ended.
    blocker = factories.run(api.url, schedule_row=row, state="succeeded", fire_at=now - timedelta(hours=2))
    waiting = factories.run(api.url, schedule_row=row, state="queued", fire_at=now - timedelta(hours=1),
                            blocked_by_run_id=blocker["id"])

    report = tick()
    assert report["released"] == 1 and sent(api) == [waiting["id"]]
    assert deliver(waiting["id"]) == {"batchItemFailures": []}

    assert_refused_without_a_call(api, waiting["id"], "expired", "expired")
    # Its expiry was set when it was released (none while it could not be claimed): fire_at + 600 s.
    assert waiting.get("expires_at", "no such column") is None
    assert run_row(api, waiting["id"])["expires_at"] == now - timedelta(hours=1) + timedelta(seconds=600)


def test_max_delay_seconds_is_bounded_and_only_for_timed_schedules(api: Api) -> None:
    conversation = api.conversation()
    base = {"conversation_id": conversation["id"], "prompt": "p", "cron": "0 7 * * *", "timezone": "Europe/Berlin"}
    for bad in (59, 86_401, "600", True):
        answer = api.alice.post("/v1/schedules", {**base, "max_delay_seconds": bad})
        assert answer.status == 422, answer.text
        assert [f["field"] for f in answer.error["fields"]] == ["max_delay_seconds"], answer.text
    hook = api.alice.post("/v1/schedules", {"conversation_id": conversation["id"], "prompt": "p", "kind": "webhook",
                                            "max_delay_seconds": 600})
    assert hook.status == 422 and [(f["field"], f["rule"]) for f in hook.error["fields"]] == [
        ("max_delay_seconds", "not_for_kind")]
    for good in (60, 86_400):
        assert api.alice.post("/v1/schedules", {**base, "max_delay_seconds": good}).status == 201
    assert rows(api.url, "SELECT 1 FROM schedules WHERE kind = 'webhook'") == []


# --- once schedules ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("late", "decision"), [(timedelta(seconds=30), "dispatched"),
                                                (timedelta(hours=1), "expired")])
def test_a_once_schedule_is_completed_when_its_moved_occurrence_is_recorded(
        api: Api, late: timedelta, decision: str) -> None:
    now = db_now(api)
    conversation = api.conversation()
    created = api.alice.post("/v1/schedules", {"conversation_id": conversation["id"], "prompt": "once",
                                               "kind": "once", "starts_at": iso(now + timedelta(days=1))})
    assert created.status == 201, created.text
    schedule_id = created.json["schedule"]["id"]
    move_cursor(api, schedule_id, now - late)

    tick()

    shown = api.alice.get(f"/v1/schedules/{schedule_id}").json["schedule"]
    assert (shown["status"], shown["next_fire_at"]) == ("completed", None)
    occurrences = rows(api.url, "SELECT decision FROM occurrences WHERE schedule_id = %(id)s", {"id": schedule_id})
    assert [o["decision"] for o in occurrences] == [decision]
    tick()  # nothing is left to fire, at starts_at or ever
    assert len(rows(api.url, "SELECT 1 FROM occurrences WHERE schedule_id = %(id)s", {"id": schedule_id})) == 1


# --- undeliverable ------------------------------------------------------------------------------------------


def test_a_run_handed_off_five_times_without_a_claim_fails_undeliverable_and_counts_toward_the_pause(
        api: Api) -> None:
    now = db_now(api)
    schedule = interval_schedule(api, anchor=now - timedelta(seconds=90))
    row = schedule_row(api, schedule["id"])
    for hours in (3, 2):  # two failures in a row already
        factories.run(api.url, schedule_row=row, state="failed", fire_at=now - timedelta(hours=hours))
    run_id = fire(api, schedule["id"], now - timedelta(seconds=90))  # handoff 1; that tick settled both
    assert schedule_row(api, schedule["id"])["consecutive_failures"] == 2

    messages = [run_id]
    for _ in range(4):  # the message never reaches a worker; each stale handoff is repaired
        rows(api.url, "UPDATE runs SET handoff_at = now() - interval '16 minutes' WHERE id = %(id)s RETURNING id",
             {"id": run_id})
        assert tick()["resent"] == 1
        messages += sent(api)
    assert messages == [run_id] * 5 and run_row(api, run_id)["state"] == "queued"

    rows(api.url, "UPDATE runs SET handoff_at = now() - interval '16 minutes' WHERE id = %(id)s RETURNING id",
         {"id": run_id})
    report = tick()

    assert (report["resent"], report.get("undeliverable")) == (0, 1) and sent(api) == []
    run = run_row(api, run_id)
    assert (run["state"], run["attempt"], run["diagnosis"]["reason_code"]) == ("failed", 0, "undeliverable")
    assert [t for t, _, _ in trace(api, run_id)] == ["run.queued", "run.failed"]
    assert trace(api, run_id)[-1][2]["reason_code"] == "undeliverable"

    tick()  # settles it: the third failure in a row pauses the schedule
    after = schedule_row(api, schedule["id"])
    assert (after["status"], after["consecutive_failures"]) == ("paused", 3)
    notes = api.alice.get(f"/v1/conversations/{row['conversation_id']}/inbox").json["notes"]
    assert [n["kind"] for n in notes if n["kind"] != "run_ended"] == ["schedule_paused"]  # and one per failure

    # A copy of an old message finally arrives: nothing runs, nothing is written.
    assert_redelivery_changes_nothing(api, run_id)
