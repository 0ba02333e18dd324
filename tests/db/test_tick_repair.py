"""The repair step: unsent and stale handoffs are sent again; runs of vanished workers are rescued."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from kairos import handoff
from kairos.db import Database
from kairos.runs import moves
from kairos.tick import Repair, Settle
from tests import factories
from tests.support.aws import SqsQueue

_instants = itertools.count()


def make_run(url: str, **columns: Any) -> dict[str, Any]:
    """A run with a fire instant of its own (the factory's default repeats within one second)."""
    fire_at = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=next(_instants))
    return factories.run(url, fire_at=fire_at, **columns)


@pytest.fixture
def now(db_url: str) -> datetime:
    """The database clock at the start of the test (rows made by the factories use it too)."""
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]


def repair(db: Database, sqs_queue: SqsQueue) -> Repair:
    return Repair(db, sqs_queue.client, sqs_queue.url)


def run_row(url: str, run_id: uuid.UUID) -> dict[str, Any]:
    with psycopg.connect(url, row_factory=dict_row) as conn:
        row = conn.execute("SELECT * FROM runs WHERE id = %s", (run_id,)).fetchone()
    assert row is not None
    return row


def events(url: str, run_id: uuid.UUID) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row) as conn:
        return conn.execute("SELECT * FROM run_events WHERE run_id = %s ORDER BY seq", (run_id,)).fetchall()


def effect(url: str, run: dict[str, Any], *, mutation: bool, state: str = "reserved") -> uuid.UUID:
    effect_id = uuid.uuid4()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO effects (id, run_id, fence, attempt, step, kind, mutation, target, request_digest, state,
                                    settled_at)
               VALUES (%s, %s, %s, %s, 'model', 'http_call', %s, 'https://example.test/', 'd', %s,
                       CASE WHEN %s = 'reserved' THEN NULL ELSE now() END)""",
            (effect_id, run["id"], run["fence"], run["attempt"], mutation, state, state),
        )
    return effect_id


def effect_state(url: str, effect_id: uuid.UUID) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT state FROM effects WHERE id = %s", (effect_id,)).fetchone()
    assert row is not None
    return str(row[0])


# --- resend ----------------------------------------------------------------------------------------


def test_unsent_and_stale_handoffs_are_sent_again_fresh_and_blocked_ones_are_not(
        db: Database, db_url: str, sqs_queue: SqsQueue, now: datetime) -> None:
    sched = factories.schedule(db_url)
    # Runs holding a slot (admitted_at: released to it): the repair sends those its releaser did not.
    never_sent = make_run(db_url, schedule_row=sched, created_at=now - timedelta(hours=1),
                          admitted_at=now - timedelta(seconds=31))
    just_released = make_run(db_url, schedule_row=sched, created_at=now - timedelta(hours=1),
                             admitted_at=now - timedelta(seconds=10))
    stale = make_run(db_url, schedule_row=sched, created_at=now - timedelta(hours=1),
                     admitted_at=now - timedelta(hours=1), handoff_at=now - timedelta(minutes=16), handoff_count=1)
    recent = make_run(db_url, schedule_row=sched, created_at=now - timedelta(hours=1),
                      admitted_at=now - timedelta(hours=1), handoff_at=now - timedelta(minutes=5), handoff_count=1)
    waiting = make_run(db_url, schedule_row=sched, created_at=now - timedelta(hours=1))  # holds no slot
    blocker = make_run(db_url, schedule_row=sched, state="running", handoff_at=now, handoff_count=1)
    blocked = make_run(db_url, schedule_row=sched, created_at=now - timedelta(hours=1),
                            blocked_by_run_id=blocker["id"])
    running = make_run(db_url, schedule_row=sched, state="running", created_at=now - timedelta(hours=1))

    report = repair(db, sqs_queue).resend_once(now=now)

    assert report.resent == 2
    assert sorted(sqs_queue.run_ids()) == sorted([never_sent["id"], stale["id"]])
    assert run_row(db_url, never_sent["id"])["handoff_at"] == now
    assert run_row(db_url, stale["id"])["handoff_count"] == 2
    for untouched in (just_released, recent, blocked, running, waiting):
        assert run_row(db_url, untouched["id"])["handoff_count"] == untouched["handoff_count"]
    assert repair(db, sqs_queue).resend_once(now=now).resent == 0


def test_only_handoffs_since_the_last_claim_count_toward_undeliverable(db: Database, db_url: str, sqs_queue: SqsQueue,
                                                                      now: datetime) -> None:
    """Five handoffs with no claim give a run up; a claim in between starts the count again."""
    sched = factories.schedule(db_url)
    claimed_between = make_run(db_url, schedule_row=sched, handoff_at=now - timedelta(minutes=16),
                               handoff_count=4, unclaimed_handoffs=4)
    with db.transaction() as conn:  # a worker claims it, then SQS is handed it again for a retry
        assert moves.claim(conn, claimed_between["id"], now=now) is not None
        conn.execute("UPDATE runs SET state = 'queued', lease_token = NULL, lease_expires_at = NULL WHERE id = %s",
                     (claimed_between["id"],))
        handoff.stamp(conn, [claimed_between["id"]], now=now - timedelta(minutes=16))
    never_claimed = make_run(db_url, schedule_row=sched, handoff_at=now - timedelta(minutes=16),
                             handoff_count=5, unclaimed_handoffs=5, admitted_at=now - timedelta(hours=1))

    report = repair(db, sqs_queue).resend_once(now=now)

    assert (report.resent, report.undeliverable) == (1, 1)
    assert sqs_queue.run_ids() == [claimed_between["id"]]
    again = run_row(db_url, claimed_between["id"])
    assert (again["state"], again["handoff_count"], again["unclaimed_handoffs"]) == ("queued", 6, 2)
    given_up = run_row(db_url, never_claimed["id"])
    assert (given_up["state"], given_up["diagnosis"]["reason_code"]) == ("failed", "undeliverable")
    assert given_up["finished_at"] == now and given_up["handoff_count"] == 5
    assert [(e["type"], e["data"]["reason_code"]) for e in events(db_url, never_claimed["id"])] == [
        ("run.failed", "undeliverable")]


def test_a_failed_resend_stays_unstamped_and_is_retried(db: Database, db_url: str, sqs_queue: SqsQueue,
                                                        now: datetime) -> None:
    run = make_run(db_url, created_at=now - timedelta(minutes=1), admitted_at=now - timedelta(minutes=1))
    broken = Repair(db, sqs_queue.client, sqs_queue.url.replace("/runs", "/missing"))
    report = broken.resend_once(now=now)
    assert report.resent == 0 and report.handoff_failures == 1
    assert run_row(db_url, run["id"])["handoff_at"] is None
    assert repair(db, sqs_queue).resend_once(now=now).resent == 1
    assert sqs_queue.run_ids() == [run["id"]]


# --- rescue ----------------------------------------------------------------------------------------


def expired(url: str, *, catch_up: bool = False, source: str = "scheduled", **columns: Any) -> dict[str, Any]:
    sched = factories.schedule(url, catch_up=catch_up)
    return make_run(url, schedule_row=sched, state="running", source=source, **columns)


LATER = timedelta(minutes=3)  # the factories' leases run 120 s


def test_a_catch_up_run_of_a_vanished_worker_is_requeued_and_sent(db: Database, db_url: str, sqs_queue: SqsQueue,
                                                                  now: datetime) -> None:
    run = expired(db_url, catch_up=True)
    report = repair(db, sqs_queue).rescue_once(now=now + LATER)
    assert (report.rescued, report.requeued) == (1, 1)
    after = run_row(db_url, run["id"])
    assert after["state"] == "queued" and after["restarts"] == 1
    assert after["lease_token"] is None and after["lease_expires_at"] is None
    assert after["fence"] == run["fence"] and after["handoff_at"] == now + LATER
    [event] = events(db_url, run["id"])
    assert event["type"] == "run.rescued" and event["data"] == {"reason": "lease_expired", "restarts": 1}
    assert sqs_queue.run_ids() == [run["id"]]


def test_a_live_lease_is_left_alone(db: Database, db_url: str, sqs_queue: SqsQueue, now: datetime) -> None:
    run = expired(db_url, catch_up=True)
    assert repair(db, sqs_queue).rescue_once(now=now + timedelta(seconds=60)).rescued == 0
    assert run_row(db_url, run["id"])["state"] == "running"


def test_without_catch_up_a_scheduled_run_is_abandoned_not_delivered_late(db: Database, db_url: str,
                                                                          sqs_queue: SqsQueue, now: datetime) -> None:
    run = expired(db_url, catch_up=False)
    report = repair(db, sqs_queue).rescue_once(now=now + LATER)
    assert report.abandoned == 1
    after = run_row(db_url, run["id"])
    assert after["state"] == "abandoned" and after["finished_at"] == now + LATER
    assert after["lease_token"] is None
    assert after["diagnosis"]["reason_code"] == "abandoned_late" and after["diagnosis"]["retry_eligible"] is False
    assert set(after["diagnosis"]) == {"summary", "scope", "reason_code", "retry_eligible", "recovery_actions"}
    assert [e["type"] for e in events(db_url, run["id"])] == ["run.abandoned"]
    assert sqs_queue.run_ids() == []


def test_a_webhook_run_restarts_even_without_catch_up(db: Database, db_url: str, sqs_queue: SqsQueue,
                                                      now: datetime) -> None:
    run = expired(db_url, catch_up=False, source="webhook")
    assert repair(db, sqs_queue).rescue_once(now=now + LATER).requeued == 1
    assert run_row(db_url, run["id"])["state"] == "queued"


def test_the_restart_limit_fails_the_run(db: Database, db_url: str, sqs_queue: SqsQueue, now: datetime) -> None:
    run = expired(db_url, catch_up=True, restarts=2)
    assert repair(db, sqs_queue).rescue_once(now=now + LATER).failed == 1
    after = run_row(db_url, run["id"])
    assert after["state"] == "failed" and after["diagnosis"]["reason_code"] == "restart_limit"
    assert [e["type"] for e in events(db_url, run["id"])] == ["run.failed"]


def test_a_reserved_mutation_becomes_ambiguous_and_the_run_fails_unreplayed(db: Database, db_url: str,
                                                                           sqs_queue: SqsQueue, now: datetime) -> None:
    run = expired(db_url, catch_up=True)
    effect_id = effect(db_url, run, mutation=True)
    assert repair(db, sqs_queue).rescue_once(now=now + LATER).failed == 1
    assert effect_state(db_url, effect_id) == "ambiguous"
    after = run_row(db_url, run["id"])
    assert after["state"] == "failed" and after["diagnosis"]["reason_code"] == "ambiguous_effect"
    assert after["diagnosis"]["retry_eligible"] is False and "retry_run" not in after["diagnosis"]["recovery_actions"]
    assert sqs_queue.run_ids() == []


def test_a_settled_mutation_also_blocks_the_replay(db: Database, db_url: str, sqs_queue: SqsQueue,
                                                   now: datetime) -> None:
    run = expired(db_url, catch_up=True)
    effect(db_url, run, mutation=True, state="settled")
    assert repair(db, sqs_queue).rescue_once(now=now + LATER).failed == 1
    assert run_row(db_url, run["id"])["diagnosis"]["reason_code"] == "ambiguous_effect"


def test_a_reserved_model_call_is_closed_failed_and_the_run_restarts(db: Database, db_url: str, sqs_queue: SqsQueue,
                                                                    now: datetime) -> None:
    run = expired(db_url, catch_up=True)
    effect_id = effect(db_url, run, mutation=False)
    assert repair(db, sqs_queue).rescue_once(now=now + LATER).requeued == 1
    assert effect_state(db_url, effect_id) == "failed"
    assert sqs_queue.run_ids() == [run["id"]]


def test_a_pending_cancel_ends_the_run_cancelled(db: Database, db_url: str, sqs_queue: SqsQueue, now: datetime) -> None:
    run = expired(db_url, catch_up=True, cancel_requested_at=now)
    assert repair(db, sqs_queue).rescue_once(now=now + LATER).cancelled == 1
    after = run_row(db_url, run["id"])
    assert after["state"] == "cancelled" and [e["type"] for e in events(db_url, run["id"])] == ["run.cancelled"]


def test_rescue_outcomes_settle_like_any_other_end(db: Database, db_url: str, sqs_queue: SqsQueue,
                                                   now: datetime) -> None:
    """An abandoned run changes no failure count; a failed one (restart limit) adds one."""
    abandoned = expired(db_url, catch_up=False)
    failed = expired(db_url, catch_up=True, restarts=2)
    repair(db, sqs_queue).rescue_once(now=now + LATER)
    Settle(db, sqs_queue.client, sqs_queue.url).run_once(now=now + LATER)
    with psycopg.connect(db_url) as conn:
        counts = dict(conn.execute("SELECT id, consecutive_failures FROM schedules").fetchall())
    assert counts[abandoned["schedule_id"]] == 0 and counts[failed["schedule_id"]] == 1


def test_concurrent_rescuers_handle_each_run_once(db: Database, db_url: str, sqs_queue: SqsQueue,
                                                  now: datetime) -> None:
    sched = factories.schedule(db_url, catch_up=True)
    runs = [make_run(db_url, schedule_row=sched, state="running") for _ in range(20)]
    barrier = threading.Barrier(6)
    totals: list[int] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            barrier.wait()
            totals.append(Repair(db, sqs_queue.client, sqs_queue.url, limit=4).rescue_once(now=now + LATER).requeued)
            totals.append(Repair(db, sqs_queue.client, sqs_queue.url, limit=4).rescue_once(now=now + LATER).requeued)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and sum(totals) == 20
    for run in runs:
        assert [e["type"] for e in events(db_url, run["id"])] == ["run.rescued"]
        assert run_row(db_url, run["id"])["restarts"] == 1
    assert sorted(sqs_queue.run_ids()) == sorted(r["id"] for r in runs)


def test_the_rescue_takes_the_stripes_it_settles_in_order_so_a_slow_path_reservation_does_not_deadlock_it(
        db: Database, db_url: str, sqs_queue: SqsQueue, now: datetime) -> None:
    """The rescue closes a run's two model calls booked on stripes 5 and 2, in that order; a slow-path
    reservation of the same owner-day holds stripe 2 and goes on to stripe 5. Settled in the order they
    closed, the rescue's commit would hold 5 and wait for 2 while the reservation waits for 5: a
    deadlock, one side failed. Taken in stripe order first, the rescue waits for 2 holding nothing."""
    run = expired(db_url, catch_up=True)
    owner, day = run["owner"], now.astimezone(UTC).date()
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO usage_ledger_stripes (owner, day, stripe, reserved_tokens) "
                     "SELECT %s, %s, s, 10 FROM generate_series(0, 7) AS s", (owner, day))
        for step, stripe in (("model-a", 5), ("model-b", 2)):  # closed, and settled, in this order
            conn.execute("INSERT INTO effects (id, run_id, fence, attempt, step, kind, mutation, target, "
                         "request_digest, charge_day, charge_tokens, charge_cost_usd, charge_stripe) "
                         "VALUES (%s, %s, %s, %s, %s, 'model_call', false, 't', 'd', %s, 10, 0, %s)",
                         (uuid.uuid4(), run["id"], run["fence"], run["attempt"], step, day, stripe))
    stripe_sql = "SELECT 1 FROM usage_ledger_stripes WHERE owner = %s AND day = %s AND stripe = %s FOR NO KEY UPDATE"
    outcome: dict[str, Any] = {}

    def rescue() -> None:
        try:
            outcome["report"] = repair(db, sqs_queue).rescue_once(now=now + LATER)
        except BaseException as exc:  # the test reports it
            outcome["error"] = exc

    with psycopg.connect(db_url) as holder, psycopg.connect(db_url, autocommit=True) as watcher:
        holder.execute("SET lock_timeout = '60s'")
        holder.execute(stripe_sql, (owner, day, 2))  # the slow path, half-way through the owner-day
        thread = threading.Thread(target=rescue)
        thread.start()
        deadline = time.monotonic() + 60
        blocked = "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))"
        while watcher.execute(blocked, (holder.info.backend_pid,)).fetchone() == (0,):
            assert thread.is_alive() and time.monotonic() < deadline, outcome
            time.sleep(0.02)
        holder.execute(stripe_sql, (owner, day, 5))  # its next stripe: free unless the rescue holds it
        holder.commit()
        thread.join(timeout=60)
    assert not thread.is_alive() and "error" not in outcome, outcome.get("error")
    assert outcome["report"].requeued == 1
    rows = _stripes(db_url, owner, day)
    assert (rows[2], rows[5]) == (0, 0)  # both reservations given back by the settlements


def _stripes(url: str, owner: str, day: Any) -> dict[int, int]:
    with psycopg.connect(url) as conn:
        return {int(s): int(t) for s, t in conn.execute(
            "SELECT stripe, reserved_tokens FROM usage_ledger_stripes WHERE owner = %s AND day = %s", (owner, day))}
