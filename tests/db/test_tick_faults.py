"""Fault injection: a tick that dies at any boundary of the fire step is repaired by the next ticks.

Each case builds the same mixed scenario (on time, a day late, catch-up, once, overlap skip and
queue_one, max_occurrences, a zoned cron) in two databases. In the first, a tick dies at one point
(``after_select``, ``after_cursor``, ``after_inserts``, ``after_commit``, ``after_send``); then the
same minute is ticked again and one more tick runs a minute later. The second database sees only the
two clean ticks. The recorded history must be identical (no duplicate, no lost fire), every runnable
run must have reached SQS and be stamped, and no cursor ever moves back.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from kairos.db import Database
from kairos.probes import Point, Probes
from kairos.tick import Tick
from tests import factories
from tests.support.aws import SqsQueue
from tests.support.postgres import PgServer

T = datetime(2026, 3, 2, 7, 0, tzinfo=UTC)
POINTS: list[Point] = ["after_select", "after_cursor", "after_inserts", "after_commit", "after_send"]
NS = uuid.UUID("0b9f6f0e-3c1d-4c57-9a55-1f3f4a6f0001")


def fixed(name: str) -> uuid.UUID:
    return uuid.uuid5(NS, name)


class Died(Exception):
    """The simulated end of a Lambda invocation."""


def at_every_point(handler: Callable[[str], None]) -> Probes:
    """Probes calling ``handler(point)`` at each of the fire step's points."""
    probes = Probes()
    for point in POINTS:
        probes.on(point, functools.partial(handler, point))
    return probes


@pytest.fixture
def reference_url(pg_server: PgServer, template_db: str) -> Iterator[str]:
    name = f"kairos_ref_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with pg_server.admin() as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template_db)))
    try:
        yield pg_server.url(name)
    finally:
        with pg_server.admin() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def build(url: str) -> None:
    """The same schedules (and active runs), with the same ids, in any database."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO conversations (id, owner, agent) VALUES (%s, 'alice', %s)",
                     (fixed("conversation"), json.dumps(factories.ECHO_AGENT)))
    cid = fixed("conversation")

    def schedule(name: str, **columns: Any) -> dict[str, Any]:
        return factories.schedule(url, conversation_id=cid, id=fixed(name), **columns)

    hourly = {"kind": "interval", "interval_seconds": 3600, "starts_at": T - timedelta(days=1)}
    schedule("on_time", cron="*/5 * * * *", next_fire_at=T)
    schedule("day_late", next_fire_at=T - timedelta(days=1), **hourly)
    schedule("day_late_catch_up", next_fire_at=T - timedelta(days=1), catch_up=True, **hourly)
    schedule("late_past_grace", cron="*/5 * * * *", next_fire_at=T - timedelta(minutes=5))
    schedule("once", kind="once", starts_at=T, next_fire_at=T)
    schedule("once_late", kind="once", starts_at=T - timedelta(hours=2), next_fire_at=T - timedelta(hours=2))
    schedule("max_one", cron="*/5 * * * *", next_fire_at=T, max_occurrences=1)
    schedule("berlin", cron="0 8 * * *", timezone="Europe/Berlin", next_fire_at=T)
    skip = schedule("skip", cron="*/5 * * * *", next_fire_at=T, overlap="skip")
    queue_one = schedule("queue_one", cron="*/5 * * * *", next_fire_at=T, overlap="queue_one")
    for name, row in (("skip_active", skip), ("queue_one_active", queue_one)):
        factories.run(url, schedule_row=row, state="running", id=fixed(name), fire_at=T - timedelta(minutes=5),
                      handoff_at=T - timedelta(minutes=5))
    for i in range(12):  # enough for three batches of 5
        schedule(f"filler_{i}", cron="*/5 * * * *", next_fire_at=T - timedelta(seconds=i + 1))


def history(url: str) -> dict[str, Any]:
    with psycopg.connect(url, row_factory=dict_row) as conn:
        return {
            "occurrences": conn.execute(
                """SELECT id, schedule_id, fire_at, local_time, utc_offset, fold, decision, covers_from, covers_until,
                          covers_count FROM occurrences
                   WHERE tzdata_version <> 'test'  -- not the factory's rows of the active runs
                   ORDER BY id""").fetchall(),
            "runs": conn.execute(
                "SELECT id, state, blocked_by_run_id, last_seq, handoff_at IS NOT NULL AS handed_off FROM runs"
                " ORDER BY id").fetchall(),
            "events": conn.execute("SELECT run_id, seq, type FROM run_events ORDER BY run_id, seq").fetchall(),
            "schedules": conn.execute(
                """SELECT id, status, revision, next_fire_at, last_fire_at, fire_count FROM schedules
                   ORDER BY id""").fetchall(),
        }


def cursors(url: str) -> dict[uuid.UUID, datetime]:
    far = datetime.max.replace(tzinfo=UTC)  # completed: past every instant
    with psycopg.connect(url) as conn:
        return {r[0]: r[1] or far for r in conn.execute("SELECT id, next_fire_at FROM schedules")}


def received(client: Any, url: str) -> Counter[uuid.UUID]:
    ids: Counter[uuid.UUID] = Counter()
    while True:
        got = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
        if not got.get("Messages"):
            return ids
        for m in got["Messages"]:
            ids[uuid.UUID(json.loads(m["Body"])["run_id"])] += 1
            client.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])


@pytest.mark.parametrize("point", POINTS)
def test_a_tick_dying_at_any_boundary_converges(db: Database, db_url: str, reference_url: str, sqs_queue: SqsQueue,
                                                point: str) -> None:
    build(db_url)
    build(reference_url)
    sqs, queue = sqs_queue.client, sqs_queue.url
    reference_queue = sqs.create_queue(QueueName="reference")["QueueUrl"]
    seen: list[dict[uuid.UUID, datetime]] = [cursors(db_url)]
    died_in: list[int] = []

    def die(at: str) -> None:
        if at == point and not died_in:
            died_in.append(1)
            raise Died(at)

    # Given a tick that dies at `point` in its second batch (the first one committed normally) ...
    batches: list[str] = []

    def second_batch(at: str) -> None:
        if at == "after_select":
            batches.append(at)
        if len(batches) == 2:
            die(at)

    with pytest.raises(Died):
        Tick(db, sqs, queue, metrics=None, batch_size=5, probes=at_every_point(second_batch),
             fire_workers=1).run(now=T)
    seen.append(cursors(db_url))
    # ... when the same minute is ticked again, and the next minute too ... (one fire worker in every
    # tick here: with two, which batch's transaction starts first decides its runs' created_at, and so
    # which runs the owner's four slots go to — a race, not a difference in history.)
    Tick(db, sqs, queue, metrics=None, batch_size=5, fire_workers=1).run(now=T)
    seen.append(cursors(db_url))
    Tick(db, sqs, queue, metrics=None, batch_size=5, fire_workers=1).run(now=T + timedelta(minutes=1))
    seen.append(cursors(db_url))

    reference = Database(reference_url, max_size=2)
    try:
        Tick(reference, sqs, reference_queue, metrics=None, batch_size=5, fire_workers=1).run(now=T)
        Tick(reference, sqs, reference_queue, metrics=None, batch_size=5, fire_workers=1).run(
            now=T + timedelta(minutes=1))
    finally:
        reference.close()

    # ... then the history is exactly the clean one: no duplicate, no lost fire.
    got, want = history(db_url), history(reference_url)
    assert got == want
    assert len(want["occurrences"]) >= 20 and {o["decision"] for o in want["occurrences"]} == {
        "dispatched", "skipped_late", "skipped_overlap", "queued_behind", "expired"}
    # Every run holding a slot (the owner's four: the rest wait unsent) reached SQS and was stamped;
    # only a death after the send duplicates a message.
    with psycopg.connect(db_url) as conn:
        runnable = {r[0] for r in conn.execute(
            "SELECT id FROM runs WHERE state = 'queued' AND admitted_at IS NOT NULL")}
        held = conn.execute("SELECT count(*) FROM runs WHERE state = 'running' OR admitted_at IS NOT NULL").fetchone()
    assert runnable and held == (4,)
    messages = received(sqs, queue)
    assert set(messages) == runnable
    # The owner's four slots went to the first batch's runs: the dead (second) batch sent none of its
    # own, so even a death after its send duplicates nothing.
    assert set(messages.values()) == {1}
    with psycopg.connect(db_url) as conn:
        unstamped = conn.execute(
            "SELECT count(*) FROM runs WHERE state = 'queued' AND admitted_at IS NOT NULL AND handoff_at IS NULL"
        ).fetchone()
    assert unstamped == (0,)
    # No cursor ever moved back.
    for before, after in itertools.pairwise(seen):
        assert all(after[k] >= before[k] for k in before)


def test_a_death_before_commit_leaves_nothing_behind(db: Database, db_url: str, sqs_queue: SqsQueue) -> None:
    build(db_url)
    sqs, queue = sqs_queue.client, sqs_queue.url
    before = history(db_url)

    def die() -> None:
        raise Died("after_inserts")

    with pytest.raises(Died):
        Tick(db, sqs, queue, metrics=None, batch_size=100, probes=Probes().on("after_inserts", die)).run(now=T)
    assert history(db_url) == before
    assert received(sqs, queue) == Counter()
