"""Tick throughput: fires per second for 10,000 due schedules, beside pgbench on the same server.

What is measured (one PostgreSQL server, one database per workload, all in the same run, ``--rounds``
rounds with pgbench before each round's workloads; medians of the rounds are reported):

1. **Kairos tick**, ``Tick.run()`` on 10,000 schedules all due at the same minute (the "07:00 burst"),
   real database time, the tick's defaults (batches of 500, two batches in flight), grace widened to
   an hour so that a slow run still dispatches every fire (the workload stays identical). Workloads:
   * *shared rules*: the schedules use 60 distinct rules (cron in UTC and four zones, intervals) — how
     real schedules look; the decision memoizes per (rule, cursor, now), so each rule is evaluated once.
   * *distinct rules*: every schedule has its own rule (a zone x day-field variant of a cron that fires
     at that minute): the calendar runs 10,000 times — the worst case.
   * *SQS stand-in 0 ms / 20 ms*: shared rules, the handoff's real botocore client against
     ``bench/sqs_standin.py`` in its own process (SQS's JSON protocol over local HTTP) answering each
     SendMessageBatch at once or after 20 ms (target: the 20 ms tick's wall time within 1.5x of the
     0 ms one: the calls overlap on the handoff's bounded pool).
   * *sends counted* (issue 41): the stand-in at 0 ms in its own process, so every SendMessageBatch
     (signing, serialising, parsing, the HTTP round trip) is inside the tick's wall time, each workload
     three times in every round: the handoff's lean path (``kairos.sqs_batch``, its exchanges on
     ``kairos.http_wire``), the lean path with every exchange through the client's HTTP session (urllib3
     and http.client: before ``kairos.http_wire``), and botocore's own request pipeline (a client the
     lean path declines: what the handoff sent before ``kairos.sqs_batch``), on two workloads: *one
     shared rule* (10,000 schedules, one daily UTC cron) and *10,000 distinct
     rules* (minute crons ``M[,x] H[,y] * * *|0-6`` across seven zones: the calendar runs 10,000
     times). Target: fires/s ≥ the same round's pgbench TPS. Beside them, the one-rule workload against
     the stand-in as it answered before (Nagle's algorithm on: ~40 ms a call, see ``sqs_standin``).
     ``--sends`` runs only these three beside pgbench; ``--profile-sends`` profiles one one-rule tick
     and one minute-crons tick in every thread (fire workers and the handoff pool), by thread CPU
     time, grouped by code and by step (locking the due rows, decisions, cursor moves, recording,
     sends, stamps).
     Each owner has ten schedules, so the bench sets ``KAIROS_OWNER_CONCURRENCY=10``: every fire holds
     a slot and is sent (with four slots an owner, six of its ten runs would wait unsent).
   * *held snapshot*: shared rules while another connection holds a REPEATABLE READ transaction that
     has read ``schedules`` (its snapshot keeps every row version the tick replaces); beside it the
     same with the keyset cursor disabled (every batch scans from the oldest due key: what the tick
     did before). Target: fire rate with the snapshot ≥ 0.9 of the same round's shared-rules rate.
   * *first burst on a fresh database*: the first shared-rules tick after the seeding (a day of one
     owner's ended runs, then ANALYZE): planned from statistics that saw nothing queued, so every
     partial index of active runs looks empty to the planner. One round, reported beside the medians.
   The other workloads use a stub SQS (an in-process client accepting everything: the tick's own cost).
   Between workloads the previous one's schedules are cancelled and its runs ended, as run workers
   would have ended them (rows kept as history): every workload starts without a backlog.
   ``--moto`` adds moto's server in another process, a fresh queue every 200 messages (moto scans
   the whole queue on every send): moto is no measure of SQS speed.
2. **pgbench** ``-b simple-update -c 8 -j 2 -T S`` (scale 1) in a separate database: the server's
   own rate for a small update transaction.

Reported: fires/s (dispatched runs ÷ wall time of the tick), the ratio to pgbench TPS (target ≥ 1:
one commit per batch of 500 fires instead of one per fire), the fire lag p50/p99 — from the tick's
start (database clock) to each run's ``handoff_at`` — and where the time went: the bench process's
CPU seconds (the tick's Python: client CPU) and the server backends' CPU seconds (read from the
postmaster's reaped children, so only with a local server; every database of that server, other
benches' included), plus the stand-in process's CPU seconds. ``--profile`` prints cProfile's top
entries for one distinct-rules tick.

The server is ``DATABASE_URL``'s when set (databases ``kairos_bench_tick*`` are dropped and
recreated; pgbench is ``/usr/lib/postgresql/15/bin/pgbench``), else an embedded one started here with
default durability settings (fsync on).

Run: ``.venv/bin/python bench/tick.py [--schedules N] [--seconds S] [--rounds R] [--moto] [--profile]
[--sends] [--profile-sends]``.
"""


from __future__ import annotations

import argparse
import cProfile
import io
import json
import logging
import multiprocessing
import os
import pstats
import socket
import statistics
import sys
import threading
import time
import uuid
import zoneinfo
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")  # the tick logs every batch: keep the table readable
# Ten schedules an owner, all due at once: with ten slots an owner every fire is sent (with the default
# four, six of each owner's ten runs would wait in PostgreSQL for a slot and never reach the queue).
os.environ.setdefault("KAIROS_OWNER_CONCURRENCY", "10")

import psycopg
from baseline import held_snapshot, pgbench_tps, recreate, server, server_cpu
from sqs_standin import StandinProcess

from kairos import calendar, handoff, migrations, sqs_batch
from kairos.db import Database
from kairos.states import ScheduleKind
from kairos.tick import FIRE_WORKERS, Tick
from kairos.tick.fire import ALL, DEFAULT_BATCH

BATCH = DEFAULT_BATCH
ONE_RULE = "sends counted (stand-in 0 ms), one shared rule"
MINUTE_CRONS = "sends counted (stand-in 0 ms), 10,000 distinct rules (minute crons, 7 zones)"
NAGLE = "sends counted, one shared rule, the stand-in as it was (Nagle on: ~40 ms a call)"
ONE_RULE_BOTOCORE = "sends counted, one shared rule, botocore's request pipeline (before kairos.sqs_batch)"
MINUTE_CRONS_BOTOCORE = "sends counted, 10,000 distinct rules, botocore's request pipeline (before kairos.sqs_batch)"
ONE_RULE_SESSION = "sends counted, one shared rule, lean through the HTTP session (before kairos.http_wire)"
MINUTE_CRONS_SESSION = "sends counted, 10,000 distinct rules, lean through the HTTP session (before kairos.http_wire)"
AGENT = {"executor": "echo", "model": "echo", "system": "bench"}


# --- workloads -------------------------------------------------------------------------------------


def _cron_at(instant: datetime, zone: str, dom: str = "*", month: str = "*", dow: str = "*") -> str:
    local = instant.astimezone(zoneinfo.ZoneInfo(zone))
    return f"{local.minute} {local.hour} {dom} {month} {dow}"


def shared_rules(due: datetime) -> list[dict[str, Any]]:
    """60 rules that all fire at ``due``: crons in five zones (daily, weekday-agnostic, hourly) and intervals."""
    rules: list[dict[str, Any]] = []
    for zone in ("UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Sydney"):
        local = due.astimezone(zoneinfo.ZoneInfo(zone))
        for cron in (_cron_at(due, zone), f"{local.minute} * * * *", f"{local.minute} {local.hour} * * 0-6",
                     f"{local.minute} {local.hour} 1-31 * *", f"*/{_step(local.minute)} * * * *",
                     f"{local.minute} {local.hour},{(local.hour + 12) % 24} * * *"):
            for catch_up in (False, True):
                rules.append({"kind": "cron", "cron": cron, "timezone": zone, "catch_up": catch_up})
    for seconds in (300, 600, 900, 1800, 3600, 7200, 14400, 21600, 43200, 86400):
        for catch_up in (False, True):
            rules.append({"kind": "interval", "interval_seconds": seconds, "starts_at": due - timedelta(days=1),
                          "catch_up": catch_up})
    return rules


def _step(minute: int) -> int:
    """A step that fires at ``minute``: the largest of 5, 3, 2, 1 dividing it."""
    return next(s for s in (5, 3, 2, 1) if minute % s == 0)


def distinct_rules(due: datetime, count: int) -> list[dict[str, Any]]:
    """``count`` different cron rules that all fire at ``due``: zone x day-field variants."""
    rules: list[dict[str, Any]] = []
    for zone in sorted(zoneinfo.available_timezones()):
        try:
            calendar.check_rule(calendar.Rule(kind=ScheduleKind.CRON, cron="0 0 * * *", timezone=zone))
        except Exception:  # noqa: BLE001 - a zone the shipped tzdata does not have
            continue
        local = due.astimezone(zoneinfo.ZoneInfo(zone))
        for dom in ("*", str(local.day), "1-31"):
            for month in ("*", str(local.month), "1-12"):
                for dow in ("*", str((local.weekday() + 1) % 7), "0-6"):
                    rules.append({"kind": "cron", "cron": _cron_at(due, zone, dom, month, dow), "timezone": zone,
                                  "catch_up": False})
                    if len(rules) == count:
                        return rules
    raise RuntimeError("not enough zones for distinct rules")


SEND_ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Sydney", "America/Los_Angeles",
              "Asia/Tokyo")


def one_rule(due: datetime) -> list[dict[str, Any]]:
    """One rule every schedule shares: a daily cron at ``due`` in UTC."""
    return [{"kind": "cron", "cron": _cron_at(due, "UTC"), "timezone": "UTC", "catch_up": False}]


def minute_crons(due: datetime, count: int) -> list[dict[str, Any]]:
    """``count`` different minute crons across ``SEND_ZONES`` that all fire at ``due``: in each zone,
    the minute field ``M`` or ``M,x``, the hour field ``H`` or ``H,y``, the weekday ``*`` or ``0-6``
    (2,400 rules a zone). ``x`` is never in the ten minutes after ``M``: a slow tick that ends in the
    next minute must not find its schedules due again."""
    fields = []
    for zone in SEND_ZONES:
        local = due.astimezone(zoneinfo.ZoneInfo(zone))
        fields.append((zone, local.minute, local.hour))
    rules: list[dict[str, Any]] = []
    for dow in ("*", "0-6"):
        for step in [0, *range(11, 60)]:
            for y in range(24):
                for zone, minute, hour in fields:  # zones interleaved: any prefix spreads over all seven
                    x = (minute + step) % 60
                    minutes = str(minute) if x == minute else f"{min(x, minute)},{max(x, minute)}"
                    hours = str(hour) if y == hour else f"{min(y, hour)},{max(y, hour)}"
                    rules.append({"kind": "cron", "cron": f"{minutes} {hours} * * {dow}", "timezone": zone,
                                  "catch_up": False})
                    if len(rules) == count:
                        return rules
    raise RuntimeError("at most 16,800 minute crons")


def seed_history(url: str, count: int) -> None:
    """A day of past fires (``count`` occurrences and ended, settled runs), as a live database has.

    Measuring on empty tables would mislead: PostgreSQL caches the plans of its foreign-key checks per
    connection, and a plan made while ``occurrences`` was empty scans it sequentially until an ANALYZE
    (autovacuum, in a live database) replaces it.
    """
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO conversations (id, owner, agent) VALUES ('00000000-0000-0000-0000-000000000001',"
                     " 'history', %s)", (json.dumps(AGENT),))
        conn.execute("""INSERT INTO schedules (id, owner, conversation_id, prompt, kind, cron, status)
                        VALUES ('00000000-0000-0000-0000-000000000002', 'history',
                                '00000000-0000-0000-0000-000000000001', 'p', 'cron', '* * * * *', 'paused')""")
        conn.execute(
            """WITH o AS (
                   INSERT INTO occurrences (id, schedule_id, source, fire_at, local_time, utc_offset, timezone,
                                            tzdata_version, schedule_revision, decision)
                   SELECT gen_random_uuid(), '00000000-0000-0000-0000-000000000002', 'scheduled',
                          now() - make_interval(secs => i * 8), now() - make_interval(secs => i * 8),
                          interval '0', 'UTC', 'history', 1, 'dispatched'
                     FROM generate_series(1, %s) AS i
                   RETURNING id, fire_at)
               INSERT INTO runs (id, occurrence_id, schedule_id, owner, source, source_conversation_id, mode,
                                 prompt, agent, state, output, created_at, finished_at, settled_at, handoff_at)
               SELECT gen_random_uuid(), o.id, '00000000-0000-0000-0000-000000000002', 'history', 'scheduled',
                      '00000000-0000-0000-0000-000000000001', 'fork', 'p', %s, 'succeeded', '{}', o.fire_at,
                      o.fire_at, o.fire_at, o.fire_at
                 FROM o""",
            (count, json.dumps(AGENT)),
        )
        conn.execute("ANALYZE")


def populate(url: str, rules: list[dict[str, Any]], count: int, due: datetime) -> None:
    """``count`` schedules cycling through ``rules``, ten per conversation, all with cursor ``due``."""
    with psycopg.connect(url, autocommit=True) as conn:
        conversations = [uuid.uuid4() for _ in range(count // 10 + 1)]
        with conn.cursor() as cur:
            with cur.copy("COPY conversations (id, owner, agent) FROM STDIN") as copy:
                for n, cid in enumerate(conversations):  # an owner per conversation: no queue cap is reached
                    copy.write_row((cid, f"bench-{n}", json.dumps(AGENT)))
            with cur.copy(
                """COPY schedules (id, owner, conversation_id, prompt, kind, cron, interval_seconds, starts_at,
                                   timezone, catch_up, next_fire_at) FROM STDIN"""
            ) as copy:
                for i in range(count):
                    rule = rules[i % len(rules)]
                    copy.write_row((uuid.uuid4(), f"bench-{i // 10}", conversations[i // 10], "Summarize the news.",
                                    rule["kind"], rule.get("cron"), rule.get("interval_seconds"),
                                    rule.get("starts_at"), rule.get("timezone", "UTC"), rule["catch_up"], due))
        conn.execute("ANALYZE")


# --- SQS -------------------------------------------------------------------------------------------


class StubSqs:
    """Accepts every entry at once: what the tick costs without the network."""

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        return {"Successful": [{"Id": e["Id"], "MessageId": e["Id"]} for e in Entries], "Failed": []}


def _moto_process(port: int) -> None:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False).start()
    threading.Event().wait()


@contextmanager
def moto_sqs() -> Iterator[tuple[Any, str]]:
    """moto's server in its own process; yields (client, queue URL)."""
    for key, value in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        os.environ.setdefault(key, value)
    import boto3
    from botocore.config import Config

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = multiprocessing.get_context("spawn").Process(target=_moto_process, args=(port,), daemon=True)
    process.start()
    try:
        client = boto3.client("sqs", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                              config=Config(max_pool_connections=16))
        for _ in range(200):
            try:
                url = client.create_queue(QueueName="runs")["QueueUrl"]
                break
            except Exception:  # noqa: BLE001 - the server is still starting
                time.sleep(0.1)
        else:
            raise RuntimeError("moto server did not start")
        yield client, url
    finally:
        process.terminate()
        process.join(5)


class RotatingQueues:
    """Hands the tick's sends to moto, moving to a fresh queue every ``per_queue`` messages.

    moto's SQS scans the whole queue on every send, so one queue of 10,000 messages would measure
    moto's quadratic loop, not the tick. Each call still goes through moto's real API (parsing,
    validation, the HTTP server); ``delivered()`` counts what all the queues hold.
    """

    def __init__(self, client: Any, per_queue: int = 200) -> None:
        self.client = client
        self.per_queue = per_queue
        self.urls: list[str] = []
        self._count = per_queue
        self._lock = threading.Lock()

    def _queue(self, entries: int) -> str:
        with self._lock:
            if self._count + entries > self.per_queue:
                self.urls.append(self.client.create_queue(QueueName=f"runs-{len(self.urls)}")["QueueUrl"])
                self._count = 0
            self._count += entries
            return self.urls[-1]

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        return dict(self.client.send_message_batch(QueueUrl=self._queue(len(Entries)), Entries=Entries))

    def delivered(self) -> int:
        return sum(int(self.client.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
                       ["Attributes"]["ApproximateNumberOfMessages"]) for url in self.urls)


# --- measurement -----------------------------------------------------------------------------------


@dataclass
class Result:
    label: str
    dispatched: int
    seconds: float
    db_seconds: float
    sqs_seconds: float
    lag_p50: float
    lag_p99: float
    client_cpu: float = 0.0
    server_cpu: float | None = None
    delivered: int | None = None
    standin_cpu: float | None = None  # the SQS stand-in process's CPU seconds (not the tick's)

    @property
    def fires_per_second(self) -> float:
        return self.dispatched / self.seconds


def measure(label: str, url: str, sqs: Any, queue_url: str, rules_for: Callable[[datetime], list[dict[str, Any]]],
            count: int, *, snapshot: bool = False, keyset: bool = True, profile: bool = False,
            fire_workers: int = FIRE_WORKERS) -> Result:
    with psycopg.connect(url, autocommit=True) as conn:
        # The previous workload's schedules and runs become history (their rows stay, as in a live
        # database): its runs end as the run workers would have ended them. Left queued, each workload
        # would start behind every earlier one's backlog: 10 more queued runs per owner that the
        # owners' queue counts read, and 10,000 more that every tick's repair reads.
        conn.execute("UPDATE schedules SET status = 'cancelled' WHERE status = 'active'")
        conn.execute("""UPDATE runs SET state = 'succeeded', output = '{}', finished_at = now(), settled_at = now(),
                                        updated_at = now()
                         WHERE state = 'queued'""")
        conn.execute("VACUUM ANALYZE schedules, runs")  # each workload starts from the same clean tables
        # The tick must end within the minute its schedules are due: a rule that fires every minute
        # would otherwise fire again (more fires than schedules, and no longer the same workload).
        row = conn.execute("SELECT extract(second FROM now())").fetchone()
        assert row is not None
        if float(row[0]) > 30:
            time.sleep(61 - float(row[0]))
        row = conn.execute("SELECT date_trunc('minute', now())").fetchone()
    assert row is not None
    due: datetime = row[0]
    populate(url, rules_for(due), count, due)
    database = Database(url, max_size=4)  # what runtime.database() gives a container
    server_before = server_cpu(url)
    standin_before = standin_cpu(sqs)
    profiler = ThreadsProfile() if profile else None
    try:
        with psycopg.connect(url) as conn:
            start_row = conn.execute("SELECT clock_timestamp()").fetchone()
        assert start_row is not None
        tick = Tick(database, sqs, queue_url, metrics=None, batch_size=BATCH, grace=timedelta(hours=1),
                    fire_workers=fire_workers)
        if not keyset:
            whole = tick.fire.run_once
            # Each batch from the oldest due key of its part (the parts still split the owners).
            tick.fire.run_once = lambda now=None, after=None, part=ALL: whole(now, part=part)  # type: ignore[method-assign]
        with held_snapshot(url, "schedules") if snapshot else _nothing():
            cpu = time.process_time()
            started = time.perf_counter()
            if profiler:
                profiler.enable()
            report = tick.run()
            if profiler:
                profiler.disable()
            seconds = time.perf_counter() - started
            client_cpu = time.process_time() - cpu
    finally:
        database.close()
    with psycopg.connect(url) as conn:
        lag = conn.execute(
            """SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM handoff_at - %(start)s)),
                      percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM handoff_at - %(start)s)),
                      count(*) FILTER (WHERE handoff_at IS NULL)
                 FROM runs WHERE created_at >= %(start)s""", {"start": start_row[0]}).fetchone()
    assert lag is not None
    if report.dispatched != count or lag[2]:
        raise RuntimeError(f"{label}: dispatched {report.dispatched} of {count}, {lag[2]} not handed off")
    time.sleep(0.2)  # the pool's backends exit and are reaped
    server_after = server_cpu(url)
    standin_after = standin_cpu(sqs)
    server_seconds = server_after - server_before if server_before is not None and server_after is not None else None
    if profiler:
        profiler.report(label)
    return Result(label, report.dispatched, seconds, report.fire_db_seconds, report.fire_sqs_seconds,
                  float(lag[0]), float(lag[1]), client_cpu, server_seconds,
                  standin_cpu=None if standin_before is None or standin_after is None
                  else standin_after - standin_before)


def standin_cpu(sqs: Any) -> float | None:
    """CPU seconds the stand-in process behind ``sqs`` has used (None for an in-process SQS)."""
    pid = getattr(sqs, "standin_pid", None)
    if pid is None:
        return None
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ThreadsProfile:
    """cProfile in every thread the tick runs (the fire workers, the handoff pool's threads), timed by
    each thread's own CPU clock, merged: where the tick process's CPU goes, whichever thread spends it.
    The handoff pool is rebuilt first so that its threads start profiled."""

    def __init__(self) -> None:
        self.profiles: list[cProfile.Profile] = []
        self._lock = threading.Lock()

    def _new(self) -> cProfile.Profile:
        profile = cProfile.Profile(time.thread_time)
        with self._lock:
            self.profiles.append(profile)
        return profile

    def _start_thread(self, *_: Any) -> None:
        sys.setprofile(None)
        self._new().enable()  # replaces this hook for the rest of the thread

    def enable(self) -> None:
        handoff.close_pool()
        threading.setprofile(self._start_thread)
        self._main = self._new()
        self._main.enable()

    def disable(self) -> None:
        self._main.disable()
        threading.setprofile(None)
        handoff.close_pool()  # its threads end: their profiles are complete

    def report(self, label: str) -> None:
        out = io.StringIO()
        stats = pstats.Stats(self.profiles[0], stream=out)
        for other in self.profiles[1:]:
            if other.getstats():
                stats.add(other)
        total = sum(t for (_, _, t, _, _) in stats.stats.values())  # type: ignore[attr-defined]
        print(f"\n### cProfile, {label}: every thread, thread CPU time ({total:.2f} s in all)\n")
        groups = {
            "botocore: sign (SigV4)": ("botocore/auth.py", "botocore/signers.py"),
            "botocore: serialise": ("botocore/serialize.py", "botocore/validate.py"),
            "botocore: parse": ("botocore/parsers.py",),
            "botocore: hooks/events, endpoint rules": ("botocore/hooks.py", "botocore/regions.py",
                                                       "botocore/endpoint_provider.py"),
            "botocore: other": ("botocore/",),
            "urllib3/http.client/socket": ("urllib3/", "http/client.py", "socket.py", "ssl.py", "email/"),
            "psycopg": ("psycopg/", "psycopg_pool/"),
            "kairos.calendar": ("kairos/calendar",),
            "kairos.tick": ("kairos/tick/",),
            "kairos.handoff": ("kairos/handoff.py",),
            "threads, queues, locks": ("threading.py", "concurrent/futures/", "queue.py"),
            "json": ("json/",),
        }
        own: dict[str, float] = dict.fromkeys(groups, 0.0)
        own["other"] = 0.0
        for (file, _, _), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
            name = next((g for g, needles in groups.items() if any(n in file for n in needles)), "other")
            own[name] += tottime
        print("| code (own CPU) | s | share |\n|---|---:|---:|")
        for name, seconds in sorted(own.items(), key=lambda kv: -kv[1]):
            print(f"| {name} | {seconds:.3f} | {seconds / total:.0%} |")
        self._steps(stats.stats, total, own)  # type: ignore[attr-defined]
        stats.sort_stats("cumulative").print_stats(45)
        stats.sort_stats("tottime").print_stats(30)
        print("```\n" + "\n".join(line for line in out.getvalue().strip().splitlines() if line.strip()) + "\n```")


    @staticmethod
    def _steps(entries: dict[Any, Any], total: float, own: dict[str, float]) -> None:
        """The tick's CPU by step (inclusive: a step's own code and everything it calls, in every thread)."""
        def inclusive(file: str, function: str, caller: tuple[str, str] | None = None) -> float:
            found = 0.0
            for (path, _, name), (_, _, _, cumtime, callers) in entries.items():
                if not (path.endswith(file) and name == function):
                    continue
                if caller is None:
                    found += cumtime
                else:
                    found += sum(c[3] for (cpath, _, cname), c in callers.items()
                                 if cpath.endswith(caller[0]) and cname == caller[1])
            return found

        steps = {
            "lock the due rows (statement, row decoding)": inclusive("kairos/db.py", "fetch_all",
                                                                     ("kairos/tick/fire.py", "run_once")),
            "decisions (kairos.tick.decision, the calendar)": inclusive("kairos/tick/fire.py", "_decide"),
            "cursor moves (parameters, statement)": inclusive("kairos/tick/fire.py", "_advance"),
            "occurrences and runs (parameters, locks, statement)": inclusive("kairos/tick/fire.py", "_record"),
            "sends (SendMessageBatch calls, every thread)": inclusive("kairos/handoff.py", "_send_chunk"),
            "handoff stamps (statement)": inclusive("kairos/handoff.py", "stamp"),
        }
        print("\n| step (inclusive CPU) | s | share |\n|---|---:|---:|")
        for name, seconds in steps.items():
            print(f"| {name} | {seconds:.3f} | {seconds / total:.0%} |")
        rest = total - sum(steps.values())
        print(f"| everything else (transactions, commits, threads, logging: {own.get('other', 0.0):.3f} s of "
              f"own 'other' time) | {rest:.3f} | {rest / total:.0%} |")


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def median_result(results: list[Result]) -> Result:
    """The median of each figure over the rounds (fires/s from the median wall time)."""
    def med(values: list[float]) -> float:
        return statistics.median(values)

    servers = [r.server_cpu for r in results if r.server_cpu is not None]
    standins = [r.standin_cpu for r in results if r.standin_cpu is not None]
    return Result(results[0].label, results[0].dispatched, med([r.seconds for r in results]),
                  med([r.db_seconds for r in results]), med([r.sqs_seconds for r in results]),
                  med([r.lag_p50 for r in results]), med([r.lag_p99 for r in results]),
                  med([r.client_cpu for r in results]), med(servers) if servers else None,
                  standin_cpu=med(standins) if standins else None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--seconds", type=int, default=8, help="pgbench duration per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--moto", action="store_true", help="add a round-less series against moto's server")
    parser.add_argument("--profile", action="store_true", help="cProfile one distinct-rules tick")
    parser.add_argument("--sends", action="store_true",
                        help="only the sends-counted workloads (SQS stand-in at 0 ms) beside pgbench")
    parser.add_argument("--profile-sends", action="store_true",
                        help="cProfile (every thread) one tick of the one-rule workload with the stand-in")
    args = parser.parse_args()
    n = args.schedules
    load_start = os.getloadavg()

    with server() as (admin_url, pgbench_binary), StandinProcess() as fast, \
            StandinProcess(delay_ms=20) as slow, StandinProcess(nagle=True) as nagle:
        url = recreate(admin_url, "kairos_bench_tick")
        migrations.apply(url)
        seed_history(url, 20_000)
        with psycopg.connect(url) as conn:
            settings = {r[0]: r[1] for r in conn.execute(
                "SELECT name, setting FROM pg_settings"
                " WHERE name IN ('fsync', 'synchronous_commit', 'server_version')")}
        fast_client, slow_client = (fast.client(handoff.MAX_PARALLEL_CALLS), slow.client(handoff.MAX_PARALLEL_CALLS))
        series: dict[str, list[Result]] = {}
        tps_runs: list[float] = []
        # The first tick on a fresh database: a deployment's first burst. It pays for its caches and the
        # seeded history's first visibility checks, which no later workload does, and it is planned from
        # statistics that saw one owner and nothing queued (the seeding's ANALYZE). Reported on its own
        # row, kept out of the medians.
        first = None if args.sends else measure(
            "first burst on a fresh database (one round, not in the medians)", url, StubSqs(), "stub", shared_rules, n)

        nagle_client = nagle.client(handoff.MAX_PARALLEL_CALLS)
        # The same stand-in through botocore's own request pipeline, as the handoff sent before
        # kairos.sqs_batch: a hook of its own on the operation (a no-op) makes the lean path decline it.
        pipeline_client = fast.client(handoff.MAX_PARALLEL_CALLS)
        pipeline_client.meta.events.register("before-send.sqs.SendMessageBatch", lambda **_: None)
        assert sqs_batch.sender(pipeline_client) is None and sqs_batch.sender(fast_client) is not None
        # The lean path with every exchange through the client's HTTP session (urllib3 + http.client), as
        # it sent before kairos.http_wire.
        session_client = fast.client(handoff.MAX_PARALLEL_CALLS)
        session_sender = sqs_batch.sender(session_client)
        assert session_sender is not None
        session_sender._wire = None
        for client, standin in ((fast_client, fast), (slow_client, slow), (nagle_client, nagle),
                                (pipeline_client, fast), (session_client, fast)):
            # Warm: the client's endpoint and its pooled connections, the handoff pool's threads (else
            # the first workload of the first round pays for them).
            warm = [uuid.uuid4() for _ in range(10 * handoff.MAX_PARALLEL_CALLS)]
            handoff.send_batch(client, standin.queue_url, warm)

        def with_sends() -> tuple[Result, ...]:
            # Each lean workload beside the same one through botocore's pipeline (interleaved).
            return (measure(ONE_RULE, url, fast_client, fast.queue_url, one_rule, n),
                    measure(ONE_RULE_SESSION, url, session_client, fast.queue_url, one_rule, n),
                    measure(ONE_RULE_BOTOCORE, url, pipeline_client, fast.queue_url, one_rule, n),
                    measure(MINUTE_CRONS, url, fast_client, fast.queue_url, lambda due: minute_crons(due, n), n),
                    measure(MINUTE_CRONS_SESSION, url, session_client, fast.queue_url,
                            lambda due: minute_crons(due, n), n),
                    measure(MINUTE_CRONS_BOTOCORE, url, pipeline_client, fast.queue_url,
                            lambda due: minute_crons(due, n), n),
                    measure(NAGLE, url, nagle_client, nagle.queue_url, one_rule, n))

        for _ in range(args.rounds):
            tps = pgbench_tps(pgbench_binary, recreate(admin_url, "kairos_bench_tick_pgbench"), args.seconds)
            if tps:
                tps_runs.append(tps)
            # Each comparison's two sides run back to back (the load of the shared machine drifts).
            for result in with_sends() if args.sends else (
                *with_sends(),
                measure("stub SQS, shared rules", url, StubSqs(), "stub", shared_rules, n),
                measure("held snapshot, shared rules", url, StubSqs(), "stub", shared_rules, n, snapshot=True),
                measure("held snapshot, shared rules, no keyset cursor", url, StubSqs(), "stub", shared_rules, n,
                        snapshot=True, keyset=False),
                measure("stub SQS, distinct rules", url, StubSqs(), "stub", lambda due: distinct_rules(due, n), n),
                measure("SQS stand-in 0 ms, shared rules", url, fast_client, fast.queue_url, shared_rules, n),
                measure("SQS stand-in 20 ms a call, shared rules", url, slow_client, slow.queue_url, shared_rules, n),
            ):
                series.setdefault(result.label, []).append(result)
        results = [median_result(rounds) for rounds in series.values()] + ([first] if first else [])
        if args.profile_sends:
            measure(f"{ONE_RULE} (profiled)", url, fast_client, fast.queue_url, one_rule, n, profile=True)
            measure(f"{MINUTE_CRONS} (profiled)", url, fast_client, fast.queue_url,
                    lambda due: minute_crons(due, n), n, profile=True)
        if args.profile:
            # One fire worker, so that the whole tick runs in the profiled thread.
            measure("stub SQS, distinct rules, 1 fire worker (profiled)", url, StubSqs(), "stub",
                    lambda due: distinct_rules(due, n), n, profile=True, fire_workers=1)
        if args.moto:
            with moto_sqs() as (client, queue_url):
                rotating = RotatingQueues(client)
                result = measure("moto SQS, shared rules", url, rotating, queue_url, shared_rules, n)
                result.delivered = rotating.delivered()
                results.append(result)

        max_in_flight = slow.stats()["max_in_flight"]
    tps = statistics.median(tps_runs) if tps_runs else None
    by = {r.label: r for r in results}
    print(f"\nTick: {n:,} schedules due at the same minute, batches of {BATCH}, {FIRE_WORKERS} in flight, "
          f"handoff pool {handoff.MAX_PARALLEL_CALLS}; PostgreSQL {settings.get('server_version')}, "
          f"fsync={settings.get('fsync')}, synchronous_commit={settings.get('synchronous_commit')}; medians of "
          f"{args.rounds} rounds; load average {' '.join(f'{x:.2f}' for x in load_start)} at the start, "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end\n")
    print("| workload | fires/s | ÷ pgbench TPS | wall s | DB + decisions s | SQS s | client CPU s | server CPU s "
          "| lag p50 s | lag p99 s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        ratio = f"{r.fires_per_second / tps:.2f}" if tps else "n/a"
        server_text = f"{r.server_cpu:.2f}" if r.server_cpu is not None else "n/a"
        if r.standin_cpu is not None:
            server_text += f" (+ stand-in {r.standin_cpu:.2f})"
        print(f"| {r.label} | {r.fires_per_second:,.0f} | {ratio} | {r.seconds:.2f} | {r.db_seconds:.2f} | "
              f"{r.sqs_seconds:.2f} | {r.client_cpu:.2f} | {server_text} | {r.lag_p50:.2f} | {r.lag_p99:.2f} |")
    runs_text = " / ".join(f"{t:,.0f}" for t in tps_runs) or "n/a"
    print(f"| pgbench simple-update, 8 clients (rounds) | {runs_text} TPS | 1.00 | {args.seconds} each "
          "| | | | | | |")
    print("\nDB + decisions and SQS are summed over the batches in flight, so they can exceed the wall time.")
    def per_round(a: str, b: str, key: Callable[[Result], float]) -> str:
        return ", ".join(f"{key(x) / key(y):.2f}" for x, y in zip(series[a], series[b], strict=True))

    def wall(r: Result) -> float:
        return r.seconds

    def rate(r: Result) -> float:
        return r.fires_per_second

    for label in (ONE_RULE, MINUTE_CRONS, NAGLE, ONE_RULE_SESSION, MINUTE_CRONS_SESSION, ONE_RULE_BOTOCORE,
                  MINUTE_CRONS_BOTOCORE):
        print(f"{label} ÷ pgbench per round: "
              + ", ".join(f"{r.fires_per_second / t:.2f}" for r, t in zip(series[label], tps_runs, strict=False))
              + " (target ≥ 1.0).")

    def client_cpu(r: Result) -> float:
        return r.client_cpu

    for lean, session, before in ((ONE_RULE, ONE_RULE_SESSION, ONE_RULE_BOTOCORE),
                                  (MINUTE_CRONS, MINUTE_CRONS_SESSION, MINUTE_CRONS_BOTOCORE)):
        print(f"{lean}: lean sends ÷ botocore's pipeline per round (same round): fires/s "
              f"{per_round(lean, before, rate)}; tick process CPU {per_round(lean, before, client_cpu)}.")
        print(f"{lean}: on the wire ÷ through the HTTP session per round (same round): fires/s "
              f"{per_round(lean, session, rate)}; tick process CPU {per_round(lean, session, client_cpu)}.")
    if args.sends:
        return 0
    stub, held_label = "stub SQS, shared rules", "held snapshot, shared rules"
    old_label, fast_label = "held snapshot, shared rules, no keyset cursor", "SQS stand-in 0 ms, shared rules"
    slow_label = "SQS stand-in 20 ms a call, shared rules"

    fast_r, slow_r = by["SQS stand-in 0 ms, shared rules"], by["SQS stand-in 20 ms a call, shared rules"]
    print(f"SQS 20 ms a call vs 0 ms: wall {slow_r.seconds:.2f} s vs {fast_r.seconds:.2f} s = "
          f"{slow_r.seconds / fast_r.seconds:.2f}x (target ≤ 1.5x); the stand-in saw at most "
          f"{max_in_flight} "
          f"calls in flight (bound {handoff.MAX_PARALLEL_CALLS}); per round: "
          f"{per_round(slow_label, fast_label, wall)}.")
    base, held = by["stub SQS, shared rules"], by["held snapshot, shared rules"]
    old = by["held snapshot, shared rules, no keyset cursor"]
    print(f"Held snapshot: {held.fires_per_second:,.0f} fires/s vs {base.fires_per_second:,.0f} without it = "
          f"{held.fires_per_second / base.fires_per_second:.2f} (target ≥ 0.9); without the keyset cursor "
          f"{old.fires_per_second / base.fires_per_second:.2f}; per round (same-round ratio): "
          f"{per_round(held_label, stub, rate)}; without the cursor {per_round(old_label, stub, rate)}.")
    distinct = series["stub SQS, distinct rules"]
    print("Distinct rules ÷ pgbench per round: "
          + ", ".join(f"{r.fires_per_second / t:.2f}" for r, t in zip(distinct, tps_runs, strict=False)) + ".")
    for r in results:
        if r.delivered is not None:
            print(f"{r.label}: moto holds {r.delivered:,} messages for {r.dispatched:,} runs.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
