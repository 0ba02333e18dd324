"""Webhook intake through the handler (HTTP API v2 events), real PostgreSQL, moto SQS.

Every status of ``POST /v1/hooks/{token}``: 202 (and its replay), 401 (signatures), 404 (unknown,
paused, cancelled, completed — byte-identical), 413, 422 (key reused with another body), 429 (with
Retry-After); the commit-then-send order; 20 concurrent posts with one key; token rotation with its
overlap; and a scan of the logs and of every table for the raw token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from kairos import identity, webhooks
from kairos.db import Database
from kairos.errors import NotFound, RateLimited
from kairos.states import Source
from kairos.tick.prune import Prune
from tests.support.api import GITHUB_SECRET, STANDARD_SECRET, Answer, Api, count, hook, rows, standard_headers
from tests.support.logs import powertools_output

# ---- 202 --------------------------------------------------------------------------------------


def test_accepted_delivery_commits_occurrence_run_event_then_hands_off(api: Api) -> None:
    schedule, token = api.webhook_schedule(timezone="Europe/Berlin")

    answer = hook(api, token, {"ref": "refs/heads/main"}, headers={"idempotency-key": "delivery-1"})

    assert answer.status == 202, answer.text
    assert set(answer.json) == {"run_id", "occurrence_id"}
    occurrence_id = identity.occurrence_id(uuid.UUID(schedule["id"]), Source.WEBHOOK, key="delivery-1")
    assert answer.json == {"run_id": str(identity.run_id(occurrence_id)), "occurrence_id": str(occurrence_id)}
    (occ,) = rows(api.url, "SELECT * FROM occurrences")
    assert occ["source"] == "webhook" and occ["decision"] == "dispatched"
    assert occ["idempotency_key"] == "delivery-1" and occ["timezone"] == "Europe/Berlin"
    assert occ["utc_offset"] in (timedelta(hours=1), timedelta(hours=2))
    assert occ["local_time"] == (occ["fire_at"] + occ["utc_offset"]).replace(tzinfo=None)
    (run,) = rows(api.url, "SELECT * FROM runs")
    assert run["state"] == "queued" and run["source"] == "webhook" and run["owner"] == "alice"
    assert run["payload"] == {"ref": "refs/heads/main"} and run["prompt"] == "on hook"
    assert run["agent"]["executor"] == "echo"
    assert run["handoff_at"] is not None, "SQS accepted the id, so the handoff is stamped"
    events = rows(api.url, "SELECT type, seq FROM run_events ORDER BY seq")
    assert events == [{"type": "run.queued", "seq": 1}]
    assert api.messages() == [{"run_id": answer.json["run_id"]}]


def test_replay_with_the_same_key_and_body_answers_the_first_response(api: Api) -> None:
    _, token = api.webhook_schedule()
    first = hook(api, token, {"n": 1}, headers={"idempotency-key": "k"})
    again = hook(api, token, {"n": 1}, headers={"idempotency-key": "k"})

    assert first.status == again.status == 202
    assert first.text == again.text
    assert count(api, "runs") == 1 and count(api, "webhook_receipts") == 1
    assert len(api.messages()) == 1, "a replay sends nothing"


def test_same_key_with_another_body_is_refused(api: Api) -> None:
    _, token = api.webhook_schedule()
    assert hook(api, token, {"n": 1}, headers={"idempotency-key": "k"}).status == 202

    answer = hook(api, token, {"n": 2}, headers={"idempotency-key": "k"})

    assert answer.status == 422
    assert answer.error["code"] == "idempotency_key_reused"
    assert answer.error["fields"][0]["field"] == "Idempotency-Key"
    assert count(api, "runs") == 1


def test_webhook_id_is_the_key_when_idempotency_key_is_absent(api: Api) -> None:
    _, token = api.webhook_schedule()
    a = hook(api, token, {"n": 1}, headers={"webhook-id": "msg_1"})
    b = hook(api, token, {"n": 1}, headers={"webhook-id": "msg_1"})
    c = hook(api, token, {"n": 1}, headers={"webhook-id": "msg_2"})
    assert a.text == b.text and a.json != c.json
    assert count(api, "runs") == 2


def test_without_a_key_every_delivery_is_a_new_run(api: Api) -> None:
    _, token = api.webhook_schedule()
    a = hook(api, token, {"n": 1})
    b = hook(api, token, {"n": 1})
    assert a.status == b.status == 202 and a.json != b.json
    assert count(api, "runs") == 2
    assert count(api, "webhook_receipts") == 0, "nothing to remember without a sender's key"


def test_bodies_that_are_not_storable_json_become_raw_text(api: Api) -> None:
    _, token = api.webhook_schedule()
    plain = hook(api, token, raw=b"a=1&b=2", headers={"content-type": "application/x-www-form-urlencoded"})
    nul = hook(api, token, raw=b'{"a": "\\u0000"}')
    surrogate = hook(api, token, raw=b'{"a": "\\ud800"}')
    binary = hook(api, token, raw=bytes(range(256)), headers={"content-type": "application/octet-stream"})
    empty = hook(api, token, raw=b"")
    assert [a.status for a in (plain, nul, surrogate, binary, empty)] == [202] * 5
    payloads = {r["id"]: r["payload"] for r in rows(api.url, "SELECT id::text, payload FROM runs")}
    assert payloads[plain.json["run_id"]] == {"raw": "a=1&b=2"}
    assert payloads[nul.json["run_id"]] == {"raw": '{"a": "\\u0000"}'}
    assert payloads[surrogate.json["run_id"]] == {"raw": '{"a": "\\ud800"}'}
    assert "raw" in payloads[binary.json["run_id"]]
    assert payloads[empty.json["run_id"]] == {"raw": ""}


def test_a_failed_send_still_answers_202_and_leaves_the_run_for_repair(api: Api,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _, token = api.webhook_schedule()
    monkeypatch.setenv("RUN_QUEUE_URL", api.queue_url + "-missing")
    from kairos import runtime

    runtime.reset()
    answer = hook(api, token, {"n": 1})

    assert answer.status == 202
    (run,) = rows(api.url, "SELECT state, handoff_at FROM runs")
    assert run == {"state": "queued", "handoff_at": None}, "committed first; the tick's repair sends it"


# ---- 404 --------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", ["paused", "cancelled", "completed"])
def test_paused_cancelled_completed_and_unknown_hooks_answer_the_same_404(api: Api, status: str) -> None:
    schedule, token = api.webhook_schedule()
    rows(api.url, "UPDATE schedules SET status = %(s)s WHERE id = %(id)s RETURNING id",
         {"s": status, "id": schedule["id"]})

    closed = hook(api, token, {"n": 1})
    unknown = hook(api, webhooks.new_token(), {"n": 1})

    assert closed.status == unknown.status == 404
    assert closed.text == unknown.text
    assert closed.headers == unknown.headers
    assert token not in closed.text
    assert count(api, "runs") == 0


# ---- 413 --------------------------------------------------------------------------------------


def test_bodies_over_64_kib_answer_413_and_the_limit_itself_is_accepted(api: Api) -> None:
    _, token = api.webhook_schedule()
    at_limit = b'"' + b"x" * (webhooks.MAX_BODY_BYTES - 2) + b'"'
    assert hook(api, token, raw=at_limit).status == 202

    over = hook(api, token, raw=at_limit + b" ")

    assert over.status == 413
    assert over.error["code"] == "payload_too_large"
    assert count(api, "runs") == 1


def test_too_large_is_decided_before_any_lookup(api: Api) -> None:
    answer = hook(api, "no-such-token", raw=b"x" * (webhooks.MAX_BODY_BYTES + 1))
    assert answer.status == 413, "size first: an unknown hook with a huge body is still 413"


# ---- 401: signatures ---------------------------------------------------------------------------

@pytest.fixture
def signing_env(api: Api) -> dict[str, str]:
    """alice's two signing secrets, stored through PUT /v1/secrets: scheme -> reference."""
    return {"standard": api.alice.secret("hook-standard", STANDARD_SECRET),
            "github": api.alice.secret("hook-github", GITHUB_SECRET)}


def test_standard_webhooks_signature(api: Api, signing_env: dict[str, str]) -> None:
    _, token = api.webhook_schedule(signing={"scheme": "standard", "secret": signing_env["standard"],
                                             "tolerance_seconds": 300})
    body = json.dumps({"type": "invoice.paid"}).encode()

    good = hook(api, token, raw=body, headers=standard_headers(body))
    tampered = hook(api, token, raw=body + b" ", headers=standard_headers(body, msg_id="msg_2"))
    stale = hook(api, token, raw=body, headers=standard_headers(body, msg_id="msg_3", at=int(time.time()) - 301))
    future = hook(api, token, raw=body, headers=standard_headers(body, msg_id="msg_4", at=int(time.time()) + 301))
    wrong_key = hook(api, token, raw=body, headers=standard_headers(
        body, msg_id="msg_5", secret="whsec_" + base64.b64encode(b"another").decode()))
    unsigned = hook(api, token, raw=body)

    assert good.status == 202, good.text
    for refused in (tampered, stale, future, wrong_key, unsigned):
        assert refused.status == 401, refused.text
        assert refused.error["code"] == "signature_invalid"
    assert count(api, "runs") == 1
    assert rows(api.url, "SELECT idempotency_key FROM occurrences") == [{"idempotency_key": "msg_1"}]


def test_github_signature(api: Api, signing_env: dict[str, str]) -> None:
    _, token = api.webhook_schedule(signing={"scheme": "github", "secret": signing_env["github"]})
    body = b'{"zen": "Design for failure."}'
    signature = "sha256=" + hmac.new(GITHUB_SECRET.encode(), body, hashlib.sha256).hexdigest()

    good = hook(api, token, raw=body, headers={"x-hub-signature-256": signature})
    bad = hook(api, token, raw=body + b"\n", headers={"x-hub-signature-256": signature})
    missing = hook(api, token, raw=body)

    assert good.status == 202
    assert bad.status == missing.status == 401
    assert count(api, "runs") == 1


def test_a_missing_signing_secret_refuses_rather_than_accepts(api: Api, signing_env: dict[str, str]) -> None:
    _, token = api.webhook_schedule(signing={"scheme": "github", "secret": signing_env["github"]})
    assert api.alice.delete("/v1/secrets/hook-github").status == 204
    body = b"{}"
    signature = "sha256=" + hmac.new(b"", body, hashlib.sha256).hexdigest()
    assert hook(api, token, raw=body, headers={"x-hub-signature-256": signature}).status == 401
    assert count(api, "runs") == 0


# ---- 429 --------------------------------------------------------------------------------------


def test_rate_limit_answers_429_with_retry_after(api: Api) -> None:
    schedule, token = api.webhook_schedule()
    rows(api.url, "UPDATE schedules SET rate_limit_per_minute = 3 WHERE id = %(id)s RETURNING id",
         {"id": schedule["id"]})
    accepted = [hook(api, token, {"n": i}, headers={"idempotency-key": f"k{i}"}) for i in range(3)]

    limited = hook(api, token, {"n": 3}, headers={"idempotency-key": "k3"})
    replay = hook(api, token, {"n": 0}, headers={"idempotency-key": "k0"})

    assert [a.status for a in accepted] == [202, 202, 202]
    assert limited.status == 429
    assert limited.error["code"] == "rate_limited"
    assert 1 <= int(limited.headers["Retry-After"]) <= 60
    assert replay.status == 202 and replay.text == accepted[0].text, "a replay is answered, not limited"
    assert count(api, "runs") == 3


def test_rate_window_moves_with_database_time(api: Api) -> None:
    schedule, token = api.webhook_schedule()
    rows(api.url, "UPDATE schedules SET rate_limit_per_minute = 2 WHERE id = %(id)s RETURNING id",
         {"id": schedule["id"]})
    database = Database(api.url)
    t0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
    try:
        def deliver(at: datetime, key: str) -> webhooks.Accepted:
            delivery = webhooks.Delivery(token, b"{}", {"idempotency-key": key})
            return webhooks.receive(database, delivery, now=at)

        deliver(t0, "a")
        deliver(t0 + timedelta(seconds=20), "b")
        with pytest.raises(RateLimited) as limited:
            deliver(t0 + timedelta(seconds=30), "c")
        assert limited.value.retry_after == 30, "the oldest of the last 2 leaves the window at t0 + 60 s"
        with pytest.raises(RateLimited) as still:
            deliver(t0 + timedelta(seconds=59), "c")
        assert still.value.retry_after == 1
        assert deliver(t0 + timedelta(seconds=60), "c").replayed is False, "Retry-After was honest"
    finally:
        database.close()


# ---- concurrency --------------------------------------------------------------------------------


def test_twenty_concurrent_posts_with_one_key_make_one_run(api: Api) -> None:
    _, token = api.webhook_schedule()
    barrier = threading.Barrier(20)

    def post(_: int) -> Answer:
        barrier.wait()
        return hook(api, token, {"same": "body"}, headers={"idempotency-key": "one-key"})

    with ThreadPoolExecutor(max_workers=20) as pool:
        answers = list(pool.map(post, range(20)))

    assert {a.status for a in answers} == {202}
    assert len({a.text for a in answers}) == 1, "every caller gets the first answer"
    assert count(api, "runs") == 1 and count(api, "occurrences") == 1 and count(api, "webhook_receipts") == 1
    assert rows(api.url, "SELECT count(*) AS n FROM run_events")[0]["n"] == 1
    assert len(api.messages()) == 1


def test_the_rate_limit_holds_under_twenty_concurrent_deliveries(api: Api) -> None:
    # Deliveries of one schedule serialize on its row lock: without it, several could count the same
    # window and all pass.
    schedule, token = api.webhook_schedule()
    rows(api.url, "UPDATE schedules SET rate_limit_per_minute = 5 WHERE id = %(id)s RETURNING id",
         {"id": schedule["id"]})
    barrier = threading.Barrier(20)

    def post(i: int) -> Answer:
        barrier.wait()
        return hook(api, token, {"i": i}, headers={"idempotency-key": f"key-{i}"})

    with ThreadPoolExecutor(max_workers=20) as pool:
        answers = list(pool.map(post, range(20)))

    assert sorted(a.status for a in answers) == [202] * 5 + [429] * 15
    assert count(api, "runs") == 5


def test_concurrent_posts_with_distinct_keys_each_get_their_own_answer(api: Api) -> None:
    schedule, token = api.webhook_schedule()
    barrier = threading.Barrier(12)

    def post(i: int) -> tuple[int, Answer]:
        barrier.wait()
        return i, hook(api, token, {"i": i}, headers={"idempotency-key": f"key-{i}"})

    with ThreadPoolExecutor(max_workers=12) as pool:
        answers = list(pool.map(post, range(12)))

    for i, answer in answers:
        expected = identity.occurrence_id(uuid.UUID(schedule["id"]), Source.WEBHOOK, key=f"key-{i}")
        assert answer.status == 202 and answer.json["occurrence_id"] == str(expected), "no crossed requests"
    payloads = {r["id"]: r["payload"] for r in rows(api.url, "SELECT id::text, payload FROM runs")}
    assert {payloads[a.json["run_id"]]["i"] for _, a in answers} == set(range(12))


# ---- rotation ---------------------------------------------------------------------------------


def test_rotation_keeps_the_old_token_for_the_overlap(api: Api) -> None:
    schedule, old = api.webhook_schedule()
    rotated = api.alice.post(f"/v1/schedules/{schedule['id']}/token", {"overlap_seconds": 3600})
    assert rotated.status == 200, rotated.text
    new = rotated.json["webhook"]["token"]
    assert rotated.json["webhook"]["url"] == f"https://kairos.example.test/v1/hooks/{new}"
    assert rotated.json["schedule"]["revision"] == schedule["revision"] + 1
    assert new != old

    assert hook(api, new, {"n": 1}).status == 202
    assert hook(api, old, {"n": 2}).status == 202, "inside the overlap the old token still works"
    rows(api.url, "UPDATE schedules SET previous_token_expires_at = now() - interval '1 second' "
                  "WHERE id = %(id)s RETURNING id", {"id": schedule["id"]})
    assert hook(api, old, {"n": 3}).status == 404, "after the overlap it is an unknown hook"
    assert hook(api, new, {"n": 4}).status == 202


def test_rotation_without_overlap_ends_the_old_token_at_once(api: Api) -> None:
    schedule, old = api.webhook_schedule()
    rotated = api.alice.post(f"/v1/schedules/{schedule['id']}/token", {"overlap_seconds": 0})
    assert hook(api, old).status == 404
    assert hook(api, rotated.json["webhook"]["token"]).status == 202


def test_rotation_defaults_and_refusals(api: Api) -> None:
    schedule, _ = api.webhook_schedule()
    default = api.alice.post(f"/v1/schedules/{schedule['id']}/token")
    assert default.status == 200
    (row,) = rows(api.url, "SELECT previous_token_expires_at - updated_at AS overlap FROM schedules")
    assert row["overlap"] == timedelta(days=1)

    too_long = api.alice.post(f"/v1/schedules/{schedule['id']}/token", {"overlap_seconds": 604_801})
    server_field = api.alice.post(f"/v1/schedules/{schedule['id']}/token", {"token_hash": "x"})
    foreign = api.bob.post(f"/v1/schedules/{schedule['id']}/token", {})
    assert too_long.status == 422 and too_long.error["fields"][0]["field"] == "overlap_seconds"
    assert server_field.status == 422 and server_field.error["fields"][0]["rule"] == "unknown_field"
    assert foreign.status == 404

    cron = api.alice.post("/v1/schedules", {"conversation_id": schedule["conversation_id"], "prompt": "p",
                                            "cron": "0 7 * * 1-5", "timezone": "Europe/Berlin"})
    not_a_hook = api.alice.post(f"/v1/schedules/{cron.json['schedule']['id']}/token", {})
    assert not_a_hook.status == 422 and not_a_hook.error["fields"][0]["rule"] == "webhook_only"
    api.alice.delete(f"/v1/schedules/{schedule['id']}")
    assert api.alice.post(f"/v1/schedules/{schedule['id']}/token", {}).status == 409


# ---- receipts -----------------------------------------------------------------------------------


def test_receipts_are_remembered_24_hours_then_pruned(api: Api) -> None:
    schedule, token = api.webhook_schedule()
    database = Database(api.url)
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    try:
        def deliver(at: datetime, body: bytes) -> webhooks.Accepted:
            return webhooks.receive(database, webhooks.Delivery(token, body, {"idempotency-key": "k"}), now=at)

        first = deliver(t0, b'{"v": 1}')
        assert deliver(t0 + timedelta(hours=23), b'{"v": 1}').replayed
        with pytest.raises(webhooks.IdempotencyMismatch):
            deliver(t0 + timedelta(hours=23), b'{"v": 2}')
        assert Prune(database).run_once(now=t0 + timedelta(hours=23)).webhook_receipts == 0
        # After 24 h the key is new again (issue 10, item 3): a new run with the new body, whose
        # receipt replaces the expired one and is the one pruned 24 h later.
        late = deliver(t0 + timedelta(hours=25), b'{"v": 2}')
        assert not late.replayed and late.run_id != first.run_id
        assert Prune(database).run_once(now=t0 + timedelta(hours=48)).webhook_receipts == 0
        assert Prune(database).run_once(now=t0 + timedelta(hours=49)).webhook_receipts == 1
        assert count(api, "runs") == 2 and count(api, "webhook_receipts") == 0
    finally:
        database.close()
    assert schedule["kind"] == "webhook"


def test_library_lookup_is_scoped_to_active_webhook_schedules(api: Api) -> None:
    schedule, token = api.webhook_schedule()
    database = Database(api.url)
    try:
        with database.transaction() as conn:
            found = webhooks.find(conn, token)
            assert found is not None and str(found["id"]) == schedule["id"]
            assert webhooks.find(conn, token + "x") is None
        with pytest.raises(NotFound) as missing:
            webhooks.receive(database, webhooks.Delivery("nope", b"", {}))
        assert missing.value.message == "hook not found"
    finally:
        database.close()


# ---- secrecy ----------------------------------------------------------------------------------


def test_the_raw_token_is_in_no_log_line_and_no_table(api: Api, capfd: pytest.CaptureFixture[str],
                                                     caplog: pytest.LogCaptureFixture,
                                                     signing_env: dict[str, str]) -> None:
    caplog.set_level("DEBUG")
    output = powertools_output()
    buffer = output.__enter__()
    schedule, token = api.webhook_schedule()
    signed, signed_token = api.webhook_schedule(
        signing={"scheme": "github", "secret": signing_env["github"]})
    body = b'{"n": 1}'
    signature = "sha256=" + hmac.new(GITHUB_SECRET.encode(), body, hashlib.sha256).hexdigest()
    hook(api, token, {"n": 1}, headers={"idempotency-key": "a"})
    hook(api, token, {"n": 1}, headers={"idempotency-key": "a"})
    hook(api, token, {"n": 2}, headers={"idempotency-key": "a"})
    hook(api, token + "x", {"n": 1})
    hook(api, token, raw=b"x" * (webhooks.MAX_BODY_BYTES + 1))
    hook(api, signed_token, raw=body, headers={"x-hub-signature-256": signature})
    hook(api, signed_token, raw=body, headers={"x-hub-signature-256": "sha256=00"})
    rotated = api.alice.post(f"/v1/schedules/{schedule['id']}/token", {"overlap_seconds": 60})
    new_token = rotated.json["webhook"]["token"]
    hook(api, new_token, {"n": 3})
    api.alice.delete(f"/v1/schedules/{schedule['id']}")
    hook(api, new_token, {"n": 4})

    output.__exit__(None, None, None)
    captured = capfd.readouterr()
    records = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    logged = buffer.getvalue() + captured.out + captured.err + records
    assert '"route":"POST /v1/hooks/{token}"' in logged, "the access lines are there"
    secrets = (token, signed_token, new_token)
    for secret in secrets:
        assert secret not in logged
    assert signed["id"] in logged
    with psycopg.connect(api.url, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()]
        assert {"schedules", "runs", "occurrences", "webhook_receipts", "run_event_batches"} <= set(tables)
        for table in tables:
            dump = "\n".join(r[0] for r in conn.execute(f"SELECT t::text FROM {table} t").fetchall())
            for secret in secrets:
                assert secret not in dump, f"raw token stored in {table}"
            if table == "schedules":
                assert webhooks.hash_token(new_token) in dump, "the hash is what is stored"
