"""A run's steps on real PostgreSQL, through the public handlers: a tool loop with the local model
server and a real local HTTP target, read back through ``GET /v1/runs/{id}/steps`` (inputs, outputs,
targets, usage); credentials never stored anywhere (the whole database scanned); a 1 MB tool answer
cut to its bound with its digest; a worker that lost its fence writing nothing; retention forgetting
the previews; the CLI's table."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from kairos import cli
from kairos.db import Database
from kairos.execution.execute import process
from kairos.probes import Probes
from kairos.runs import steps as run_steps
from kairos.tick.prune import Prune
from tests import factories
from tests.support.api import Api
from tests.support.executors import OPENAI_KEY, OPENAI_SETTINGS, FakeOpenAI, openai_agent, tool_call
from tests.support.peer import Peer, respond

PEER_KEY = "peer-api-key-0123456789"
PEER_TOKEN = "peer-bearer-token-abcdef"


def rows(url: str, query: str, *args: Any) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        return conn.execute(query, args).fetchall()


@pytest.fixture
def leaky() -> Iterator[Peer]:
    """A tool target that answers with credentials: an api_key field, an Authorization value and the
    model's own resolved key echoed back inside a sentence."""
    body = json.dumps({"ok": True, "api_key": PEER_KEY, "headers": {"Authorization": f"Bearer {PEER_TOKEN}"},
                       "note": f"you sent {OPENAI_KEY} to us"})
    with Peer(respond(200, body)) as peer:
        yield peer


def chat_run(api: Api, fake: FakeOpenAI, target_url: str, **agent: Any) -> uuid.UUID:
    fake.script = [tool_call("post-1", "http_post", {"url": target_url, "body": {"order": 42}}),
                   {"content": "Posted."}]
    created = api.alice.post("/v1/conversations", {"agent": {**openai_agent(fake), "tools": ["http"],
                                                             "approval": "never", **agent}})
    assert created.status == 201, created.text
    turn = api.alice.post(f"/v1/conversations/{created.json['conversation']['id']}/messages",
                          {"content": "post the order"})
    assert turn.status == 202, turn.text
    api.messages()
    return uuid.UUID(turn.json["run_id"])


def work(db: Database, run_id: uuid.UUID, **kwargs: Any) -> Any:
    return process(db, run_id, settings=OPENAI_SETTINGS, **kwargs)


def text_columns(url: str) -> list[tuple[str, str]]:
    found = rows(url, """SELECT table_name, column_name FROM information_schema.columns
                          WHERE table_schema = 'public'
                            AND data_type IN ('text', 'jsonb', 'json', 'character varying', 'bytea')
                          ORDER BY table_name, column_name""")
    return [(r["table_name"], r["column_name"]) for r in found]


def stored_anywhere(url: str, needle: str) -> list[str]:
    """Every table.column of the database holding ``needle`` in some row."""
    hits = []
    with psycopg.connect(url, autocommit=True) as conn:
        for table, column in text_columns(url):
            query = sql.SQL("SELECT 1 FROM {} WHERE position(%s in {}::text) > 0 LIMIT 1").format(
                sql.Identifier(table), sql.Identifier(column))
            if conn.execute(query, (needle,)).fetchone() is not None:
                hits.append(f"{table}.{column}")
    return hits


def test_a_tool_loops_steps_are_listed_with_inputs_outputs_targets_and_usage(
        api: Api, db: Database, fake_openai: FakeOpenAI, leaky: Peer) -> None:
    # Given a chat turn whose model posts to a target and then answers
    run_id = chat_run(api, fake_openai, leaky.url("/hook"))

    # When the worker runs it
    assert work(db, run_id).result == "succeeded"

    # Then its owner reads three steps: the model turn, the http call, the model's answer
    page = api.alice.get(f"/v1/runs/{run_id}/steps")
    assert page.status == 200, page.text
    steps = page.json["steps"]
    assert page.json["next_after"] == 3
    assert [(s["step"], s["attempt"], s["kind"], s["name"], s["state"]) for s in steps] == [
        (1, 1, "model", "gpt-e2e", "succeeded"), (2, 1, "tool", "http_post", "succeeded"),
        (3, 1, "model", "gpt-e2e", "succeeded")]
    first, call, answer = steps
    assert first["target"] == {"method": "POST", "host": f"127.0.0.1:{fake_openai.port}",
                               "path": "/v1/chat/completions"}
    assert first["input"]["model"] == "gpt-e2e" and first["input"]["tools"] == ["http_post"]
    assert first["input"]["messages"][-1] == {"role": "user", "content": "post the order"}
    assert first["output"]["tool_calls"] == [{"id": "post-1", "name": "http_post",
                                              "arguments": {"url": leaky.url("/hook"), "body": {"order": 42}}}]
    assert (first["usage"]["input_tokens"], first["usage"]["output_tokens"]) == (21, 7)
    assert first["usage"]["cost_usd"] >= 0
    assert call["input"] == {"url": leaky.url("/hook"), "body": {"order": 42}}
    assert call["target"] == {"method": "POST", "host": f"127.0.0.1:{leaky.port}", "path": "/hook"}
    assert call["output"]["status"] == 200 and call["output"]["body"]["ok"] is True
    assert call["usage"]["tool_calls"] == 1
    assert answer["output"] == {"content": "Posted.", "tool_calls": []}
    assert answer["input"]["messages"][0]["role"] == "tool"  # this turn's new input: the tool's answer
    effects = {r["id"] for r in rows(api.url, "SELECT id FROM effects WHERE run_id = %s", run_id)}
    assert {uuid.UUID(s["effect_id"]) for s in steps} == effects
    assert all(s["started_at"] <= s["finished_at"] for s in steps)
    # and pages by step number
    second = api.alice.get(f"/v1/runs/{run_id}/steps?after=1&limit=1").json
    assert [s["step"] for s in second["steps"]] == [2] and second["next_after"] == 2
    assert api.alice.get(f"/v1/runs/{run_id}/steps?after=3").json == {"steps": [], "next_after": 3}


def test_another_owners_or_a_missing_runs_steps_are_not_found(
        api: Api, db: Database, fake_openai: FakeOpenAI, leaky: Peer) -> None:
    run_id = chat_run(api, fake_openai, leaky.url("/hook"))
    assert work(db, run_id).result == "succeeded"

    foreign, missing = api.bob.get(f"/v1/runs/{run_id}/steps"), api.alice.get(f"/v1/runs/{uuid.uuid4()}/steps")

    assert (foreign.status, missing.status) == (404, 404)
    assert foreign.json["error"]["code"] == missing.json["error"]["code"] == "not_found"
    refused = api.alice.get(f"/v1/runs/{run_id}/steps?limit=0")
    assert refused.status == 422 and refused.json["error"]["fields"][0]["field"] == "limit"


def test_credentials_are_never_stored_in_any_row(
        api: Api, db: Database, fake_openai: FakeOpenAI, leaky: Peer) -> None:
    # Given a run whose model key is a resolved secret (sent in its Authorization header) and whose
    # tool target answers an api_key field, an Authorization value and the model's key echoed back
    run_id = chat_run(api, fake_openai, leaky.url("/hook"))
    assert work(db, run_id).result == "succeeded"
    assert fake_openai.requests[0]["headers"]["Authorization"] == f"Bearer {OPENAI_KEY}"
    # (the model did read the answer whole in this attempt)
    assert PEER_KEY in json.dumps(fake_openai.bodies()[1])

    # Then no column of any table holds any of them
    for needle in (OPENAI_KEY, PEER_KEY, PEER_TOKEN):
        assert stored_anywhere(api.url, needle) == [], needle
    # and the step shows where they were
    [call] = [s for s in api.alice.get(f"/v1/runs/{run_id}/steps").json["steps"] if s["kind"] == "tool"]
    assert call["output"]["body"]["api_key"] == "[redacted]"
    assert call["output"]["body"]["headers"] == {"Authorization": "[redacted]"}
    assert call["output"]["body"]["note"] == "you sent [redacted] to us"


def test_a_one_megabyte_tool_answer_is_cut_to_four_kib_with_its_digest(
        api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    big = {"data": "x" * 1_000_000}
    with Peer(respond(200, json.dumps(big))) as peer:
        run_id = chat_run(api, fake_openai, peer.url("/big"))
        assert work(db, run_id).result == "succeeded"

    [call] = [s for s in api.alice.get(f"/v1/runs/{run_id}/steps").json["steps"] if s["kind"] == "tool"]
    whole = json.dumps({"body": big, "status": 200}, ensure_ascii=False, sort_keys=True).encode("utf-8")
    output = call["output"]
    assert output["truncated"] is True
    assert (output["bytes"], output["sha256"]) == (len(whole), hashlib.sha256(whole).hexdigest())
    assert whole.decode().startswith(output["head"]) and len(output["head"]) > 1000
    [stored] = rows(api.url, "SELECT output FROM run_steps WHERE run_id = %s AND kind = 'tool'", run_id)
    assert len(json.dumps(stored["output"]).encode("utf-8")) <= run_steps.PREVIEW_BYTES
    # and the model got its own cut of the answer, as before
    assert len(fake_openai.bodies()[1]["messages"][-1]["content"]) <= 8_192


def test_a_worker_that_lost_its_fence_writes_no_step(
        api: Api, db: Database, fake_openai: FakeOpenAI, leaky: Peer) -> None:
    # Given a worker whose lease is taken over (a rescue and a new claim) while its http call is out
    run_id = chat_run(api, fake_openai, leaky.url("/hook"))

    def taken_over(effect: Any, **_: Any) -> None:
        if effect.kind == "http_call":
            with psycopg.connect(api.url, autocommit=True) as conn:
                conn.execute("UPDATE runs SET fence = fence + 1 WHERE id = %s", (run_id,))

    # When it comes back with the answer
    outcome = work(db, run_id, probes=Probes().on("after_send", taken_over))

    # Then it stops, and the step it had opened is neither ended nor given an output
    assert outcome.result == "lease_lost"
    found = rows(api.url, "SELECT n, state, output, record FROM run_steps WHERE run_id = %s ORDER BY n", run_id)
    assert [(r["n"], r["state"]) for r in found] == [(1, "succeeded"), (2, "running")]
    assert found[1]["output"] is None and found[1]["record"] is None
    # and every step write of the old fence is refused, leaving the rows as they were
    [run] = rows(api.url, "SELECT fence FROM runs WHERE id = %s", run_id)
    stale = int(run["fence"]) - 1
    with db.transaction() as conn:
        assert not run_steps.progress(conn, run_id, stale, 2, {"content": "late"})
        assert not run_steps.finish(conn, run_id, stale, n=2, kind="tool", name="http_post", record={"content": "x"},
                                    output={"late": True})
        assert not run_steps.begin(conn, run_id, stale, n=3, kind="model", name="gpt-e2e")
        assert run_steps.close_open(conn, run_id, stale) == 0
    assert rows(api.url, "SELECT n, state, output, record FROM run_steps WHERE run_id = %s ORDER BY n", run_id) == found


def test_progress_grows_a_running_steps_output_for_the_fence_holder_only(
        api: Api, db: Database, fake_openai: FakeOpenAI, leaky: Peer) -> None:
    run_id = chat_run(api, fake_openai, leaky.url("/hook"))
    grown: list[bool] = []

    def grow(effect: Any, fence: int, **_: Any) -> None:
        if effect.kind == "http_call":
            with db.transaction() as conn:
                grown.append(run_steps.progress(conn, run_id, fence, 2, {"so_far": "par"}))
                seen = conn.execute("SELECT output FROM run_steps WHERE run_id = %s AND n = 2", (run_id,)).fetchone()
                grown.append(seen is not None and seen["output"] == {"so_far": "par"})

    assert work(db, run_id, probes=Probes().on("after_reserve", grow)).result == "succeeded"

    assert grown == [True, True]
    # the end replaces the partial output with the whole answer
    [call] = rows(api.url, "SELECT output FROM run_steps WHERE run_id = %s AND n = 2", run_id)
    assert call["output"]["status"] == 200


def test_a_call_parked_for_approval_shows_waiting_then_denied(
        api: Api, db: Database, fake_openai: FakeOpenAI, leaky: Peer) -> None:
    run_id = chat_run(api, fake_openai, leaky.url("/hook"), approval="mutations")
    assert work(db, run_id).result == "awaiting_approval"

    waiting = api.alice.get(f"/v1/runs/{run_id}/steps").json["steps"]
    assert [(s["step"], s["state"], s["finished_at"] is None) for s in waiting] == [
        (1, "succeeded", False), (2, "waiting_approval", True)]
    assert waiting[1]["target"]["path"] == "/hook" and waiting[1]["input"]["body"] == {"order": 42}
    [approval] = api.alice.get("/v1/approvals?state=pending").json["approvals"]
    assert api.alice.post(f"/v1/approvals/{approval['id']}/deny").status == 200

    denied = api.alice.get(f"/v1/runs/{run_id}/steps").json["steps"]
    assert (denied[1]["state"], denied[1]["finished_at"] is not None) == ("denied", True)
    assert leaky.received == []


def test_an_approved_call_keeps_its_step_number_on_the_next_attempt(
        api: Api, db: Database, fake_openai: FakeOpenAI, leaky: Peer) -> None:
    run_id = chat_run(api, fake_openai, leaky.url("/hook"), approval="mutations")
    assert work(db, run_id).result == "awaiting_approval"
    [approval] = api.alice.get("/v1/approvals?state=pending").json["approvals"]
    assert api.alice.post(f"/v1/approvals/{approval['id']}/approve").status == 200
    api.messages()

    assert work(db, run_id).result == "succeeded"

    steps = api.alice.get(f"/v1/runs/{run_id}/steps").json["steps"]
    assert [(s["step"], s["attempt"], s["kind"], s["state"]) for s in steps] == [
        (1, 1, "model", "succeeded"), (2, 2, "tool", "succeeded"), (3, 2, "model", "succeeded")]
    assert len(leaky.received) == 1


def test_retention_forgets_the_previews_and_keeps_what_each_step_was(
        api: Api, db: Database, fake_openai: FakeOpenAI, leaky: Peer) -> None:
    run_id = chat_run(api, fake_openai, leaky.url("/hook"))
    assert work(db, run_id).result == "succeeded"
    factories.ended_ago(api.url, run_id)

    report = Prune(db).run_once()

    assert report.steps == 3
    steps = api.alice.get(f"/v1/runs/{run_id}/steps").json["steps"]
    assert [(s["kind"], s["state"], s["input"], s["output"]) for s in steps] == [
        ("model", "succeeded", None, None), ("tool", "succeeded", None, None), ("model", "succeeded", None, None)]
    assert all(s["pruned_at"] is not None and s["usage"] is not None for s in steps)
    assert steps[1]["target"]["path"] == "/hook"
    assert Prune(db).run_once().steps == 0


def test_the_cli_prints_a_runs_steps_as_a_table_or_json(
        api: Api, db: Database, fake_openai: FakeOpenAI, leaky: Peer, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = chat_run(api, fake_openai, leaky.url("/hook"))
    assert work(db, run_id).result == "succeeded"
    monkeypatch.setenv("DATABASE_URL", api.url)

    assert cli.main(["runs", "steps", str(run_id)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:5] == ["step", "att", "kind", "name", "state"]
    assert table[2].split()[:5] == ["2", "1", "tool", "http_post", "succeeded"]
    assert f"POST 127.0.0.1:{leaky.port}/hook" in table[2]

    assert cli.main(["runs", "steps", str(run_id), "--json", "--after", "2"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [s["step"] for s in printed["steps"]] == [3] and printed["next_after"] == 3


class Crash(BaseException):
    """The worker dies right after its http call went out (not an Exception: nothing catches it)."""


def test_a_step_its_worker_died_in_ends_ambiguous_when_the_tick_ends_the_run(
        api: Api, db: Database, fake_openai: FakeOpenAI, leaky: Peer) -> None:
    from datetime import UTC, datetime, timedelta

    from kairos.tick import Tick

    # Given a worker that dies with its http call sent and not settled
    run_id = chat_run(api, fake_openai, leaky.url("/hook"))

    def crash(effect: Any, **_: Any) -> None:
        if effect.kind == "http_call":
            raise Crash()

    with pytest.raises(Crash):
        work(db, run_id, probes=Probes().on("after_send", crash))
    assert [r["state"] for r in rows(api.url, "SELECT state FROM run_steps WHERE run_id = %s ORDER BY n", run_id)] \
        == ["succeeded", "running"]

    # When its lease runs out and the tick ends the run
    with psycopg.connect(api.url, autocommit=True) as conn:
        conn.execute("UPDATE runs SET lease_expires_at = now() - interval '1 second' WHERE id = %s", (run_id,))
    Tick(db, api.sqs, api.queue_url, metrics=None).run(now=datetime.now(UTC) + timedelta(seconds=1))

    # Then the step it left reads ambiguous (the post may have been applied), ended
    steps = api.alice.get(f"/v1/runs/{run_id}/steps").json["steps"]
    assert [(s["step"], s["state"], s["finished_at"] is not None) for s in steps] == [
        (1, "succeeded", True), (2, "ambiguous", True)]


def test_cancelling_a_run_that_waits_for_approval_ends_its_waiting_step(
        api: Api, db: Database, fake_openai: FakeOpenAI, leaky: Peer) -> None:
    run_id = chat_run(api, fake_openai, leaky.url("/hook"), approval="mutations")
    assert work(db, run_id).result == "awaiting_approval"

    assert api.alice.post(f"/v1/runs/{run_id}/cancel").status == 200

    steps = api.alice.get(f"/v1/runs/{run_id}/steps").json["steps"]
    assert [(s["step"], s["state"], s["finished_at"] is not None) for s in steps] == [
        (1, "succeeded", True), (2, "failed", True)]
    assert leaky.received == []


def test_a_run_without_tools_shows_its_one_model_call_as_a_step(
        api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    created = api.alice.post("/v1/conversations", {"agent": openai_agent(fake_openai)})
    turn = api.alice.post(f"/v1/conversations/{created.json['conversation']['id']}/messages", {"content": "hello"})
    api.messages()
    run_id = uuid.UUID(turn.json["run_id"])

    assert work(db, run_id).result == "succeeded"

    [step] = api.alice.get(f"/v1/runs/{run_id}/steps").json["steps"]
    assert (step["step"], step["attempt"], step["kind"], step["name"], step["state"]) == (
        1, 1, "model", "gpt-e2e", "succeeded")
    assert step["input"]["messages"][-1] == {"role": "user", "content": "hello"}
    assert step["output"] == {"content": "Good morning from the fake model.", "tool_calls": []}
    assert step["target"]["path"] == "/v1/chat/completions"
    assert (step["usage"]["input_tokens"], step["usage"]["output_tokens"]) == (21, 7)
    [effect] = rows(api.url, "SELECT id, created_at FROM effects WHERE run_id = %s", run_id)
    assert step["effect_id"] == str(effect["id"]) and step["started_at"] <= step["finished_at"]
    assert stored_anywhere(api.url, OPENAI_KEY) == []
