"""The sample events in ``events/api_*.json`` (the shapes ``sam local generate-event`` makes, with the
JWT authorizer's claims) go through the handler as they are: every one answers 2xx once the objects
they name exist for their principal. This holds the template's sample events and the API together."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kairos import runtime, webhooks
from tests import factories
from tests.support.api import HANDLER, Api, rows
from tests.support.aws import LambdaContext

EVENTS = Path(__file__).resolve().parents[2] / "events"
# Reads and edits first, the hook before its token rotates, cancellations last.
ORDER = [
    "api_openapi", "api_put_secret", "api_list_secrets", "api_create_conversation", "api_create_schedule",
    "api_create_webhook_schedule",
    "api_get_conversation", "api_get_inbox", "api_post_message", "api_list_schedules", "api_get_schedule",
    "api_preview_schedule", "api_list_occurrences", "api_list_runs", "api_list_conversations",
    "api_edit_schedule", "api_pause_schedule", "api_resume_schedule", "api_hook", "api_rotate_token",
    "api_trigger_schedule", "api_test_schedule", "api_backfill_schedule", "api_retry_run", "api_list_approvals",
    "api_get_approval",
    "api_approve", "api_deny", "api_list_input_requests", "api_answer_input_request", "api_create_loop",
    "api_get_loop", "api_edit_loop", "api_get_run", "api_run_events", "api_run_steps",
    "api_run_output", "api_run_corpus", "api_run_corpus_records", "api_pause_run", "api_resume_run",
    "api_get_usage", "api_get_status", "api_console_root", "api_console_index", "api_console_file",
    "api_cancel_run", "api_cancel_schedule", "api_delete_secret",
]


def load(name: str) -> dict[str, Any]:
    return dict(json.loads((EVENTS / f"{name}.json").read_text()))


def test_every_api_sample_event_is_covered() -> None:
    assert sorted(p.stem for p in EVENTS.glob("api_*.json")) == sorted(ORDER)


def test_the_sample_events_answer_2xx_in_jwt_mode(api: Api, monkeypatch: pytest.MonkeyPatch,
                                                  lambda_context: LambdaContext) -> None:
    monkeypatch.setenv("KAIROS_AUTH", "jwt")
    # The sample conversation's agent names the operator's shared OpenAI key, sent only to its host.
    monkeypatch.setenv("KAIROS_SHARED_SECRETS", "env:OPENAI_API_KEY@api.openai.com")
    runtime.reset()
    principal = load("api_get_schedule")["requestContext"]["authorizer"]["jwt"]["claims"]["sub"]
    conversation_id = load("api_get_conversation")["pathParameters"]["id"]
    schedule_id = load("api_get_schedule")["pathParameters"]["id"]
    run_id = load("api_get_run")["pathParameters"]["id"]
    token = load("api_hook")["pathParameters"]["token"]
    rows(api.url, "INSERT INTO conversations (id, owner, title, agent) VALUES (%(id)s, %(owner)s, 'sample', "
                  "%(agent)s) RETURNING id",
         {"id": conversation_id, "owner": principal, "agent": json.dumps(factories.ECHO_AGENT)})
    schedule = factories.schedule(api.url, owner=principal, conversation_id=conversation_id, kind="webhook",
                                  id=schedule_id, token_hash=webhooks.hash_token(token))
    factories.run(api.url, schedule_row=schedule, id=run_id)
    # The backfill sample's cron schedule existed before its window; the retry sample's run failed.
    factories.schedule(api.url, owner=principal, conversation_id=conversation_id,
                       id=load("api_backfill_schedule")["pathParameters"]["id"],
                       created_at=datetime(2025, 12, 1, tzinfo=UTC))
    factories.run(api.url, schedule_row=schedule, id=load("api_retry_run")["pathParameters"]["id"], state="failed",
                  fire_at=datetime(2026, 1, 5, tzinfo=UTC))
    # The corpus samples' run: a queued corpus run of inline items (paused, then resumed).
    factories.run(api.url, schedule_row=schedule, id=load("api_run_corpus")["pathParameters"]["id"],
                  source="manual", fire_at=datetime(2026, 1, 4, tzinfo=UTC), corpus=json.dumps(
                      {"source": {"items": ["a"]}, "instructions": "x", "partition_size": 20, "max_items": 1,
                       "formats": ["jsonl"]}))
    # Two runs parked for approval: one request is approved, the other denied.
    for n, name in enumerate(("api_approve", "api_deny")):
        waiting = factories.run(api.url, schedule_row=schedule, state="awaiting_approval",
                                fire_at=datetime(2026, 1, 6 + n, tzinfo=UTC))
        factories.approval(api.url, run_row=waiting, id=load(name)["pathParameters"]["id"])

    # The loop samples: a conversation whose agent calls tools, a loop, and a run of it waiting on a question.
    loop_conversation = json.loads(load("api_create_loop")["body"])["conversation_id"]
    rows(api.url, "INSERT INTO conversations (id, owner, title, agent) VALUES (%(id)s, %(owner)s, 'loops', "
                  "%(agent)s) RETURNING id",
         {"id": loop_conversation, "owner": principal, "agent": json.dumps({
             "executor": "openai", "model": "gpt-4o-mini", "base_url": "https://api.openai.com/v1",
             "api_key_secret": "env:OPENAI_API_KEY"})})
    loop = factories.loop(api.url, owner=principal, conversation_id=loop_conversation,
                          id=load("api_get_loop")["pathParameters"]["id"])
    asking = factories.run(api.url, schedule_row=loop, state="awaiting_input", attempt=1, fence=1,
                           fire_at=datetime(2026, 1, 8, tzinfo=UTC))
    factories.input_request(api.url, run_row=asking, id=load("api_answer_input_request")["pathParameters"]["id"])

    for name in ORDER:
        event = load(name)
        if name == "api_create_loop":  # a loop ends at most 90 days ahead: the sample's end, moved to now
            event["body"] = json.dumps({**json.loads(event["body"]),
                                        "ends_at": (datetime.now(UTC) + timedelta(days=30)).isoformat()})
        answer = HANDLER(event, lambda_context)
        # /console redirects to /console/ (the page's relative imports resolve under it).
        expected = (308, 309) if name == "api_console_root" else (200, 300)
        assert expected[0] <= answer["statusCode"] < expected[1], (name, answer["body"])
    assert rows(api.url, "SELECT state FROM runs WHERE id = %(id)s", {"id": run_id}) == [{"state": "cancelled"}]
    assert len(rows(api.url, "SELECT id FROM runs WHERE source = 'webhook'")) == 1
