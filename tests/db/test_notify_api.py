"""``notify`` through the API and the whole tick: written with ``POST /v1/schedules`` (422s naming field
and rule, nothing stored), shown on the schedule with the secret's reference only, and delivered by
``Tick.run`` signed with the owner's key from (moto's) Secrets Manager."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

import pytest

from kairos.db import Database
from kairos.tick import Tick
from tests import factories
from tests.support.api import Api, rows
from tests.support.peer import Peer, respond

KEY = b"fedcba9876543210fedcba9876543210"
SECRET = "whsec_" + base64.b64encode(KEY).decode()


def create(api: Api, conversation: str, **fields: Any) -> Any:
    return api.alice.post("/v1/schedules", {"conversation_id": conversation, "prompt": "report",
                                            "cron": "0 7 * * 1", "timezone": "Europe/Paris", **fields})


def test_notify_defaults_to_every_unhappy_end_and_shows_only_the_reference(api: Api,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAIROS_EGRESS_ALLOW", "hooks.internal")
    conversation = str(api.conversation()["id"])
    plain = create(api, conversation)
    assert plain.status == 201, plain.text
    assert plain.json["schedule"]["notify"] == {"on": ["failed", "abandoned", "expired", "policy_blocked"]}

    reference = api.alice.secret("hook", SECRET)
    notify = {"on": ["succeeded", "failed"], "webhook": {"url": "http://hooks.internal/kairos", "secret": reference}}
    hooked = create(api, conversation, notify=notify)
    assert hooked.status == 201, hooked.text
    shown = api.alice.get(f"/v1/schedules/{hooked.json['schedule']['id']}").json["schedule"]
    assert shown["notify"] == notify and SECRET not in json.dumps(shown)
    stored = rows(api.url, "SELECT notify FROM schedules WHERE id = %(id)s", {"id": shown["id"]})
    assert stored == [{"notify": notify}]


def test_bad_notify_fields_come_back_together_and_store_nothing(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAIROS_EGRESS_ALLOW", raising=False)
    conversation = str(api.conversation()["id"])
    bobs = api.bob.secret("hook", SECRET)
    cases: list[tuple[dict[str, Any], set[tuple[str, str]]]] = [
        ({"on": ["running", "failed"]}, {("notify.on", "terminal_state")}),
        ({"on": ["failed"], "email": "me@example.com"}, {("notify.email", "unknown_field")}),
        ({"webhook": {"url": "http://hooks.example.com/x", "secret": "whsec_literal"}},
         {("notify.webhook.url", "https_required"), ("notify.webhook.secret", "secret_reference")}),
        ({"webhook": {"url": "ftp://hooks.example.com/x", "secret": bobs}},
         {("notify.webhook.url", "url")}),
        ({"webhook": {"url": "https://hooks.example.com/x", "secret": bobs}},
         {("notify.webhook.secret", "secret_reference")}),
        ("failed", {("notify", "type")}),
    ]
    for notify, expected in cases:
        answer = create(api, conversation, notify=notify, mode="copy")
        assert answer.status == 422, answer.text
        found = {(f["field"], f["rule"]) for f in answer.error["fields"]}
        assert found == expected | {("mode", "enum")}, (notify, found)
        assert "whsec_literal" not in answer.text
    assert rows(api.url, "SELECT id FROM schedules") == []


def test_the_tick_reports_a_failed_run_to_the_inbox_and_the_webhook(api: Api, db: Database,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAIROS_EGRESS_ALLOW", "127.0.0.1")
    with Peer(respond(202, "")) as receiver:
        conversation = str(api.conversation()["id"])
        reference = api.alice.secret("hook", SECRET)
        answer = create(api, conversation, notify={"webhook": {"url": receiver.url("/kairos"), "secret": reference}})
        assert answer.status == 201, answer.text
        schedule = rows(api.url, "SELECT * FROM schedules WHERE id = %(id)s", {"id": answer.json["schedule"]["id"]})[0]
        run = factories.run(api.url, schedule_row=schedule, state="failed")
        tick = Tick(db, api.sqs, api.queue_url, metrics=None, egress_allow=("127.0.0.1",))
        report = tick.run()
        assert (report.notes, report.notify_delivered) == (1, 1)
        assert tick.run().notify_delivered == 0
    (received,) = receiver.received
    headers = received.headers
    assert headers["webhook-id"] == str(run["id"])
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + received.body
    assert headers["webhook-signature"] == "v1," + base64.b64encode(
        hmac.new(KEY, signed, hashlib.sha256).digest()).decode()
    assert json.loads(received.body) == {"type": "run.failed", "run_id": str(run["id"]),
                                         "schedule_id": str(schedule["id"])}
    inbox = api.alice.get(f"/v1/conversations/{conversation}/inbox").json["notes"]
    assert [n["kind"] for n in inbox] == ["run_ended"]
    assert rows(api.url, "SELECT state, attempts FROM notify_deliveries") == [{"state": "delivered", "attempts": 1}]


def test_notify_is_edited_as_a_new_revision_and_null_restores_the_default(api: Api) -> None:
    conversation = str(api.conversation()["id"])
    reference = api.alice.secret("hook", SECRET)
    created = create(api, conversation).json["schedule"]
    path = f"/v1/schedules/{created['id']}"
    notify = {"on": ["succeeded"], "webhook": {"url": "https://hooks.example.com/k", "secret": reference}}

    edited = api.alice.patch(path, {"notify": notify})
    assert edited.status == 200, edited.text
    assert edited.json["schedule"]["notify"] == notify
    assert edited.json["schedule"]["revision"] == created["revision"] + 1
    kept = api.alice.patch(path, {"name": "renamed"})  # other edits keep it
    assert kept.status == 200 and kept.json["schedule"]["notify"] == notify
    refused = api.alice.patch(path, {"notify": {"on": ["queued"]}})
    assert refused.status == 422 and [(f["field"], f["rule"]) for f in refused.error["fields"]] == [
        ("notify.on", "terminal_state")]
    reset = api.alice.patch(path, {"notify": None})
    assert reset.json["schedule"]["notify"] == {"on": ["failed", "abandoned", "expired", "policy_blocked"]}

    history = rows(api.url, "SELECT revision, definition -> 'notify' AS notify FROM schedule_revisions "
                            "WHERE schedule_id = %(id)s ORDER BY revision", {"id": created["id"]})
    assert [h["notify"] for h in history][1:] == [notify, notify, reset.json["schedule"]["notify"]]
    assert SECRET not in json.dumps(history)
