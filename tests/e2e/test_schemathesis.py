"""Schemathesis against the served OpenAPI document: no 5xx and no response that breaks the schema.

The real handler is served over HTTP by ``kairos.local.apigw`` on 127.0.0.1 (port 0) against a real
PostgreSQL and moto SQS, and schemathesis sends every operation generated requests (positive and
negative data) with the dev bearer token. The document is loaded with ``from_dict`` from the same
function that serves ``/v1/openapi.json`` (one test checks the served bytes are that document):
schemathesis 4.32's lazy ``from_fixture`` loader does not run under pytest 9 (it writes
``request.node._nodeid``), and ``from_url`` at import time would need a server before collection. So that the
success paths are exercised too, not only 404s, every other generated id is swapped for one of a
seeded object of the right kind (a conversation, a schedule, a webhook schedule, a run) and every
other hook token for a live one. ``max_examples`` is bounded to keep the run within CI's budget.
"""

from __future__ import annotations

import itertools
import json
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from kairos import db
from kairos.api.app import ROUTES, openapi_document
from kairos.local import apigw
from tests.support.api import HANDLER, TOKENS, Api, ApiClient

MAX_EXAMPLES = 30

_turn = itertools.count()


@pytest.fixture
def served(api: Api) -> Iterator[dict[str, Any]]:
    """The API fixture's handler (real database, moto SQS, dev tokens), served over HTTP."""
    server = apigw.serve(HANDLER)
    try:
        yield {"url": server.url, **_seed(api.url)}
    finally:
        server.close()


def _seed(db_url: str) -> dict[str, Any]:
    client = ApiClient("alice")
    conversation = client.post("/v1/conversations", {"agent": {"executor": "echo", "model": "echo"}}).json
    conversation_id = conversation["conversation"]["id"]
    cron = client.post("/v1/schedules", {"conversation_id": conversation_id, "prompt": "p", "cron": "0 7 * * *",
                                         "timezone": "Europe/Berlin"}).json
    hook = client.post("/v1/schedules", {"conversation_id": conversation_id, "prompt": "p", "kind": "webhook"}).json
    token = hook["webhook"]["token"]
    with db.Database(db_url).transaction() as conn:
        conn.execute("UPDATE schedules SET rate_limit_per_minute = 100000")
    run = client.post(f"/v1/hooks/{token}", {"seed": True}, as_user=None).json
    return {"conversation": conversation_id, "schedule": cron["schedule"]["id"], "hook": hook["schedule"]["id"],
            "token": token, "run": run["run_id"]}


schema = schemathesis.openapi.from_dict(openapi_document())


def _real_ids(case: Any, seeded: dict[str, Any]) -> None:
    """Every other case targets a seeded object instead of a random id (success paths, not only 404s)."""
    if next(_turn) % 2:
        return
    params = case.path_parameters or {}
    path = case.operation.path
    if "id" in params:
        if path.startswith("/v1/conversations"):
            params["id"] = seeded["conversation"]
        elif path.startswith("/v1/runs"):
            params["id"] = seeded["run"]
        elif path.endswith("/token"):
            params["id"] = seeded["hook"]
        else:
            params["id"] = seeded["schedule"]
    if "token" in params:
        params["token"] = seeded["token"]
    if path == "/v1/schedules" and isinstance(case.body, dict) and "conversation_id" in case.body:
        case.body["conversation_id"] = seeded["conversation"]
    if path == "/v1/schedules" and case.method.upper() == "GET" and case.query:
        case.query["conversation_id"] = seeded["conversation"]


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_no_server_error_and_every_response_matches_the_schema(case: Any, served: dict[str, Any]) -> None:
    _real_ids(case, served)
    case.call_and_validate(
        base_url=served["url"],
        headers={"Authorization": f"Bearer {TOKENS['alice']}"},
        checks=[not_a_server_error, response_schema_conformance],
    )


def test_the_served_document_is_the_tested_one_and_lists_every_operation(served: dict[str, Any]) -> None:
    with urllib.request.urlopen(f"{served['url']}/v1/openapi.json") as answer:
        served_document = json.loads(answer.read())
    assert served_document == json.loads(json.dumps(openapi_document()))
    loaded = schemathesis.openapi.from_dict(served_document)
    operations = {f"{op.ok().method.upper()} {op.ok().path}" for op in loaded.get_all_operations()}
    assert operations == {spec.key for spec in ROUTES if not spec.page}  # the console's files are no JSON API
    assert uuid.UUID(served["run"])
