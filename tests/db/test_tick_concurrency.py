"""Eight ticks at once — four processes and four threads — over 2,000 schedules, round after round.

Real PostgreSQL, and moto's SQS server shared by every process. Rounds: on time, five minutes later,
the same minute again (EventBridge's duplicate), and a day late. After them every due instant of
every schedule is accounted for by exactly one occurrence (its own or a range that covers it), each
run-bearing occurrence has one run, nothing due is left behind, every cursor sits on the rule's next
fire, and SQS holds each runnable run exactly once.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import psycopg
import pytest
from psycopg.rows import dict_row

from kairos import calendar
from kairos.db import Database
from kairos.tick import Settle, Tick
from kairos.tick.decision import Due
from tests import factories

T = datetime(2026, 3, 2, 7, 0, tzinfo=UTC)
SCHEDULES = 2_000
PROCESSES = 4
THREADS = 4
BATCH = 100
ROUNDS = [
    T + timedelta(seconds=10),
    T + timedelta(minutes=5, seconds=10),
    T + timedelta(minutes=5, seconds=10),  # the same minute delivered twice
    T + timedelta(days=1, seconds=30),  # a day late (workers finished the earlier runs meanwhile)
]
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def _tick_process(url: str, endpoint: str, barrier: Any, commands: Any, results: Any) -> None:
    """A separate process running ticks on command (as several Lambda containers would)."""
    os.environ.update(AWS_ENV)
    os.environ["POWERTOOLS_LOG_LEVEL"] = "WARNING"
    database = Database(url, max_size=2)
    client = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1")
    try:
        while (command := commands.get()) is not None:
            now, queue_url = command
            barrier.wait()
            try:
                report = Tick(database, client, queue_url, metrics=None, batch_size=BATCH).run(now=now)
                results.put(("ok", report.as_dict()))
            except BaseException as exc:
                results.put(("error", repr(exc)))
    finally:
        database.close()


@pytest.fixture
def moto_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    for key, value in AWS_ENV.items():
        monkeypatch.setenv(key, value)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


# Eight shapes of schedule (kind, rule, cursor, policies); schedule i has shape i % 8.
HOURLY_FROM_YESTERDAY = {"kind": "interval", "interval_seconds": 3600, "starts_at": T - timedelta(days=1)}
SHAPES: list[dict[str, Any]] = [
    {"cron": "*/5 * * * *", "next_fire_at": T},  # on time every round
    {"cron": "*/5 * * * *", "next_fire_at": T - timedelta(minutes=5), "overlap": "skip"},  # one missed, then busy
    {**HOURLY_FROM_YESTERDAY, "next_fire_at": T - timedelta(days=1)},  # a day behind: 24 skipped, 1 run
    {**HOURLY_FROM_YESTERDAY, "next_fire_at": T - timedelta(days=1), "catch_up": True},  # 25 collapse into 1
    {"cron": "*/10 * * * *", "next_fire_at": T, "overlap": "queue_one"},
    {"kind": "once", "starts_at": T + timedelta(minutes=5), "next_fire_at": T + timedelta(minutes=5)},
    {"cron": "55 * * * *", "next_fire_at": T - timedelta(minutes=5)},  # always past grace: skipped only
    {"kind": "interval", "interval_seconds": 3600, "starts_at": T - timedelta(days=1, minutes=-30),
     "next_fire_at": T - timedelta(minutes=30)},  # always past grace: skipped only
]


def populate(url: str) -> None:
    """The schedules, ten per conversation, all due at T or earlier except the ``once`` ones. Each
    conversation has its own owner, so a batch records fires of many owners at once (each owner's queue
    lock is taken in owner order; one owner with all of them would hit KAIROS_OWNER_QUEUE_MAX)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO conversations (id, owner, agent)
               SELECT md5('c' || i)::uuid, 'owner-' || i, %s::jsonb FROM generate_series(0, %s) AS i""",
            (psycopg.types.json.Jsonb(factories.ECHO_AGENT), SCHEDULES // 10),
        )
        rows = []
        for i in range(SCHEDULES):
            shape = {"kind": "cron", "cron": None, "interval_seconds": None, "starts_at": None, "overlap": "allow",
                     "catch_up": False, **SHAPES[i % len(SHAPES)]}
            rows.append({"i": i, "conversation": i // 10, **shape})
        with conn.cursor() as cur:
            cur.executemany(
                """INSERT INTO schedules (id, owner, conversation_id, prompt, kind, cron, interval_seconds, starts_at,
                                          next_fire_at, overlap, catch_up)
                   VALUES (md5('s' || %(i)s)::uuid, 'owner-' || %(conversation)s, md5('c' || %(conversation)s)::uuid,
                           'p', %(kind)s,
                           %(cron)s, %(interval_seconds)s, %(starts_at)s, %(next_fire_at)s, %(overlap)s,
                           %(catch_up)s)""",
                rows,
            )


def finish_queued_runs(url: str, at: datetime) -> int:
    """What workers would have done: every unblocked queued run succeeded."""
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(
            """UPDATE runs SET state = 'succeeded', output = '{}', finished_at = %s
                WHERE state = 'queued' AND blocked_by_run_id IS NULL""", (at,)).rowcount


def run_round(now: datetime, *, db: Database, sqs: Any, queue_urls: list[str], barrier: Any, commands: list[Any],
              results: Any) -> list[dict[str, Any]]:
    reports: list[dict[str, Any]] = []
    errors: list[str] = []

    def thread_tick(queue_url: str) -> None:
        try:
            barrier.wait()
            reports.append(Tick(db, sqs, queue_url, metrics=None, batch_size=BATCH).run(now=now).as_dict())
        except BaseException as exc:
            errors.append(repr(exc))

    for command, queue_url in zip(commands, queue_urls, strict=False):
        command.put((now, queue_url))
    threads = [threading.Thread(target=thread_tick, args=(queue_url,)) for queue_url in queue_urls[PROCESSES:]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for _ in commands:
        status, value = results.get(timeout=120)
        if status == "ok":
            reports.append(value)
        else:
            errors.append(value)
    assert errors == []
    return reports


@pytest.mark.slow
def test_eight_concurrent_ticks_fire_every_due_instant_exactly_once(db: Database, db_url: str,
                                                                     moto_endpoint: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES + THREADS, timeout=120)
    commands = [ctx.Queue() for _ in range(PROCESSES)]
    results = ctx.Queue()
    processes = [ctx.Process(target=_tick_process, args=(db_url, moto_endpoint, barrier, c, results))
                 for c in commands]
    for p in processes:
        p.start()  # they import while the schedules are written
    populate(db_url)
    sqs = boto3.client("sqs", endpoint_url=moto_endpoint, region_name="us-east-1")
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        initial = {r["id"]: r for r in conn.execute("SELECT * FROM schedules")}
    messages = 0
    try:
        for i, now in enumerate(ROUNDS):
            # A queue per tick and round: moto's SQS scans its whole queue on every send (quadratic), so
            # each tick gets a short one of its own; the messages of all of them are counted together.
            if i == len(ROUNDS) - 1:
                assert finish_queued_runs(db_url, now - timedelta(hours=1)) > 0
            queue_urls = [sqs.create_queue(QueueName=f"runs-{i}-{j}")["QueueUrl"] for j in range(PROCESSES + THREADS)]
            started = time.perf_counter()
            reports = run_round(now, db=db, sqs=sqs, queue_urls=queue_urls, barrier=barrier, commands=commands,
                                results=results)
            print(f"round {i}: {time.perf_counter() - started:.1f} s, {sum(r['schedules'] for r in reports)} schedules")
            assert len(reports) == PROCESSES + THREADS
            for queue_url in queue_urls:
                attrs = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages"])
                messages += int(attrs["Attributes"]["ApproximateNumberOfMessages"])
            if now == ROUNDS[0]:  # the first round really was shared between the ticks
                assert sum(1 for r in reports if r["schedules"]) >= 2
    finally:
        for c in commands:
            c.put(None)
        for p in processes:
            p.join(timeout=60)
    assert all(p.exitcode == 0 for p in processes)

    last = ROUNDS[-1]
    # Settle skips schedules a concurrent fire batch holds; the next tick settles those. Run that part.
    leftover = sqs.create_queue(QueueName="settle")["QueueUrl"]
    while Settle(db, sqs, leftover).run_once(now=last).settled:
        pass
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        schedules = {r["id"]: r for r in conn.execute("SELECT * FROM schedules")}
        occurrences: dict[uuid.UUID, list[dict[str, Any]]] = defaultdict(list)
        for o in conn.execute("SELECT * FROM occurrences ORDER BY fire_at"):
            occurrences[o["schedule_id"]].append(o)
        runs = conn.execute(
            "SELECT r.*, o.decision FROM runs r JOIN occurrences o ON o.id = r.occurrence_id").fetchall()
        due_left = conn.execute("SELECT count(*) AS n FROM schedules WHERE status = 'active' AND next_fire_at <= %s",
                                (last,)).fetchone()
    assert due_left is not None and due_left["n"] == 0

    # Every due instant is covered by exactly one occurrence (its own, or a range that stands for it).
    expected: dict[tuple[Any, ...], tuple[list[datetime], calendar.Fire | None]] = {}
    for schedule_id, before in initial.items():
        rule = Due.from_row(before).rule
        key = (rule, before["next_fire_at"])  # 2,000 schedules, eight shapes: evaluate each shape once
        if key not in expected:
            instants = [before["next_fire_at"],
                        *(f.fire_at for f in calendar.fires_between(rule, before["next_fire_at"], last))]
            expected[key] = (instants, calendar.next_fire(rule, last))
        due, following = expected[key]
        ranges = sorted((o["covers_from"] or o["fire_at"], o["covers_until"] or o["fire_at"], o["covers_count"])
                        for o in occurrences[schedule_id])
        assert sum(count for _, _, count in ranges) == len(due), schedule_id
        for (_, until, _), (start, _, _) in itertools.pairwise(ranges):
            assert until < start, schedule_id  # ranges never overlap
        assert all(any(lo <= instant <= hi for lo, hi, _ in ranges) for instant in due), schedule_id
        after = schedules[schedule_id]
        if after["status"] == "completed":
            assert before["kind"] == "once" and after["next_fire_at"] is None
        else:
            assert following is not None and after["next_fire_at"] == following.fire_at

    # One run per run-bearing occurrence, none for the others; the overlap policies held.
    bearing = [o for os_ in occurrences.values() for o in os_ if o["decision"] in ("dispatched", "queued_behind")]
    assert len(runs) == len(bearing) and {r["occurrence_id"] for r in runs} == {o["id"] for o in bearing}
    runs_per_schedule: dict[uuid.UUID, list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        runs_per_schedule[r["schedule_id"]].append(r)
    for schedule_id, before in initial.items():
        mine = runs_per_schedule[schedule_id]
        if before["overlap"] == "skip":  # round 0 runs; busy in round 1; free again (its run ended) in round 3
            assert len(mine) == 2
        if before["overlap"] == "queue_one":
            # Round 0 runs; round 1 waits behind it; in round 3 the first has ended, so settle releases the
            # waiting one, and round 3's own fire waits behind it — or is skipped, when a tick fired it
            # before any tick's settle released the waiting run. Never more than one waits.
            assert len(mine) in (2, 3) and sum(1 for r in mine if r["blocked_by_run_id"] is not None) == len(mine) - 2
        if before["cron"] == "55 * * * *" or before["next_fire_at"] == T - timedelta(minutes=30):
            assert mine == []  # always past grace, never run
    # Every ended run was accounted for.
    assert all(r["settled_at"] is not None for r in runs if r["finished_at"] is not None)
    assert all(s["consecutive_failures"] == 0 for s in schedules.values())

    # Every run holding a slot reached SQS exactly once (by exactly one of the eight ticks) and was
    # stamped; runs waiting for a slot and blocked runs were never sent.
    # (finish_queued_runs ends waiting runs too, as workers would once each had its slot; the runs its
    # statement released, released_by set, are its "worker's" to send, and the repair's a tick later.)
    runnable = [r for r in runs if r["state"] == "queued" and r["admitted_at"] is not None
                and r["released_by"] is None]
    assert runnable and all(r["handoff_count"] == 1 and r["handoff_at"] is not None for r in runnable)
    assert all(r["handoff_count"] == 0 for r in runs if r["state"] == "queued" and r["admitted_at"] is None)
    assert all(r["handoff_count"] <= 1 for r in runs)
    assert all(r["handoff_at"] is None for r in runs if r["blocked_by_run_id"] is not None)
    assert messages == sum(r["handoff_count"] for r in runs)
