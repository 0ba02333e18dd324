"""One lock order for a run and its waits: the run row first, then its approval or input request.

A decision (approve, deny, answer), the tick's expiry and a cancel (of the run, or of its loop) each
lock a run and one of its waits. Taken in opposite orders, PostgreSQL breaks the cycle by killing one
transaction and the API answers 500. These tests race the two sides through the API handler on real
threads and a real database, and pin the order itself with a side connection that holds one row.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from kairos import approvals, schedules
from kairos import db as kdb
from kairos.db import Database
from kairos.execution.execute import process
from kairos.schedules import loops
from kairos.tick import Tick
from tests import factories
from tests.support.api import Api
from tests.support.executors import OPENAI_SETTINGS, FakeOpenAI, openai_agent, tool_call
from tests.support.peer import Peer, respond

ROUNDS = 20


def rows(url: str, query: str, *args: Any) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        return conn.execute(query, args).fetchall()


def post(api: Api, path: str, body: Any = None) -> Callable[[], int]:
    return lambda: api.alice.post(path, body).status


def race(*calls: Callable[[], int]) -> list[int]:
    """Starts ``calls`` together on real threads; their statuses, in the order given."""
    start = threading.Barrier(len(calls))
    statuses: list[int | None] = [None] * len(calls)

    def go(i: int, call: Callable[[], int]) -> None:
        start.wait(timeout=30)
        statuses[i] = call()

    threads = [threading.Thread(target=go, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a request hung"
    assert all(s is not None for s in statuses), statuses
    return [int(s) for s in statuses if s is not None]


@pytest.fixture
def target() -> Any:
    with Peer(respond(200, '{"ok": true}')) as peer:
        yield peer


def parked(api: Api, db: Database, fake: FakeOpenAI, target: Peer) -> tuple[uuid.UUID, dict[str, Any]]:
    """A chat turn whose ``http_post`` call waits for approval (the real worker parked it)."""
    fake.script = [tool_call("post-1", "http_post", {"url": target.url("/hook"), "body": {"n": 1}}),
                   {"content": "Posted."}]
    created = api.alice.post("/v1/conversations", {"agent": {**openai_agent(fake), "tools": ["http"]}})
    turn = api.alice.post(f"/v1/conversations/{created.json['conversation']['id']}/messages", {"content": "go"})
    run_id = uuid.UUID(turn.json["run_id"])
    assert process(db, run_id, settings=OPENAI_SETTINGS).result == "awaiting_approval"
    [approval] = rows(api.url, "SELECT * FROM approvals WHERE run_id = %s", run_id)
    return run_id, approval


def test_approve_or_deny_racing_a_cancel_never_answers_500_and_never_sends_the_call(
        api: Api, db: Database, fake_openai: FakeOpenAI, target: Peer) -> None:
    for round_ in range(ROUNDS):
        run_id, approval = parked(api, db, fake_openai, target)
        verb = "approve" if round_ % 2 == 0 else "deny"

        decided, cancelled = race(post(api, f"/v1/approvals/{approval['id']}/{verb}"),
                                  post(api, f"/v1/runs/{run_id}/cancel"))

        assert cancelled == 200 and decided in (200, 409), (round_, verb, decided, cancelled)
        [run] = rows(api.url, "SELECT state FROM runs WHERE id = %s", run_id)
        [after] = rows(api.url, "SELECT state FROM approvals WHERE id = %s", approval["id"])
        if verb == "approve":
            # Approved first: the cancel ends the queued run and retires the approval; else the cancel
            # retired it and the approval conflicted. Either way the run ends cancelled.
            assert (run["state"], after["state"]) == ("cancelled", "retired"), (round_, decided)
        else:
            assert (run["state"], after["state"]) in {("cancelled", "retired"), ("policy_blocked", "denied")}
            assert (decided == 200) == (after["state"] == "denied"), (round_, decided, after)
        # A worker handed the run after the race (the approval's send) applies nothing.
        process(db, run_id, settings=OPENAI_SETTINGS)
        api.messages()
    assert target.received == []  # the approved call was never sent, let alone twice


def test_an_approved_call_raced_by_a_late_cancel_is_applied_at_most_once(
        api: Api, db: Database, fake_openai: FakeOpenAI, target: Peer) -> None:
    """Approve, then a worker and a cancel together: the call goes out once or not at all."""
    for round_ in range(ROUNDS // 2):
        run_id, approval = parked(api, db, fake_openai, target)
        sent_before = len(target.received)
        assert api.alice.post(f"/v1/approvals/{approval['id']}/approve").status == 200

        _, cancelled = race(partial(work, db, run_id), post(api, f"/v1/runs/{run_id}/cancel"))

        assert cancelled == 200, round_
        [after] = rows(api.url, "SELECT state FROM approvals WHERE id = %s", approval["id"])
        sent = len(target.received) - sent_before
        assert sent <= 1 and (sent == 1) == (after["state"] == "applied"), (round_, sent, after)
        api.messages()


def work(db: Database, run_id: uuid.UUID) -> int:
    process(db, run_id, settings=OPENAI_SETTINGS)
    return 200


def test_an_answer_racing_a_cancel_never_answers_500(api: Api) -> None:
    conversation = factories.conversation(api.url, owner="alice")
    loop = factories.loop(api.url, owner="alice", conversation_id=conversation["id"])
    for round_ in range(ROUNDS):
        asking = factories.run(api.url, schedule_row=loop, state="awaiting_input", attempt=1, fence=1,
                               fire_at=datetime(2026, 1, 1, tzinfo=UTC) + timedelta(hours=round_))
        question = factories.input_request(api.url, run_row=asking)

        answered, cancelled = race(post(api, f"/v1/input-requests/{question['id']}/answer", {"answer": "blue"}),
                                   post(api, f"/v1/runs/{asking['id']}/cancel"))

        assert cancelled == 200 and answered in (200, 409), (round_, answered, cancelled)
        [run] = rows(api.url, "SELECT state FROM runs WHERE id = %s", asking["id"])
        [after] = rows(api.url, "SELECT state FROM input_requests WHERE id = %s", question["id"])
        assert run["state"] == "cancelled"
        assert after["state"] == ("answered" if answered == 200 else "cancelled"), (round_, answered, after)
        api.messages()


def test_an_answer_racing_the_loops_cancel_never_answers_500(api: Api) -> None:
    for round_ in range(ROUNDS // 2):
        conversation = factories.conversation(api.url, owner="alice")
        loop = factories.loop(api.url, owner="alice", conversation_id=conversation["id"])
        asking = factories.run(api.url, schedule_row=loop, state="awaiting_input", attempt=1, fence=1)
        question = factories.input_request(api.url, run_row=asking)

        answered, cancelled = race(post(api, f"/v1/input-requests/{question['id']}/answer", {"answer": "blue"}),
                                   partial(lambda path: api.alice.delete(path).status, f"/v1/schedules/{loop['id']}"))

        assert cancelled == 200 and answered in (200, 409), (round_, answered, cancelled)
        [run] = rows(api.url, "SELECT state FROM runs WHERE id = %s", asking["id"])
        [after] = rows(api.url, "SELECT state FROM input_requests WHERE id = %s", question["id"])
        # Answered first: the run is queued again (the claim refuses it, its loop cancelled); else the
        # loop's cancel ended the waiting run with its question.
        expected = ("queued", "answered") if answered == 200 else ("cancelled", "cancelled")
        assert (run["state"], after["state"]) == expected, (round_, answered)
        api.messages()


# --- the order itself --------------------------------------------------------------------------------


def waiting_on_a_lock(url: str, pid: int, deadline: float = 20.0) -> None:
    """Waits until backend ``pid`` waits on a lock (a deadline, not a sleep of a guessed length)."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        [row] = rows(url, "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", pid)
        if row["wait_event_type"] == "Lock":
            return
        time.sleep(0.01)
    raise AssertionError(f"backend {pid} never waited on a lock")


def decision(decide: str, conn: Any, approval_id: uuid.UUID, done: threading.Event,
             failure: list[BaseException]) -> None:
    try:
        with kdb.atomic(conn):
            if decide == "approve":
                approvals.approve(conn, approval_id, owner="alice")
            elif decide == "deny":
                approvals.deny(conn, approval_id, owner="alice")
            else:
                approvals.expire_due(conn)
    except BaseException as error:
        failure.append(error)  # reported to the test's thread
    finally:
        done.set()


def test_a_decision_and_the_expiry_take_the_run_before_the_approval(api: Api) -> None:
    """With the run held elsewhere (as a cancel holds it), a decision and the tick's expiry wait for the
    run without holding the approval: the holder can still take the approval (as a cancel does next)."""
    for decide in ("approve", "deny", "expire"):
        parked_run = factories.run(api.url, state="awaiting_approval", attempt=1, fence=1)
        approval = factories.approval(api.url, run_row=parked_run)
        if decide == "expire":
            with psycopg.connect(api.url, autocommit=True) as c:
                c.execute("UPDATE approvals SET expires_at = now() - interval '1 second' WHERE id = %s",
                          (approval["id"],))
        with psycopg.connect(api.url, row_factory=dict_row) as holder, \
                psycopg.connect(api.url, row_factory=dict_row) as decider:
            holder.execute("SELECT 1 FROM runs WHERE id = %s FOR NO KEY UPDATE", (parked_run["id"],))
            pid = decider.info.backend_pid
            done = threading.Event()
            failure: list[BaseException] = []
            thread = threading.Thread(target=decision, args=(decide, decider, approval["id"], done, failure))
            thread.start()
            try:
                if decide != "expire":
                    waiting_on_a_lock(api.url, pid)
                else:
                    # The expiry skips a run someone holds rather than wait for it.
                    assert done.wait(timeout=20)
                # The holder (a cancel) takes the approval next: it must not be held by the decision.
                holder.execute("SET LOCAL lock_timeout = '2s'")
                holder.execute("SELECT 1 FROM approvals WHERE id = %s FOR NO KEY UPDATE", (approval["id"],))
                holder.rollback()
            finally:
                holder.rollback()
                thread.join(timeout=30)
            assert not failure, (decide, failure)
        [after] = rows(api.url, "SELECT state FROM approvals WHERE id = %s", approval["id"])
        expected = {"approve": "approved", "deny": "denied", "expire": "pending"}[decide]
        assert after["state"] == expected, (decide, after)


def loop_question(api: Api, db: Database, fake: FakeOpenAI) -> tuple[str, uuid.UUID]:
    """A goal loop (through the API) whose run asked a question (the real worker parked it)."""
    created = api.alice.post("/v1/conversations", {"agent": openai_agent(fake)})
    loop = api.alice.post("/v1/loops", {
        "conversation_id": created.json["conversation"]["id"], "prompt": "Tidy the backlog",
        "goal": {"outcome": "No stale issues"}, "interval_seconds": 3600,
        "ends_at": (datetime.now(UTC) + timedelta(days=7)).isoformat(), "max_occurrences": 10})
    assert loop.status == 201, loop.text
    loop_id = loop.json["schedule"]["id"]
    with psycopg.connect(api.url, autocommit=True) as conn:
        conn.execute("UPDATE schedules SET next_fire_at = now() - interval '1 second', "
                     "starts_at = now() - interval '1 second' WHERE id = %s", (loop_id,))
    Tick(db, api.sqs, api.queue_url, metrics=None).run()
    [fired] = rows(api.url, "SELECT id FROM runs WHERE schedule_id = %s", loop_id)
    api.messages()
    fake.script = [tool_call("ask-1", "goal_report", {"disposition": "needs_input", "summary": "Need a decision",
                                                      "question": "Close the maybe issues?"})]
    assert process(db, fired["id"], settings=OPENAI_SETTINGS).result == "awaiting_input"
    return loop_id, fired["id"]


def loop_move(move: str, conn: Any, loop_id: str, done: threading.Event, failure: list[BaseException]) -> None:
    try:
        with kdb.atomic(conn):
            if move == "cancel":
                schedules.cancel(conn, uuid.UUID(loop_id), owner="alice")
            else:
                loops.edit(conn, uuid.UUID(loop_id), owner="alice", patch={"goal": {"outcome": "Something else"}})
    except BaseException as error:
        failure.append(error)  # reported to the test's thread
    finally:
        done.set()


@pytest.mark.parametrize("move", ["cancel", "goal_edit"])
def test_a_loop_cancel_and_goal_edit_take_the_waiting_run_before_the_loop(
        api: Api, db: Database, fake_openai: FakeOpenAI, move: str) -> None:
    """With the waiting run held elsewhere (as its worker holds it), the loop's cancel or goal edit waits
    for the run without holding the loop: the holder can still take the loop (as a goal report does
    next), so the two never deadlock."""
    loop_id, run_id = loop_question(api, db, fake_openai)
    with psycopg.connect(api.url, row_factory=dict_row) as holder, \
            psycopg.connect(api.url, row_factory=dict_row) as mover:
        holder.execute("SELECT 1 FROM runs WHERE id = %s FOR NO KEY UPDATE", (run_id,))
        done = threading.Event()
        failure: list[BaseException] = []
        thread = threading.Thread(target=loop_move, args=(move, mover, loop_id, done, failure))
        thread.start()
        try:
            waiting_on_a_lock(api.url, mover.info.backend_pid)
            # The holder (a loop run's worker) takes the loop next: it must not be held by the move.
            holder.execute("SET LOCAL lock_timeout = '2s'")
            holder.execute("SELECT 1 FROM schedules WHERE id = %s FOR NO KEY UPDATE", (loop_id,))
        finally:
            holder.rollback()
            thread.join(timeout=30)
        assert done.is_set() and not failure, (move, failure)
    # Then the move went through: the question and its run cancelled with the loop or the old goal
    [run] = rows(api.url, "SELECT state, diagnosis FROM runs WHERE id = %s", run_id)
    reason = "schedule_cancelled" if move == "cancel" else "goal_revised"
    assert (run["state"], run["diagnosis"]["reason_code"]) == ("cancelled", reason)
    [request] = rows(api.url, "SELECT state FROM input_requests WHERE run_id = %s", run_id)
    assert request["state"] == "cancelled"
    [loop] = rows(api.url, "SELECT status FROM schedules WHERE id = %s", loop_id)
    assert loop["status"] == ("cancelled" if move == "cancel" else "draft")
