"""Bounded model input (docs/api.md "API", max_input_tokens): the system prompt, the run's prompt and as many of the
newest transcript entries as fit ``max_input_tokens`` (characters / 4) reach the model; the rest is
left out behind one marker, chosen in SQL. Runs go through the real ``openai`` executor to a local
OpenAI-compatible server, on real PostgreSQL."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from kairos import agents, conversations
from kairos.db import QUERIES as db_queries
from kairos.db import Database
from kairos.execution.execute import process
from kairos.runs import moves
from tests import factories
from tests.support.executors import OPENAI_SETTINGS as SETTINGS
from tests.support.executors import FakeOpenAI, openai_agent

ENTRY_CHARS = 400


def _transcript(count: int) -> list[tuple[str, str]]:
    """``count`` entries, alternating user/assistant, each ENTRY_CHARS long and naming its seq."""
    return [("user" if seq % 2 else "assistant", f"entry {seq:04d} " + "x" * (ENTRY_CHARS - 11))
            for seq in range(1, count + 1)]


def _events(url: str, run_id: Any, kind: str) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        return [r["data"] for r in conn.execute(
            "SELECT data FROM run_events WHERE run_id = %s AND type = %s ORDER BY seq", (run_id, kind))]


# A fork's first attempt is claimed in one trip that reads its window before it knows the agent (at the
# default limit, then narrowed): the limits below, at and above the default cover each way it is read.
@pytest.mark.parametrize("mode", ["append", "fork"])
@pytest.mark.parametrize(("limit", "entries"), [(2_000, 300), (None, 400), (40_000, 600)])
def test_a_run_sends_only_the_newest_entries_that_fit(db: Database, db_url: str, fake_openai: FakeOpenAI,
                                                      limit: int | None, entries: int, mode: str) -> None:
    # Given a conversation far larger than the agent's input limit (160 KB at the default)
    agent = openai_agent(fake_openai) | ({} if limit is None else {"max_input_tokens": limit})
    conv = factories.conversation(db_url, agent=agent, entries=_transcript(entries))
    sched = factories.schedule(db_url, conversation_id=conv["id"], prompt="Brief me.", agent=agent, mode=mode)
    run = factories.run(db_url, schedule_row=sched)

    outcome = process(db, run["id"], settings=SETTINGS)

    # Then the body the model received is bounded by the limit, not by the transcript
    assert outcome.result == "succeeded"
    (request,) = fake_openai.requests
    budget_chars = (limit or 16_000) * 4
    messages = json.loads(request["raw"])["messages"]
    assert sum(len(m["content"]) for m in messages) <= budget_chars
    assert len(request["raw"]) < budget_chars + 40 * len(messages)  # JSON framing only on top
    # It keeps the system prompt first, the marker, then the newest entries in order, then the prompt
    system, marker, *kept, prompt = messages
    assert system == {"role": "system", "content": "You are terse."}
    assert prompt == {"role": "user", "content": "Brief me."}
    newest = _transcript(entries)[-len(kept):]
    assert [(m["role"], m["content"]) for m in kept] == newest
    assert len(kept) >= budget_chars // (ENTRY_CHARS + 16) - 2  # the window is filled, not just bounded
    elided = entries - len(kept)
    assert marker == {"role": "system",
                      "content": f"[{elided} earlier entries of this conversation left out to fit the input limit]"}
    # And the trace records the window (counts only) with the model call's reservation
    (reserved,) = _events(db_url, run["id"], "effect.reserved")
    assert reserved["input"] == {"max_input_tokens": limit or 16_000, "entries": len(kept), "elided": elided,
                                 "estimated_tokens": reserved["input"]["estimated_tokens"]}
    assert reserved["input"]["estimated_tokens"] <= (limit or 16_000)


def test_the_next_append_run_sees_the_previous_run_as_its_newest_entries(db: Database, db_url: str,
                                                                         fake_openai: FakeOpenAI) -> None:
    agent = openai_agent(fake_openai) | {"max_input_tokens": 1_000}
    conv = factories.conversation(db_url, agent=agent, entries=_transcript(100))
    sched = factories.schedule(db_url, conversation_id=conv["id"], prompt="Brief me.", agent=agent, mode="append")
    earlier = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=2)
    first = factories.run(db_url, schedule_row=sched, fire_at=earlier)
    second = factories.run(db_url, schedule_row=sched)

    assert process(db, first["id"], settings=SETTINGS).result == "succeeded"
    assert process(db, second["id"], settings=SETTINGS).result == "succeeded"

    messages = json.loads(fake_openai.requests[1]["raw"])["messages"]
    assert messages[-3:] == [{"role": "user", "content": "Brief me."},
                             {"role": "assistant", "content": "Good morning from the fake model."},
                             {"role": "user", "content": "Brief me."}]
    assert messages[-4]["content"].startswith("entry 0100 ")


def test_a_prompt_that_alone_exceeds_the_limit_fails_input_too_large_without_a_call(
        db: Database, db_url: str, fake_openai: FakeOpenAI) -> None:
    agent = openai_agent(fake_openai) | {"max_input_tokens": 100}
    sched = factories.schedule(db_url, prompt="p" * 401, agent=agent, mode="append")
    run = factories.run(db_url, schedule_row=sched)

    outcome = process(db, run["id"], settings=SETTINGS)

    assert (outcome.result, outcome.reason_code) == ("failed", "input_too_large")
    assert fake_openai.requests == []
    with psycopg.connect(db_url, row_factory=dict_row, autocommit=True) as conn:
        row = conn.execute("SELECT diagnosis FROM runs WHERE id = %s", (run["id"],)).fetchone()
        effects = conn.execute("SELECT count(*) AS n FROM effects WHERE run_id = %s", (run["id"],)).fetchone()
    assert row is not None and effects is not None and effects["n"] == 0
    assert row["diagnosis"]["reason_code"] == "input_too_large" and not row["diagnosis"]["retry_eligible"]
    assert row["diagnosis"]["recovery_actions"] == ["check_agent_config"]


def test_a_transcript_that_fits_is_sent_whole_without_a_marker(db: Database, db_url: str,
                                                               fake_openai: FakeOpenAI) -> None:
    conv = factories.conversation(db_url, agent=openai_agent(fake_openai), entries=_transcript(5))
    sched = factories.schedule(db_url, conversation_id=conv["id"], prompt="Brief me.", agent=openai_agent(fake_openai),
                               mode="append")
    run = factories.run(db_url, schedule_row=sched)

    assert process(db, run["id"], settings=SETTINGS).result == "succeeded"

    messages = json.loads(fake_openai.requests[0]["raw"])["messages"]
    assert [(m["role"], m["content"]) for m in messages[1:-1]] == _transcript(5)
    (reserved,) = _events(db_url, run["id"], "effect.reserved")
    assert (reserved["input"]["entries"], reserved["input"]["elided"]) == (5, 0)


def test_the_window_spans_a_fork_and_its_parent_newest_first(db: Database, db_url: str) -> None:
    # Given a parent with 10 entries, a fork at 10 with 5 of its own, and later entries in the parent
    parent = factories.conversation(db_url, entries=[("user", f"p{seq:02d}") for seq in range(1, 11)])
    with db.transaction() as conn:
        child = conversations.fork(conn, parent["id"])
        for n in range(11, 16):
            conversations.append(conn, child.id, role="user", content=f"c{n:02d}")
        conversations.append(conn, parent["id"], role="user", content="p11-after-the-fork")

        # When a window fits 7 entries of 3 characters (each costs 3 + 16)
        window = conversations.window(conn, child.id, budget_chars=7 * 19, entry_overhead=16)
        nothing = conversations.window(conn, child.id, budget_chars=18, entry_overhead=16)

    # Then it holds the newest 7 of the merged transcript, oldest first, and counts the 8 left out
    assert [e.content for e in window.entries] == ["p09", "p10", "c11", "c12", "c13", "c14", "c15"]
    assert window.elided == 8
    assert (nothing.entries, nothing.elided) == ((), 15)


def test_the_fork_claims_window_is_the_threads_window(db: Database, db_url: str) -> None:
    # Given a schedule on a fork (at 10 of its parent, 5 entries of its own; the parent went on after it)
    parent = factories.conversation(db_url, entries=[("user", f"p{seq:02d}") for seq in range(1, 11)])
    with db.transaction() as conn:
        source = conversations.fork(conn, parent["id"])
        for n in range(11, 16):
            conversations.append(conn, source.id, role="user", content=f"c{n:02d}")
        conversations.append(conn, parent["id"], role="user", content="p11-after-the-fork")
    sched = factories.schedule(db_url, conversation_id=source.id, prompt="Brief me.", mode="fork")
    run = factories.run(db_url, schedule_row=sched)
    thread_id = uuid.uuid4()

    # When its first attempt is claimed by the one statement that also reads a window of 7 entries
    with db.transaction() as conn:
        row = moves.send_claim(conn, run["id"], thread_id=thread_id, fork_only=True,
                               window_budget=7 * 19, window_overhead=16)()
    assert row is not None and row["forked"]
    claimed = conversations.claimed_window(row)

    # Then it is the window read of the new thread afterwards, without the run's prompt entry
    with db.transaction() as conn:
        after = conversations.window(conn, thread_id, budget_chars=7 * 19, entry_overhead=16,
                                     exclude_run=run["id"])
    assert [e.content for e in claimed.entries] == ["p09", "p10", "c11", "c12", "c13", "c14", "c15"]
    assert claimed == after


def test_the_window_reads_each_ancestor_by_its_key_whatever_the_statistics(db_url: str) -> None:
    # Given a young table (a few thousand entries, freshly analyzed: a sequential scan looks cheap) and
    # the generic plan a prepared statement settles on after five executions
    parent = factories.conversation(db_url, entries=[("user", f"p{seq:02d}") for seq in range(1, 11)])
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as conn:
        conn.execute("""INSERT INTO conversations (id, owner, agent)
                        SELECT gen_random_uuid(), 'others', '{"executor": "echo"}' FROM generate_series(1, 30)""")
        conn.execute("""INSERT INTO conversation_entries (conversation_id, seq, role, content)
                        SELECT c.id, g, 'user', repeat('x', 200)
                          FROM conversations c CROSS JOIN generate_series(1, 100) g WHERE c.owner = 'others'""")
        child = conversations.fork(conn, parent["id"])
        conn.execute("ANALYZE conversation_entries")
        conn.execute("SET plan_cache_mode = force_generic_plan")
        query = db_queries["conversation_entries_window"]
        names = {"conversation_id": "$1::uuid", "run_ids": "$2", "budget": "$3", "overhead": "$4"}
        for name, placeholder in names.items():
            query = query.replace(f"%({name})s", placeholder)
        # The shipped query with $n placeholders (not user input)
        conn.execute(f"PREPARE window_plan AS {query}")  # type: ignore[arg-type]
        plan = "\n".join(str(row["QUERY PLAN"]) for row in conn.execute(
            sql.SQL("EXPLAIN EXECUTE window_plan({}, '{{}}', 32000, 16)").format(sql.Literal(str(child.id)))))

    # Then no plan node scans a table whole: each lineage member and its entries are index ranges
    assert "conversation_entries_pkey" in plan
    assert "Seq Scan" not in plan, plan


def test_an_agent_may_set_max_input_tokens_up_to_the_cap() -> None:
    from kairos.errors import ValidationFailed

    agent = {"executor": "openai", "model": "m", "base_url": "https://api.example/v1"}
    accepted = agents.validate({**agent, "max_input_tokens": 100_000}, owner=None)
    assert accepted["max_input_tokens"] == 100_000
    for value, rule in [(100_001, "max"), (0, "min"), ("16000", "type")]:
        with pytest.raises(ValidationFailed) as info:
            agents.validate({**agent, "max_input_tokens": value}, owner=None)
        assert [(f.field, f.rule) for f in info.value.fields] == [("agent.max_input_tokens", rule)]
