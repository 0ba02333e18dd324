"""The API handler driven in-process with HTTP API v2 events, on a real database.

The ``api`` fixture points the runtime at the test's database (``DATABASE_URL`` + ``kairos.runtime.reset()``), dev
auth with two principals (alice, bob), and moto (the ``sqs_queue`` fixture: the run queue is ``RUN_QUEUE_URL``;
Secrets Manager). ``ApiClient`` builds events with ``kairos.local.apigw.build_event`` (the same shape as
``events/*.json``) and calls ``functions/webhook/app.handler``. Also the webhook helpers (``hook``, signing).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kairos import db, runtime, secrets
from kairos.local import apigw
from kairos.local.stack import load_handler
from tests.support.aws import LambdaContext, SqsQueue

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
        response = HANDLER(event, LambdaContext(function_name="kairos-api"))
        return Answer(int(response["statusCode"]), dict(response.get("headers") or {}), str(response.get("body", "")))

    def get(self, target: str, **kw: Any) -> Answer:
        return self("GET", target, **kw)

    def post(self, target: str, body: Any = None, **kw: Any) -> Answer:
        return self("POST", target, body, **kw)

    def delete(self, target: str, **kw: Any) -> Answer:
        return self("DELETE", target, **kw)

    def patch(self, target: str, body: Any = None, **kw: Any) -> Answer:
        return self("PATCH", target, body, **kw)

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
def api_fixture(db_url: str, sqs_queue: SqsQueue, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("KAIROS_AUTH", "dev")
    monkeypatch.setenv("KAIROS_DEV_TOKENS", ",".join(f"{t}={who}" for who, t in TOKENS.items()))
    monkeypatch.setenv("KAIROS_PUBLIC_URL", "https://kairos.example.test")
    monkeypatch.setenv("RUN_QUEUE_URL", sqs_queue.url)
    runtime.reset()
    secrets.clear_cache()
    try:
        yield Api(db_url, sqs_queue.url, sqs_queue.client, ApiClient("alice"), ApiClient("bob"), ApiClient(None))
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


# ---- webhooks ----------------------------------------------------------------------------------

HOOK = "/v1/hooks/{}"


def hook(api: Api, token: str, body: Any = None, *, headers: dict[str, str] | None = None,
         raw: bytes | None = None) -> Answer:
    return api.anonymous.post(HOOK.format(token), body, headers=headers, raw=raw)


def count(api: Api, table: str) -> int:
    return int(rows(api.url, f"SELECT count(*) AS n FROM {table}")[0]["n"])


STANDARD_SECRET = "whsec_" + base64.b64encode(b"standard-webhooks-secret-bytes!!").decode()
GITHUB_SECRET = "github-secret"


def standard_headers(body: bytes, *, msg_id: str = "msg_1", at: int | None = None,
                     secret: str = STANDARD_SECRET) -> dict[str, str]:
    stamp = str(int(time.time()) if at is None else at)
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(key, f"{msg_id}.{stamp}.".encode() + body, hashlib.sha256).digest()
    return {"webhook-id": msg_id, "webhook-timestamp": stamp,
            "webhook-signature": "v1,Zm9vYmFy v1," + base64.b64encode(mac).decode()}
