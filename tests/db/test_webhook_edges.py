"""Hostile webhook deliveries through the API handler, on real PostgreSQL (issue 10, items 9 and 10).

Each was reproduced on the local stack: a captured signed delivery re-posted under a fresh unsigned
``Idempotency-Key``; bodies with ``NaN``/``Infinity``/``1e999`` (500, and the payload in the error log
through PostgreSQL's error context); a database error on this route (503, nothing of the payload, the
SQL or the token in any log); 500s from an overflowing ``webhook-timestamp``, NUL and non-ASCII
characters in the key headers; and ``POST /v1/hooks/`` answering another 404 than every unknown hook.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid

import psycopg
import pytest

from tests.support.api import GITHUB_SECRET, STANDARD_SECRET, Api, count, hook, rows, standard_headers
from tests.support.logs import powertools_output


@pytest.fixture
def signing_env(api: Api) -> dict[str, str]:
    """alice's two signing secrets (as in test_webhooks), stored through PUT /v1/secrets: scheme -> reference."""
    return {"standard": api.alice.secret("hook-standard", STANDARD_SECRET),
            "github": api.alice.secret("hook-github", GITHUB_SECRET)}


def github_headers(body: bytes, **extra: str) -> dict[str, str]:
    return {"x-hub-signature-256": "sha256=" + hmac.new(GITHUB_SECRET.encode(), body, hashlib.sha256).hexdigest(),
            **extra}


# ---- replays of signed deliveries -------------------------------------------------------------------


def test_a_captured_standard_webhooks_delivery_replayed_with_new_keys_makes_one_run(
        api: Api, signing_env: dict[str, str]) -> None:
    _, token = api.webhook_schedule(signing={"scheme": "standard", "secret": signing_env["standard"]})
    body = json.dumps({"type": "invoice.paid", "amount": 100}).encode()
    captured = standard_headers(body, msg_id="msg_captured")

    original = hook(api, token, raw=body, headers=captured)
    replays = [hook(api, token, raw=body, headers={**captured, "idempotency-key": f"attacker-{i}"})
               for i in range(3)]

    assert original.status == 202, original.text
    for replay in replays:
        assert replay.status == 202 and replay.text == original.text, "the signed id decides, not the header"
    assert count(api, "runs") == 1
    assert rows(api.url, "SELECT idempotency_key FROM occurrences") == [{"idempotency_key": "msg_captured"}]


def test_a_github_signed_redelivery_with_a_new_idempotency_key_is_the_same_delivery(
        api: Api, signing_env: dict[str, str]) -> None:
    _, token = api.webhook_schedule(signing={"scheme": "github", "secret": signing_env["github"]})
    body = b'{"ref": "refs/heads/main"}'
    headers = github_headers(body, **{"x-github-delivery": "d3b07384-d9a0-4c9b-8f1e-000000000001"})

    original = hook(api, token, raw=body, headers=headers)
    replay = hook(api, token, raw=body, headers={**headers, "idempotency-key": "attacker-1"})

    assert original.status == replay.status == 202
    assert replay.text == original.text
    assert count(api, "runs") == 1


def test_a_captured_github_body_replayed_under_any_delivery_id_or_none_answers_the_first_run(
        api: Api, signing_env: dict[str, str]) -> None:
    """GitHub signs the body alone: re-posting it without X-GitHub-Delivery, or with a new one, verifies.
    The body's digest is remembered for the receipt window, so each replay answers the first run."""
    _, token = api.webhook_schedule(signing={"scheme": "github", "secret": signing_env["github"]})
    body = b'{"action": "opened", "number": 7}'
    original = hook(api, token, raw=body, headers=github_headers(body, **{"x-github-delivery": "first-delivery"}))

    replays = [hook(api, token, raw=body, headers=github_headers(body)),
               hook(api, token, raw=body, headers=github_headers(body, **{"x-github-delivery": "new-delivery"})),
               hook(api, token, raw=body, headers=github_headers(body, **{"idempotency-key": "new-key"}))]

    assert original.status == 202, original.text
    for replay in replays:
        assert replay.status == 202 and replay.text == original.text
    assert count(api, "runs") == 1 and len(api.messages()) == 1  # the replays handed nothing to SQS
    # Another body is another delivery; so is the same body once the receipt window has passed.
    other = b'{"action": "closed", "number": 7}'
    assert hook(api, token, raw=other, headers=github_headers(other)).status == 202
    assert count(api, "runs") == 2
    with psycopg.connect(api.url, autocommit=True) as conn:
        conn.execute("UPDATE webhook_receipts SET expires_at = now() - interval '1 second'")
    later = hook(api, token, raw=body, headers=github_headers(body))
    assert later.status == 202 and later.json["run_id"] != original.json["run_id"]
    assert count(api, "runs") == 3


def test_an_unsigned_hook_still_takes_the_same_body_twice(api: Api) -> None:
    """Only a schedule verifying GitHub signatures remembers bodies: elsewhere a repeated body is a new
    delivery unless it repeats a key."""
    _, token = api.webhook_schedule()
    first, second = hook(api, token, {"n": 1}), hook(api, token, {"n": 1})
    assert first.status == second.status == 202 and first.json["run_id"] != second.json["run_id"]


# ---- bodies PostgreSQL's jsonb refuses ----------------------------------------------------------------


@pytest.mark.parametrize("text", ['{"a": NaN}', '{"a": Infinity}', '{"a": -Infinity}', '{"a": 1e999}', "[1e999]"])
def test_non_json_numbers_are_kept_as_raw_text(api: Api, text: str) -> None:
    _, token = api.webhook_schedule()
    answer = hook(api, token, raw=text.encode())
    assert answer.status == 202, answer.text
    (run,) = rows(api.url, "SELECT payload FROM runs")
    assert run["payload"] == {"raw": text}


# ---- a database error on this route --------------------------------------------------------------------

MARKER = "payload-marker-7f3a"


def test_a_database_error_answers_503_and_logs_no_payload_sql_or_token(
        api: Api, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    _, token = api.webhook_schedule()
    # A real PostgreSQL error whose text quotes the payload (as jsonb's "Token NaN is invalid ... JSON data,
    # line 1: {"a": NaN" did): the route must not carry it into any log line.
    with psycopg.connect(api.url, autocommit=True) as conn:
        conn.execute("""
            CREATE FUNCTION refuse_run() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION 'refused: %', NEW.payload::text USING DETAIL = NEW.payload::text;
            END $$;
            CREATE TRIGGER refuse_run BEFORE INSERT ON runs FOR EACH ROW EXECUTE FUNCTION refuse_run();
        """)
    caplog.set_level("DEBUG")
    with powertools_output() as buffer:
        answer = hook(api, token, {"secret": MARKER}, headers={"idempotency-key": "db-error-1"})

    captured = capfd.readouterr()
    records = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    logged = buffer.getvalue() + captured.out + captured.err + records
    assert MARKER not in logged, "the payload leaked into a log line"
    assert "refused:" not in logged and "INSERT INTO" not in logged, "database error text leaked"
    assert token not in logged
    assert '"action":"webhook_database_error"' in logged, "one line says what failed"
    assert '"sqlstate":"P0001"' in logged
    assert answer.status == 503, answer.text
    assert answer.error["code"] == "service_unavailable"
    assert MARKER not in answer.text and "INSERT" not in answer.text
    assert count(api, "runs") == 0 and count(api, "occurrences") == 0, "nothing was accepted"
    assert api.messages() == []


# ---- 4xx, never 500 ---------------------------------------------------------------------------------------


def test_an_overflowing_or_non_ascii_webhook_timestamp_is_a_401(api: Api, signing_env: dict[str, str]) -> None:
    _, token = api.webhook_schedule(signing={"scheme": "standard", "secret": signing_env["standard"]})
    body = b'{"n": 1}'
    now = str(int(time.time()))
    arabic_digits = "".join(chr(0x0660 + int(d)) for d in now)  # int() accepts these; the standard does not
    for stamp in ("1" + "0" * 400, "9" * 4000, arabic_digits, "1e400", "+" + now):
        headers = standard_headers(body, msg_id=f"msg-{len(stamp)}")
        headers["webhook-timestamp"] = stamp
        answer = hook(api, token, raw=body, headers=headers)
        assert answer.status == 401, (stamp[:20], answer.text)
        assert answer.error["code"] == "signature_invalid"
    assert count(api, "runs") == 0


@pytest.mark.parametrize("header", ["idempotency-key", "webhook-id", "x-github-delivery"])
@pytest.mark.parametrize("value", ["a\x00b", "clé-ünïcode", "a\udcffb", "tab\there"])
def test_a_key_header_with_nul_or_non_ascii_is_a_422_naming_it(api: Api, header: str, value: str) -> None:
    _, token = api.webhook_schedule()
    answer = hook(api, token, {"n": 1}, headers={header: value})
    assert answer.status == 422, answer.text
    (field,) = answer.error["fields"]
    assert field["field"].lower() == header and field["rule"] == "invalid_character"
    assert count(api, "runs") == 0


def test_a_signed_delivery_with_a_nul_in_its_signed_id_is_a_422(api: Api, signing_env: dict[str, str]) -> None:
    _, token = api.webhook_schedule(signing={"scheme": "standard", "secret": signing_env["standard"]})
    body = b'{"n": 1}'
    answer = hook(api, token, raw=body, headers=standard_headers(body, msg_id="msg\x00evil"))
    assert answer.status == 422, answer.text
    assert answer.error["fields"][0]["field"] == "webhook-id"


def test_non_ascii_or_unencodable_signatures_are_a_401(api: Api, signing_env: dict[str, str]) -> None:
    _, standard = api.webhook_schedule(signing={"scheme": "standard", "secret": signing_env["standard"]})
    _, github = api.webhook_schedule(signing={"scheme": "github", "secret": signing_env["github"]})
    body = b'{"n": 1}'
    for bad in ("v1,é", "v1,\udcff"):
        headers = {**standard_headers(body, msg_id="m1"), "webhook-signature": bad}
        assert hook(api, standard, raw=body, headers=headers).status == 401
    unencodable_id = standard_headers(body, msg_id="m2")
    unencodable_id["webhook-id"] = "m\udcff"
    assert hook(api, standard, raw=body, headers=unencodable_id).status == 401
    for bad in ("sha256=é", "sha256=\udcff"):
        assert hook(api, github, raw=body, headers={"x-hub-signature-256": bad}).status == 401
    assert count(api, "runs") == 0


# ---- one 404 for every unknown hook -----------------------------------------------------------------------


def test_an_empty_token_answers_exactly_like_an_unknown_one(api: Api) -> None:
    unknown = hook(api, "no-such-token-" + uuid.uuid4().hex, {"n": 1})
    empty = api.anonymous.post("/v1/hooks/", {"n": 1})
    nested = api.anonymous.post("/v1/hooks/a/b", {"n": 1})

    assert unknown.status == empty.status == nested.status == 404
    assert empty.text == unknown.text == nested.text
    assert unknown.error["message"] == "hook not found"
    assert empty.headers == unknown.headers
