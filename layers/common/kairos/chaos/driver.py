"""The rehearsal itself: the local stack driven by a ``Plan`` on a simulated database clock.

Role: ``Rehearsal`` starts what ``kairos dev`` starts (an embedded PostgreSQL it may stop and restart,
moto's SQS with a dead-letter queue, the demo model with its counting ``/sink``), creates the workload's
schedules (cron and interval, webhook, a goal loop), then walks the plan step by step: at each step
the simulated clock moves ``STEP_SECONDS`` (every named query takes it as ``now``), the step's
deliveries, chat turns and corpus turn arrive, the tick runs,
a worker loop takes what the queue holds and hands each run id to ``kairos.execution.execute.process``
as the run function would, and pending approvals are decided as the plan says. The step's faults are
armed on the way: probe handlers that restart PostgreSQL, kill sessions or raise (a crash) in the tick
or a run; a wrapped ``kairos.db.run`` that raises at the nth named statement; SQS deliveries duplicated,
delayed, reordered or dropped; a short remaining time; a worker clock off the database's. Then a drain
phase without faults (the DLQ redriven first) runs ticks and workers until every run has ended or the
rescue bounds have passed, and ``kairos.chaos.invariants`` checks what happened.

Single-threaded by design, so one seed replays the same faults at the same points; what stays
nondeterministic is thread timing inside the components (the tick's parallel fire batches, heartbeat
threads, SQS visibility in real seconds).

Must not: run against a database it did not start (it stops and restarts its server).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from kairos import approvals, chat, conversations, db, handoff, migrations, runtime, schedules, webhooks
from kairos.chaos.plan import START, STEP_SECONDS, Action, Fault, Plan
from kairos.execution.execute import process
from kairos.execution.sqs import GAVE_UP_SLOT, parse_run_id
from kairos.local import demo_server
from kairos.local.apigw import LocalContext
from kairos.local.postgres import LocalPostgres
from kairos.observability import logger, metrics
from kairos.probes import Probes
from kairos.schedules import loops
from kairos.tick import Tick

OWNER = "chaos"
DRAIN_MINUTES = 40  # simulated: past the handoff's stale bound (15 min) and the lease (2 min)
VISIBILITY_SECONDS = 1  # a failed record comes back after this (real) time
MAX_RECEIVES = 5  # then SQS moves it to the dead-letter queue
EXPORT_BUCKET = "kairos-exports"  # a corpus run's exports, in moto's S3
RETRY_DELAY_MAX = 2  # a run's retry delay, compressed to real seconds


CRASHES = ("pg_restart", "pg_terminate", "kill")  # the faults that strike inside a tick or a run


class Crash(BaseException):
    """Raised by a fault where a process would die: the invocation ends there. A BaseException (as
    the tests' crashes are), so no ``except Exception`` of the component can turn it into an outcome."""


@dataclass
class Counters:
    planned: Counter[str] = field(default_factory=Counter)
    struck: Counter[str] = field(default_factory=Counter)
    events: Counter[str] = field(default_factory=Counter)


class _StatementKill:
    """``kairos.db.run`` wrapped: when armed, the nth named statement raises ``Crash`` (once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._left = 0
        self._original: Callable[..., Any] | None = None

    def install(self) -> None:
        if self._original is None:
            self._original = db.run
            original = db.run

            def run(conn: Any, query: Any, params: Any, *, prepare: bool) -> Any:
                with self._lock:
                    fire = False
                    if self._left > 0:
                        self._left -= 1
                        fire = self._left == 0
                if fire:
                    raise Crash("killed at a statement")
                return original(conn, query, params, prepare=prepare)

            db.run = run

    def uninstall(self) -> None:
        if self._original is not None:
            db.run = self._original
            self._original = None

    def arm(self, nth: int) -> None:
        with self._lock:
            self._left = nth

    def disarm(self) -> bool:
        """Disarms; whether it had fired."""
        with self._lock:
            fired = self._left == 0
            self._left = 0
            return fired


class Rehearsal:
    def __init__(self, plan: Plan, *, out: Callable[[str], None] = print, verbose: bool = False) -> None:
        self.plan = plan
        self.out = out
        self.verbose = verbose
        self.counters = Counters(planned=Counter({k: 0 for k in plan.kinds}))
        self.counters.planned.update(f.kind for f in plan.faults)
        self.kill = _StatementKill()
        self.decisions = {a.mark: a.decision for a in plan.actions if a.kind == "chat"}
        self.sim = START
        self.hooks: list[tuple[uuid.UUID, str]] = []  # (schedule id, token)
        self.chat_conversations: dict[bool, uuid.UUID] = {}
        self.corpus_conversation = uuid.UUID(int=0)
        self.struck: set[Fault] = set()
        self._lock = threading.Lock()

    # -- the stack ---------------------------------------------------------------------------------

    @contextmanager
    def stack(self) -> Iterator[Rehearsal]:
        import boto3

        from kairos.local.awsstate import MotoServer

        base = Path(tempfile.mkdtemp(prefix="kairos-chaos-"))
        saved = dict(os.environ)
        self.pg = LocalPostgres(base / "pgdata")
        moto = MotoServer()
        self.model = demo_server.DemoModelServer(port=0)
        try:
            self.url = self.pg.url()
            migrations.apply(self.url)
            endpoint = moto.start()
            os.environ.update({"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "local",
                               "AWS_SECRET_ACCESS_KEY": "local", "AWS_DEFAULT_REGION": "us-east-1"})
            self.sqs = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1")
            self.dlq = self.sqs.create_queue(QueueName="chaos-runs-dlq")["QueueUrl"]
            dlq_arn = self.sqs.get_queue_attributes(QueueUrl=self.dlq, AttributeNames=["QueueArn"])
            self.queue = self.sqs.create_queue(QueueName="chaos-runs", Attributes={
                "VisibilityTimeout": str(VISIBILITY_SECONDS),
                "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn["Attributes"]["QueueArn"],
                                             "maxReceiveCount": str(MAX_RECEIVES)})})["QueueUrl"]
            boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=EXPORT_BUCKET)
            self.model.start()
            os.environ.update({"KAIROS_EXPORT_BUCKET": EXPORT_BUCKET, "DATABASE_URL": self.url,
                               "RUN_QUEUE_URL": self.queue, "KAIROS_LOCAL": "1",
                               "KAIROS_EGRESS_ALLOW": self.model.egress_allow(None),
                               "POWERTOOLS_METRICS_DISABLED": "true", "POWERTOOLS_TRACE_DISABLED": "true"})
            runtime.reset()
            self.settings = runtime.settings()
            self.db = db.Database(self.url, max_size=4)
            self.kill.install()
            yield self
        finally:
            self.kill.uninstall()
            metrics.clear_metrics()  # the components' EMF lines: CloudWatch's input, nothing to print here
            closers: list[Callable[[], Any]] = [self.model.stop, moto.stop, self.pg.stop]
            if hasattr(self, "db"):
                closers.insert(0, self.db.close)
            for close in closers:
                try:
                    close()
                except Exception:  # noqa: BLE001, S110 - tearing down; the first error already showed
                    pass
            runtime.reset()
            os.environ.clear()
            os.environ.update(saved)

    # -- the workload ------------------------------------------------------------------------------

    def create_workload(self) -> None:
        echo = {"executor": "echo", "model": "echo", "system": "You repeat what you are told."}
        demo = demo_server.agent(self.model.base_url) | {"tools": []}
        with self.db.transaction() as conn:
            conv = {name: conversations.create(conn, owner=OWNER, agent=agent, title=f"chaos {name}").id
                    for name, agent in (("echo", echo), ("demo", demo))}
            self.corpus_conversation = conversations.create(conn, owner=OWNER, agent=demo, title="chaos corpus").id
            # A goal loop: each run reports `continue` through goal_report, up to its max_occurrences.
            loop_conversation = conversations.create(conn, owner=OWNER, agent=demo, title="chaos loop").id
            loops.create(conn, owner=OWNER, now=START, raw={
                "conversation_id": str(loop_conversation), "goal": {"outcome": "The rehearsal is over"},
                "prompt": "Check the rehearsal.\ndemo: goal continue", "interval_seconds": 300,
                "starts_at": (START + timedelta(seconds=40)).isoformat(),
                "ends_at": (START + timedelta(hours=3)).isoformat(), "max_occurrences": 6})
            for name, rule, zone, agent in self.plan.schedules:
                schedules.create(conn, owner=OWNER, now=START, raw={
                    "conversation_id": str(conv[agent]), "name": name, "timezone": zone,
                    "prompt": f"Rehearsal schedule {name}: report the time.", **rule})
            for name, agent in (("hook-echo", "echo"), ("hook-demo", "demo")):
                made = schedules.create(conn, owner=OWNER, now=START, raw={
                    "conversation_id": str(conv[agent]), "name": name, "kind": "webhook",
                    "prompt": "A webhook arrived; say what it contains."})
                if made.token is None:
                    raise RuntimeError("a webhook schedule was made without its token")
                self.hooks.append((made.schedule.id, made.token))
            for asks in (True, False):
                chat_agent = demo_server.agent(self.model.base_url) | {
                    "tools": ["http"], "approval": "mutations" if asks else "never"}
                self.chat_conversations[asks] = conversations.create(
                    conn, owner=OWNER, agent=chat_agent, title=f"chaos chat approval={asks}").id

    def sink_url(self, mark: str) -> str:
        return f"{self.model.url}/sink/{mark}"

    def act(self, action: Action, index: int) -> None:
        try:
            if action.kind == "webhook":
                _, token = self.hooks[index % len(self.hooks)]
                headers = {"content-type": "application/json"}
                if action.keyed:
                    headers["idempotency-key"] = f"chaos-{action.mark}"
                body = json.dumps({"mark": action.mark}).encode()
                for _ in range(action.copies):
                    webhooks.receive(self.db, webhooks.Delivery(token, body, headers), now=self.sim,
                                     handoff=self._handoff)
                self.counters.events["webhook deliveries"] += action.copies
            elif action.kind == "corpus":
                corpus = {"partition_size": action.copies, "instructions": "One record per note.\ndemo: records",
                          "source": {"items": [f"Note {i} of {action.mark}." for i in range(action.items)]}}
                with self.db.transaction() as conn:
                    turn = chat.post(conn, self.corpus_conversation, owner=OWNER, now=self.sim,
                                     raw={"content": f"Catalogue {action.mark}.", "corpus": corpus})
                if not turn.waiting:
                    self._handoff(self.db, [turn.run_id])
                self.counters.events["corpus runs"] += 1
            else:
                call = {"url": self.sink_url(action.mark), "body": {"mark": action.mark}}
                content = f"Chat turn {action.mark}.\ndemo: call http_post {json.dumps(call)}"
                with self.db.transaction() as conn:
                    turn = chat.post(conn, self.chat_conversations[action.approval], owner=OWNER,
                                     raw={"content": content}, now=self.sim)
                if not turn.waiting:
                    self._handoff(self.db, [turn.run_id])
                self.counters.events["chat turns"] += 1
        except Exception as error:  # noqa: BLE001 - a refused request (503 while the database is down) is data
            self.counters.events[f"{action.kind} refused ({type(error).__name__})"] += 1

    def _handoff(self, database: db.Database, run_ids: list[uuid.UUID]) -> None:
        handoff.send(database, self.sqs, self.queue, run_ids, now=self.sim)

    def decide_approvals(self) -> None:
        try:
            with self.db.transaction() as conn:
                pending = conn.execute(
                    "SELECT a.id, r.prompt, r.id AS run_id FROM approvals a JOIN runs r ON r.id = a.run_id "
                    "WHERE a.state = 'pending' AND r.owner = %(owner)s ORDER BY a.created_at, a.id",
                    {"owner": OWNER}).fetchall()
            for row in pending:
                mark = next((m for m in self.decisions if m in row["prompt"]), None)
                decision = self.decisions.get(mark or "", "approve")
                with self.db.transaction() as conn:
                    if decision == "approve":
                        approvals.approve(conn, row["id"], owner=OWNER)
                    else:
                        approvals.deny(conn, row["id"], owner=OWNER)
                if decision == "approve":
                    self._handoff(self.db, [row["run_id"]])
                self.counters.events["approvals approved" if decision == "approve" else "approvals denied"] += 1
        except Exception as error:  # noqa: BLE001 - decided again at the next step
            self.counters.events[f"approval refused ({type(error).__name__})"] += 1

    # -- faults ------------------------------------------------------------------------------------

    def _probes(self, fault: Fault | None) -> Probes:
        probes = Probes()
        if fault is None or fault.point in ("", "statement"):
            return probes

        def strike(**_: Any) -> None:
            with self._lock:
                if fault in self.struck:
                    return
                self.struck.add(fault)
            self.counters.struck[fault.kind] += 1
            if fault.kind == "pg_restart":
                self.pg.restart(mode="immediate")
            elif fault.kind == "pg_terminate":
                self.terminate_sessions()
            else:
                raise Crash(f"killed at {fault.point}")

        probes.on(fault.point, strike)  # type: ignore[arg-type]
        return probes

    def terminate_sessions(self) -> int:
        with psycopg.connect(self.url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                "AND datname = current_database() AND backend_type = 'client backend'").fetchall()
        return len(rows)

    # -- the tick and the worker -------------------------------------------------------------------

    def tick(self, fault: Fault | None) -> None:
        tick = Tick(self.db, self.sqs, self.queue, probes=self._probes(fault), fire_workers=1,
                    retention_days=self.settings.retention_days, egress_allow=self.settings.egress_allow)
        if fault is not None and fault.point == "statement":
            self.kill.arm(fault.nth)
        context = LocalContext(timeout_ms=60_000, function_name="kairos-tick")
        try:
            tick.run(context.get_remaining_time_in_millis, now=self.sim)
            self.counters.events["ticks"] += 1
        except (Exception, Crash) as error:  # noqa: BLE001 - a tick that dies; the next one comes back
            self.counters.events[f"ticks died ({type(error).__name__})"] += 1
        finally:
            if fault is not None and fault.point == "statement" and self.kill.disarm():
                self.counters.struck[fault.kind] += 1
                self.struck.add(fault)

    def work(self, faults: list[Fault], run_fault: Fault | None = None, *, rounds: int = 3) -> int:
        """Takes what the queue holds (up to ``rounds`` receives) and runs each id; how many were taken.
        ``run_fault`` (a probe fault) strikes the first run that reaches its point, a statement kill the
        first run; a short deadline, the first run; a skewed clock, every run of the step."""
        by_kind = {f.kind: f for f in faults}
        probes = self._probes(run_fault)
        statement = run_fault.nth if run_fault is not None and run_fault.point == "statement" else 0
        taken = 0
        for round_ in range(rounds):
            received: list[dict[str, Any]] = list(self.sqs.receive_message(  # type: ignore[arg-type]
                QueueUrl=self.queue, MaxNumberOfMessages=10, WaitTimeSeconds=0,
                AttributeNames=["All"]).get("Messages", []))
            if not received:
                break
            taken += len(received)
            if round_ == 0:
                received = self._sqs_faults(received, by_kind)
            for message in received:
                self._invoke(message, probes, (statement, run_fault), by_kind.pop("deadline", None),
                             by_kind.get("clock_skew"))
                statement = 0
        return taken

    def _sqs_faults(self, messages: list[dict[str, Any]], faults: dict[str, Fault]) -> list[dict[str, Any]]:
        def pick(fault: Fault) -> dict[str, Any]:
            return messages[int(fault.value) % len(messages)]

        if (fault := faults.get("sqs_duplicate")) is not None:
            self.sqs.send_message(QueueUrl=self.queue, MessageBody=pick(fault)["Body"])
            self.counters.struck["sqs_duplicate"] += 1
        if (fault := faults.get("sqs_delay")) is not None and messages:
            held = pick(fault)
            self.sqs.send_message(QueueUrl=self.queue, MessageBody=held["Body"], DelaySeconds=int(fault.value))
            self._delete(held)
            messages = [m for m in messages if m is not held]
            self.counters.struck["sqs_delay"] += 1
        if (fault := faults.get("sqs_drop")) is not None and messages:
            lost = pick(fault)
            self._delete(lost)
            messages = [m for m in messages if m is not lost]
            self.counters.struck["sqs_drop"] += 1
        if (fault := faults.get("sqs_reorder")) is not None and len(messages) > 1:
            random.Random(f"{self.plan.seed}:{fault.step}").shuffle(messages)
            self.counters.struck["sqs_reorder"] += 1
        return messages

    def _delete(self, message: dict[str, Any]) -> None:
        self.sqs.delete_message(QueueUrl=self.queue, ReceiptHandle=message["ReceiptHandle"])

    def _invoke(self, message: dict[str, Any], probes: Probes, kill: tuple[int, Fault | None],
                deadline: Fault | None, skew: Fault | None) -> None:
        statement, statement_fault = kill
        run_id = parse_run_id(message.get("Body"))
        if run_id is None:
            self._delete(message)
            return
        now = self.sim
        if skew is not None:
            now = self.sim + timedelta(seconds=skew.value)
            if skew not in self.struck:
                self.struck.add(skew)
                self.counters.struck["clock_skew"] += 1
        remaining: Callable[[], int] | None = None
        if deadline is not None:
            started = time.monotonic()
            budget = deadline.value

            def remaining() -> int:
                return int(budget - (time.monotonic() - started) * 1000)

            self.counters.struck["deadline"] += 1
        if statement:
            self.kill.arm(statement)
        try:
            outcome = process(self.db, run_id, settings=self.settings, now=now, probes=probes,
                              lambda_remaining_ms=remaining)
        except (Exception, Crash) as error:  # noqa: BLE001 - the record fails; SQS delivers it again
            self.counters.events[f"records failed ({type(error).__name__})"] += 1
            return
        finally:
            if statement and self.kill.disarm():
                self.counters.struck["kill"] += 1
                if statement_fault is not None:
                    self.struck.add(statement_fault)
        self.counters.events[f"worker outcome {outcome.result}"] += 1
        if outcome.result == "deferred":
            return  # redelivered after the visibility timeout
        if outcome.result in GAVE_UP_SLOT:  # as RunFunction: send what the end released into its slot
            try:
                handoff.send_released(self.db, self.sqs, self.queue, [run_id], now=self.sim)
            except Exception:  # noqa: BLE001 - released and unsent: the tick's repair sends them
                self.counters.events["released runs left to the repair"] += 1
        if outcome.result in ("retry", "continued", "held"):
            delay = min(RETRY_DELAY_MAX, outcome.retry_delay_seconds or 0)
            try:
                self.sqs.send_message(QueueUrl=self.queue, MessageBody=handoff.body(run_id), DelaySeconds=delay)
                with self.db.transaction() as conn:
                    handoff.stamp(conn, [run_id], now=self.sim)
            except Exception:  # noqa: BLE001 - the record is delivered again instead
                return
        self._delete(message)

    # -- the phases --------------------------------------------------------------------------------

    def run(self) -> None:
        wall = time.monotonic()
        self.create_workload()
        carried: dict[str, Fault | None] = {"tick": None, "run": None}
        for step in range(self.plan.steps):
            self.sim = START + timedelta(seconds=STEP_SECONDS * (step + 1))
            actions, faults = self.plan.at(step)
            for index, action in enumerate(actions):
                self.act(action, step + index)
            # A fault that finds nothing to strike (no fire in this tick, no run reaching its point) waits
            # for the next step, until the step of the next fault of its target.
            for target in ("tick", "run"):
                new = next((f for f in faults if f.kind in CRASHES and f.target == target), None)
                if new is not None:
                    carried[target] = new
            self.tick(carried["tick"])
            self.work(faults, carried["run"])
            for target in ("tick", "run"):
                if carried[target] in self.struck:
                    carried[target] = None
            self.decide_approvals()
            if self.verbose and step % 15 == 0:
                self.out(f"step {step}/{self.plan.steps}  sim {self.sim.isoformat()}  "
                         f"wall {time.monotonic() - wall:.1f}s")
        self.drain()

    def redrive(self) -> int:
        moved = 0
        while True:
            got = self.sqs.receive_message(QueueUrl=self.dlq, MaxNumberOfMessages=10,
                                           WaitTimeSeconds=0).get("Messages", [])
            if not got:
                return moved
            for message in got:
                self.sqs.send_message(QueueUrl=self.queue, MessageBody=message["Body"])
                self.sqs.delete_message(QueueUrl=self.dlq, ReceiptHandle=message["ReceiptHandle"])
                moved += 1

    def drain(self, *, wall_limit: float = 120.0) -> None:
        """No more faults: ticks and workers until every run has ended and the queue is empty, or the
        simulated drain bound (past every rescue bound) has passed."""
        self.counters.events["DLQ redriven"] += self.redrive()
        end = self.sim + timedelta(minutes=DRAIN_MINUTES)
        started = time.monotonic()
        while self.sim < end and time.monotonic() - started < wall_limit:
            self.tick(None)
            taken = self.work([], rounds=10)
            self.decide_approvals()
            if not self._open_runs() and not self._queued_messages():
                break
            if taken == 0:
                self.sim += timedelta(seconds=STEP_SECONDS)
                if self._queued_messages():
                    time.sleep(0.2)  # in flight or delayed in real seconds: let SQS hand them out
        self.counters.events["DLQ redriven"] += self.redrive()
        self.drained_at = self.sim
        with psycopg.connect(self.url) as conn:
            for kind, state, reason, count in conn.execute(
                    "SELECT CASE WHEN s.loop THEN 'loop' WHEN r.corpus IS NOT NULL THEN 'corpus' ELSE r.source END,"
                    " r.state, r.diagnosis->>'reason_code', count(*)"
                    " FROM runs r LEFT JOIN schedules s ON s.id = r.schedule_id GROUP BY 1, 2, 3").fetchall():
                why = f" ({reason})" if reason and state != "succeeded" else ""
                self.counters.events[f"runs {kind} {state}{why}"] += int(count)
        if self.verbose:
            self.out(f"drained in {time.monotonic() - started:.1f}s to sim {self.sim.isoformat()}")

    def _open_runs(self) -> int:
        with psycopg.connect(self.url) as conn:
            row = conn.execute("SELECT count(*) FROM runs WHERE finished_at IS NULL").fetchone()
        return int(row[0]) if row else 0

    def _queued_messages(self) -> int:
        attrs = self.sqs.get_queue_attributes(QueueUrl=self.queue, AttributeNames=["All"])["Attributes"]
        return sum(int(attrs.get(k, 0)) for k in ("ApproximateNumberOfMessages",
                                                   "ApproximateNumberOfMessagesNotVisible",
                                                   "ApproximateNumberOfMessagesDelayed"))


@contextlib.contextmanager
def quiet_logs(level: str = "CRITICAL") -> Iterator[None]:
    """The handlers' logs at ``level`` (the faults make them loud) while the rehearsal runs; the levels
    before it come back after, so a caller in the same process (a test run) logs as it did."""
    import logging

    loggers: dict[Any, int | str] = {
        logger: level, logging.getLogger("werkzeug"): logging.ERROR, logging.getLogger("botocore"): logging.ERROR,
        logging.getLogger("psycopg.pool"): level}  # "discarding closed connection": the faults, expected
    before = {each: each.level for each in loggers}
    for each, wanted in loggers.items():
        each.setLevel(wanted)
    try:
        yield
    finally:
        for each, was in before.items():
            each.setLevel(was)


def iso(value: datetime) -> str:
    return value.isoformat()
