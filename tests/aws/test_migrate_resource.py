"""The deploy-time migration resource: a real database, a real HTTP server standing in for the
presigned S3 ResponseURL, and exactly one cfn-response answer per request whatever happens.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import psycopg
import pytest
from moto import mock_aws

from kairos import db, migrations, runtime, settings
from kairos.local.stack import load_function
from kairos.migrations import Migration, custom_resource
from tests.support.aws import LambdaContext

ROOT = Path(__file__).resolve().parents[2]
SIGNATURE = "X-Amz-Signature=4f1c0ffee5ecre7519a7"


app = load_function("migrate")


@dataclass
class Answer:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class ResponseServer:
    """Records every PUT; answers with the queued statuses first, then 200."""

    url: str
    answers: list[Answer] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    received: threading.Event = field(default_factory=threading.Event)


@pytest.fixture
def response_server() -> Iterator[ResponseServer]:
    state = ResponseServer(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length))
            status = state.statuses.pop(0) if state.statuses else 200
            if status == 200:
                state.answers.append(Answer(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()
            if status == 200:
                state.received.set()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/cfn-response/stack%7CSchemaMigrations?{SIGNATURE}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def database(empty_db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("DATABASE_URL", empty_db_url)
    runtime.reset()
    yield empty_db_url
    runtime.reset()


def request(kind: str, server: ResponseServer, **extra: Any) -> dict[str, Any]:
    event: dict[str, Any] = copy.deepcopy(json.loads((ROOT / "events" / "migrate_create.json").read_text()))
    event["RequestType"] = kind
    event["ResponseURL"] = server.url
    if kind != "Create":
        event["PhysicalResourceId"] = "kairos-schema"
    if kind == "Update":
        event["OldResourceProperties"] = dict(event["ResourceProperties"], LayerVersion="arn:old")
    event.update(extra)
    return event


def tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")
        return {r[0] for r in rows}


def test_create_applies_every_migration_and_answers_success(database: str, response_server: ResponseServer,
                                                            lambda_context: LambdaContext) -> None:
    event = request("Create", response_server)

    returned = app.handler(event, lambda_context)

    (answer,) = response_server.answers
    assert answer.body["Status"] == "SUCCESS"
    assert answer.body == returned
    for key in ("StackId", "RequestId", "LogicalResourceId"):
        assert answer.body[key] == event[key]
    assert answer.body["PhysicalResourceId"] == "kairos-schema"
    known = migrations.discover()
    assert answer.body["Data"] == {
        "Applied": ",".join(f"{m.version:04d}_{m.name}" for m in known),
        "SchemaVersion": f"{known[-1].version:04d}",
    }
    # The presigned S3 URL is signed without a content type; the PUT must not add one.
    assert answer.headers.get("content-type", "") == ""
    assert answer.path.endswith(SIGNATURE)
    assert {"schedules", "runs", "occurrences", "run_events", "kairos_migrations"} <= tables(database)


def test_update_is_idempotent_and_keeps_the_physical_id(database: str, response_server: ResponseServer,
                                                        lambda_context: LambdaContext) -> None:
    app.handler(request("Create", response_server), lambda_context)

    app.handler(request("Update", response_server), lambda_context)

    create, update = response_server.answers
    assert update.body["Status"] == "SUCCESS"
    assert update.body["PhysicalResourceId"] == create.body["PhysicalResourceId"]
    assert update.body["Data"]["Applied"] == ""
    with psycopg.connect(database) as conn:
        (count,) = conn.execute("SELECT count(*) FROM kairos_migrations").fetchone() or (0,)
    assert count == len(migrations.discover())


def test_update_applies_a_migration_the_new_code_adds(database: str, response_server: ResponseServer,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      lambda_context: LambdaContext) -> None:
    app.handler(request("Create", response_server), lambda_context)
    newer = [*migrations.discover(), Migration(9001, "add_thing", "CREATE TABLE thing (x int)")]
    monkeypatch.setattr(migrations, "discover", lambda: newer)

    app.handler(request("Update", response_server), lambda_context)

    update = response_server.answers[-1]
    assert update.body["Status"] == "SUCCESS"
    assert update.body["Data"] == {"Applied": "9001_add_thing", "SchemaVersion": "9001"}
    assert "thing" in tables(database)


def test_delete_leaves_the_database_alone(database: str, response_server: ResponseServer,
                                          lambda_context: LambdaContext) -> None:
    app.handler(request("Delete", response_server), lambda_context)

    (answer,) = response_server.answers
    assert answer.body["Status"] == "SUCCESS"
    assert answer.body["PhysicalResourceId"] == "kairos-schema"
    assert tables(database) == set()  # nothing applied, nothing dropped


def test_delete_succeeds_even_when_the_database_is_unreachable(
    response_server: ResponseServer, monkeypatch: pytest.MonkeyPatch, lambda_context: LambdaContext
) -> None:
    # Given no database configuration at all (e.g. the secret was deleted before the stack)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("DATABASE_SECRET_ARN", raising=False)
    runtime.reset()

    app.handler(request("Delete", response_server), lambda_context)

    assert [a.body["Status"] for a in response_server.answers] == ["SUCCESS"]
    runtime.reset()


@pytest.mark.parametrize(
    ("url", "secret", "error"),
    [
        # libpq echoes a malformed password back in its message.
        ("postgresql://kairos:hunter%ZZ2pw@127.0.0.1:5432/kairos", "hunter%ZZ2pw", "ProgrammingError"),
        # Nothing listens on port 1.
        ("postgresql://kairos:s3cret-Pa55@127.0.0.1:1/kairos", "s3cret-Pa55", "OperationalError"),
    ],
)
def test_failure_answers_failed_with_a_reason_and_no_secret(
    url: str, secret: str, error: str, response_server: ResponseServer, monkeypatch: pytest.MonkeyPatch,
    lambda_context: LambdaContext,
) -> None:
    monkeypatch.setenv("DATABASE_URL", url)
    runtime.reset()

    app.handler(request("Create", response_server), lambda_context)

    (answer,) = response_server.answers
    assert answer.body["Status"] == "FAILED"
    reason = answer.body["Reason"]
    assert reason.startswith("migrations failed: ") and error in reason
    assert secret not in reason and "hunter" not in reason and "s3cret" not in reason
    assert len(reason) <= custom_resource.MAX_REASON_CHARS
    runtime.reset()


def test_a_changed_applied_migration_fails_the_deploy(database: str, response_server: ResponseServer,
                                                      lambda_context: LambdaContext) -> None:
    # Given a database where 0001 was applied from different text
    first = migrations.discover()[0]
    migrations.apply(database, [Migration(first.version, first.name, "CREATE TABLE early (x int)")])

    app.handler(request("Create", response_server), lambda_context)

    (answer,) = response_server.answers
    assert answer.body["Status"] == "FAILED"
    assert "changed after it was applied" in answer.body["Reason"]


def test_unknown_request_type_fails(database: str, response_server: ResponseServer,
                                    lambda_context: LambdaContext) -> None:
    app.handler(request("Rollback", response_server), lambda_context)

    (answer,) = response_server.answers
    assert answer.body["Status"] == "FAILED"
    assert tables(database) == set()


def test_answers_failed_before_the_timeout_when_migrations_block(
    database: str, response_server: ResponseServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given another runner holding the migration lock, and a Lambda with little time left
    monkeypatch.setattr(custom_resource, "TIMEOUT_MARGIN_SECONDS", 0.0)
    holder = psycopg.connect(database, autocommit=True)
    holder.execute("SELECT pg_advisory_lock(%s)", (migrations.LOCK_KEY,))
    finished = threading.Event()

    def invoke() -> None:
        try:
            app.handler(request("Create", response_server), LambdaContext(remaining_ms=200))
        finally:
            finished.set()

    worker = threading.Thread(target=invoke)
    worker.start()
    try:
        # When the watchdog fires while the migrator still waits for the lock
        assert response_server.received.wait(timeout=30)
        assert not finished.is_set()
    finally:
        holder.execute("SELECT pg_advisory_unlock(%s)", (migrations.LOCK_KEY,))
        holder.close()
    worker.join(timeout=60)

    # Then CloudFormation got one answer, FAILED, and the late success was not sent over it
    assert finished.is_set()
    (answer,) = response_server.answers
    assert answer.body["Status"] == "FAILED"
    assert "timeout" in answer.body["Reason"]
    assert "kairos_migrations" in tables(database)


def test_the_answer_is_retried_when_the_put_fails(
    response_server: ResponseServer, monkeypatch: pytest.MonkeyPatch, lambda_context: LambdaContext
) -> None:
    monkeypatch.setattr(custom_resource, "RESPONSE_BACKOFF_SECONDS", 0.0)
    response_server.statuses.extend([503])

    app.handler(request("Delete", response_server), lambda_context)

    assert [a.body["Status"] for a in response_server.answers] == ["SUCCESS"]
    assert response_server.statuses == []  # the failed attempt was consumed


def test_the_response_url_and_credentials_never_reach_the_logs(
    database: str, response_server: ResponseServer, caplog: pytest.LogCaptureFixture, lambda_context: LambdaContext
) -> None:
    caplog.set_level(logging.DEBUG)

    app.handler(request("Create", response_server), lambda_context)

    # Every record with every structured field it carries (Powertools turns `extra` into attributes)
    logged = [str(vars(record)) for record in caplog.records]
    assert any(getattr(record, "action", None) == "migrate" for record in caplog.records)
    for text in logged:
        assert SIGNATURE not in text and "cfn-response" not in text
        assert database not in text


# --- settings: RDS Proxy ---------------------------------------------------------------------------


@pytest.fixture
def secret_arn(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        arn = boto3.client("secretsmanager").create_secret(
            Name="kairos/database",
            SecretString=json.dumps(
                {"host": "db.internal", "port": 6543, "username": "kairos", "password": "p@ss/word", "dbname": "app"}
            ),
        )["ARN"]
        settings._url_from_secret.cache_clear()
        yield arn
        settings._url_from_secret.cache_clear()


def test_database_proxy_host_replaces_the_secret_host(secret_arn: str) -> None:
    direct = settings.Settings.from_env({"DATABASE_SECRET_ARN": secret_arn}).resolve_database_url()
    proxied = settings.Settings.from_env(
        {"DATABASE_SECRET_ARN": secret_arn, "DATABASE_PROXY_HOST": "kairos.proxy-abc.us-east-1.rds.amazonaws.com"}
    ).resolve_database_url()

    assert direct == "postgresql://kairos:p%40ss%2Fword@db.internal:6543/app?sslmode=require"
    # RDS Proxy listens on PostgreSQL's default port whatever the instance's port is.
    assert proxied == (
        "postgresql://kairos:p%40ss%2Fword@kairos.proxy-abc.us-east-1.rds.amazonaws.com:5432/app?sslmode=require"
    )


def test_database_url_still_wins_over_the_secret_and_proxy(secret_arn: str) -> None:
    chosen = settings.Settings.from_env(
        {"DATABASE_URL": "postgresql://local/db", "DATABASE_SECRET_ARN": secret_arn, "DATABASE_PROXY_HOST": "proxy"}
    ).resolve_database_url()
    assert chosen == "postgresql://local/db"


def test_prepared_statements_are_off_behind_rds_proxy_or_when_turned_off() -> None:
    assert settings.Settings.from_env({}).prepared_statements is True
    assert settings.Settings.from_env({"DATABASE_PROXY_HOST": "proxy"}).prepared_statements is False
    assert settings.Settings.from_env({"KAIROS_PREPARED_STATEMENTS": "off"}).prepared_statements is False
    assert settings.Settings.from_env({"KAIROS_PREPARED_STATEMENTS": "on"}).prepared_statements is True


def test_the_container_pool_follows_the_prepared_statements_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://kairos@proxied.invalid/app")
    monkeypatch.setenv("DATABASE_PROXY_HOST", "proxied.invalid")
    runtime.reset()
    database = runtime.database()
    try:
        assert database.prepared_statements is False
    finally:
        runtime.reset()
        db._databases.pop(database.url).close()  # never connected: the pool opens connections on demand
