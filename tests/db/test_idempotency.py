"""Idempotency keys through the API handler, on real PostgreSQL (issue 10, item 3).

Webhooks: a key whose receipt expired is new again (a new run with the new body, deterministic ids);
GitHub's ``X-GitHub-Delivery`` is a key, after ``Idempotency-Key`` and ``webhook-id``.
Creates: ``POST /v1/schedules`` and ``POST /v1/conversations`` with an ``Idempotency-Key`` make one
object per owner and key in 24 h; the same body answers the first response again (the webhook token
included), another body 422; the first response is stored sealed, never the token or the key in clear.
Time moves the way a black-box test can move it: by editing ``expires_at``.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from kairos import identity, migrations, webhooks
from kairos.db import Database
from kairos.schedules import hash_token
from kairos.states import Source
from tests import factories
from tests.support.api import Answer, Api, ApiClient, count, hook, rows

AGENT = {"executor": "echo", "model": "echo"}


def expire_webhook_receipts(api: Api) -> None:
    rows(api.url, "UPDATE webhook_receipts SET expires_at = now() - interval '1 second' RETURNING schedule_id")


def expire_create_receipts(api: Api) -> None:
    rows(api.url, "UPDATE idempotency_receipts SET expires_at = now() - interval '1 second' RETURNING key_digest")


# ---- webhooks: an expired key is new again --------------------------------------------------------


def test_a_key_used_again_after_its_receipt_expired_makes_a_new_run_with_the_new_body(api: Api) -> None:
    schedule, token = api.webhook_schedule()
    sid = uuid.UUID(schedule["id"])
    first = hook(api, token, {"v": 1}, headers={"idempotency-key": "nightly"})
    assert first.status == 202, first.text
    assert hook(api, token, {"v": 2}, headers={"idempotency-key": "nightly"}).status == 422, "live: another body"

    expire_webhook_receipts(api)
    second = hook(api, token, {"v": 2}, headers={"idempotency-key": "nightly"})
    retried = hook(api, token, {"v": 2}, headers={"idempotency-key": "nightly"})

    assert second.status == 202, second.text
    assert second.json != first.json, "after expiry the key is new: a new occurrence and run"
    assert retried.text == second.text, "the new use has its own live receipt"
    payloads = rows(api.url, "SELECT payload FROM runs ORDER BY created_at")
    assert [p["payload"] for p in payloads] == [{"v": 1}, {"v": 2}], "the new body is not dropped"
    expected = identity.occurrence_id(sid, Source.WEBHOOK, key="nightly", generation=1)
    assert second.json == {"occurrence_id": str(expected), "run_id": str(identity.run_id(expected))}
    (receipt,) = rows(api.url, "SELECT run_id, generation, expires_at > now() AS live FROM webhook_receipts")
    assert str(receipt["run_id"]) == second.json["run_id"] and receipt["generation"] == 1 and receipt["live"]
    assert [m["run_id"] for m in api.messages()] == [first.json["run_id"], second.json["run_id"]]

    expire_webhook_receipts(api)
    third = hook(api, token, {"v": 3}, headers={"idempotency-key": "nightly"})
    expected = identity.occurrence_id(sid, Source.WEBHOOK, key="nightly", generation=2)
    assert third.json["occurrence_id"] == str(expected) and count(api, "runs") == 3


def test_the_first_generation_keeps_the_ids_made_before_generations_existed(api: Api) -> None:
    schedule, token = api.webhook_schedule()
    answer = hook(api, token, {"v": 1}, headers={"idempotency-key": "k"})
    legacy = identity.occurrence_id(uuid.UUID(schedule["id"]), Source.WEBHOOK, key="k")
    assert answer.json["occurrence_id"] == str(legacy)
    assert identity.occurrence_id(uuid.UUID(schedule["id"]), Source.WEBHOOK, key="k", generation=1) != legacy


# ---- webhooks: GitHub's delivery id ---------------------------------------------------------------


def test_github_redeliveries_converge_on_one_run(api: Api) -> None:
    _, token = api.webhook_schedule()
    body = {"action": "opened", "number": 7}
    guid = "72d3162e-cc78-11e3-81ab-4c9367dc0958"
    first = hook(api, token, body, headers={"x-github-delivery": guid, "x-github-event": "pull_request"})
    redelivered = hook(api, token, body, headers={"x-github-delivery": guid, "x-github-event": "pull_request"})
    other = hook(api, token, body, headers={"x-github-delivery": "another-guid"})

    assert first.status == redelivered.status == other.status == 202
    assert redelivered.text == first.text and other.json != first.json
    assert count(api, "runs") == 2
    keys = sorted(r["idempotency_key"] for r in rows(api.url, "SELECT idempotency_key FROM occurrences"))
    assert keys == sorted([guid, "another-guid"])


def test_key_order_is_idempotency_key_then_webhook_id_then_github_delivery(api: Api) -> None:
    _, token = api.webhook_schedule()
    hook(api, token, {"n": 1}, headers={"idempotency-key": "ik", "webhook-id": "wid", "x-github-delivery": "gh"})
    hook(api, token, {"n": 2}, headers={"webhook-id": "wid2", "x-github-delivery": "gh2"})
    hook(api, token, {"n": 3}, headers={"x-github-delivery": "gh3"})
    keys = {r["idempotency_key"] for r in rows(api.url, "SELECT idempotency_key FROM occurrences")}
    assert keys == {"ik", "wid2", "gh3"}


# ---- creates: schedules --------------------------------------------------------------------------


def schedule_body(api: Api, conversation_id: str | None = None, **fields: Any) -> dict[str, Any]:
    cid = conversation_id or api.conversation()["id"]
    return {"conversation_id": cid, "prompt": "on hook", "kind": "webhook", **fields}


def test_a_retried_schedule_create_answers_the_first_response_and_makes_one_schedule(api: Api) -> None:
    body = schedule_body(api)
    key = {"idempotency-key": str(uuid.uuid4())}

    first = api.alice.post("/v1/schedules", body, headers=key)
    retried = api.alice.post("/v1/schedules", body, headers=key)
    # The same JSON written differently (key order, spacing) is the same request.
    reordered = api.alice.post("/v1/schedules", raw=json.dumps(dict(reversed(list(body.items())))).encode(),
                               headers=key)

    assert first.status == retried.status == reordered.status == 201, first.text
    assert retried.text == first.text == reordered.text, "the first response again, token included"
    assert retried.headers.get("Idempotent-Replayed") == "true" and "Idempotent-Replayed" not in first.headers
    assert count(api, "schedules") == 1
    token = first.json["webhook"]["token"]
    assert hook(api, token, {"n": 1}).status == 202, "the replayed token is the schedule's token"


def test_the_same_key_with_another_body_is_refused(api: Api) -> None:
    body = schedule_body(api)
    key = {"idempotency-key": "create-1"}
    assert api.alice.post("/v1/schedules", body, headers=key).status == 201

    other = api.alice.post("/v1/schedules", {**body, "prompt": "something else"}, headers=key)

    assert other.status == 422
    assert other.error["code"] == "idempotency_key_reused"
    assert other.error["fields"][0]["field"] == "Idempotency-Key"
    assert count(api, "schedules") == 1


def test_keys_are_scoped_to_their_owner_and_their_route(api: Api) -> None:
    key = {"idempotency-key": "shared-key"}
    alice = api.alice.post("/v1/schedules", schedule_body(api), headers=key)
    bob_body = schedule_body(api, api.conversation("bob")["id"])
    bob = api.bob.post("/v1/schedules", bob_body, headers=key)
    assert alice.status == bob.status == 201
    assert alice.json["schedule"]["id"] != bob.json["schedule"]["id"], "bob's key is not alice's"
    # One key, one request: the same key on another route is another request.
    assert api.alice.post("/v1/conversations", {"agent": AGENT}, headers=key).status == 422


def test_without_a_key_every_create_is_new(api: Api) -> None:
    body = schedule_body(api)
    assert api.alice.post("/v1/schedules", body).status == 201
    assert api.alice.post("/v1/schedules", body).status == 201
    assert count(api, "schedules") == 2
    assert count(api, "idempotency_receipts") == 0


def test_an_expired_create_receipt_makes_the_key_new_again(api: Api) -> None:
    body = schedule_body(api)
    key = {"idempotency-key": "daily-setup"}
    first = api.alice.post("/v1/schedules", body, headers=key)

    expire_create_receipts(api)
    again = api.alice.post("/v1/schedules", {**body, "prompt": "new"}, headers=key)
    retried = api.alice.post("/v1/schedules", {**body, "prompt": "new"}, headers=key)

    assert first.status == again.status == 201
    assert again.json["schedule"]["id"] != first.json["schedule"]["id"]
    assert retried.text == again.text
    assert count(api, "schedules") == 2 and count(api, "idempotency_receipts") == 1


def test_a_refused_create_remembers_nothing(api: Api) -> None:
    body = schedule_body(api)
    key = {"idempotency-key": "fix-and-retry"}
    refused = api.alice.post("/v1/schedules", {**body, "kind": "sometimes"}, headers=key)
    fixed = api.alice.post("/v1/schedules", body, headers=key)
    assert refused.status == 422 and refused.error["code"] == "validation_failed"
    assert fixed.status == 201
    assert count(api, "schedules") == 1


@pytest.mark.parametrize("bad", ["a\x00b", "clé", "x" * 256, "a\udcffb"])
def test_a_key_that_cannot_be_a_key_is_a_422_naming_the_header(api: Api, bad: str) -> None:
    answer = api.alice.post("/v1/schedules", schedule_body(api), headers={"idempotency-key": bad})
    assert answer.status == 422, answer.text
    assert answer.error["fields"][0]["field"] == "Idempotency-Key"
    assert answer.error["fields"][0]["rule"] in ("invalid_character", "max_length")
    assert count(api, "schedules") == 0


def test_twelve_concurrent_retries_make_one_schedule(api: Api) -> None:
    body = schedule_body(api)
    key = {"idempotency-key": str(uuid.uuid4())}

    def post(_: int) -> Answer:
        return ApiClient("alice").post("/v1/schedules", body, headers=key)

    with ThreadPoolExecutor(max_workers=12) as pool:
        answers = list(pool.map(post, range(12)))

    assert {a.status for a in answers} == {201}
    assert len({a.text for a in answers}) == 1
    assert count(api, "schedules") == 1 and count(api, "idempotency_receipts") == 1


def test_neither_the_token_nor_the_key_is_stored_in_clear(api: Api) -> None:
    key = "client-key-" + uuid.uuid4().hex
    first = api.alice.post("/v1/schedules", schedule_body(api), headers={"idempotency-key": key})
    token = first.json["webhook"]["token"]
    replayed = api.alice.post("/v1/schedules", schedule_body(api, first.json["schedule"]["conversation_id"]),
                              headers={"idempotency-key": key})
    assert replayed.text == first.text, "the token comes back from the sealed receipt"

    with psycopg.connect(api.url, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()]
        assert "idempotency_receipts" in tables
        for table in tables:
            dump = "\n".join(r[0] for r in conn.execute(f"SELECT t::text FROM {table} t").fetchall())
            assert token not in dump, f"webhook token stored in clear in {table}"
            assert key not in dump, f"idempotency key stored in clear in {table}"
        (sealed,) = conn.execute("SELECT sealed FROM idempotency_receipts").fetchone() or (b"",)
    assert token.encode() not in bytes(sealed)
    from kairos import idempotency  # new with this fix: imported here so the rest of the file runs on main

    (receipt,) = rows(api.url, "SELECT key_digest FROM idempotency_receipts")
    assert receipt["key_digest"] == idempotency.key_digest("alice", key)


# ---- creates: conversations ------------------------------------------------------------------------


def test_a_retried_conversation_create_makes_one_conversation(api: Api) -> None:
    key = {"idempotency-key": "conv-1"}
    first = api.alice.post("/v1/conversations", {"agent": AGENT, "title": "t"}, headers=key)
    retried = api.alice.post("/v1/conversations", {"agent": AGENT, "title": "t"}, headers=key)
    other = api.alice.post("/v1/conversations", {"agent": AGENT, "title": "u"}, headers=key)

    assert first.status == retried.status == 201
    assert retried.text == first.text
    assert other.status == 422 and other.error["code"] == "idempotency_key_reused"
    assert count(api, "conversations") == 1


# ---- the upgrade ------------------------------------------------------------------------------------


def test_the_migration_keeps_live_receipts_and_frees_expired_keys(empty_db_url: str) -> None:
    """Receipts written before 0005 expire 24 h after they were made; their rows keep generation 0."""
    url = empty_db_url
    migrations.apply(url, [m for m in migrations.discover() if m.version < 5])
    sched = factories.schedule(url, kind="webhook", token_hash=hash_token("tok-upgrade"))
    body = b'{"v": 1}'
    keys = {}
    for name, age in (("live", timedelta(hours=1)), ("old", timedelta(hours=25))):
        run = factories.run(url, schedule_row=sched, source="webhook")
        (occ,) = rows(url, "SELECT idempotency_key FROM occurrences WHERE id = %(id)s", {"id": run["occurrence_id"]})
        keys[name] = (occ["idempotency_key"], run)
        rows(url, """INSERT INTO webhook_receipts (schedule_id, idempotency_key, request_digest, occurrence_id,
                                                   run_id, created_at)
                     VALUES (%(s)s, %(k)s, %(d)s, %(o)s, %(r)s, now() - %(age)s) RETURNING run_id""",
             {"s": sched["id"], "k": occ["idempotency_key"], "d": hashlib.sha256(body).hexdigest(),
              "o": run["occurrence_id"], "r": run["id"], "age": age})

    migrations.apply(url)

    upgraded = rows(url, "SELECT created_at, expires_at, generation FROM webhook_receipts")
    assert all(r["expires_at"] == r["created_at"] + timedelta(hours=24) and r["generation"] == 0 for r in upgraded)
    assert {r["key_generation"] for r in rows(url, "SELECT key_generation FROM occurrences")} == {0}
    database = Database(url)
    try:
        def deliver(key: str) -> webhooks.Accepted:
            return webhooks.receive(database, webhooks.Delivery("tok-upgrade", body, {"idempotency-key": key}))

        live_key, live_run = keys["live"]
        old_key, old_run = keys["old"]
        replay = deliver(live_key)
        assert replay.replayed and replay.run_id == live_run["id"], "a live receipt still answers"
        fresh = deliver(old_key)
        assert not fresh.replayed and fresh.run_id != old_run["id"], "an expired one frees its key"
        assert fresh.occurrence_id == identity.occurrence_id(sched["id"], Source.WEBHOOK, key=old_key, generation=1)
    finally:
        database.close()
