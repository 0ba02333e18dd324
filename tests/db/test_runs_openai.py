"""End to end through the real ``openai`` executor: a run against a local OpenAI-compatible server
(``ThreadingHTTPServer`` on 127.0.0.1), real PostgreSQL, the real registry and egress check."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from kairos.db import Database
from kairos.execution.execute import process
from kairos.settings import Settings
from tests import factories
from tests.support.executors import OPENAI_KEY as KEY
from tests.support.executors import OPENAI_SETTINGS as SETTINGS
from tests.support.executors import FakeOpenAI, openai_agent


def _one(url: str, sql: str, *params: Any) -> dict[str, Any]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        row = conn.execute(sql, params).fetchone()
    assert row is not None
    return row


def test_a_scheduled_run_goes_through_the_openai_executor_once(db: Database, db_url: str,
                                                               fake_openai: FakeOpenAI) -> None:
    conv = factories.conversation(db_url, agent=openai_agent(fake_openai),
                                  entries=[("user", "Who are you?"), ("assistant", "A test agent.")])
    sched = factories.schedule(db_url, conversation_id=conv["id"], prompt="Brief me.", agent=openai_agent(fake_openai))
    run = factories.run(db_url, schedule_row=sched)

    outcome = process(db, run["id"], settings=SETTINGS)
    again = process(db, run["id"], settings=SETTINGS)  # a redelivery

    assert outcome.result == "succeeded" and again.result == "skipped"
    (request,) = fake_openai.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["Authorization"] == f"Bearer {KEY}"
    sent = json.loads(request["raw"])
    assert sent["model"] == "gpt-e2e" and sent["max_tokens"] == 64
    assert sent["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Who are you?"},
        {"role": "assistant", "content": "A test agent."},
        {"role": "user", "content": "Brief me."},
    ]
    effect = _one(db_url, "SELECT * FROM effects WHERE run_id = %s", run["id"])
    assert effect["state"] == "settled" and effect["kind"] == "model_call" and effect["mutation"] is False
    assert effect["request_digest"] == hashlib.sha256(request["raw"]).hexdigest()
    assert effect["target"] == f"{fake_openai.base_url}/chat/completions"
    row = _one(db_url, "SELECT * FROM runs WHERE id = %s", run["id"])
    assert row["usage"]["total_tokens"] == 28
    answer = _one(db_url, "SELECT content FROM conversation_entries WHERE conversation_id = %s AND seq = %s",
                  row["conversation_id"], row["output"]["entry_seq"])
    assert answer["content"] == "Good morning from the fake model."
    # Nothing the model or the key said ended up in the trace.
    with psycopg.connect(db_url, autocommit=True) as conn:
        dumped = json.dumps([r[0] for r in conn.execute("SELECT data FROM run_events WHERE run_id = %s",
                                                         (run["id"],))])
    assert "Good morning" not in dumped and KEY not in dumped and "Brief me" not in dumped


def test_a_503_is_retried_on_the_same_run_with_a_new_attempt(db: Database, db_url: str,
                                                              fake_openai: FakeOpenAI) -> None:
    fake_openai.statuses = [503]
    sched = factories.schedule(db_url, agent=openai_agent(fake_openai))
    run = factories.run(db_url, schedule_row=sched)

    first = process(db, run["id"], settings=SETTINGS)
    second = process(db, run["id"], settings=SETTINGS)

    assert (first.result, first.reason_code) == ("retry", "peer_error")
    assert second.result == "succeeded"
    assert len(fake_openai.requests) == 2
    assert fake_openai.requests[0]["raw"] == fake_openai.requests[1]["raw"]  # the same transcript and prompt
    row = _one(db_url, "SELECT attempt, output FROM runs WHERE id = %s", run["id"])
    assert row["attempt"] == 2 and row["output"]["attempt"] == 2


@pytest.mark.parametrize("executor", ["openai", "http"])
def test_an_effect_target_keeps_no_query_fragment_or_userinfo(db: Database, db_url: str, fake_openai: FakeOpenAI,
                                                              executor: str) -> None:
    # Given a base_url that carries a key in its query (some gateways take ?api-key=) and a fragment
    agent = {**openai_agent(fake_openai), "executor": executor,
             "base_url": f"{fake_openai.base_url}?api-key=QUERY-KEY-123&x=1#frag-SECRET"}
    if executor == "http":
        del agent["model"], agent["system"], agent["max_tokens"]
    sched = factories.schedule(db_url, agent=agent)
    run = factories.run(db_url, schedule_row=sched)

    outcome = process(db, run["id"], settings=SETTINGS)

    # Then the call still carried the query to the peer, but the ledger and the trace keep none of it
    assert outcome.result == "succeeded"
    (request,) = fake_openai.requests
    assert "api-key=QUERY-KEY-123" in request["path"]
    effect = _one(db_url, "SELECT target FROM effects WHERE run_id = %s", run["id"])
    expected = f"{fake_openai.base_url}/chat/completions" if executor == "openai" else fake_openai.base_url
    assert effect["target"] == expected
    with psycopg.connect(db_url, autocommit=True) as conn:
        stored = json.dumps([list(r) for r in conn.execute(
            "SELECT e.*, (SELECT json_agg(v) FROM run_events v WHERE v.run_id = e.run_id) FROM effects e")],
            default=str)
    assert "QUERY-KEY-123" not in stored and "frag-SECRET" not in stored


def _visible(url: str, run_id: Any) -> dict[str, Any]:
    """What the owner can see of a run: state, attempts, diagnosis, and the trace without ids and times."""
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        row = conn.execute("SELECT state, attempt, diagnosis, usage, output FROM runs WHERE id = %s",
                           (run_id,)).fetchone()
        events = conn.execute("SELECT seq, type, attempt, step, data FROM run_events WHERE run_id = %s ORDER BY seq",
                              (run_id,)).fetchall()
    assert row is not None
    for event in events:
        event["data"] = {k: v for k, v in (event["data"] or {}).items() if not k.endswith("_id")}
    return {**row, "events": events}


def test_a_private_name_and_a_name_that_does_not_resolve_fail_alike(db: Database, db_url: str) -> None:
    # Given two agents: one whose host resolves to a loopback address (not allowed here), one whose
    # host does not resolve at all (.invalid never does)
    private = factories.schedule(db_url, agent={"executor": "openai", "model": "m", "base_url": "http://localhost:9/v1"})
    missing = factories.schedule(db_url, agent={"executor": "openai", "model": "m",
                                                "base_url": "http://kairos-no-such-host.invalid:9/v1"})
    runs_ = [factories.run(db_url, schedule_row=private), factories.run(db_url, schedule_row=missing)]

    # When each runs until it ends (retries included)
    outcomes: list[list[tuple[str, str | None]]] = []
    for run in runs_:
        seen: list[tuple[str, str | None]] = []
        for _ in range(5):
            outcome = process(db, run["id"], settings=Settings())
            seen.append((outcome.result, outcome.reason_code))
            if outcome.result != "retry":
                break
        outcomes.append(seen)

    # Then the owner sees the same thing for both: reason, retries, diagnosis and trace
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][-1] == ("failed", "connect_failed")
    first, second = (_visible(db_url, run["id"]) for run in runs_)
    assert first == second
    assert first["diagnosis"]["reason_code"] == "connect_failed"
