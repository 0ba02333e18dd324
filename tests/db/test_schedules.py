"""Schedules against real PostgreSQL: create, read, the API's moves, limits, scoping, webhook tokens."""

from __future__ import annotations

import hashlib
import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from kairos import calendar, conversations, schedules, webhooks
from kairos.db import Database
from kairos.errors import Conflict, Forbidden, KairosError, LimitExceeded, NotFound, ValidationFailed
from kairos.states import ScheduleKind, ScheduleStatus
from tests import factories
from tests.support.db import wait_until_blocked

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)  # a Tuesday


def hourly(cid: uuid.UUID, **extra: Any) -> dict[str, Any]:
    return {"conversation_id": str(cid), "prompt": "say hello", "cron": "0 * * * *", **extra}


def create(db: Database, owner: str = "alice", **kwargs: Any) -> schedules.Created:
    with db.transaction() as conn:
        return schedules.create(conn, owner=owner, **kwargs)


def count(db_url: str, table: str = "schedules") -> int:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert row is not None
    return int(row[0])


def raw_row(db_url: str, schedule_id: uuid.UUID) -> dict[str, Any]:
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        row = conn.execute("SELECT * FROM schedules WHERE id = %s", (schedule_id,)).fetchone()
    assert row is not None
    return row


@pytest.fixture
def cid(db_url: str) -> uuid.UUID:
    row = factories.conversation(db_url, owner="alice", agent={"executor": "echo", "model": "e"})
    conversation_id: uuid.UUID = row["id"]
    return conversation_id


# --- create ------------------------------------------------------------------------------------


def test_create_cron_stores_the_rule_and_the_first_fire_after_now(db: Database, cid: uuid.UUID) -> None:
    created = create(db, raw=hourly(cid, cron="0 7 * * 1-5", timezone="Europe/Berlin", name="briefing"), now=T0)
    s = created.schedule
    assert created.token is None
    assert (s.kind, s.cron, s.timezone, s.name) == (ScheduleKind.CRON, "0 7 * * 1-5", "Europe/Berlin", "briefing")
    assert s.next_fire_at == datetime(2030, 1, 2, 6, 0, tzinfo=UTC)  # Wed 07:00 CET
    assert s.last_fire_at is None
    assert (s.status, s.revision, s.consecutive_failures, s.fire_count) == (ScheduleStatus.ACTIVE, 1, 0, 0)
    assert s.agent == {"executor": "echo", "model": "e"}  # the conversation's agent, snapshotted
    assert s.created_by_run_id is None
    assert s.created_at == s.updated_at == T0
    assert s.token_hash is None


def test_create_uses_the_database_clock_by_default(db: Database, cid: uuid.UUID) -> None:
    s = create(db, raw=hourly(cid)).schedule
    assert s.created_at is not None and s.next_fire_at is not None
    assert s.created_at < s.next_fire_at <= s.created_at + timedelta(hours=1)
    assert s.next_fire_at.minute == 0 and s.next_fire_at.second == 0


def test_daily_utc_cron_is_stored_as_an_interval(db: Database, cid: uuid.UUID) -> None:
    s = create(db, raw=hourly(cid, cron="30 7 * * *"), now=T0).schedule
    assert (s.kind, s.cron, s.interval_seconds) == (ScheduleKind.INTERVAL, None, 86_400)
    assert s.starts_at == datetime(1970, 1, 1, 7, 30, tzinfo=UTC)
    assert s.next_fire_at == datetime(2030, 1, 2, 7, 30, tzinfo=UTC)


def test_interval_once_and_fresh_agent(db: Database, cid: uuid.UUID) -> None:
    every = create(db, raw={"conversation_id": str(cid), "prompt": "p", "every_seconds": 900}, now=T0).schedule
    assert (every.kind, every.interval_seconds, every.starts_at) == (ScheduleKind.INTERVAL, 900, T0)
    assert every.next_fire_at == T0 + timedelta(seconds=900)
    at = T0 + timedelta(days=2)
    once = create(db, raw={"conversation_id": str(cid), "prompt": "p", "starts_at": at.isoformat()}, now=T0).schedule
    assert (once.kind, once.next_fire_at) == (ScheduleKind.ONCE, at)
    agent = {"executor": "openai", "model": "m", "base_url": "https://llm.example/v1",
             "api_key_secret": "arn:aws:secretsmanager:us-east-1:123456789012:secret:kairos/alice/llm-AbCdEf"}
    fresh = create(db, raw=hourly(cid, mode="fresh", agent=agent), now=T0).schedule
    assert fresh.agent == agent


HOOK_SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:kairos/alice/hook-AbCdEf"


def test_webhook_token_is_returned_once_and_only_its_hash_is_stored(db_url: str, db: Database,
                                                                     cid: uuid.UUID) -> None:
    created = create(db, raw={"conversation_id": str(cid), "prompt": "p", "kind": "webhook",
                              "signing": {"scheme": "github", "secret": HOOK_SECRET}})
    token = created.token
    assert token is not None and len(token) >= 43  # 32 random bytes, urlsafe base64
    s = created.schedule
    assert s.next_fire_at is None and s.signing == {"scheme": "github", "secret": HOOK_SECRET,
                                                    "tolerance_seconds": 300}
    row = raw_row(db_url, s.id)
    assert row["token_hash"] == hashlib.sha256(token.encode()).hexdigest() == schedules.hash_token(token)
    assert not any(token in str(value) for value in row.values())  # the token itself is nowhere in the row
    # Shown once: reads never carry it, and nothing shows the hash either.
    with db.transaction() as conn:
        again = schedules.get(conn, s.id, owner="alice")
    for shown in (str(again.as_json()), str(s.as_json()), repr(again), repr(created)):
        assert token not in shown
        assert row["token_hash"] not in shown
    assert "token_hash" not in s.as_json()
    # Tokens differ per hook.
    other = create(db, raw={"conversation_id": str(cid), "prompt": "p", "kind": "webhook"})
    assert other.token != token


def test_as_json_is_the_api_shape(db: Database, cid: uuid.UUID) -> None:
    s = create(db, raw=hourly(cid), now=T0).schedule
    shown = s.as_json()
    assert shown["id"] == str(s.id) and shown["conversation_id"] == str(cid)
    assert shown["created_at"] == "2030-01-01T12:00:00Z"
    assert shown["next_fire_at"] == "2030-01-01T13:00:00Z"
    assert shown["kind"] == "cron" and shown["status"] == "active" and shown["revision"] == 1
    assert not {"owner", "token_hash", "previous_token_hash", "created_by_run_id"} & set(shown)


# --- refusals write nothing --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "error", "rule"),
    [
        (lambda c: hourly(c, owner="mallory"), ValidationFailed, "unknown_field"),
        (lambda c: hourly(c, cron="*/1 * * * *"), LimitExceeded, "min_interval"),
        (lambda c: hourly(c, timezone="Mars/Olympus"), ValidationFailed, "known_zone"),
        (lambda c: hourly(uuid.uuid4()), NotFound, None),
        (lambda c: {"conversation_id": str(c), "prompt": "p", "kind": "webhook", "signing": {"scheme": "github",
                                                                                             "secret": "x"}},
         ValidationFailed, "secret_reference"),
    ],
)
def test_refused_inputs_write_no_row(db_url: str, db: Database, cid: uuid.UUID, make: Any,
                                     error: type[KairosError], rule: str | None) -> None:
    before = (count(db_url), count(db_url, "conversations"))
    with pytest.raises(error) as info:
        create(db, raw=make(cid), now=T0)
    if rule is not None:
        assert rule in {f.rule for f in info.value.fields}
    assert (count(db_url), count(db_url, "conversations")) == before


def test_a_foreign_conversation_is_not_found_like_a_missing_one(db: Database, cid: uuid.UUID) -> None:
    with pytest.raises(NotFound) as foreign:
        create(db, owner="bob", raw=hourly(cid))
    with pytest.raises(NotFound) as missing:
        create(db, owner="bob", raw=hourly(uuid.uuid4()))
    assert foreign.value.as_body() == missing.value.as_body()


# --- limits ------------------------------------------------------------------------------------


def test_ten_open_schedules_per_conversation(db_url: str, db: Database, cid: uuid.UUID) -> None:
    made = [create(db, raw=hourly(cid), now=T0).schedule for _ in range(10)]
    with pytest.raises(LimitExceeded) as info:
        create(db, raw=hourly(cid), now=T0)
    assert [(f.field, f.rule) for f in info.value.fields] == [("conversation_id", "max_per_conversation")]
    assert count(db_url) == 10
    # Paused ones count; cancelled and completed ones do not.
    with db.transaction() as conn:
        schedules.pause(conn, made[0].id, owner="alice")
    with pytest.raises(LimitExceeded):
        create(db, raw=hourly(cid), now=T0)
    with db.transaction() as conn:
        schedules.cancel(conn, made[1].id, owner="alice")
        conn.execute("UPDATE schedules SET status = 'completed' WHERE id = %s", (made[2].id,))
    create(db, raw=hourly(cid), now=T0)
    create(db, raw=hourly(cid), now=T0)
    with pytest.raises(LimitExceeded):
        create(db, raw=hourly(cid), now=T0)
    # The limit is per conversation.
    other = factories.conversation(db_url, owner="alice")["id"]
    create(db, raw=hourly(other), now=T0)


def test_twelve_concurrent_creates_make_exactly_ten(db_url: str, cid: uuid.UUID) -> None:
    workers = 12
    barrier = threading.Barrier(workers)
    outcomes: list[str] = []
    database = Database(db_url, max_size=workers)

    def attempt() -> None:
        try:
            with database.transaction() as conn:
                barrier.wait(30)
                schedules.create(conn, owner="alice", raw=hourly(cid), now=T0)
            outcomes.append("created")
        except LimitExceeded:
            outcomes.append("limit")
        except BaseException as exc:
            outcomes.append(repr(exc))

    try:
        threads = [threading.Thread(target=attempt) for _ in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        database.close()
    assert sorted(outcomes) == ["created"] * 10 + ["limit"] * 2
    assert count(db_url) == 10


def test_a_create_waits_for_an_uncommitted_tenth_and_then_refuses(db_url: str, db: Database,
                                                                  cid: uuid.UUID) -> None:
    """The interleaving that overshoots without the conversation lock, forced deterministically."""
    for _ in range(9):
        create(db, raw=hourly(cid), now=T0)
    holding = threading.Event()
    release = threading.Event()
    second_done = threading.Event()
    outcome: dict[str, Any] = {}

    def tenth() -> None:
        with psycopg.connect(db_url, row_factory=dict_row) as conn:
            schedules.create(conn, owner="alice", raw=hourly(cid), now=T0)
            holding.set()
            release.wait(30)
            conn.commit()

    def eleventh() -> None:
        try:
            with psycopg.connect(db_url, row_factory=dict_row) as conn:
                outcome["pid"] = conn.info.backend_pid
                holding.wait(30)
                schedules.create(conn, owner="alice", raw=hourly(cid), now=T0)
                conn.commit()
                outcome["result"] = "created"
        except LimitExceeded:
            outcome["result"] = "limit"
        finally:
            second_done.set()

    threads = [threading.Thread(target=tenth), threading.Thread(target=eleventh)]
    for t in threads:
        t.start()
    holding.wait(30)
    while "pid" not in outcome:
        second_done.wait(0.005)
    blocked = wait_until_blocked(db_url, outcome["pid"], second_done)
    release.set()
    for t in threads:
        t.join(30)
    assert blocked
    assert outcome["result"] == "limit"
    assert count(db_url) == 10


def test_no_schedule_from_inside_a_run_or_for_a_conversation_a_run_created(db_url: str, db: Database,
                                                                           cid: uuid.UUID) -> None:
    with pytest.raises(Forbidden) as info:
        create(db, raw=hourly(cid), context_run_id=uuid.uuid4())
    assert [(f.field, f.rule) for f in info.value.fields] == [("conversation_id", "no_schedule_from_run")]
    with db.transaction() as conn:
        run_fork = conversations.fork(conn, cid, origin_run_id=uuid.uuid4())
        descendant = conversations.fork(conn, run_fork.id)
    for target in (run_fork.id, descendant.id):
        with pytest.raises(Forbidden) as refused:
            create(db, raw=hourly(target))
        assert refused.value.fields[0].rule == "no_schedule_from_run"
    assert count(db_url) == 0
    # A plain fork made by a person is fine.
    with db.transaction() as conn:
        plain = conversations.fork(conn, cid)
    create(db, raw=hourly(plain.id))


# --- reads and scoping -------------------------------------------------------------------------


def test_get_and_list_are_owner_scoped(db_url: str, db: Database, cid: uuid.UUID) -> None:
    a = create(db, raw=hourly(cid), now=T0).schedule
    b = create(db, raw=hourly(cid), now=T0 + timedelta(seconds=1)).schedule
    c = create(db, raw=hourly(cid), now=T0 + timedelta(seconds=2)).schedule
    other_cid = factories.conversation(db_url, owner="alice")["id"]
    d = create(db, raw=hourly(other_cid), now=T0 + timedelta(seconds=3)).schedule
    bobs = factories.conversation(db_url, owner="bob")["id"]
    create(db, owner="bob", raw=hourly(bobs), now=T0)
    with db.transaction() as conn:
        schedules.pause(conn, b.id, owner="alice")
        schedules.cancel(conn, c.id, owner="alice")
        assert schedules.get(conn, a.id, owner="alice") == a
        assert [s.id for s in schedules.list_for(conn, owner="alice")] == [a.id, b.id, d.id]
        assert [s.id for s in schedules.list_for(conn, owner="alice", conversation_id=cid)] == [a.id, b.id]
        assert schedules.list_for(conn, owner="bob", conversation_id=cid) == []
        with pytest.raises(NotFound) as foreign:
            schedules.get(conn, a.id, owner="bob")
        with pytest.raises(NotFound) as missing:
            schedules.get(conn, uuid.uuid4(), owner="bob")
    assert foreign.value.as_body() == missing.value.as_body()
    assert foreign.value.message == "schedule not found"
    for move in (schedules.pause, schedules.resume, schedules.cancel):
        with db.transaction() as conn, pytest.raises(NotFound) as moved:
            move(conn, a.id, owner="bob")
        assert moved.value.as_body() == missing.value.as_body()
    with db.transaction() as conn:
        assert schedules.get(conn, a.id, owner="alice").revision == 1  # bob changed nothing


# --- moves -------------------------------------------------------------------------------------


def test_every_edit_bumps_revision_and_updated_at(db: Database, cid: uuid.UUID) -> None:
    s = create(db, raw=hourly(cid), now=T0).schedule
    with db.transaction() as conn:
        paused = schedules.pause(conn, s.id, owner="alice", now=T0 + timedelta(minutes=1))
        resumed = schedules.resume(conn, s.id, owner="alice", now=T0 + timedelta(minutes=2))
        cancelled = schedules.cancel(conn, s.id, owner="alice", now=T0 + timedelta(minutes=3))
    assert (paused.status, paused.revision, paused.updated_at) == (ScheduleStatus.PAUSED, 2, T0 + timedelta(minutes=1))
    assert (resumed.status, resumed.revision) == (ScheduleStatus.ACTIVE, 3)
    assert (cancelled.status, cancelled.revision, cancelled.next_fire_at) == (ScheduleStatus.CANCELLED, 4, None)
    assert cancelled.updated_at == T0 + timedelta(minutes=3)
    assert cancelled.created_at == T0


@pytest.mark.parametrize(
    ("setup", "move"),
    [
        ((), schedules.resume),  # active cannot be resumed
        ((schedules.pause,), schedules.pause),  # paused cannot be paused again
        ((schedules.cancel,), schedules.cancel),
        ((schedules.cancel,), schedules.resume),
        ((schedules.cancel,), schedules.pause),
    ],
)
def test_the_wrong_state_is_a_conflict_and_changes_nothing(db: Database, cid: uuid.UUID, setup: Any,
                                                          move: Any) -> None:
    s = create(db, raw=hourly(cid), now=T0).schedule
    with db.transaction() as conn:
        for step in setup:
            step(conn, s.id, owner="alice")
        before = schedules.get(conn, s.id, owner="alice")
    with db.transaction() as conn, pytest.raises(Conflict) as info:
        move(conn, s.id, owner="alice")
    assert info.value.fields[0].field == "status"
    with db.transaction() as conn:
        assert schedules.get(conn, s.id, owner="alice") == before


def test_completed_cannot_be_cancelled(db: Database, cid: uuid.UUID) -> None:
    s = create(db, raw=hourly(cid), now=T0).schedule
    with db.transaction() as conn:
        conn.execute("UPDATE schedules SET status = 'completed' WHERE id = %s", (s.id,))
    with db.transaction() as conn, pytest.raises(Conflict):
        schedules.cancel(conn, s.id, owner="alice")


def test_resume_clears_failures_and_recomputes_the_next_fire_from_now(db: Database, cid: uuid.UUID) -> None:
    s = create(db, raw=hourly(cid, cron="15 * * * *"), now=T0).schedule
    assert s.next_fire_at == T0 + timedelta(minutes=15)
    with db.transaction() as conn:
        # What the tick's settle does after three failures.
        conn.execute("UPDATE schedules SET status = 'paused', consecutive_failures = 3 WHERE id = %s", (s.id,))
    later = T0 + timedelta(days=3, minutes=20)
    with db.transaction() as conn:
        resumed = schedules.resume(conn, s.id, owner="alice", now=later)
    assert resumed.consecutive_failures == 0
    assert resumed.next_fire_at == datetime(2030, 1, 4, 13, 15, tzinfo=UTC)  # first :15 after 12:20 on Jan 4
    assert resumed.next_fire_at == schedules.next_fire_at(resumed, later)


def test_resume_of_a_schedule_with_nothing_left_is_a_conflict(db: Database, cid: uuid.UUID) -> None:
    at = T0 + timedelta(hours=1)
    s = create(db, raw={"conversation_id": str(cid), "prompt": "p", "starts_at": at.isoformat()}, now=T0).schedule
    with db.transaction() as conn:
        schedules.pause(conn, s.id, owner="alice", now=T0)
    with db.transaction() as conn, pytest.raises(Conflict) as info:
        schedules.resume(conn, s.id, owner="alice", now=at + timedelta(minutes=1))
    assert info.value.fields[0].rule == "no_future_fire"


def test_resume_of_a_webhook_keeps_no_cursor(db: Database, cid: uuid.UUID) -> None:
    s = create(db, raw={"conversation_id": str(cid), "prompt": "p", "kind": "webhook"}).schedule
    with db.transaction() as conn:
        schedules.pause(conn, s.id, owner="alice")
        resumed = schedules.resume(conn, s.id, owner="alice")
    assert (resumed.status, resumed.next_fire_at, resumed.token_hash) == (ScheduleStatus.ACTIVE, None, s.token_hash)


# --- preview and the cursor --------------------------------------------------------------------


def test_preview(db: Database, cid: uuid.UUID) -> None:
    s = create(db, raw=hourly(cid, cron="0 7 * * *", timezone="Europe/Berlin", max_occurrences=3), now=T0).schedule
    fires = schedules.preview(s, after=T0, count=10)
    assert len(fires) == 3  # max_occurrences bounds the preview
    assert [f.local_time.hour for f in fires] == [7, 7, 7]
    assert fires == calendar.fires(s.rule(), T0, 3)
    hook = create(db, raw={"conversation_id": str(cid), "prompt": "p", "kind": "webhook"}).schedule
    assert schedules.preview(hook, after=T0, count=5) == []
    for bad in (0, 101):
        with pytest.raises(ValidationFailed) as info:
            schedules.preview(s, after=T0, count=bad)
        assert info.value.fields[0].field == "count"


def test_preview_owned_reads_the_owners_schedule_and_starts_at_the_database_clock(
        db: Database, cid: uuid.UUID) -> None:
    s = create(db, raw=hourly(cid), now=T0).schedule
    hook = create(db, raw={"conversation_id": str(cid), "prompt": "p", "kind": "webhook"}).schedule
    with db.transaction() as conn:
        # Given no `after`, the preview starts at the database's now (injected here), like the tick.
        assert schedules.preview_owned(conn, s.id, owner="alice", count=3, now=T0) == \
            schedules.preview(s, after=T0, count=3)
        later = T0 + timedelta(days=2)
        assert schedules.preview_owned(conn, s.id, owner="alice", count=2, after=later) == \
            schedules.preview(s, after=later, count=2)
        assert schedules.preview_owned(conn, hook.id, owner="alice", count=5) == []
        # And the real clock when nothing is injected: the first fire is the next whole hour after it.
        row = conn.execute("SELECT now() AS now").fetchone()
        assert row is not None
        db_now = row["now"]
        (first,) = schedules.preview_owned(conn, s.id, owner="alice", count=1)
        assert db_now < first.fire_at <= db_now + timedelta(hours=1)
        with pytest.raises(NotFound):
            schedules.preview_owned(conn, s.id, owner="bob", count=3)


def test_preview_owned_checks_its_arguments_before_it_reads_the_schedule(db: Database) -> None:
    missing = uuid.uuid4()
    with db.transaction() as conn:
        for count, after, rule in ((0, None, "min"), (3, datetime(1, 1, 2, tzinfo=UTC), "min"),
                                   (3, datetime(2030, 1, 1), "timezone_aware")):
            with pytest.raises(ValidationFailed) as info:  # not NotFound: the id is never looked up
                schedules.preview_owned(conn, missing, owner="alice", count=count, after=after)
            assert [(f.field, f.rule) for f in info.value.fields] == [("count" if count == 0 else "after", rule)]


def test_rotate_answers_a_new_token_and_the_schedule_it_moved(db: Database, db_url: str, cid: uuid.UUID) -> None:
    hook = create(db, raw={"conversation_id": str(cid), "prompt": "p", "kind": "webhook"}, now=T0).schedule
    with db.transaction() as conn:
        rotated = webhooks.rotate(conn, hook.id, owner="alice", overlap_seconds=60, now=T0)
    assert rotated.schedule.id == hook.id and rotated.schedule.revision == hook.revision + 1
    assert rotated.schedule.token_hash == schedules.hash_token(rotated.token) != hook.token_hash
    assert rotated.token not in repr(rotated)
    stored = raw_row(db_url, hook.id)
    assert stored["previous_token_hash"] == hook.token_hash
    assert stored["previous_token_expires_at"] == T0 + timedelta(seconds=60)


def test_rotate_says_why_it_refuses_and_changes_nothing(db: Database, db_url: str, cid: uuid.UUID) -> None:
    cron = create(db, raw=hourly(cid), now=T0).schedule
    hook = create(db, raw={"conversation_id": str(cid), "prompt": "p", "kind": "webhook"}).schedule
    done = create(db, raw={"conversation_id": str(cid), "prompt": "p", "kind": "webhook"}).schedule
    with db.transaction() as conn:
        schedules.cancel(conn, done.id, owner="alice")
    before = {s.id: raw_row(db_url, s.id) for s in (cron, hook, done)}

    def refusal(schedule_id: uuid.UUID, owner: str = "alice", overlap: int = 60) -> KairosError:
        with pytest.raises(KairosError) as info, db.transaction() as conn:
            webhooks.rotate(conn, schedule_id, owner=owner, overlap_seconds=overlap)
        return info.value

    foreign, missing = refusal(hook.id, owner="bob"), refusal(uuid.uuid4())
    assert type(foreign) is type(missing) is NotFound and foreign.message == missing.message
    not_webhook = refusal(cron.id)
    assert type(not_webhook) is ValidationFailed
    assert [(f.field, f.rule) for f in not_webhook.fields] == [("kind", "webhook_only")]
    cancelled = refusal(done.id)
    assert type(cancelled) is Conflict and cancelled.message == "a cancelled schedule's token cannot be rotated"
    for overlap, rule in ((-1, "min"), (schedules.TOKEN_OVERLAP_MAX_SECONDS + 1, "max")):
        bad = refusal(uuid.uuid4(), overlap=overlap)  # the overlap is judged before any lookup
        assert type(bad) is ValidationFailed and [(f.field, f.rule) for f in bad.fields] == [("overlap_seconds", rule)]
    assert {s.id: raw_row(db_url, s.id) for s in (cron, hook, done)} == before


def test_next_fire_at_for_a_schedule_and_a_rule(db: Database, cid: uuid.UUID) -> None:
    s = create(db, raw=hourly(cid, max_occurrences=2), now=T0).schedule
    assert schedules.next_fire_at(s, T0) == T0 + timedelta(hours=1)
    assert schedules.next_fire_at(s.rule(), T0 + timedelta(minutes=90)) == T0 + timedelta(hours=2)
    used_up = schedules.Schedule(**{**s.__dict__, "fire_count": 2})
    assert schedules.next_fire_at(used_up, T0) is None
