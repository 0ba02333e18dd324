"""A model reply the database cannot store — a NUL in its text or in a tool call's arguments, a number
that is not finite, a lone surrogate, a token count no call can have — ends its run ``failed``
(``unstorable_reply``, not retry-eligible) at once, after exactly one call to a real local
OpenAI-compatible server, and nothing of the reply reaches the logs or the database — but its usage
does: the server answered and billed the call, so the run, the day and the ledger count it."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from kairos.db import Database
from kairos.execution.execute import process
from tests import factories
from tests.support.executors import OPENAI_SETTINGS, FakeOpenAI, openai_agent

MARK = "LEAKMARK7f3a"  # in every reply: it must appear in no log line and no row


def completion(message: str, usage: str = '{"prompt_tokens": 21, "completion_tokens": 7, "total_tokens": 28}',
               ) -> bytes:
    """A chat completion written by hand, so it can hold what ``json.dumps`` would never write."""
    return ('{"id": "chatcmpl-x", "object": "chat.completion", "choices": [{"index": 0, '
            f'"finish_reason": "stop", "message": {message}}}], "usage": {usage}}}').encode()


def tool_message(arguments: str) -> str:
    return ('{"role": "assistant", "content": null, "tool_calls": [{"id": "call-1", "type": "function", '
            f'"function": {{"name": "schedules_list", "arguments": {json.dumps(arguments)}}}}}]}}')


CASES = {
    "nul_in_content": completion(f'{{"role": "assistant", "content": "{MARK} before\\u0000after"}}'),
    "lone_surrogate_in_content": completion(f'{{"role": "assistant", "content": "{MARK} \\ud800"}}'),
    "nan_in_tool_arguments": completion(tool_message(f'{{"note": "{MARK}", "n": NaN}}')),
    "infinity_in_tool_arguments": completion(tool_message(f'{{"note": "{MARK}", "n": 1e999}}')),
    "nul_in_tool_arguments": completion(tool_message(f'{{"note": "{MARK}\\u0000"}}')),
    "nul_in_a_tool_arguments_key": completion(tool_message(f'{{"{MARK}\\u0000": 1}}')),
    "usage_at_2_63": completion(f'{{"role": "assistant", "content": "{MARK}"}}',
                                '{"prompt_tokens": 9223372036854775808, "completion_tokens": 7}'),
    "negative_usage": completion(f'{{"role": "assistant", "content": "{MARK}"}}',
                                 '{"prompt_tokens": 21, "completion_tokens": -7}'),
}

# The (input, output) tokens each case is counted with when not the answered 21 and 7: the count that
# is out of range is the unstorable part, and is counted 0; the other count is the provider's.
COUNTED = {"usage_at_2_63": (0, 7), "negative_usage": (21, 0)}


def rows(url: str, query: str, *args: Any) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        return conn.execute(query, args).fetchall()


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_unstorable_reply_fails_the_run_at_once_after_one_call_and_is_never_logged(
        db: Database, db_url: str, fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture, case: str) -> None:
    caplog.set_level(logging.DEBUG)
    # Given a run of an agent with tools (a tool loop) and a model that answers the case's body
    agent = {**openai_agent(fake_openai), "tools": ["schedules"], "approval": "never"}
    conversation = factories.conversation(db_url, agent=agent)
    schedule = factories.schedule(db_url, conversation_id=conversation["id"], agent=agent)
    run = factories.run(db_url, schedule_row=schedule, source="manual")
    run_id = uuid.UUID(str(run["id"]))
    fake_openai.script = [{"raw": CASES[case]}]

    # When a worker takes the run (and another delivery of it comes)
    outcome = process(db, run_id, settings=OPENAI_SETTINGS)
    again = process(db, run_id, settings=OPENAI_SETTINGS)

    # Then it ended failed at once, with a closed reason, after exactly one model call
    assert (outcome.result, outcome.reason_code) == ("failed", "unstorable_reply")
    assert again.result == "skipped"
    assert len(fake_openai.requests) == 1
    [ended] = rows(db_url, "SELECT state, lease_token, diagnosis FROM runs WHERE id = %s", run_id)
    assert ended["state"] == "failed" and ended["lease_token"] is None
    assert ended["diagnosis"]["reason_code"] == "unstorable_reply" and ended["diagnosis"]["retry_eligible"] is False
    # The model answered (and its provider billed the call): the call is settled, refused, and counted
    # with the counts it answered — a count that is no count (the unstorable part) counted 0
    [effect] = rows(db_url, "SELECT state, error_code, usage FROM effects WHERE run_id = %s", run_id)
    assert (effect["state"], effect["error_code"]) == ("settled", "unstorable_reply")
    tokens = COUNTED.get(case, (21, 7))
    assert (effect["usage"]["input_tokens"], effect["usage"]["output_tokens"], effect["usage"]["calls"]) == (
        *tokens, 1)
    [usage] = rows(db_url, "SELECT owner, usage FROM runs WHERE id = %s", run_id)
    assert (usage["usage"]["input_tokens"], usage["usage"]["output_tokens"], usage["usage"]["calls"]) == (*tokens, 1)
    [ledger] = rows(db_url, "SELECT * FROM usage_ledger WHERE owner = %s", usage["owner"])
    assert (ledger["input_tokens"], ledger["output_tokens"], ledger["calls"], ledger["runs"]) == (*tokens, 1, 1)
    assert (ledger["reserved_tokens"], ledger["reserved_cost_usd"]) == (0, 0)
    # and nothing of the reply is in a log line or a row
    logged = "\n".join(f"{r.getMessage()} {r.__dict__} {r.exc_text or ''}" for r in caplog.records)
    assert MARK not in logged and "9223372036854775808" not in logged
    for table, column in (("run_events", "data"), ("run_steps", "record"), ("conversation_entries", "content")):
        dumped = json.dumps([r["v"] for r in rows(db_url, f"SELECT {column}::text AS v FROM {table}")])
        assert MARK not in dumped, table
