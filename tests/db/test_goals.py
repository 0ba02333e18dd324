"""Goal loops through the real path: the API creates the loop, the tick fires it, the run worker claims
each run and a real local model server (chat-completions tool calls) answers with scripted goal
reports. A walk continue -> needs_input -> (answer) -> continue -> complete with the loop's status,
notes and trace after each step and nothing held while it waits; and the races: two answers, an
answer against a cancel, a goal edit while a run is queued, max_occurrences reached while waiting,
a loop cancelled while its run waits."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import psycopg
from psycopg.rows import dict_row

from kairos.db import Database
from kairos.execution.execute import process
from kairos.tick import Tick
from tests import factories
from tests.support.api import Answer, Api
from tests.support.executors import OPENAI_SETTINGS, FakeOpenAI, openai_agent, tool_call


def rows(url: str, query: str, *args: Any) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        return conn.execute(query, args).fetchall()


def one(url: str, query: str, *args: Any) -> dict[str, Any]:
    [row] = rows(url, query, *args)
    return row


def report(call_id: str, disposition: str, summary: str = "done", **more: Any) -> dict[str, Any]:
    return tool_call(call_id, "goal_report", {"disposition": disposition, "summary": summary, **more})


def make_loop(api: Api, fake: FakeOpenAI, **fields: Any) -> tuple[str, dict[str, Any]]:
    created = api.alice.post("/v1/conversations", {"agent": openai_agent(fake)})
    assert created.status == 201, created.text
    conversation_id = created.json["conversation"]["id"]
    body = {"conversation_id": conversation_id, "prompt": "Tidy the backlog",
            "goal": {"outcome": "The backlog has no stale issues", "constraints": ["never close P0 issues"],
                     "verification": "count issues older than 90 days: 0"},
            "interval_seconds": 3600, "ends_at": (datetime.now(UTC) + timedelta(days=7)).isoformat(),
            "max_occurrences": 10, **fields}
    answer = api.alice.post("/v1/loops", body)
    assert answer.status == 201, answer.text
    return conversation_id, answer.json["schedule"]


def fire(api: Api, db: Database, loop_id: str) -> uuid.UUID | None:
    """Makes the loop due and runs the tick; the run it fired (None when nothing fired)."""
    before = {r["id"] for r in rows(api.url, "SELECT id FROM runs WHERE schedule_id = %s", loop_id)}
    with psycopg.connect(api.url, autocommit=True) as conn:
        # The interval's anchor moves with the cursor, so the due instant is on the rule's grid.
        conn.execute("UPDATE schedules SET next_fire_at = now() - interval '1 second', "
                     "starts_at = now() - interval '1 second' WHERE id = %s AND next_fire_at IS NOT NULL",
                     (loop_id,))
    Tick(db, api.sqs, api.queue_url, metrics=None).run()
    new = [r["id"] for r in rows(api.url, "SELECT id FROM runs WHERE schedule_id = %s", loop_id)
           if r["id"] not in before]
    assert len(new) <= 1
    return new[0] if new else None


def work(db: Database, run_id: uuid.UUID) -> Any:
    return process(db, run_id, settings=OPENAI_SETTINGS)


def loop_row(api: Api, loop_id: str) -> dict[str, Any]:
    return one(api.url, "SELECT * FROM schedules WHERE id = %s", loop_id)


def notes(api: Api, conversation_id: str) -> list[str]:
    return [n["kind"] for n in api.alice.get(f"/v1/conversations/{conversation_id}/inbox").json["notes"]]


def events(api: Api, run_id: uuid.UUID) -> list[str]:
    return [e["type"] for e in api.alice.get(f"/v1/runs/{run_id}/events?limit=200").json["events"]]


def park(api: Api, db: Database, fake: FakeOpenAI, loop_id: str, question: str = "Which region?") -> tuple[
        uuid.UUID, dict[str, Any]]:
    """Fires the loop once and has its run ask ``question``: the run and its pending request."""
    fake.script = [report(f"ask-{uuid.uuid4().hex[:6]}", "needs_input", "I need a decision", question=question)]
    run_id = fire(api, db, loop_id)
    assert run_id is not None
    assert work(db, run_id).result == "awaiting_input"
    [request] = api.alice.get("/v1/input-requests?state=pending").json["input_requests"]
    assert request["run_id"] == str(run_id)
    return run_id, request


# --- the walk ------------------------------------------------------------------------------------------


def test_a_loop_walks_continue_needs_input_answer_continue_complete(
        api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    conversation_id, loop = make_loop(api, fake_openai)
    loop_id = loop["id"]
    assert (loop["status"], loop["loop"], loop["catch_up"], loop["overlap"], loop["mode"]) == (
        "active", True, False, "skip", "append")
    assert "verification" not in loop["goal"] and loop["goal"]["verification_digest"]

    # 1. continue: the run succeeds, the loop keeps its next occurrence.
    fake_openai.script = [report("c1", "continue", "Closed 12 stale issues")]
    first = fire(api, db, loop_id)
    assert first is not None and work(db, first).result == "succeeded"
    assert loop_row(api, loop_id)["status"] == "active"
    sent = fake_openai.bodies()[0]
    assert "goal_report" in {t["function"]["name"] for t in sent["tools"]}
    assert "The backlog has no stale issues" in sent["messages"][0]["content"]
    assert notes(api, conversation_id) == []

    # 2. needs_input: the run parks with no lease, the loop pauses waiting on it, a note is left.
    fake_openai.requests.clear()
    second, request = park(api, db, fake_openai, loop_id, "Close issues labelled 'maybe'?")
    run = one(api.url, "SELECT * FROM runs WHERE id = %s", second)
    assert (run["state"], run["lease_token"], run["lease_expires_at"]) == ("awaiting_input", None, None)
    assert rows(api.url, "SELECT 1 FROM runs WHERE state = 'running'") == []  # no worker holds anything
    waiting = loop_row(api, loop_id)
    assert (waiting["status"], waiting["input_run_id"]) == ("paused", second)
    assert notes(api, conversation_id) == ["input_required"]
    assert events(api, second)[-2:] == ["step.finished", "input.waiting"]
    assert request["question"] == "Close issues labelled 'maybe'?" and request["state"] == "pending"
    assert fire(api, db, loop_id) is None  # a paused loop fires nothing while it waits
    thread = api.alice.get(f"/v1/conversations/{conversation_id}").json["conversation"]["entries"]
    assert thread[-1]["content"] == "Close issues labelled 'maybe'?"

    # 3. the owner answers: the same run is queued again and handed to SQS.
    api.messages()
    answered = api.alice.post(f"/v1/input-requests/{request['id']}/answer", {"answer": "Yes, close them"})
    assert answered.status == 200, answered.text
    assert answered.json["run_id"] == str(second) and answered.json["input_request"]["state"] == "answered"
    assert api.messages() == [{"run_id": str(second)}]
    assert one(api.url, "SELECT state FROM runs WHERE id = %s", second)["state"] == "queued"

    # 4. the resumed attempt reads the answer and reports continue: the loop is active at a future fire.
    fake_openai.requests.clear()
    fake_openai.script = [report("c3", "continue", "Closed the 'maybe' issues")]
    assert work(db, second).result == "succeeded"
    resumed = fake_openai.bodies()[0]["messages"][-1]
    assert resumed["role"] == "tool" and json.loads(resumed["content"])["answer"] == "Yes, close them"
    after = loop_row(api, loop_id)
    assert (after["status"], after["input_run_id"]) == ("active", None)
    assert after["next_fire_at"] > one(api.url, "SELECT now() AS now")["now"]
    run = one(api.url, "SELECT * FROM runs WHERE id = %s", second)
    assert (run["state"], run["attempt"], run["output"]["disposition"]) == ("succeeded", 2, "continue")
    assert events(api, second) == [
        # attempt 1: the model turn asks goal_report(needs_input); the run parks on the question
        "run.queued", "run.claimed", "step.started", "effect.reserved", "effect.settled", "step.finished",
        "step.started", "step.finished", "input.waiting",
        # the owner's answer requeues the same run
        "input.answered", "run.queued",
        # attempt 2: the claim's step folds the log, the answer is the call's result, the model reports
        "run.claimed", "step.started", "step.finished", "step.started", "step.finished",
        "step.started", "effect.reserved", "effect.settled", "step.finished",
        "step.started", "output.published", "step.finished", "run.succeeded"]

    # 5. complete: the loop is completed and fires no more.
    fake_openai.script = [report("c4", "complete", "No stale issues left")]
    third = fire(api, db, loop_id)
    assert third is not None and work(db, third).result == "succeeded"
    done = loop_row(api, loop_id)
    assert (done["status"], done["next_fire_at"]) == ("completed", None)
    assert notes(api, conversation_id) == ["goal_completed", "input_required"]
    assert fire(api, db, loop_id) is None
    assert api.alice.get(f"/v1/loops/{loop_id}").json["schedule"]["status"] == "completed"


def test_blocked_pauses_the_loop_with_a_note(api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    conversation_id, loop = make_loop(api, fake_openai)
    fake_openai.script = [report("b1", "blocked", "The tracker's API key was revoked")]
    run_id = fire(api, db, loop["id"])
    assert run_id is not None and work(db, run_id).result == "succeeded"
    assert loop_row(api, loop["id"])["status"] == "paused"
    assert notes(api, conversation_id) == ["goal_blocked"]


def test_a_loop_run_without_a_report_fails_goal_report_missing(
        api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    _, loop = make_loop(api, fake_openai)
    fake_openai.script = [{"content": "I did some things."}]
    run_id = fire(api, db, loop["id"])
    assert run_id is not None and work(db, run_id).result == "failed"
    run = one(api.url, "SELECT * FROM runs WHERE id = %s", run_id)
    assert run["diagnosis"]["reason_code"] == "goal_report_missing"
    assert loop_row(api, loop["id"])["status"] == "active"


def test_a_bad_report_is_a_tool_error_the_model_corrects(api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    _, loop = make_loop(api, fake_openai)
    fake_openai.script = [tool_call("x1", "goal_report", {"disposition": "needs_input", "summary": "?"}),
                          tool_call("x2", "goal_report", {"disposition": "finished", "summary": "done"}),
                          report("x3", "continue", "ok")]
    run_id = fire(api, db, loop["id"])
    assert run_id is not None and work(db, run_id).result == "succeeded"
    first, second = (json.loads(b["messages"][-1]["content"]) for b in fake_openai.bodies()[1:3])
    assert [f["field"] for f in first["error"]["fields"]] == ["question"]
    assert second["error"]["fields"][0]["rule"] == "enum"
    assert rows(api.url, "SELECT 1 FROM input_requests") == []


# --- races ---------------------------------------------------------------------------------------------


def race(*calls: Callable[[], Answer]) -> list[Answer]:
    barrier = threading.Barrier(len(calls))
    answers: list[Answer | None] = [None] * len(calls)

    def go(i: int) -> None:
        barrier.wait()
        answers[i] = calls[i]()

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [a for a in answers if a is not None]


def test_two_answers_to_one_request_one_wins(api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    conversation_id, loop = make_loop(api, fake_openai)
    run_id, request = park(api, db, fake_openai, loop["id"])
    path = f"/v1/input-requests/{request['id']}/answer"

    answers = race(lambda: api.alice.post(path, {"answer": "left"}), lambda: api.alice.post(path, {"answer": "right"}))

    assert sorted(a.status for a in answers) == [200, 409]
    assert [a.error["code"] for a in answers if a.status == 409] == ["not_pending"]
    thread = api.alice.get(f"/v1/conversations/{conversation_id}").json["conversation"]["entries"]
    assert sum(e["content"] in ("left", "right") for e in thread) == 1  # one answer in the thread
    assert "input.answered" in events(api, run_id) and events(api, run_id).count("input.answered") == 1
    assert api.alice.post(path, {"answer": "again"}).status == 409


def test_an_answer_racing_a_cancel_exactly_one_wins(api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    for _ in range(3):
        _, loop = make_loop(api, fake_openai)
        run_id, request = park(api, db, fake_openai, loop["id"])
        answer_path, cancel_path = f"/v1/input-requests/{request['id']}/answer", f"/v1/runs/{run_id}/cancel"
        answer, cancel = race(partial(api.alice.post, answer_path, {"answer": "go"}),
                              partial(api.alice.post, cancel_path))
        assert cancel.status == 200
        state = one(api.url, "SELECT state FROM input_requests WHERE id = %s", request["id"])["state"]
        # Either the answer came first (answered, the requeued run then cancelled while queued) or the
        # cancel did (the request cancelled, the answer refused): never both, never neither.
        assert (state, answer.status) in (("answered", 200), ("cancelled", 409))
        assert one(api.url, "SELECT state FROM runs WHERE id = %s", run_id)["state"] == "cancelled"
        fake_openai.requests.clear()
        assert work(db, run_id).result != "succeeded"
        assert fake_openai.requests == []  # the cancelled run never calls the model again
        api.alice.delete(f"/v1/schedules/{loop['id']}")


def test_a_goal_edit_while_a_run_is_queued_refuses_it_at_claim(
        api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    _, loop = make_loop(api, fake_openai)
    queued = fire(api, db, loop["id"])
    assert queued is not None

    edited = api.alice.patch(f"/v1/loops/{loop['id']}", {"goal": {"outcome": "Only label stale issues"}})
    assert edited.status == 200, edited.text
    shown = edited.json["schedule"]
    assert (shown["status"], shown["goal_revision"], shown["goal"]["outcome"]) == (
        "draft", loop["revision"] + 1, "Only label stale issues")
    assert fire(api, db, loop["id"]) is None  # a draft loop fires nothing
    assert api.alice.post(f"/v1/schedules/{loop['id']}/resume").json["schedule"]["status"] == "active"

    outcome = work(db, queued)  # the loop is active again, but the run was made for the old goal

    assert (outcome.result, outcome.reason_code) == ("refused", "goal_revised")
    run = one(api.url, "SELECT * FROM runs WHERE id = %s", queued)
    assert (run["state"], run["diagnosis"]["reason_code"]) == ("cancelled", "goal_revised")
    assert fake_openai.requests == []
    fake_openai.script = [report("n1", "continue", "labelled")]
    fresh = fire(api, db, loop["id"])  # a run of the new revision works toward the new goal
    assert fresh is not None and work(db, fresh).result == "succeeded"
    assert "Only label stale issues" in fake_openai.bodies()[0]["messages"][0]["content"]


def test_a_goal_edit_cancels_the_old_goals_question(api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    _, loop = make_loop(api, fake_openai)
    run_id, request = park(api, db, fake_openai, loop["id"])
    assert api.alice.patch(f"/v1/loops/{loop['id']}", {"goal": {"outcome": "Something else"}}).status == 200
    assert one(api.url, "SELECT state FROM input_requests WHERE id = %s", request["id"])["state"] == "cancelled"
    run = one(api.url, "SELECT * FROM runs WHERE id = %s", run_id)
    assert (run["state"], run["diagnosis"]["reason_code"]) == ("cancelled", "goal_revised")
    assert api.alice.post(f"/v1/input-requests/{request['id']}/answer", {"answer": "late"}).status == 409


def test_max_occurrences_reached_while_waiting_for_input(api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    _, loop = make_loop(api, fake_openai, max_occurrences=2)
    fake_openai.script = [report("m1", "continue", "first")]
    first = fire(api, db, loop["id"])
    assert first is not None and work(db, first).result == "succeeded"

    run_id, request = park(api, db, fake_openai, loop["id"])  # the last occurrence asks
    assert loop_row(api, loop["id"])["status"] == "completed"  # its fire used up max_occurrences

    assert api.alice.post(f"/v1/input-requests/{request['id']}/answer", {"answer": "yes"}).status == 200
    fake_openai.script = [report("m3", "continue", "finished what was asked")]
    assert work(db, run_id).result == "succeeded"  # the answered run still runs under a completed loop

    after = loop_row(api, loop["id"])
    assert (after["status"], after["fire_count"], after["next_fire_at"]) == ("completed", 2, None)
    assert fire(api, db, loop["id"]) is None


def test_a_loop_that_ends_while_waiting_completes_on_continue(
        api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    _, loop = make_loop(api, fake_openai)
    run_id, request = park(api, db, fake_openai, loop["id"])
    with psycopg.connect(api.url, autocommit=True) as conn:  # the end comes before the next fire
        conn.execute("UPDATE schedules SET ends_at = now() + interval '1 second' WHERE id = %s", (loop["id"],))
    assert api.alice.post(f"/v1/input-requests/{request['id']}/answer", {"answer": "yes"}).status == 200
    fake_openai.script = [report("e1", "continue", "more to do")]
    assert work(db, run_id).result == "succeeded"
    after = loop_row(api, loop["id"])
    assert (after["status"], after["next_fire_at"], after["input_run_id"]) == ("completed", None, None)


def test_deleting_a_loop_cancels_its_pending_questions(api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    _, loop = make_loop(api, fake_openai)
    run_id, request = park(api, db, fake_openai, loop["id"])

    assert api.alice.delete(f"/v1/schedules/{loop['id']}").status == 200

    assert one(api.url, "SELECT state FROM input_requests WHERE id = %s", request["id"])["state"] == "cancelled"
    run = one(api.url, "SELECT * FROM runs WHERE id = %s", run_id)
    assert (run["state"], run["diagnosis"]["reason_code"]) == ("cancelled", "schedule_cancelled")
    refused = api.alice.post(f"/v1/input-requests/{request['id']}/answer", {"answer": "too late"})
    assert (refused.status, refused.error["code"]) == (409, "not_pending")
    assert api.alice.get("/v1/input-requests?state=pending").json["input_requests"] == []


# --- no loosening through the schedules API -------------------------------------------------------------


def test_the_schedules_api_cannot_loosen_a_loop(api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    _, loop = make_loop(api, fake_openai)
    loop_id = loop["id"]
    now = datetime.now(UTC)
    refused = {
        "trigger": api.alice.post(f"/v1/schedules/{loop_id}/trigger"),
        "backfill": api.alice.post(f"/v1/schedules/{loop_id}/backfill", {
            "from": (now - timedelta(days=1)).isoformat(), "until": now.isoformat()}),
        "patch": api.alice.patch(f"/v1/schedules/{loop_id}", {"catch_up": True}),
        "patch_overlap": api.alice.patch(f"/v1/schedules/{loop_id}", {"overlap": "allow"}),
    }
    fake_openai.script = [{"content": "no report"}]
    failed = fire(api, db, loop_id)
    assert failed is not None and work(db, failed).result == "failed"
    refused["retry"] = api.alice.post(f"/v1/runs/{failed}/retry")
    for name, answer in refused.items():
        assert (name, answer.status, answer.error["code"]) == (name, 409, "loop_policy"), answer.text
    row = loop_row(api, loop_id)
    assert (row["catch_up"], row["overlap"], row["revision"]) == (False, "skip", loop["revision"])
    assert rows(api.url, "SELECT source FROM occurrences WHERE schedule_id = %s", loop_id) == [
        {"source": "scheduled"}]


def test_another_owners_request_is_the_same_404_bytes_as_a_missing_one(
        api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    _, loop = make_loop(api, fake_openai)
    _, request = park(api, db, fake_openai, loop["id"])
    foreign = api.bob.post(f"/v1/input-requests/{request['id']}/answer", {"answer": "mine"})
    missing = api.bob.post(f"/v1/input-requests/{uuid.uuid4()}/answer", {"answer": "mine"})
    assert foreign.status == missing.status == 404 and foreign.text == missing.text
    assert api.bob.get("/v1/input-requests").json["input_requests"] == []
    assert one(api.url, "SELECT state FROM input_requests WHERE id = %s", request["id"])["state"] == "pending"


def test_an_answer_racing_the_loops_cancel_exactly_one_wins(
        api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    for _ in range(3):
        _, loop = make_loop(api, fake_openai)
        run_id, request = park(api, db, fake_openai, loop["id"])
        answer, cancel = race(partial(api.alice.post, f"/v1/input-requests/{request['id']}/answer", {"answer": "go"}),
                              partial(api.alice.delete, f"/v1/schedules/{loop['id']}"))
        assert cancel.status == 200, cancel.text
        state = one(api.url, "SELECT state FROM input_requests WHERE id = %s", request["id"])["state"]
        run = one(api.url, "SELECT state, diagnosis FROM runs WHERE id = %s", run_id)
        if answer.status == 200:  # the answer first: the run is queued, and its claim finds the loop cancelled
            assert (state, run["state"]) == ("answered", "queued")
            assert work(db, run_id).reason_code == "schedule_cancelled"
        else:  # the cancel first: the question and its run are cancelled, the answer refused
            assert (state, run["state"], answer.error["code"]) == ("cancelled", "cancelled", "not_pending")
        assert one(api.url, "SELECT state FROM runs WHERE id = %s", run_id)["state"] == "cancelled"


def test_a_waiting_run_holds_no_owner_slot(api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    import dataclasses

    one_slot = dataclasses.replace(OPENAI_SETTINGS, owner_concurrency=1)
    _, waiting_loop = make_loop(api, fake_openai)
    fake_openai.script = [report("s1", "needs_input", "?", question="Which one?")]
    waiting = fire(api, db, waiting_loop["id"])
    assert waiting is not None and process(db, waiting, settings=one_slot).result == "awaiting_input"

    _, other_loop = make_loop(api, fake_openai)
    fake_openai.script = [report("s2", "continue", "meanwhile")]
    other = fire(api, db, other_loop["id"])
    assert other is not None
    assert process(db, other, settings=one_slot).result == "succeeded"  # the owner's one slot was free


def test_retention_forgets_an_old_runs_question_and_keeps_its_digest(
        api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    from kairos.tick.prune import FORGOTTEN, Prune

    # Given a loop run that asked a question and was cancelled 31 days ago
    _, loop = make_loop(api, fake_openai)
    run_id, request = park(api, db, fake_openai, loop["id"], question="Which region, eu-west-1 or us-east-1?")
    assert api.alice.post(f"/v1/runs/{run_id}/cancel").status == 200
    before = one(api.url, "SELECT * FROM input_requests WHERE id = %s", request["id"])
    assert (before["state"], before["question"]) == ("cancelled", "Which region, eu-west-1 or us-east-1?")
    factories.ended_ago(api.url, run_id)

    # When the pruner passes
    report = Prune(db).run_once()

    # Then the question reads as forgotten, and everything else of the request is as it was
    assert (report.runs, report.questions) == (1, 1)
    after = one(api.url, "SELECT * FROM input_requests WHERE id = %s", request["id"])
    assert after["question"] == FORGOTTEN
    assert {k: v for k, v in after.items() if k not in ("question", "updated_at")} == \
        {k: v for k, v in before.items() if k not in ("question", "updated_at")}
    listed = api.alice.get("/v1/input-requests?state=cancelled").json["input_requests"]
    assert [(r["id"], r["question"]) for r in listed] == [(request["id"], FORGOTTEN)]
