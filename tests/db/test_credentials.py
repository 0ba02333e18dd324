"""Credentials end to end (docs/api.md "Credentials"): through the public API and run handlers, real
PostgreSQL, moto for SQS and Secrets Manager, and a real local model server that records what it is
sent.

Before this, ``"api_key_secret": "env:AWS_SECRET_ACCESS_KEY"`` with a ``base_url`` of the caller's
choosing made the run send the function's own AWS key as ``Authorization: Bearer …`` to that host,
and any Secrets Manager ARN was read with the run role. Every way a reference reaches
``secrets.resolve`` is listed in ``RESOLVE_CALLERS`` (a scan of the package keeps the list complete),
and each is shown here refusing the function's environment and other owners' namespaces, both when
the reference is written and when it was edited in the database afterwards.
"""

from __future__ import annotations

import ast
import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import pytest

from kairos.local.stack import load_function
from tests.support.api import Api, rows
from tests.support.aws import LambdaContext, run_body, sqs_event
from tests.support.executors import FakeOpenAI

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "layers" / "common" / "kairos"
AWS_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"  # the function's own credentials, in this test
ALICE_KEY = "sk-alice-real-key"
BOB_KEY = "sk-bob-real-key"

run_app = load_function("run")


@pytest.fixture
def model(fake_openai: FakeOpenAI) -> FakeOpenAI:
    """The local model server; what it received is ``model.requests``."""
    return fake_openai


def received(model: FakeOpenAI) -> list[dict[str, str]]:
    """The headers of every request the model server received."""
    return [dict(request["headers"]) for request in model.requests]


@pytest.fixture
def world(api: Api, model: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """alice's and bob's keys stored through PUT /v1/secrets; the function's environment as on Lambda."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_KEY)
    monkeypatch.setenv("KAIROS_EGRESS_ALLOW", "127.0.0.1")
    monkeypatch.setenv("SHARED_MODEL_KEY", "sk-operator-shared")
    monkeypatch.setenv("KAIROS_SHARED_SECRETS", "env:SHARED_MODEL_KEY@model.example")
    return {"alice": api.alice.secret("model", ALICE_KEY), "bob": api.bob.secret("model", BOB_KEY)}


def agent(model: FakeOpenAI, reference: str, *, executor: str = "openai") -> dict[str, Any]:
    out: dict[str, Any] = {"executor": executor, "base_url": model.base_url, "api_key_secret": reference}
    if executor == "openai":
        out["model"] = "m"
    return out


def forbidden_references(world: dict[str, Any]) -> list[str]:
    """Each names the function's environment or someone else's namespace (for alice)."""
    alices = world["alice"]
    region_account = alices.split(":secret:")[0]
    return [
        "env:AWS_SECRET_ACCESS_KEY", "env:AWS_SESSION_TOKEN", "env:DATABASE_URL", "env:PATH",
        "env:SHARED_MODEL_KEY",  # shared, but for another host
        world["bob"],
        f"{region_account}:secret:kairos/bob/model",
        f"{region_account}:secret:kairos/alice/../bob/model",
        f"{region_account}:secret:kairos/alice-x/model",
        f"{region_account}:secret:kairos-database",
    ]


# ---- when written: 422 naming the field and the rule, nothing stored -------------------------------


def test_conversations_refuse_every_forbidden_reference(api: Api, world: dict[str, Any],
                                                        model: FakeOpenAI) -> None:
    for reference in forbidden_references(world):
        answer = api.alice.post("/v1/conversations", {"agent": agent(model, reference)})
        assert answer.status == 422, (reference, answer.text)
        (problem,) = answer.error["fields"]
        assert problem["field"] == "agent.api_key_secret"
        assert problem["rule"] in ("secret_reference", "secret_audience"), reference
        assert AWS_KEY not in answer.text and BOB_KEY not in answer.text
    assert rows(api.url, "SELECT count(*) AS n FROM conversations")[0]["n"] == 0
    # alice's own key, and the shared key towards its own host, are accepted.
    assert api.alice.post("/v1/conversations", {"agent": agent(model, world["alice"])}).status == 201
    shared = {**agent(model, "env:SHARED_MODEL_KEY"), "base_url": "https://model.example/v1"}
    assert api.alice.post("/v1/conversations", {"agent": shared}).status == 201


def test_schedules_refuse_forbidden_agent_snapshots_and_signing_secrets(api: Api, world: dict[str, Any],
                                                                       model: FakeOpenAI) -> None:
    conversation = api.conversation()
    for reference in forbidden_references(world):
        fresh = api.alice.post("/v1/schedules", {"conversation_id": conversation["id"], "prompt": "p",
                                                 "cron": "0 * * * *", "mode": "fresh",
                                                 "agent": agent(model, reference, executor="http")})
        hook = api.alice.post("/v1/schedules", {"conversation_id": conversation["id"], "prompt": "p",
                                                "kind": "webhook",
                                                "signing": {"scheme": "github", "secret": reference}})
        assert fresh.status == 422 and hook.status == 422, (reference, fresh.text, hook.text)
        assert [f["field"] for f in fresh.error["fields"]] == ["agent.api_key_secret"]
        assert [f["field"] for f in hook.error["fields"]] == ["signing.secret"]
    # A shared model key is no signing secret: it has an audience host, and a hook has none.
    shared = api.alice.post("/v1/schedules", {"conversation_id": conversation["id"], "prompt": "p",
                                              "kind": "webhook",
                                              "signing": {"scheme": "github", "secret": "env:SHARED_MODEL_KEY"}})
    assert shared.status == 422 and shared.error["fields"][0]["rule"] == "secret_audience"
    assert rows(api.url, "SELECT count(*) AS n FROM schedules")[0]["n"] == 0


# ---- at the call: a reference edited in the database is refused again --------------------------------


def hook_run(api: Api, agent_json: dict[str, Any]) -> str:
    """A queued run through a webhook of alice's, with ``agent_json`` as its fresh agent snapshot."""
    conversation = api.conversation()
    created = api.alice.post("/v1/schedules", {"conversation_id": conversation["id"], "prompt": "p",
                                               "kind": "webhook", "mode": "fresh", "agent": agent_json})
    assert created.status == 201, created.text
    token = created.json["webhook"]["token"]
    accepted = api.anonymous.post(f"/v1/hooks/{token}", {"n": 1})
    assert accepted.status == 202, accepted.text
    api.messages()  # the handoff; the test delivers the run itself
    return str(accepted.json["run_id"])


def deliver(run_id: str) -> None:
    assert run_app.handler(sqs_event(run_body(run_id)), LambdaContext()) == {"batchItemFailures": []}  # type: ignore[arg-type]


def run_row(api: Api, run_id: str) -> dict[str, Any]:
    (row,) = rows(api.url, "SELECT state, diagnosis FROM runs WHERE id = %(id)s", {"id": run_id})
    return row


@pytest.mark.parametrize("executor", ["openai", "http"])
def test_an_untampered_reference_sends_the_owners_key_to_the_agents_host(
        api: Api, world: dict[str, Any], model: FakeOpenAI, executor: str) -> None:
    run_id = hook_run(api, agent(model, world["alice"], executor=executor))
    deliver(run_id)
    assert run_row(api, run_id)["state"] == "succeeded"
    (headers,) = received(model)
    if executor == "openai":
        assert headers["Authorization"] == f"Bearer {ALICE_KEY}"
    else:  # the http executor signs with the key and never sends it
        assert "webhook-signature" in headers and ALICE_KEY not in json.dumps(headers)


@pytest.mark.parametrize("table", ["runs", "schedules"])
@pytest.mark.parametrize("executor", ["openai", "http"])
def test_a_reference_edited_in_the_database_is_refused_before_the_call(
        api: Api, world: dict[str, Any], model: FakeOpenAI, executor: str, table: str) -> None:
    for reference in forbidden_references(world):
        run_id = hook_run(api, agent(model, world["alice"], executor=executor))
        edit = json.dumps(reference)
        if table == "runs":
            rows(api.url, "UPDATE runs SET agent = jsonb_set(agent, '{api_key_secret}', %(ref)s::jsonb)"
                          " WHERE id = %(id)s RETURNING id", {"ref": edit, "id": run_id})
        else:  # the run re-reads nothing from its schedule; editing both proves it does not matter where
            rows(api.url, "UPDATE schedules SET agent = jsonb_set(agent, '{api_key_secret}', %(ref)s::jsonb)"
                          " RETURNING id", {"ref": edit})
            rows(api.url, "UPDATE runs SET agent = jsonb_set(agent, '{api_key_secret}', %(ref)s::jsonb)"
                          " WHERE id = %(id)s RETURNING id", {"ref": edit, "id": run_id})
        deliver(run_id)
        row = run_row(api, run_id)
        assert row["state"] == "failed", reference
        assert row["diagnosis"]["reason_code"] == "secret_unavailable"
        assert row["diagnosis"]["retry_eligible"] is False
        dumped = json.dumps(rows(api.url, "SELECT * FROM run_events WHERE run_id = %(id)s", {"id": run_id}),
                            default=str) + json.dumps(row, default=str)
        assert AWS_KEY not in dumped and BOB_KEY not in dumped
    assert received(model) == []  # no request at all, so no header to leak in


def test_a_signing_secret_edited_in_the_database_verifies_nothing(api: Api, world: dict[str, Any]) -> None:
    conversation = api.conversation()
    created = api.alice.post("/v1/schedules", {"conversation_id": conversation["id"], "prompt": "p",
                                               "kind": "webhook",
                                               "signing": {"scheme": "github", "secret": world["alice"]}})
    token = created.json["webhook"]["token"]
    body = b'{"n": 1}'

    def signed_with(key: str, idempotency: str) -> int:
        signature = "sha256=" + hmac.new(key.encode(), body, hashlib.sha256).hexdigest()
        return api.anonymous.post(f"/v1/hooks/{token}", raw=body, headers={
            "x-hub-signature-256": signature, "idempotency-key": idempotency}).status

    assert signed_with(ALICE_KEY, "k0") == 202
    for n, (reference, key) in enumerate([("env:AWS_SECRET_ACCESS_KEY", AWS_KEY), (world["bob"], BOB_KEY)]):
        rows(api.url, "UPDATE schedules SET signing = jsonb_set(signing, '{secret}', %(ref)s::jsonb) RETURNING id",
             {"ref": json.dumps(reference)})
        # Signed with the very value the edited reference names: still refused, so the hook is no oracle.
        assert signed_with(key, f"k{n + 1}") == 401
    assert rows(api.url, "SELECT count(*) AS n FROM runs")[0]["n"] == 1


# ---- every way in ----------------------------------------------------------------------------------

# (module, function) of every call that hands a reference to ``secrets.resolve``; the executors hold it
# as ``self._secret``. A new caller must be added here and shown above.
RESOLVE_CALLERS = {
    ("executors/openai.py", "prepare"),
    ("executors/http.py", "prepare"),
    ("webhooks.py", "_resolve_secret"),
    ("notify.py", "attempt"),
}


def test_every_call_into_resolve_is_known_and_passes_owner_and_audience() -> None:
    found: set[tuple[str, str]] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for call in ast.walk(function):
                if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute):
                    continue
                target = call.func
                named = (target.attr == "resolve" and isinstance(target.value, ast.Name)
                         and target.value.id == "secrets") or target.attr == "_secret"
                if not named:
                    continue
                where = (str(path.relative_to(PACKAGE)), function.name)
                if where[0] == "secrets.py":
                    continue
                found.add(where)
                keywords = {k.arg for k in call.keywords}
                assert {"owner", "audience"} <= keywords, where
    assert found == RESOLVE_CALLERS


def test_nothing_but_secrets_reads_a_variable_named_by_data() -> None:
    """Reading ``os.environ`` with a computed name is how ``env:NAME`` reached any variable."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in ("secrets.py", "settings.py", "stack.py"):
            continue  # settings and the local stack read fixed names, and pass whole mappings
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Subscript) and "environ" in ast.unparse(node.value):
                if not isinstance(node.slice, ast.Constant):
                    offenders.append(f"{path.name}:{node.lineno}")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                    and "environ" in ast.unparse(node.func.value) and node.args
                    and not isinstance(node.args[0], ast.Constant)):
                offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []


# ---- the owners' key store through the API ----------------------------------------------------------


def test_secrets_api_is_owner_scoped_and_never_returns_a_value(api: Api) -> None:
    put = api.alice.put("/v1/secrets/openai", {"value": ALICE_KEY})
    again = api.alice.put("/v1/secrets/openai", {"value": ALICE_KEY + "-2"})
    api.bob.put("/v1/secrets/other", {"value": BOB_KEY})

    assert put.status == again.status == 200
    assert put.json["secret"]["name"] == "openai" and ":secret:kairos/alice/openai" in put.json["secret"]["reference"]
    listed = api.alice.get("/v1/secrets")
    assert [s["name"] for s in listed.json["secrets"]] == ["openai"]
    assert [s["name"] for s in api.bob.get("/v1/secrets").json["secrets"]] == ["other"]
    for answer in (put, again, listed):
        assert ALICE_KEY not in answer.text
    # bob deleting alice's name is the same 404 as a name nobody has.
    foreign, missing = api.bob.delete("/v1/secrets/openai"), api.bob.delete("/v1/secrets/nobody")
    assert foreign.status == missing.status == 404 and foreign.text == missing.text
    deleted = api.alice.delete("/v1/secrets/openai")
    assert (deleted.status, deleted.text) == (204, "")
    assert api.alice.get("/v1/secrets").json["secrets"] == []


@pytest.mark.parametrize(("target", "body", "field", "rule"), [
    ("/v1/secrets/..", {"value": "v"}, "name", "pattern"),
    ("/v1/secrets/a%2Fb", {"value": "v"}, "name", "pattern"),
    ("/v1/secrets/ok", {"value": ""}, "value", "min_length"),
    ("/v1/secrets/ok", {"value": "x" * 65_537}, "value", "max_length"),
    ("/v1/secrets/ok", {"value": 5}, "value", "type"),
    ("/v1/secrets/ok", {"value": "v", "owner": "bob"}, "owner", "unknown_field"),
    ("/v1/secrets/ok", {}, "value", "required"),
])
def test_secrets_api_refuses_bad_input_naming_field_and_rule(api: Api, target: str, body: dict[str, Any],
                                                             field: str, rule: str) -> None:
    answer = api.alice.put(target, body)
    assert answer.status == 422, answer.text
    assert (answer.error["fields"][0]["field"], answer.error["fields"][0]["rule"]) == (field, rule)
    assert api.alice.get("/v1/secrets").json["secrets"] == []
