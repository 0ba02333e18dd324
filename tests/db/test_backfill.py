"""Backfill on real PostgreSQL: each instant from the revision in force at it, across an edit and a
daylight-saving change; instants already dispatched left alone; one run at a time, oldest first;
repeated and concurrent requests making each instant once; and the refusals."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from kairos import schedules
from kairos.db import Database
from kairos.errors import Conflict, NotFound, ValidationFailed
from kairos.schedules import backfill, edit
from tests import factories
from tests.support.api import Api

CREATED = datetime(2026, 3, 20, 12, 0, tzinfo=UTC)
EDITED = datetime(2026, 3, 30, 12, 0, tzinfo=UTC)  # the day after Berlin moved to CEST (03-29 01:00 UTC)
NOW = datetime(2026, 4, 10, 12, 0, tzinfo=UTC)
WINDOW = {"from": "2026-03-25T00:00:00Z", "until": "2026-04-02T00:00:00Z"}


def rows(url: str, query: str, *args: Any) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        return conn.execute(query, args).fetchall()


@pytest.fixture
def briefing(db: Database, db_url: str) -> uuid.UUID:
    """07:00 Berlin every day from 03-20, edited on 03-30 to 09:00 with another prompt."""
    conversation = factories.conversation(db_url)
    with db.transaction() as conn:
        created = schedules.create(conn, owner="alice", now=CREATED, raw={
            "conversation_id": str(conversation["id"]), "prompt": "morning v1", "cron": "0 7 * * *",
            "timezone": "Europe/Berlin"})
    with db.transaction() as conn:
        edit.edit(conn, created.schedule.id, owner="alice", now=EDITED,
                  patch={"prompt": "morning v2", "cron": "0 9 * * *"})
    return created.schedule.id


def run_backfill(db: Database, schedule_id: uuid.UUID, raw: object, owner: str = "alice",
                 now: datetime = NOW) -> backfill.Backfilled:
    with db.transaction() as conn:
        return backfill.backfill(conn, schedule_id, owner=owner, raw=raw, now=now)


def test_each_instant_comes_from_the_revision_in_force_with_its_local_time_and_offset(
        db: Database, db_url: str, briefing: uuid.UUID) -> None:
    done = run_backfill(db, briefing, WINDOW)

    got = [(o["fire_at"], o["local_time"], o["utc_offset"], o["schedule_revision"]) for o in done.occurrences]
    assert got == [
        ("2026-03-25T06:00:00Z", "2026-03-25T07:00:00", "+01:00", 1),
        ("2026-03-26T06:00:00Z", "2026-03-26T07:00:00", "+01:00", 1),
        ("2026-03-27T06:00:00Z", "2026-03-27T07:00:00", "+01:00", 1),
        ("2026-03-28T06:00:00Z", "2026-03-28T07:00:00", "+01:00", 1),
        ("2026-03-29T05:00:00Z", "2026-03-29T07:00:00", "+02:00", 1),  # CEST from 01:00 UTC that day
        ("2026-03-30T05:00:00Z", "2026-03-30T07:00:00", "+02:00", 1),  # before the 12:00 UTC edit
        ("2026-03-31T07:00:00Z", "2026-03-31T09:00:00", "+02:00", 2),
        ("2026-04-01T07:00:00Z", "2026-04-01T09:00:00", "+02:00", 2),
    ]
    # Each run executes its occurrence's revision: the old prompt before the edit, the new one after.
    prompts = rows(db_url, "SELECT o.fire_at, r.prompt, r.source, r.blocked_by_run_id, r.id FROM occurrences o "
                           "JOIN runs r ON r.occurrence_id = o.id WHERE o.schedule_id = %s ORDER BY o.fire_at",
                   briefing)
    assert [p["prompt"] for p in prompts] == ["morning v1"] * 6 + ["morning v2"] * 2
    assert {p["source"] for p in prompts} == {"backfill"}
    # One at a time, oldest first: each run waits for the one before; only the first is sendable.
    assert prompts[0]["blocked_by_run_id"] is None
    assert [p["blocked_by_run_id"] for p in prompts[1:]] == [p["id"] for p in prompts[:-1]]
    assert done.sendable == [prompts[0]["id"]]
    assert [o["decision"] for o in done.occurrences] == ["dispatched"] + ["queued_behind"] * 7


def test_instants_already_dispatched_are_left_alone_and_skipped_late_ones_are_eligible(
        db: Database, db_url: str, briefing: uuid.UUID) -> None:
    # What a tick recorded: 03-21..03-26 missed (one skipped_late occurrence at 03-26 covering them),
    # 03-27 dispatched.
    [schedule_row] = rows(db_url, "SELECT * FROM schedules WHERE id = %s", briefing)
    factories.run(db_url, schedule_row=schedule_row, state="succeeded", fire_at=datetime(2026, 3, 27, 6, tzinfo=UTC))
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO occurrences (id, schedule_id, source, fire_at, local_time, utc_offset, fold, timezone,"
            " tzdata_version, schedule_revision, decision, covers_from, covers_until, covers_count)"
            " VALUES (%s, %s, 'scheduled', '2026-03-26T06:00:00Z', '2026-03-26T07:00:00', interval '1 hour', 0,"
            " 'Europe/Berlin', 'test', 1, 'skipped_late', '2026-03-21T06:00:00Z', '2026-03-26T06:00:00Z', 6)",
            (uuid.uuid4(), briefing))

    done = run_backfill(db, briefing, {"from": "2026-03-25T00:00:00Z", "until": "2026-03-29T00:00:00Z"})

    assert [o["fire_at"][:10] for o in done.occurrences] == ["2026-03-25", "2026-03-26", "2026-03-28"]
    assert len(done.sendable) == 1


def test_a_repeated_request_changes_nothing_and_answers_the_same(
        db: Database, db_url: str, briefing: uuid.UUID) -> None:
    first = run_backfill(db, briefing, WINDOW)
    counts = rows(db_url, "SELECT (SELECT count(*) FROM occurrences) AS o, (SELECT count(*) FROM runs) AS r, "
                          "(SELECT count(*) FROM run_events) AS e")
    second = run_backfill(db, briefing, WINDOW)
    assert second.occurrences == first.occurrences and second.sendable == []
    assert rows(db_url, "SELECT (SELECT count(*) FROM occurrences) AS o, (SELECT count(*) FROM runs) AS r, "
                        "(SELECT count(*) FROM run_events) AS e") == counts
    # A wider window adds only the new instants, chained behind the earlier request's last run.
    wider = run_backfill(db, briefing, {"from": "2026-03-25T00:00:00Z", "until": "2026-04-03T00:00:00Z"})
    assert len(wider.occurrences) == len(first.occurrences) + 1
    [last_before] = [o for o in first.occurrences if o["fire_at"] == "2026-04-01T07:00:00Z"]
    [added] = rows(db_url, "SELECT r.blocked_by_run_id FROM runs r JOIN occurrences o ON o.id = r.occurrence_id "
                           "WHERE o.schedule_id = %s AND o.fire_at = '2026-04-02T07:00:00Z'", briefing)
    assert str(added["blocked_by_run_id"]) == last_before["run_id"] and wider.sendable == []


def test_two_concurrent_backfills_of_one_window_make_each_instant_once(
        db: Database, db_url: str, briefing: uuid.UUID) -> None:
    start = threading.Barrier(2)
    answers: list[backfill.Backfilled] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            start.wait(timeout=10)
            answers.append(run_backfill(db, briefing, WINDOW))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == [] and len(answers) == 2
    made = rows(db_url, "SELECT fire_at, count(*) AS n FROM occurrences WHERE schedule_id = %s GROUP BY fire_at",
                briefing)
    assert len(made) == 8 and {m["n"] for m in made} == {1}
    assert answers[0].occurrences == answers[1].occurrences
    assert sorted(len(a.sendable) for a in answers) == [0, 1]  # one request made the chain's head
    chain = rows(db_url, "SELECT count(*) AS n FROM runs WHERE schedule_id = %s AND blocked_by_run_id IS NULL",
                 briefing)
    assert chain == [{"n": 1}]


def test_never_before_the_schedule_existed(db: Database, briefing: uuid.UUID) -> None:
    done = run_backfill(db, briefing, {"from": "2026-03-15T00:00:00Z", "until": "2026-03-22T00:00:00Z"})
    # Created 03-20 12:00 UTC: the first instant is 03-21 07:00 Berlin.
    assert [o["fire_at"] for o in done.occurrences] == ["2026-03-21T06:00:00Z"]


@pytest.mark.parametrize(("raw", "field", "rule"), [
    ({"from": "2026-03-01T00:00:00Z", "until": "2026-04-02T00:00:01Z"}, "until", "max_window"),
    ({"from": "2026-03-25T00:00:00Z", "until": "2026-03-25T00:00:00Z"}, "until", "after_from"),
    ({"from": "2026-04-09T00:00:00Z", "until": "2026-04-11T00:00:00Z"}, "until", "not_future"),
    ({"from": "2026-03-21T00:00:00Z", "until": "2026-04-02T00:00:00Z", "max": 5}, "until", "max_instants"),
    ({"from": "2026-03-25T00:00:00Z", "until": "2026-03-26T00:00:00Z", "max": 101}, "max", "max"),
    ({"from": "2026-03-25T00:00:00", "until": "2026-03-26T00:00:00Z"}, "from", "timezone_aware"),
    ({"from": "2026-03-25T00:00:00Z"}, "until", "required"),
    ({"from": "2026-03-25T00:00:00Z", "until": "2026-03-26T00:00:00Z", "every": 1}, "every", "unknown_field"),
])
def test_a_refused_backfill_names_the_field_and_the_rule_and_records_nothing(
        db: Database, db_url: str, briefing: uuid.UUID, raw: dict[str, Any], field: str, rule: str) -> None:
    with pytest.raises(ValidationFailed) as refused:
        run_backfill(db, briefing, raw)
    assert (field, rule) in {(f.field, f.rule) for f in refused.value.fields}, refused.value.fields
    assert rows(db_url, "SELECT 1 FROM occurrences WHERE schedule_id = %s", briefing) == []


def test_only_an_active_timed_schedule_of_your_own(db: Database, db_url: str, briefing: uuid.UUID) -> None:
    with pytest.raises(NotFound):
        run_backfill(db, briefing, WINDOW, owner="bob")
    hook = factories.schedule(db_url, kind="webhook")
    with pytest.raises(ValidationFailed) as refused:
        run_backfill(db, hook["id"], WINDOW)
    assert refused.value.fields[0].rule == "timed_only"
    with db.transaction() as conn:
        schedules.pause(conn, briefing, owner="alice", now=NOW - timedelta(days=1))
    with pytest.raises(Conflict):
        run_backfill(db, briefing, WINDOW)


def test_the_route_answers_202_with_the_occurrences_and_hands_the_first_run_to_sqs(api: Api) -> None:
    conversation = api.conversation()
    created = api.alice.post("/v1/schedules", {"conversation_id": conversation["id"], "prompt": "daily",
                                               "cron": "0 9 * * *"})
    schedule_id = created.json["schedule"]["id"]
    with psycopg.connect(api.url, autocommit=True) as conn:
        conn.execute("UPDATE schedules SET created_at = now() - interval '5 days' WHERE id = %s", (schedule_id,))
    until = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    window = {"from": (until - timedelta(days=3)).isoformat(), "until": until.isoformat()}

    answer = api.alice.post(f"/v1/schedules/{schedule_id}/backfill", window)

    assert answer.status == 202, answer.text
    fires = [o["fire_at"] for o in answer.json["occurrences"]]
    assert len(fires) == 3 and fires == sorted(fires)
    assert [m["run_id"] for m in api.messages()] == [answer.json["occurrences"][0]["run_id"]]
    refused = api.alice.post(f"/v1/schedules/{schedule_id}/backfill", {"from": window["from"]})
    assert refused.status == 422 and refused.error["fields"][0]["field"] == "until"
    foreign = api.bob.post(f"/v1/schedules/{schedule_id}/backfill", window)
    missing = api.bob.post(f"/v1/schedules/{uuid.uuid4()}/backfill", window)
    assert foreign.status == missing.status == 404 and foreign.text == missing.text
