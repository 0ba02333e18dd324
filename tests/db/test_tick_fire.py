"""The fire step against real PostgreSQL and moto SQS: decisions, overlap, cursor, handoff.

Time is injected (``now=``) so decisions are exact; one test uses the real database clock with a
Lambda clock 5 minutes off to show that only the database's time decides.
"""

from __future__ import annotations

import gc
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from kairos import calendar, heap
from kairos.db import Database
from kairos.probes import Probes
from kairos.tick import Tick
from kairos.tick.decision import COUNT_CAP
from tests import factories
from tests.support.aws import SqsQueue

T = datetime(2026, 3, 2, 7, 0, tzinfo=UTC)  # a Monday, 07:00 UTC


def tick(db: Database, sqs_queue: SqsQueue, **kwargs: Any) -> Tick:
    return Tick(db, sqs_queue.client, sqs_queue.url, metrics=None, **kwargs)


def rows(url: str, query: str, *args: Any) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row) as conn:
        return conn.execute(query, args).fetchall()


def one(url: str, query: str, *args: Any) -> dict[str, Any]:
    found = rows(url, query, *args)
    assert len(found) == 1, found
    return found[0]


def occurrences(url: str, schedule_id: uuid.UUID) -> list[dict[str, Any]]:
    return rows(url, "SELECT * FROM occurrences WHERE schedule_id = %s ORDER BY fire_at", schedule_id)


def runs_of(url: str, schedule_id: uuid.UUID) -> list[dict[str, Any]]:
    return rows(url, "SELECT * FROM runs WHERE schedule_id = %s ORDER BY created_at, id", schedule_id)


def schedule_row(url: str, schedule_id: uuid.UUID) -> dict[str, Any]:
    return one(url, "SELECT * FROM schedules WHERE id = %s", schedule_id)


# --- dispatch --------------------------------------------------------------------------------------


def test_a_due_fire_becomes_one_occurrence_one_run_and_one_message(db: Database, db_url: str,
                                                                   sqs_queue: SqsQueue) -> None:
    sched = factories.schedule(db_url, cron="*/5 * * * *", next_fire_at=T)

    report = tick(db, sqs_queue).run(now=T + timedelta(seconds=30))

    assert (report.dispatched, report.skipped, report.schedules) == (1, 0, 1)
    [occ] = occurrences(db_url, sched["id"])
    assert occ["decision"] == "dispatched" and occ["fire_at"] == T and occ["source"] == "scheduled"
    assert occ["schedule_revision"] == sched["revision"]
    assert occ["tzdata_version"] == calendar.TZDATA_VERSION and occ["timezone"] == "UTC"
    assert occ["covers_from"] is None and occ["covers_count"] == 1
    [run] = runs_of(db_url, sched["id"])
    assert run["occurrence_id"] == occ["id"] and run["state"] == "queued" and run["source"] == "scheduled"
    assert run["prompt"] == sched["prompt"] and run["source_conversation_id"] == sched["conversation_id"]
    assert run["agent"] == factories.ECHO_AGENT  # the conversation's agent: the schedule has no snapshot
    assert run["handoff_at"] == T + timedelta(seconds=30) and run["handoff_count"] == 1
    events = rows(db_url, "SELECT * FROM run_events WHERE run_id = %s", run["id"])
    assert [(e["seq"], e["type"], e["attempt"]) for e in events] == [(1, "run.queued", 0)]
    assert run["last_seq"] == 1
    assert sqs_queue.drain() == [json.dumps({"run_id": str(run["id"])})]
    after = schedule_row(db_url, sched["id"])
    assert after["next_fire_at"] == T + timedelta(minutes=5)
    assert after["last_fire_at"] == T and after["fire_count"] == 1 and after["status"] == "active"


def test_ids_are_deterministic(db: Database, db_url: str, sqs_queue: SqsQueue) -> None:
    from kairos import identity
    from kairos.states import Source

    sched = factories.schedule(db_url, cron="*/5 * * * *", next_fire_at=T)
    tick(db, sqs_queue).run(now=T)
    [run] = runs_of(db_url, sched["id"])
    expected_occurrence = identity.occurrence_id(sched["id"], Source.SCHEDULED, fire_at=T)
    assert run["occurrence_id"] == expected_occurrence
    assert run["id"] == identity.run_id(expected_occurrence)


def test_the_schedule_agent_snapshot_wins_over_the_conversation_agent(db: Database, db_url: str,
                                                                      sqs_queue: SqsQueue) -> None:
    snapshot = {"executor": "echo", "model": "snapshot", "system": "fresh"}
    sched = factories.schedule(db_url, cron="*/5 * * * *", next_fire_at=T, agent=snapshot, mode="fresh")
    tick(db, sqs_queue).run(now=T)
    [run] = runs_of(db_url, sched["id"])
    assert run["agent"] == snapshot and run["mode"] == "fresh"


def test_a_duplicated_minute_and_an_older_tick_change_nothing(db: Database, db_url: str, sqs_queue: SqsQueue) -> None:
    sched = factories.schedule(db_url, cron="*/5 * * * *", next_fire_at=T)
    t = tick(db, sqs_queue)
    first = t.run(now=T + timedelta(seconds=5))
    again = t.run(now=T + timedelta(seconds=5))  # EventBridge delivered the same minute twice
    older = t.run(now=T - timedelta(minutes=3))  # a tick whose clock is behind
    assert first.dispatched == 1 and again.schedules == 0 and older.schedules == 0
    assert len(occurrences(db_url, sched["id"])) == 1 and len(runs_of(db_url, sched["id"])) == 1
    assert len(sqs_queue.drain()) == 1
    assert schedule_row(db_url, sched["id"])["next_fire_at"] == T + timedelta(minutes=5)


def test_a_replayed_fire_converges_on_the_existing_rows(db: Database, db_url: str, sqs_queue: SqsQueue) -> None:
    """Someone moves the cursor back to an instant already fired: no second occurrence or run."""
    sched = factories.schedule(db_url, cron="*/5 * * * *", next_fire_at=T)
    t = tick(db, sqs_queue)
    t.run(now=T)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE schedules SET next_fire_at = %s WHERE id = %s", (T, sched["id"]))
    report = t.run(now=T + timedelta(seconds=1))
    assert report.schedules == 1 and report.dispatched == 0 and report.conflicts == 1
    assert len(occurrences(db_url, sched["id"])) == 1 and len(runs_of(db_url, sched["id"])) == 1
    assert len(sqs_queue.drain()) == 1
    assert schedule_row(db_url, sched["id"])["next_fire_at"] == T + timedelta(minutes=5)


def test_the_cursor_update_is_guarded_by_the_value_read(db: Database, db_url: str) -> None:
    """A tick holding a stale cursor (someone else moved it) moves nothing and so records nothing."""
    from kairos import db as dbm

    sched = factories.schedule(db_url, cron="*/5 * * * *", next_fire_at=T)
    move = {"id": str(sched["id"]), "read_next_fire_at": (T - timedelta(minutes=5)).isoformat(),
            "next_fire_at": (T + timedelta(minutes=5)).isoformat(), "last_fire_at": T.isoformat(),
            "runs_created": 1, "completed": False}
    with db.transaction() as conn:
        assert dbm.fetch_all(conn, "schedules_advance_cursor", {"moves": json.dumps([move]), "now": None}) == []
        move["read_next_fire_at"] = T.isoformat()
        assert len(dbm.fetch_all(conn, "schedules_advance_cursor", {"moves": json.dumps([move]), "now": None})) == 1
    assert schedule_row(db_url, sched["id"])["next_fire_at"] == T + timedelta(minutes=5)


def test_decisions_follow_the_database_clock_not_the_lambda_clock(db: Database, db_url: str,
                                                                  sqs_queue: SqsQueue) -> None:
    """The Lambda clock is 5 minutes off in either direction; only the database's now() decides."""
    db_now = one(db_url, "SELECT now() AS now")["now"]

    def hourly(at: datetime) -> dict[str, Any]:  # its only instant near now is `at`
        return factories.schedule(db_url, kind="interval", interval_seconds=3600, starts_at=at, next_fire_at=at)

    due = hourly(db_now - timedelta(seconds=60))
    future = hourly(db_now + timedelta(seconds=150))
    late = hourly(db_now - timedelta(seconds=170))

    for skew in (timedelta(minutes=-5), timedelta(minutes=5)):
        tick(db, sqs_queue, clock=lambda skew=skew: datetime.now(UTC) + skew).run()

    # Lambda at -5 min would think `due` is 4 minutes in the future; the database says it is due.
    assert [o["decision"] for o in occurrences(db_url, due["id"])] == ["dispatched"]
    # Lambda at +5 min would think `future` is due; the database says it is not.
    assert occurrences(db_url, future["id"]) == []
    assert schedule_row(db_url, future["id"])["next_fire_at"] == db_now + timedelta(seconds=150)
    # Lambda at -5 min would think `late` is on time; the database says it is 170 s late (grace 120 s).
    assert [o["decision"] for o in occurrences(db_url, late["id"])] == ["skipped_late"]
    assert runs_of(db_url, late["id"]) == []


# --- lateness and catch-up -------------------------------------------------------------------------


def test_a_tick_24_hours_late_dispatches_the_latest_and_records_the_missed_range(db: Database, db_url: str,
                                                                                sqs_queue: SqsQueue) -> None:
    sched = factories.schedule(db_url, kind="interval", interval_seconds=3600, starts_at=T, next_fire_at=T)
    now = T + timedelta(hours=24, seconds=30)

    report = tick(db, sqs_queue).run(now=now)

    skipped, dispatched = occurrences(db_url, sched["id"])
    assert skipped["decision"] == "skipped_late" and skipped["fire_at"] == T + timedelta(hours=23)
    assert (skipped["covers_from"], skipped["covers_until"], skipped["covers_count"]) == (
        T, T + timedelta(hours=23), 24)
    assert dispatched["decision"] == "dispatched" and dispatched["fire_at"] == T + timedelta(hours=24)
    assert len(runs_of(db_url, sched["id"])) == 1
    assert report.fires_covered == 25 and report.fire_lag_max_seconds == 30
    after = schedule_row(db_url, sched["id"])
    assert after["next_fire_at"] == T + timedelta(hours=25) and after["fire_count"] == 1


def test_without_catch_up_a_fire_past_grace_is_one_skipped_occurrence(db: Database, db_url: str,
                                                                      sqs_queue: SqsQueue) -> None:
    sched = factories.schedule(db_url, kind="interval", interval_seconds=3600, starts_at=T, next_fire_at=T)
    report = tick(db, sqs_queue).run(now=T + timedelta(hours=24, minutes=10))
    [skipped] = occurrences(db_url, sched["id"])
    assert skipped["decision"] == "skipped_late" and skipped["fire_at"] == T + timedelta(hours=24)
    assert (skipped["covers_from"], skipped["covers_until"], skipped["covers_count"]) == (
        T, T + timedelta(hours=24), 25)
    assert runs_of(db_url, sched["id"]) == [] and sqs_queue.drain() == []
    assert report.skipped == 1 and report.dispatched == 0
    after = schedule_row(db_url, sched["id"])
    assert after["next_fire_at"] == T + timedelta(hours=25) and after["fire_count"] == 0
    assert after["last_fire_at"] == T + timedelta(hours=24)


@pytest.mark.parametrize(("late", "expected"), [(timedelta(seconds=120), "dispatched"),
                                                (timedelta(seconds=121), "skipped_late")])
def test_grace_is_120_seconds_inclusive(db: Database, db_url: str, sqs_queue: SqsQueue, late: timedelta,
                                        expected: str) -> None:
    sched = factories.schedule(db_url, cron="*/5 * * * *", next_fire_at=T)
    tick(db, sqs_queue).run(now=T + late)
    assert [o["decision"] for o in occurrences(db_url, sched["id"])] == [expected]


def test_with_catch_up_missed_fires_collapse_into_one_run(db: Database, db_url: str, sqs_queue: SqsQueue) -> None:
    sched = factories.schedule(db_url, kind="interval", interval_seconds=3600, starts_at=T, next_fire_at=T,
                               catch_up=True)
    now = T + timedelta(hours=24, minutes=10)
    report = tick(db, sqs_queue).run(now=now)
    [occ] = occurrences(db_url, sched["id"])
    assert occ["decision"] == "dispatched" and occ["fire_at"] == T + timedelta(hours=24)
    assert (occ["covers_from"], occ["covers_until"], occ["covers_count"]) == (T, T + timedelta(hours=24), 25)
    [run] = runs_of(db_url, sched["id"])
    assert run["catch_up"] is True and sqs_queue.run_ids() == [run["id"]]
    assert report.fire_lag_max_seconds == 600


def test_counting_stops_at_the_cap_but_the_range_is_exact(db: Database, db_url: str, sqs_queue: SqsQueue) -> None:
    """A 5-minute cron 40 days behind (11,520 instants): covers_count stops at the cap, the range does not."""
    sched = factories.schedule(db_url, cron="*/5 * * * *", next_fire_at=T)
    now = T + timedelta(days=40, seconds=10)
    tick(db, sqs_queue).run(now=now)
    skipped, dispatched = occurrences(db_url, sched["id"])
    assert dispatched["fire_at"] == T + timedelta(days=40)
    assert skipped["fire_at"] == T + timedelta(days=40, minutes=-5)
    assert (skipped["covers_from"], skipped["covers_until"]) == (T, T + timedelta(days=40, minutes=-5))
    assert skipped["covers_count"] == COUNT_CAP - 1
    assert schedule_row(db_url, sched["id"])["next_fire_at"] == T + timedelta(days=40, minutes=5)


def test_a_once_schedule_late_past_grace_expires_and_completes(db: Database, db_url: str, sqs_queue: SqsQueue) -> None:
    sched = factories.schedule(db_url, kind="once", starts_at=T, next_fire_at=T)
    tick(db, sqs_queue).run(now=T + timedelta(hours=4))
    [occ] = occurrences(db_url, sched["id"])
    assert occ["decision"] == "expired" and runs_of(db_url, sched["id"]) == []
    after = schedule_row(db_url, sched["id"])
    assert after["status"] == "completed" and after["next_fire_at"] is None
    assert after["revision"] == sched["revision"] + 1


def test_a_once_schedule_on_time_dispatches_and_completes(db: Database, db_url: str, sqs_queue: SqsQueue) -> None:
    sched = factories.schedule(db_url, kind="once", starts_at=T, next_fire_at=T)
    report = tick(db, sqs_queue).run(now=T + timedelta(seconds=40))
    assert report.dispatched == 1 and report.completed == 1
    after = schedule_row(db_url, sched["id"])
    assert after["status"] == "completed" and after["next_fire_at"] is None and after["fire_count"] == 1
    assert tick(db, sqs_queue).run(now=T + timedelta(days=1)).schedules == 0


def test_max_occurrences_completes_the_schedule(db: Database, db_url: str, sqs_queue: SqsQueue) -> None:
    sched = factories.schedule(db_url, cron="*/5 * * * *", next_fire_at=T, max_occurrences=2)
    t = tick(db, sqs_queue)
    t.run(now=T)
    assert schedule_row(db_url, sched["id"])["status"] == "active"
    t.run(now=T + timedelta(minutes=5))
    after = schedule_row(db_url, sched["id"])
    assert after["status"] == "completed" and after["fire_count"] == 2 and after["next_fire_at"] is None
    t.run(now=T + timedelta(minutes=10))
    assert len(runs_of(db_url, sched["id"])) == 2


def test_ends_at_completes_the_schedule_after_its_last_fire(db: Database, db_url: str, sqs_queue: SqsQueue) -> None:
    sched = factories.schedule(db_url, cron="*/5 * * * *", next_fire_at=T, ends_at=T + timedelta(minutes=5))
    t = tick(db, sqs_queue)
    t.run(now=T)
    assert schedule_row(db_url, sched["id"])["next_fire_at"] == T + timedelta(minutes=5)
    t.run(now=T + timedelta(minutes=5))
    after = schedule_row(db_url, sched["id"])
    assert after["status"] == "completed" and after["next_fire_at"] is None
    assert [o["fire_at"] for o in occurrences(db_url, sched["id"])] == [T, T + timedelta(minutes=5)]


def test_a_zoned_fire_records_its_wall_time_offset_and_fold(db: Database, db_url: str, sqs_queue: SqsQueue) -> None:
    """01:30 in New York on 2026-11-01 happens twice; dst_fold=last fires at the second (EST, fold 1)."""
    rule = calendar.Rule(kind=calendar.ScheduleKind.CRON, cron="30 1 * * *", timezone="America/New_York",
                         dst_fold=calendar.DstFold.LAST)
    fire = calendar.next_fire(rule, datetime(2026, 11, 1, 4, 0, tzinfo=UTC))
    assert fire is not None and fire.fold == 1
    sched = factories.schedule(db_url, cron="30 1 * * *", timezone="America/New_York", dst_fold="last",
                               next_fire_at=fire.fire_at)
    tick(db, sqs_queue).run(now=fire.fire_at + timedelta(seconds=1))
    [occ] = occurrences(db_url, sched["id"])
    assert occ["fire_at"] == datetime(2026, 11, 1, 6, 30, tzinfo=UTC)
    assert occ["local_time"] == datetime(2026, 11, 1, 1, 30) and occ["fold"] == 1
    assert occ["utc_offset"] == timedelta(hours=-5) and occ["timezone"] == "America/New_York"
    assert schedule_row(db_url, sched["id"])["next_fire_at"] == datetime(2026, 11, 2, 6, 30, tzinfo=UTC)


@pytest.mark.parametrize(("cron", "zone", "fire_at", "local", "following"), [
    ("30 8 * * *", "Europe/Berlin", datetime(2026, 3, 3, 7, 30, tzinfo=UTC), datetime(2026, 3, 3, 8, 30),
     datetime(2026, 3, 4, 7, 30, tzinfo=UTC)),
    ("0 7 * * *", "Europe/Berlin", datetime(2026, 3, 3, 6, 0, tzinfo=UTC), datetime(2026, 3, 3, 7, 0),
     datetime(2026, 3, 4, 6, 0, tzinfo=UTC)),
], ids=["rule and zone", "zone only"])
def test_a_rule_changed_between_ticks_fires_by_the_new_rule(db: Database, db_url: str, sqs_queue: SqsQueue, cron: str,
                                                            zone: str, fire_at: datetime, local: datetime,
                                                            following: datetime) -> None:
    """Whatever the decisions remember between ticks (compiled expressions, checked rules, scans), a
    schedule whose cron or zone changed since its last fire is decided by what its row says now."""
    sched = factories.schedule(db_url, cron="0 7 * * *", timezone="UTC", next_fire_at=T)
    tick(db, sqs_queue).run(now=T + timedelta(seconds=5))
    assert schedule_row(db_url, sched["id"])["next_fire_at"] == T + timedelta(days=1)
    with psycopg.connect(db_url) as conn:
        conn.execute("UPDATE schedules SET cron = %s, timezone = %s, next_fire_at = %s, revision = revision + 1"
                     " WHERE id = %s", (cron, zone, fire_at, sched["id"]))
    tick(db, sqs_queue).run(now=fire_at + timedelta(seconds=5))
    second = occurrences(db_url, sched["id"])[-1]
    assert (second["fire_at"], second["local_time"], second["timezone"]) == (fire_at, local, zone)
    assert second["utc_offset"] == timedelta(hours=1) and second["schedule_revision"] == 2
    assert schedule_row(db_url, sched["id"])["next_fire_at"] == following


def test_a_rule_that_no_longer_evaluates_pauses_the_schedule_with_a_note(db: Database, db_url: str,
                                                                         sqs_queue: SqsQueue) -> None:
    broken = factories.schedule(db_url, cron="*/5 * * * *", next_fire_at=T, timezone="Mars/Olympus_Mons")
    fine = factories.schedule(db_url, cron="*/5 * * * *", next_fire_at=T)
    report = tick(db, sqs_queue).run(now=T)
    assert report.paused == 1 and report.dispatched == 1
    after = schedule_row(db_url, broken["id"])
    assert after["status"] == "paused" and after["next_fire_at"] == T
    assert occurrences(db_url, broken["id"]) == [] and len(runs_of(db_url, fine["id"])) == 1
    note = one(db_url, "SELECT * FROM inbox_notes WHERE conversation_id = %s", broken["conversation_id"])
    assert note["kind"] == "schedule_paused" and note["body"]["schedule_id"] == str(broken["id"])


def test_batches_continue_until_nothing_is_due(db: Database, db_url: str, sqs_queue: SqsQueue) -> None:
    conversation = factories.conversation(db_url)
    ids = [factories.schedule(db_url, conversation_id=conversation["id"], cron="*/5 * * * *",
                              next_fire_at=T - timedelta(seconds=i))["id"] for i in range(23)]
    report = tick(db, sqs_queue, batch_size=5).run(now=T)
    assert report.batches == 5 and report.dispatched == 23
    assert rows(db_url, "SELECT count(*) AS n FROM schedules WHERE next_fire_at <= %s", T)[0]["n"] == 0
    # One owner, four running slots: four of its runs (the first batch's) are sent, nineteen wait unsent.
    sent = sqs_queue.run_ids()
    assert len(set(sent)) == 4 and set(sent) <= {r["id"] for i in ids for r in runs_of(db_url, i)}
    assert rows(db_url, "SELECT count(*) AS n FROM runs WHERE admitted_at IS NULL AND handoff_at IS NULL")[0]["n"] == 19


def test_the_loop_stops_when_the_invocation_runs_short(db: Database, db_url: str, sqs_queue: SqsQueue) -> None:
    conversation = factories.conversation(db_url)
    for i in range(12):
        at = T - timedelta(seconds=i)
        factories.schedule(db_url, conversation_id=conversation["id"], kind="interval", interval_seconds=3600,
                           starts_at=at, next_fire_at=at)
    committed: list[str] = []

    # The invocation has a minute left until two batches have committed, then 9 s.
    t = tick(db, sqs_queue, batch_size=5, probes=Probes().on("after_commit", lambda: committed.append("commit")),
             fire_workers=1)
    report = t.run(lambda: 60_000 if len(committed) < 2 else 9_000, now=T)
    assert report.stopped_for_time and report.batches == 2 and report.dispatched == 10
    assert rows(db_url, "SELECT count(*) AS n FROM schedules WHERE next_fire_at <= %s", T)[0]["n"] == 2


# --- overlap ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("active_state", ["queued", "running"])
def test_overlap_skip_records_skipped_overlap_and_no_run(db: Database, db_url: str, sqs_queue: SqsQueue,
                                                         active_state: str) -> None:
    sched = factories.schedule(db_url, cron="*/5 * * * *", next_fire_at=T, overlap="skip")
    sent = {"admitted_at": T, "handoff_at": T} if active_state == "queued" else {}  # released and sent
    factories.run(db_url, schedule_row=sched, state=active_state, fire_at=T - timedelta(minutes=5), **sent)
    tick(db, sqs_queue).run(now=T)
    [_, occ] = occurrences(db_url, sched["id"])
    assert occ["decision"] == "skipped_overlap" and len(runs_of(db_url, sched["id"])) == 1
    assert sqs_queue.drain() == []


def test_overlap_allow_dispatches_beside_an_active_run(db: Database, db_url: str, sqs_queue: SqsQueue) -> None:
    sched = factories.schedule(db_url, cron="*/5 * * * *", next_fire_at=T, overlap="allow")
    factories.run(db_url, schedule_row=sched, state="running", fire_at=T - timedelta(minutes=5))
    tick(db, sqs_queue).run(now=T)
    assert [o["decision"] for o in occurrences(db_url, sched["id"])] == ["dispatched", "dispatched"]
    assert len(sqs_queue.drain()) == 1


def test_overlap_ignores_ended_runs(db: Database, db_url: str, sqs_queue: SqsQueue) -> None:
    sched = factories.schedule(db_url, cron="*/5 * * * *", next_fire_at=T, overlap="skip")
    factories.run(db_url, schedule_row=sched, state="succeeded", fire_at=T - timedelta(minutes=5))
    tick(db, sqs_queue).run(now=T)
    assert occurrences(db_url, sched["id"])[-1]["decision"] == "dispatched"


def test_queue_one_keeps_one_pending_run_released_when_the_blocker_ends(db: Database, db_url: str,
                                                                       sqs_queue: SqsQueue) -> None:
    sched = factories.schedule(db_url, cron="*/5 * * * *", next_fire_at=T, overlap="queue_one")
    blocker = factories.run(db_url, schedule_row=sched, state="running", fire_at=T - timedelta(minutes=5))
    t = tick(db, sqs_queue)

    t.run(now=T)  # queued behind the running one, not handed to SQS
    waiting = [r for r in runs_of(db_url, sched["id"]) if r["id"] != blocker["id"]]
    assert [(r["state"], r["blocked_by_run_id"], r["handoff_at"]) for r in waiting] == [
        ("queued", blocker["id"], None)]
    assert occurrences(db_url, sched["id"])[-1]["decision"] == "queued_behind"
    assert sqs_queue.drain() == []

    t.run(now=T + timedelta(minutes=5))  # one is already waiting: this fire is skipped
    assert occurrences(db_url, sched["id"])[-1]["decision"] == "skipped_overlap"
    assert len(runs_of(db_url, sched["id"])) == 2
    assert t.run(now=T + timedelta(minutes=6, seconds=40)).resent == 0  # blocked runs are never repaired

    with psycopg.connect(db_url, autocommit=True) as conn:  # the blocker ends
        conn.execute(
            """UPDATE runs SET state = 'succeeded', output = '{}', lease_token = NULL, lease_expires_at = NULL,
                   finished_at = now() WHERE id = %s""", (blocker["id"],))
    report = t.run(now=T + timedelta(minutes=7))
    assert report.released == 1 and report.settled == 1
    released = one(db_url, "SELECT * FROM runs WHERE id = %s", waiting[0]["id"])
    assert released["blocked_by_run_id"] is None and released["handoff_at"] is not None
    assert sqs_queue.run_ids() == [released["id"]]


def test_the_tick_fires_with_the_young_threshold_raised_and_puts_it_back(db: Database, db_url: str,
                                                                       sqs_queue: SqsQueue) -> None:
    """kairos.heap: the batches run without mid-tick full collections; the process's setting returns."""
    factories.schedule(db_url, cron="*/5 * * * *", next_fire_at=T)
    seen: list[int] = []
    probes = Probes().on("after_select", lambda: seen.append(gc.get_threshold()[0]))
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        report = tick(db, sqs_queue, probes=probes).run(now=T + timedelta(seconds=30))
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.set_threshold(*saved)
    assert report.dispatched == 1 and seen == [heap.BATCH_YOUNG]
