"""The answer published in one statement (``runs_publish``, migration 0037), against real PostgreSQL:
what it writes (the answer entry, the settled effect with its usage, the run's output and usage that
count that effect, the ledger's day, the four events in order), and what a cancel requested while the
call answered leaves instead (no answer, no step record of a success, the call's usage still counted),
for a run without a step record (echo) and one with its model step (openai)."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg.rows import dict_row

from kairos import runs
from kairos.db import Database
from kairos.execution.execute import process
from kairos.probes import Probes
from kairos.settings import Settings
from tests import factories
from tests.support.executors import OPENAI_SETTINGS, FakeOpenAI, openai_agent


def _rows(url: str, sql: str, *params: Any) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def _events(url: str, run_id: uuid.UUID) -> list[dict[str, Any]]:
    return _rows(url, "SELECT seq, type, step, data FROM run_events WHERE run_id = %s ORDER BY seq", run_id)


def _echo_run(url: str) -> dict[str, Any]:
    conversation = factories.conversation(url, entries=[("user", "hello"), ("assistant", "echo: hello")])
    schedule = factories.schedule(url, conversation_id=conversation["id"], mode="fork")
    return factories.run(url, schedule_row=schedule)


def _cancel(run_id: uuid.UUID, url: str) -> Any:
    def request(**_: Any) -> None:
        with psycopg.connect(url, row_factory=dict_row) as conn:
            assert runs.cancel(conn, run_id, owner="alice").cancel_requested_at is not None
    return request


def test_a_published_answer_settles_its_effect_and_counts_its_usage_in_the_same_statement(
        db: Database, db_url: str) -> None:
    run = _echo_run(db_url)
    assert process(db, run["id"], settings=Settings()).result == "succeeded"
    (row,) = _rows(db_url, "SELECT * FROM runs WHERE id = %s", run["id"])
    (effect,) = _rows(db_url, "SELECT * FROM effects WHERE run_id = %s", run["id"])
    (answer,) = _rows(db_url, "SELECT seq, content FROM conversation_entries WHERE conversation_id = %s "
                              "AND role = 'assistant'", row["conversation_id"])
    assert effect["state"] == "settled" and effect["usage"]["calls"] == 1
    # The run's usage is its settled effects' sum, the one this statement settled included.
    assert row["usage"] == _rows(db_url, "SELECT kairos_run_usage(%s) AS u", run["id"])[0]["u"]
    assert row["usage"]["calls"] == 1
    assert row["output"] == {"conversation_id": str(row["conversation_id"]), "entry_seq": answer["seq"],
                             "attempt": 1}
    (day,) = _rows(db_url, "SELECT calls, reserved_tokens FROM usage_ledger WHERE owner = %s", row["owner"])
    assert day == {"calls": 1, "reserved_tokens": 0}
    events = _events(db_url, run["id"])
    assert [e["seq"] for e in events] == list(range(1, row["last_seq"] + 1))
    assert [(e["type"], e["step"], e["data"]) for e in events[-4:]] == [
        ("effect.settled", effect["step"], {"effect_id": str(effect["id"]), "state": "settled"}),
        ("output.published", effect["step"], {"conversation_id": str(row["conversation_id"]),
                                              "entry_seq": answer["seq"], "truncated": False}),
        ("step.finished", effect["step"], {"outcome": "succeeded"}),
        ("run.succeeded", None, {"entry_seq": answer["seq"]}),
    ]


def test_a_cancel_requested_while_the_call_answered_publishes_nothing_and_counts_the_call(
        db: Database, db_url: str) -> None:
    run = _echo_run(db_url)
    outcome = process(db, run["id"], settings=Settings(), probes=Probes().on("after_send", _cancel(run["id"], db_url)))
    assert (outcome.result, outcome.state) == ("cancelled", "cancelled")
    (row,) = _rows(db_url, "SELECT * FROM runs WHERE id = %s", run["id"])
    assert row["output"] is None and row["usage"]["calls"] == 1
    assert _rows(db_url, "SELECT seq FROM conversation_entries WHERE conversation_id = %s AND role = 'assistant'",
                 row["conversation_id"]) == []
    (effect,) = _rows(db_url, "SELECT state, usage FROM effects WHERE run_id = %s", run["id"])
    assert effect["state"] == "settled" and effect["usage"]["calls"] == 1
    (day,) = _rows(db_url, "SELECT calls, reserved_tokens FROM usage_ledger WHERE owner = %s", row["owner"])
    assert day == {"calls": 1, "reserved_tokens": 0}
    events = _events(db_url, run["id"])
    assert [e["seq"] for e in events] == list(range(1, row["last_seq"] + 1))
    assert [e["type"] for e in events[-3:]] == ["effect.settled", "step.finished", "run.cancelled"]
    assert "output.published" not in [e["type"] for e in events]


def test_a_model_run_cancelled_as_its_call_answered_writes_no_step_of_a_success(
        db: Database, db_url: str, fake_openai: FakeOpenAI) -> None:
    agent = openai_agent(fake_openai)
    conversation = factories.conversation(db_url, agent=agent, entries=[("user", "Who are you?")])
    schedule = factories.schedule(db_url, conversation_id=conversation["id"], prompt="Brief me.", agent=agent)
    run = factories.run(db_url, schedule_row=schedule)
    outcome = process(db, run["id"], settings=OPENAI_SETTINGS,
                      probes=Probes().on("after_send", _cancel(run["id"], db_url)))
    assert (outcome.result, outcome.state) == ("cancelled", "cancelled")
    assert [s["state"] for s in _rows(db_url, "SELECT state FROM run_steps WHERE run_id = %s", run["id"])
            if s["state"] == "succeeded"] == []
    (row,) = _rows(db_url, "SELECT usage FROM runs WHERE id = %s", run["id"])
    assert row["usage"]["calls"] == 1 and row["usage"]["total_tokens"] == 28
    # Published, the same run's model step is written with the answer.
    again = factories.run(db_url, schedule_row=schedule, source="manual")
    assert process(db, again["id"], settings=OPENAI_SETTINGS).result == "succeeded"
    assert [s["state"] for s in _rows(db_url, "SELECT state FROM run_steps WHERE run_id = %s", again["id"])] == [
        "succeeded"]
