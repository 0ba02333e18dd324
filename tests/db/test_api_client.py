"""Support for the API tests: the handler driven in-process with HTTP API v2 events, on a real database.

The ``api`` fixture points the runtime at the test's database (``DATABASE_URL`` + ``kairos.runtime.reset()``), dev
auth with two principals (alice, bob), and moto for SQS (a queue, ``RUN_QUEUE_URL``) and Secrets Manager. ``ApiClient``
builds events with ``kairos.local.apigw.build_event`` (the same shape as ``events/*.json``) and calls
``functions/webhook/app.handler``. No tests here; the other test modules import the fixtures.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from kairos import db, runtime, secrets
from kairos.local import apigw
from kairos.local.stack import load_handler
from moto import mock_aws

ROOT = Path(__file__).resolve().parents[2]
SAME = object()  # "as this client's user"
TOKENS = {"alice": "tok-alice-0123456789", "bob": "tok-bob-9876543210"}


HANDLER = load_handler("webhook")


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    text: str

    @property
    def json(self) -> Any:
        return json.loads(self.text)

    @property
    def error(self) -> dict[str, Any]:
        body = self.json
        assert set(body) == {"error"}, body
        assert set(body["error"]) == {"code", "message", "fields"}, body
        return dict(body["error"])


class ApiClient:
    def __init__(self, as_user: str | None = "alice") -> None:
        self.as_user = as_user

    def __call__(self, method: str, target: str, body: Any = None, *, headers: Mapping[str, str] | None = None,
                 raw: bytes | None = None, as_user: object = SAME, domain: str | None = None) -> Answer:
        who = self.as_user if as_user is SAME else as_user
        sent: dict[str, str] = {"content-type": "application/json"}
        if isinstance(who, str):
            sent["authorization"] = f"Bearer {TOKENS.get(who, who)}"
        sent.update(headers or {})
        payload = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        event = apigw.build_event(method, target, sent, payload)
        if domain is not None:
            event["requestContext"]["domainName"] = domain
        response = HANDLER(event, apigw.LocalContext())
        return Answer(int(response["statusCode"]), dict(response.get("headers") or {}), str(response.get("body", "")))

    def get(self, target: str, **kw: Any) -> Answer:
        return self("GET", target, **kw)

    def post(self, target: str, body: Any = None, **kw: Any) -> Answer:
        return self("POST", target, body, **kw)

    def delete(self, target: str, **kw: Any) -> Answer:
        return self("DELETE", target, **kw)

    def put(self, target: str, body: Any = None, **kw: Any) -> Answer:
        return self("PUT", target, body, **kw)

    def secret(self, name: str, value: str) -> str:
        """Stores one of this user's keys (moto's Secrets Manager) and returns its reference."""
        answer = self.put(f"/v1/secrets/{name}", {"value": value})
        assert answer.status == 200, answer.text
        return str(answer.json["secret"]["reference"])


@dataclass
class Api:
    url: str
    queue_url: str
    sqs: Any
    alice: ApiClient
    bob: ApiClient
    anonymous: ApiClient

    def messages(self) -> list[dict[str, Any]]:
        """Every message on the run queue (received once, so each call sees new ones only)."""
        bodies: list[dict[str, Any]] = []
        while True:
            got = self.sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
            batch = got.get("Messages", [])
            if not batch:
                return bodies
            for message in batch:
                bodies.append(json.loads(message["Body"]))
                self.sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"])

    def conversation(self, who: str = "alice") -> dict[str, Any]:
        client = self.alice if who == "alice" else ApiClient(who)
        answer = client.post("/v1/conversations", {"agent": {"executor": "echo", "model": "echo"}, "title": "t"})
        assert answer.status == 201, answer.text
        return dict(answer.json["conversation"])

    def webhook_schedule(self, who: str = "alice", **fields: Any) -> tuple[dict[str, Any], str]:
        client = self.alice if who == "alice" else ApiClient(who)
        conversation = self.conversation(who)
        answer = client.post("/v1/schedules", {"conversation_id": conversation["id"], "prompt": "on hook",
                                               "kind": "webhook", **fields})
        assert answer.status == 201, answer.text
        return dict(answer.json["schedule"]), str(answer.json["webhook"]["token"])


@pytest.fixture(name="api")
def api_fixture(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("KAIROS_AUTH", "dev")
    monkeypatch.setenv("KAIROS_DEV_TOKENS", ",".join(f"{t}={who}" for who, t in TOKENS.items()))
    monkeypatch.setenv("KAIROS_PUBLIC_URL", "https://kairos.example.test")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        queue_url = sqs.create_queue(QueueName=f"runs-{uuid.uuid4().hex[:8]}")["QueueUrl"]
        monkeypatch.setenv("RUN_QUEUE_URL", queue_url)
        runtime.reset()
        secrets.clear_cache()
        try:
            yield Api(db_url, queue_url, sqs, ApiClient("alice"), ApiClient("bob"), ApiClient(None))
        finally:
            runtime.reset()
            secrets.clear_cache()
            _close_pool(db_url)


def _close_pool(url: str) -> None:
    """The handler's per-process pool for this test's database (the database is dropped next)."""
    with db._lock:
        pool = db._databases.pop(url, None)
    if pool is not None:
        pool.close()


def rows(url: str, sql: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    import psycopg
    from psycopg.rows import dict_row

    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        return conn.execute(sql, params or {}).fetchall()  # type: ignore[arg-type]
