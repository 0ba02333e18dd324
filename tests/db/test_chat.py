"""Chat turns on real PostgreSQL: a message is a chat run of no schedule that appends the agent's
answer; a conversation's turns run one at a time in order; the tick settles and releases them."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg.rows import dict_row

from kairos.db import Database
from kairos.execution.execute import process
from kairos.settings import Settings
from kairos.tick import Tick
from tests.support.api import Api
from tests.support.executors import ScriptedExecutor


def rows(url: str, query: str, *args: Any) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        return conn.execute(query, args).fetchall()


def test_a_message_is_a_chat_run_that_appends_the_answer_to_the_conversation(api: Api, db: Database) -> None:
    conversation = api.conversation()

    answer = api.alice.post(f"/v1/conversations/{conversation['id']}/messages", {"content": "What is new?"})

    assert answer.status == 202, answer.text
    [run] = rows(api.url, "SELECT * FROM runs WHERE id = %s", answer.json["run_id"])
    assert (run["source"], run["mode"], run["schedule_id"], run["prompt"]) == ("chat", "append", None, "What is new?")
    [occurrence] = rows(api.url, "SELECT * FROM occurrences WHERE id = %s", answer.json["occurrence_id"])
    assert (occurrence["source"], occurrence["schedule_id"], occurrence["decision"]) == ("chat", None, "dispatched")
    assert [m["run_id"] for m in api.messages()] == [answer.json["run_id"]]
    read = api.alice.get(f"/v1/runs/{run['id']}")
    assert read.status == 200 and read.json["run"]["schedule_id"] is None and read.json["run"]["source"] == "chat"

    outcome = process(db, run["id"], settings=Settings(), executor_factory=ScriptedExecutor().factory)

    assert outcome.result == "succeeded"
    entries = api.alice.get(f"/v1/conversations/{conversation['id']}").json["conversation"]["entries"]
    assert [(e["role"], e["content"]) for e in entries] == [("user", "What is new?"), ("assistant", "the answer")]
    Tick(db, api.sqs, api.queue_url, metrics=None).run()
    assert rows(api.url, "SELECT settled_at IS NOT NULL AS settled FROM runs WHERE id = %s", run["id"]) == [
        {"settled": True}]


def test_turns_of_one_conversation_run_one_at_a_time_in_order(api: Api, db: Database) -> None:
    conversation = api.conversation()
    path = f"/v1/conversations/{conversation['id']}/messages"
    first = api.alice.post(path, {"content": "one"}).json["run_id"]
    second = api.alice.post(path, {"content": "two"}).json["run_id"]
    assert [m["run_id"] for m in api.messages()] == [first]  # the second waits
    [waiting] = rows(api.url, "SELECT blocked_by_run_id FROM runs WHERE id = %s", second)
    assert str(waiting["blocked_by_run_id"]) == first

    process(db, uuid.UUID(first), settings=Settings(), executor_factory=ScriptedExecutor().factory)
    Tick(db, api.sqs, api.queue_url, metrics=None).run()  # releases the second turn and sends it
    assert [m["run_id"] for m in api.messages()] == [second]
    process(db, uuid.UUID(second), settings=Settings(), executor_factory=ScriptedExecutor().factory)
    entries = rows(api.url, "SELECT role, content FROM conversation_entries WHERE conversation_id = %s ORDER BY seq",
                   conversation["id"])
    assert [(e["role"], e["content"]) for e in entries] == [
        ("user", "one"), ("assistant", "the answer"), ("user", "two"), ("assistant", "the answer")]


def test_a_refused_message_names_the_field_and_the_rule_and_records_nothing(api: Api) -> None:
    conversation = api.conversation()
    path = f"/v1/conversations/{conversation['id']}/messages"
    cases: list[tuple[Any, str, str]] = [
        ({}, "content", "required"),
        ({"content": "   "}, "content", "min_length"),
        ({"content": 7}, "content", "type"),
        ({"content": "x" * 32_769}, "content", "max_bytes"),
        ({"content": "hi", "role": "system"}, "role", "unknown_field"),
    ]
    for body, field, rule in cases:
        answer = api.alice.post(path, body)
        assert answer.status == 422, (body, answer.text)
        assert (field, rule) in {(f["field"], f["rule"]) for f in answer.error["fields"]}, answer.text
    assert api.alice.post(path, [1]).status == 422
    assert rows(api.url, "SELECT 1 FROM runs WHERE source = 'chat'") == []
    foreign = api.bob.post(path, {"content": "hi"})
    missing = api.bob.post(f"/v1/conversations/{uuid.uuid4()}/messages", {"content": "hi"})
    assert foreign.status == missing.status == 404 and foreign.text == missing.text


def test_a_retried_post_with_an_idempotency_key_makes_one_turn(api: Api) -> None:
    conversation = api.conversation()
    path = f"/v1/conversations/{conversation['id']}/messages"
    first = api.alice.post(path, {"content": "once"}, headers={"Idempotency-Key": "turn-1"})
    again = api.alice.post(path, {"content": "once"}, headers={"Idempotency-Key": "turn-1"})
    assert first.status == again.status == 202 and first.json == again.json
    other = api.alice.post(path, {"content": "another"}, headers={"Idempotency-Key": "turn-1"})
    assert other.status == 422
    assert len(rows(api.url, "SELECT 1 FROM runs WHERE source = 'chat'")) == 1
