"""The run worker against real PostgreSQL: claim, modes, execution, retries, failures, cancel, reads."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from kairos import runs
from kairos.db import Database
from kairos.diagnosis import REASON_CODES, RECOVERY_ACTIONS, RUN_REASON_CODES, diagnose
from kairos.errors import NotFound
from kairos.execution.execute import CALL_TIMEOUT_CAP_SECONDS, LAMBDA_MARGIN_SECONDS, RUNTIME_CAP_SECONDS, process
from kairos.execution.heartbeat import Heartbeat
from kairos.executors.base import (
    ExecutionRequest,
    ExecutorError,
    PreparedCall,
    Reply,
    canonical_json,
    digest,
)
from kairos.probes import Probes
from kairos.runs import moves
from kairos.settings import Settings
from tests import factories
from tests.support.executors import ScriptedExecutor, raising

SETTINGS = Settings()


def _row(url: str, sql: str, *params: Any) -> dict[str, Any] | None:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        return conn.execute(sql, params).fetchone()


def _rows(url: str, sql: str, *params: Any) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def _types(url: str, run_id: uuid.UUID) -> list[str]:
    return [r["type"] for r in _rows(url, "SELECT type FROM run_events WHERE run_id = %s ORDER BY seq", run_id)]


def _entries(url: str, conversation_id: uuid.UUID) -> list[tuple[int, str, str]]:
    return [(r["seq"], r["role"], r["content"]) for r in _rows(
        url, "SELECT seq, role, content FROM conversation_entries WHERE conversation_id = %s ORDER BY seq",
        conversation_id)]


def _run(url: str, **columns: Any) -> dict[str, Any]:
    return factories.run(url, **columns)


# --- success and the trace --------------------------------------------------------------------------


def test_a_run_succeeds_once_with_an_output_reference_and_a_closed_trace(db: Database, db_url: str) -> None:
    run = _run(db_url)
    executor = ScriptedExecutor()

    outcome = process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory)

    assert outcome.result == "succeeded"
    row = _row(db_url, "SELECT * FROM runs WHERE id = %s", run["id"])
    assert row is not None
    assert row["state"] == "succeeded" and row["attempt"] == 1 and row["fence"] == 1
    assert row["lease_token"] is None and row["finished_at"] is not None
    assert row["output"] == {"conversation_id": str(row["conversation_id"]), "entry_seq": 2, "attempt": 1}
    assert row["usage"]["prompt_tokens"] == 3 and row["usage"]["completion_tokens"] == 5
    assert _types(db_url, run["id"]) == [
        "run.claimed", "step.started", "effect.reserved", "effect.settled", "output.published",
        "step.finished", "run.succeeded",
    ]
    assert _entries(db_url, row["conversation_id"]) == [(1, "user", "say hello"), (2, "assistant", "the answer")]
    (effect,) = _rows(db_url, "SELECT * FROM effects WHERE run_id = %s", run["id"])
    assert effect["state"] == "settled" and effect["fence"] == 1 and effect["kind"] == "model_call"
    assert effect["request_digest"] == digest(canonical_json({"prompt": "say hello", "n": 0}))
    assert len(executor.timeouts) == 1


def test_the_trace_carries_no_prompt_reply_or_payload(db: Database, db_url: str) -> None:
    sched = factories.schedule(db_url, prompt="SECRET-PROMPT-TEXT")
    run = _run(db_url, schedule_row=sched, payload={"k": "SECRET-PAYLOAD"})
    executor = ScriptedExecutor(on_send=lambda p, t: Reply(content="SECRET-REPLY-TEXT"))

    assert process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory).result == "succeeded"

    dumped = json.dumps([r["data"] for r in _rows(db_url, "SELECT data FROM run_events WHERE run_id = %s",
                                                   run["id"])])
    for secret in ("SECRET-PROMPT-TEXT", "SECRET-REPLY-TEXT", "SECRET-PAYLOAD"):
        assert secret not in dumped
    # The prompt entry references the payload instead of copying it; the executor still gets it.
    conversation_id = _row(db_url, "SELECT conversation_id FROM runs WHERE id = %s", run["id"])["conversation_id"]
    prompt_entry = _entries(db_url, conversation_id)[0][2]
    assert prompt_entry.startswith("SECRET-PROMPT-TEXT") and "SECRET-PAYLOAD" not in prompt_entry
    assert executor.requests[0].payload == {"k": "SECRET-PAYLOAD"}


def test_a_message_for_an_unknown_or_finished_run_does_nothing(db: Database, db_url: str) -> None:
    done = _run(db_url, state="succeeded")
    executor = ScriptedExecutor()

    unknown = process(db, uuid.uuid4(), settings=SETTINGS, executor_factory=executor.factory)
    finished = process(db, done["id"], settings=SETTINGS, executor_factory=executor.factory)

    assert unknown.result == "unknown"
    assert finished.result == "skipped" and finished.state == "succeeded"
    assert executor.requests == []
    assert _types(db_url, done["id"]) == []


def test_a_run_queued_behind_another_is_not_claimed(db: Database, db_url: str) -> None:
    first = _run(db_url, state="running")
    behind = _run(db_url, blocked_by_run_id=first["id"])
    executor = ScriptedExecutor()

    outcome = process(db, behind["id"], settings=SETTINGS, executor_factory=executor.factory)

    assert outcome.result == "skipped"
    assert _row(db_url, "SELECT state, attempt FROM runs WHERE id = %s", behind["id"]) == {
        "state": "queued", "attempt": 0}
    assert executor.requests == []


# --- run modes ----------------------------------------------------------------------------------------


def test_fork_leaves_the_owning_transcript_unchanged(db: Database, db_url: str) -> None:
    conv = factories.conversation(db_url, entries=[("user", "earlier"), ("assistant", "reply")])
    sched = factories.schedule(db_url, conversation_id=conv["id"], mode="fork")
    run = _run(db_url, schedule_row=sched)
    executor = ScriptedExecutor()

    assert process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory).result == "succeeded"

    row = _row(db_url, "SELECT conversation_id, output FROM runs WHERE id = %s", run["id"])
    assert row is not None
    fork = _row(db_url, "SELECT * FROM conversations WHERE id = %s", row["conversation_id"])
    assert fork is not None
    assert fork["parent_id"] == conv["id"] and fork["fork_seq"] == 2 and fork["origin_run_id"] == run["id"]
    assert _entries(db_url, conv["id"]) == [(1, "user", "earlier"), (2, "assistant", "reply")]
    assert _entries(db_url, fork["id"]) == [(3, "user", "say hello"), (4, "assistant", "the answer")]
    assert row["output"]["entry_seq"] == 4
    # The executor saw the parent's transcript, not the run's own prompt entry.
    assert [(m.role, m.content) for m in executor.requests[0].transcript] == [
        ("user", "earlier"), ("assistant", "reply")]


def test_append_adds_to_the_owning_transcript(db: Database, db_url: str) -> None:
    conv = factories.conversation(db_url, entries=[("user", "earlier")])
    sched = factories.schedule(db_url, conversation_id=conv["id"], mode="append")
    run = _run(db_url, schedule_row=sched)
    executor = ScriptedExecutor()

    assert process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory).result == "succeeded"

    assert _row(db_url, "SELECT conversation_id FROM runs WHERE id = %s", run["id"]) == {"conversation_id": conv["id"]}
    assert _entries(db_url, conv["id"]) == [(1, "user", "earlier"), (2, "user", "say hello"),
                                            (3, "assistant", "the answer")]
    assert [(m.role, m.content) for m in executor.requests[0].transcript] == [("user", "earlier")]


def test_fresh_starts_from_the_agent_snapshot(db: Database, db_url: str) -> None:
    conv = factories.conversation(db_url, entries=[("user", "earlier")])
    snapshot = {"executor": "echo", "model": "snap", "system": "You are the snapshot."}
    sched = factories.schedule(db_url, conversation_id=conv["id"], mode="fresh", agent=snapshot)
    run = _run(db_url, schedule_row=sched)
    executor = ScriptedExecutor()

    assert process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory).result == "succeeded"

    target = _row(db_url, "SELECT c.* FROM runs r JOIN conversations c ON c.id = r.conversation_id WHERE r.id = %s",
                  run["id"])
    assert target is not None
    assert target["id"] != conv["id"] and target["parent_id"] is None
    assert target["agent"] == snapshot and target["owner"] == "alice" and target["origin_run_id"] == run["id"]
    assert _entries(db_url, target["id"]) == [(1, "user", "say hello"), (2, "assistant", "the answer")]
    assert _entries(db_url, conv["id"]) == [(1, "user", "earlier")]
    assert executor.requests[0].transcript == () and executor.requests[0].agent == snapshot


def test_fresh_with_an_unusable_snapshot_fails_the_run_with_a_diagnosis(db: Database, db_url: str) -> None:
    sched = factories.schedule(db_url, mode="fresh", agent={"executor": "openai"})  # no model, no base_url
    run = _run(db_url, schedule_row=sched)
    executor = ScriptedExecutor()

    outcome = process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory)

    assert (outcome.result, outcome.reason_code) == ("failed", "agent_invalid")
    row = _row(db_url, "SELECT state, diagnosis, conversation_id FROM runs WHERE id = %s", run["id"])
    assert row is not None and row["state"] == "failed" and row["conversation_id"] is None
    assert row["diagnosis"]["reason_code"] == "agent_invalid"
    assert "check_agent_config" in row["diagnosis"]["recovery_actions"]
    assert _types(db_url, run["id"]) == ["run.claimed", "step.started", "step.finished", "run.failed"]
    assert executor.requests == []


# --- failures, retries, effects ---------------------------------------------------------------------------


def test_a_retry_safe_failure_requeues_the_same_run_and_the_next_attempt_succeeds(db: Database, db_url: str) -> None:
    run = _run(db_url)
    failing = ScriptedExecutor(on_send=raising(ExecutorError("connect_failed", "refused", retry_safe=True)))

    first = process(db, run["id"], settings=SETTINGS, executor_factory=failing.factory)

    assert (first.result, first.reason_code, first.retry_delay_seconds) == ("retry", "connect_failed", 10)
    row = _row(db_url, "SELECT * FROM runs WHERE id = %s", run["id"])
    assert row is not None
    assert row["state"] == "queued" and row["attempt"] == 1 and row["lease_token"] is None
    assert row["handoff_at"] is not None and row["finished_at"] is None

    working = ScriptedExecutor()
    second = process(db, run["id"], settings=SETTINGS, executor_factory=working.factory)

    assert second.result == "succeeded"
    row = _row(db_url, "SELECT * FROM runs WHERE id = %s", run["id"])
    assert row is not None
    assert row["state"] == "succeeded" and row["attempt"] == 2 and row["fence"] == 2
    assert row["output"]["attempt"] == 2
    # Same run, same conversation, the prompt written once; the retry saw the same transcript.
    assert [e[1] for e in _entries(db_url, row["conversation_id"])] == ["user", "assistant"]
    assert working.requests[0].transcript == failing.requests[0].transcript
    assert [e["state"] for e in _rows(db_url, "SELECT state FROM effects WHERE run_id = %s ORDER BY fence",
                                      run["id"])] == ["failed", "settled"]
    assert _types(db_url, run["id"]) == [
        "run.claimed", "step.started", "effect.reserved", "effect.settled", "step.finished", "run.queued",
        "run.claimed", "step.started", "effect.reserved", "effect.settled", "output.published", "step.finished",
        "run.succeeded",
    ]


def test_retries_stop_at_max_attempts_with_a_retry_eligible_diagnosis(db: Database, db_url: str) -> None:
    run = _run(db_url, max_attempts=2)
    failing = ScriptedExecutor(on_send=raising(ExecutorError("rate_limited", "429", retry_safe=True)))

    results = [process(db, run["id"], settings=SETTINGS, executor_factory=failing.factory).result
               for _ in range(3)]

    assert results == ["retry", "failed", "skipped"]
    assert len(failing.timeouts) == 2
    row = _row(db_url, "SELECT state, attempt, diagnosis FROM runs WHERE id = %s", run["id"])
    assert row is not None and row["state"] == "failed" and row["attempt"] == 2
    assert row["diagnosis"]["reason_code"] == "rate_limited" and row["diagnosis"]["retry_eligible"] is True


def test_a_failure_that_is_not_retry_safe_fails_at_once_with_a_closed_diagnosis(db: Database, db_url: str) -> None:
    run = _run(db_url)
    executor = ScriptedExecutor(on_send=raising(ExecutorError("peer_error", "HTTP 400")))

    outcome = process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory)

    assert (outcome.result, outcome.reason_code) == ("failed", "peer_error")
    diagnosis = _row(db_url, "SELECT diagnosis FROM runs WHERE id = %s", run["id"])["diagnosis"]
    assert set(diagnosis) == {"summary", "scope", "reason_code", "retry_eligible", "recovery_actions"}
    assert diagnosis["reason_code"] in REASON_CODES and diagnosis["scope"] in ("run", "step", "target")
    assert set(diagnosis["recovery_actions"]) <= RECOVERY_ACTIONS
    assert "400" not in diagnosis["summary"]  # provider detail stays out of the diagnosis
    assert _types(db_url, run["id"])[-2:] == ["step.finished", "run.failed"]


def test_a_mutation_with_an_unknown_outcome_ends_ambiguous_and_is_never_replayed(db: Database, db_url: str) -> None:
    run = _run(db_url)
    executor = ScriptedExecutor(mutation=True, on_send=raising(
        ExecutorError("ambiguous_effect", "dropped after sending", outcome_unknown=True)))

    outcome = process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory)

    assert (outcome.result, outcome.reason_code) == ("failed", "ambiguous_effect")
    assert _row(db_url, "SELECT state FROM effects WHERE run_id = %s", run["id"]) == {"state": "ambiguous"}
    diagnosis = _row(db_url, "SELECT diagnosis FROM runs WHERE id = %s", run["id"])["diagnosis"]
    assert diagnosis["retry_eligible"] is False and "retry_run" not in diagnosis["recovery_actions"]

    # Even if something put the run back in the queue, a new claim refuses to replay it.
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE runs SET state = 'queued', finished_at = NULL, diagnosis = NULL WHERE id = %s",
                     (run["id"],))
    again = process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory)
    assert (again.result, again.reason_code) == ("failed", "ambiguous_effect")
    assert len(executor.timeouts) == 1


def test_a_mutation_that_failed_with_a_known_outcome_may_retry(db: Database, db_url: str) -> None:
    run = _run(db_url)
    executor = ScriptedExecutor(mutation=True, on_send=raising(ExecutorError("connect_failed", "refused",
                                                                            retry_safe=True)))

    assert process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory).result == "retry"
    assert _row(db_url, "SELECT state FROM effects WHERE run_id = %s", run["id"]) == {"state": "failed"}


def test_a_non_mutation_with_an_unknown_outcome_fails_without_retry(db: Database, db_url: str) -> None:
    run = _run(db_url)
    executor = ScriptedExecutor(on_send=raising(ExecutorError("timeout", "no answer", outcome_unknown=True)))

    outcome = process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory)

    assert (outcome.result, outcome.reason_code) == ("failed", "timeout")
    assert _row(db_url, "SELECT state, error_code FROM effects WHERE run_id = %s", run["id"]) == {
        "state": "failed", "error_code": "timeout"}


def test_a_prepare_error_fails_without_reserving_an_effect(db: Database, db_url: str) -> None:
    run = _run(db_url)

    def refuse(request: ExecutionRequest) -> None:
        raise ExecutorError("egress_refused", "169.254.169.254 is a metadata address")

    executor = ScriptedExecutor(on_prepare=refuse)
    outcome = process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory)

    assert (outcome.result, outcome.reason_code) == ("failed", "egress_refused")
    assert _rows(db_url, "SELECT * FROM effects WHERE run_id = %s", run["id"]) == []
    assert executor.timeouts == []


def test_an_unknown_executor_name_fails_the_run_as_agent_invalid(db: Database, db_url: str) -> None:
    sched = factories.schedule(db_url, agent={"executor": "nope"})
    run = _run(db_url, schedule_row=sched)

    outcome = process(db, run["id"], settings=SETTINGS)  # the real registry

    assert (outcome.result, outcome.reason_code) == ("failed", "agent_invalid")


def test_an_internal_error_during_a_mutation_call_fails_the_run_and_leaves_the_effect_ambiguous(
        db: Database, db_url: str) -> None:
    run = _run(db_url)
    executor = ScriptedExecutor(mutation=True, on_send=raising(RuntimeError("bug in an executor")))

    outcome = process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory)

    assert (outcome.result, outcome.reason_code) == ("failed", "internal")
    assert _row(db_url, "SELECT state FROM effects WHERE run_id = %s", run["id"]) == {"state": "ambiguous"}
    assert _row(db_url, "SELECT state FROM runs WHERE id = %s", run["id"]) == {"state": "failed"}


def test_the_echo_executor_runs_end_to_end_through_the_registry(db: Database, db_url: str) -> None:
    run = _run(db_url)

    assert process(db, run["id"], settings=SETTINGS).result == "succeeded"

    with db.transaction() as conn:
        out = runs.output(conn, run["id"], owner="alice")
    assert out["state"] == "available" and out["text"] == "echo: say hello"


# --- runtime limit -------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_the_call_timeout_is_bounded_by_the_runtime_limit(db: Database, db_url: str) -> None:
    run = _run(db_url, runtime_limit_seconds=7)
    executor = ScriptedExecutor()

    process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory, clock=FakeClock())

    assert executor.timeouts == [7.0]


def test_a_limit_above_the_server_cap_is_capped(db: Database, db_url: str) -> None:
    run = _run(db_url, runtime_limit_seconds=100_000)
    executor = ScriptedExecutor()

    process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory, clock=FakeClock())

    assert executor.timeouts == [min(RUNTIME_CAP_SECONDS, CALL_TIMEOUT_CAP_SECONDS)]


def test_exceeding_the_runtime_limit_fails_with_its_own_reason_code(db: Database, db_url: str) -> None:
    run = _run(db_url, runtime_limit_seconds=30)
    clock = FakeClock()

    def slow(prepared: PreparedCall, timeout: float) -> Reply:
        clock.t += timeout  # the call used all the time it was given
        raise ExecutorError("timeout", "no answer in time", outcome_unknown=True)

    executor = ScriptedExecutor(on_send=slow)
    outcome = process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory, clock=clock)

    assert (outcome.result, outcome.reason_code) == ("failed", "runtime_limit")
    assert _row(db_url, "SELECT diagnosis->>'reason_code' AS code FROM runs WHERE id = %s", run["id"]) == {
        "code": "runtime_limit"}


def test_a_run_over_its_limit_before_the_call_fails_without_calling(db: Database, db_url: str) -> None:
    run = _run(db_url, runtime_limit_seconds=30)
    clock = FakeClock()
    probes = Probes().on("after_claim", lambda **_: setattr(clock, "t", clock.t + 31))
    executor = ScriptedExecutor()

    outcome = process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory, clock=clock,
                           probes=probes)

    assert (outcome.result, outcome.reason_code) == ("failed", "runtime_limit")
    assert executor.timeouts == []


def test_the_invocation_deadline_bounds_the_call_and_a_short_one_defers_the_claim(db: Database, db_url: str) -> None:
    run = _run(db_url)
    executor = ScriptedExecutor()

    deferred = process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory,
                            clock=FakeClock(), lambda_remaining_ms=lambda: 20_000)
    assert deferred.result == "deferred"
    assert _row(db_url, "SELECT state, attempt FROM runs WHERE id = %s", run["id"]) == {
        "state": "queued", "attempt": 0}

    done = process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory,
                        clock=FakeClock(), lambda_remaining_ms=lambda: 100_000)
    assert done.result == "succeeded"
    assert executor.timeouts == [100.0 - LAMBDA_MARGIN_SECONDS]


# --- cancellation --------------------------------------------------------------------------------------


def test_cancelling_a_queued_run_is_immediate_and_idempotent(db: Database, db_url: str) -> None:
    run = _run(db_url)

    with db.transaction() as conn:
        first = runs.cancel(conn, run["id"], owner="alice")
    with db.transaction() as conn:
        second = runs.cancel(conn, run["id"], owner="alice")

    assert first.state == "cancelled" and second.state == "cancelled"
    assert first.finished_at is not None and first.diagnosis is not None
    assert _types(db_url, run["id"]) == ["run.cancelled"]
    executor = ScriptedExecutor()
    assert process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory).result == "skipped"
    assert executor.requests == []


def test_cancel_of_a_foreign_or_missing_run_is_not_found(db: Database, db_url: str) -> None:
    run = _run(db_url)
    with db.transaction() as conn:
        with pytest.raises(NotFound) as foreign:
            runs.cancel(conn, run["id"], owner="mallory")
    with db.transaction() as conn:
        with pytest.raises(NotFound) as missing:
            runs.cancel(conn, uuid.uuid4(), owner="alice")
    assert foreign.value.as_body() == missing.value.as_body()
    assert _row(db_url, "SELECT state FROM runs WHERE id = %s", run["id"]) == {"state": "queued"}


def test_a_cancel_during_the_call_stops_the_run_and_never_publishes_success(db: Database, db_url: str) -> None:
    run = _run(db_url)

    def cancel_meanwhile(prepared: PreparedCall, timeout: float) -> Reply:
        with db.transaction() as conn:
            requested = runs.cancel(conn, run["id"], owner="alice")
        assert requested.state == "running" and requested.cancel_requested_at is not None
        return Reply(content="a stale answer")

    executor = ScriptedExecutor(on_send=cancel_meanwhile)
    outcome = process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory)

    assert outcome.result == "cancelled"
    row = _row(db_url, "SELECT * FROM runs WHERE id = %s", run["id"])
    assert row is not None and row["state"] == "cancelled" and row["output"] is None
    assert [e[2] for e in _entries(db_url, row["conversation_id"])] == ["say hello"]  # no answer published
    assert _row(db_url, "SELECT state FROM effects WHERE run_id = %s", run["id"]) == {"state": "settled"}
    types = _types(db_url, run["id"])
    assert "output.published" not in types and "run.succeeded" not in types
    assert types[-3:] == ["effect.settled", "step.finished", "run.cancelled"]
    assert "run.cancel_requested" in types


def test_a_cancel_seen_by_the_heartbeat_stops_the_run_before_its_call(db: Database, db_url: str) -> None:
    run = _run(db_url)
    beats: list[Heartbeat] = []

    def cancel_and_beat(**_: Any) -> None:
        with db.transaction() as conn:
            runs.cancel(conn, run["id"], owner="alice")
        assert beats[0].beat_once() is True
        assert beats[0].cancel_requested.is_set()

    probes = (Probes().on("heartbeat_started", lambda heartbeat, **_: beats.append(heartbeat))
             .on("after_reserve", cancel_and_beat))
    executor = ScriptedExecutor()
    outcome = process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory, probes=probes,
                           heartbeat_interval=3600)

    assert outcome.result == "cancelled"
    assert executor.timeouts == []  # never sent
    assert _row(db_url, "SELECT state, error_code FROM effects WHERE run_id = %s", run["id"]) == {
        "state": "failed", "error_code": "cancelled"}


def test_a_cancel_before_the_reservation_ends_the_run_without_a_call(db: Database, db_url: str) -> None:
    """The reservation itself refuses under a cancel request: no effect, no call, the run cancelled."""
    run = _run(db_url)

    def cancel_now(request: ExecutionRequest) -> None:
        with db.transaction() as conn:
            runs.cancel(conn, run["id"], owner="alice")

    executor = ScriptedExecutor(on_prepare=cancel_now)
    outcome = process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory,
                           heartbeat_interval=3600)

    assert outcome.result == "cancelled"
    assert executor.timeouts == []  # never sent
    assert _rows(db_url, "SELECT * FROM effects WHERE run_id = %s", run["id"]) == []
    assert _types(db_url, run["id"])[-3:] == ["run.cancel_requested", "step.finished", "run.cancelled"]


def test_success_cannot_be_written_once_a_cancel_was_requested(db: Database, db_url: str) -> None:
    run = _run(db_url, state="running", cancel_requested_at=datetime.now(UTC))
    with db.transaction() as conn:
        assert moves.succeed(conn, run["id"], 1, output={"entry_seq": 1}) is False
    assert _row(db_url, "SELECT state FROM runs WHERE id = %s", run["id"]) == {"state": "running"}


def test_a_requeued_run_with_a_pending_cancel_is_cancelled_instead_of_run(db: Database, db_url: str) -> None:
    run = _run(db_url, cancel_requested_at=datetime.now(UTC))
    executor = ScriptedExecutor()

    outcome = process(db, run["id"], settings=SETTINGS, executor_factory=executor.factory)

    assert outcome.result == "cancelled" and executor.requests == []
    assert _row(db_url, "SELECT state FROM runs WHERE id = %s", run["id"]) == {"state": "cancelled"}


# --- reads ---------------------------------------------------------------------------------------------


def test_get_is_owner_scoped_and_as_json_has_the_api_shape(db: Database, db_url: str) -> None:
    run = _run(db_url)
    process(db, run["id"], settings=SETTINGS, executor_factory=ScriptedExecutor().factory)

    with db.transaction() as conn:
        got = runs.get(conn, run["id"], owner="alice").as_json()
        with pytest.raises(NotFound):
            runs.get(conn, run["id"], owner="mallory")

    assert got["id"] == str(run["id"]) and got["state"] == "succeeded" and got["attempt"] == 1
    assert got["output"]["entry_seq"] == 2
    for key in ("created_at", "started_at", "finished_at"):
        assert got[key].endswith("Z") and "T" in got[key]
    assert "prompt" not in got and "agent" not in got and "payload" not in got
    json.dumps(got)  # serializable as is


def test_the_output_projection_follows_the_run(db: Database, db_url: str) -> None:
    queued = _run(db_url)
    running = _run(db_url, state="running")
    failed = _run(db_url)
    process(db, failed["id"], settings=SETTINGS,
                 executor_factory=ScriptedExecutor(on_send=raising(ExecutorError("peer_error", "400"))).factory)
    long_answer = "x" * (runs.OUTPUT_PREVIEW_CHARS + 10)
    succeeded = _run(db_url)
    process(db, succeeded["id"], settings=SETTINGS,
                 executor_factory=ScriptedExecutor(on_send=lambda p, t: Reply(content=long_answer)).factory)
    cancelled = _run(db_url, state="cancelled")

    with db.transaction() as conn:
        # (runs made by the factory, not recorded from a fire: no revision, no agent digest)
        unrecorded = {"schedule_revision": None, "agent_digest": None}
        assert runs.output(conn, queued["id"], owner="alice") == {"state": "empty", "reason": "queued", **unrecorded}
        assert runs.output(conn, running["id"], owner="alice") == {"state": "empty", "reason": "running", **unrecorded}
        out_failed = runs.output(conn, failed["id"], owner="alice")
        out_ok = runs.output(conn, succeeded["id"], owner="alice")
        assert runs.output(conn, cancelled["id"], owner="alice")["reason"] == "no_output"
        with pytest.raises(NotFound):
            runs.output(conn, succeeded["id"], owner="mallory")

    assert out_failed["state"] == "empty" and out_failed["reason"] == "failed"
    assert out_failed["diagnosis"]["reason_code"] == "peer_error"
    assert out_ok["state"] == "available" and out_ok["truncated"] is True
    assert out_ok["text"] == long_answer[: runs.OUTPUT_PREVIEW_CHARS]
    assert out_ok["entry_seq"] == 2 and out_ok["attempt"] == 1

    # The answer's source is gone (not by the pruner, which also stamps the run: then the reason is
    # `pruned`, tests/db/test_retention.py): unavailable, and the run still says succeeded.
    with psycopg.connect(db_url, autocommit=True) as conn, conn.transaction():
        conn.execute("SELECT kairos_allow_pruning()")  # entries are append-only otherwise
        conn.execute("DELETE FROM conversation_entries WHERE run_id = %s AND role = 'assistant'", (succeeded["id"],))
    with db.transaction() as conn:
        assert runs.output(conn, succeeded["id"], owner="alice") == {"state": "unavailable", "reason": "source_gone",
                                                                      "schedule_revision": None, "agent_digest": None}
        assert runs.get(conn, succeeded["id"], owner="alice").state == "succeeded"


def test_diagnose_refuses_unknown_codes_and_covers_every_reason_code() -> None:
    for code in REASON_CODES | RUN_REASON_CODES:
        assert diagnose(code)["reason_code"] == code
    with pytest.raises(ValueError):
        diagnose("executor_error")


def test_effects_of_a_run_are_listed_oldest_first(db: Database, db_url: str) -> None:
    run = _run(db_url)
    process(db, run["id"], settings=SETTINGS,
                 executor_factory=ScriptedExecutor(on_send=raising(ExecutorError("connect_failed", "x",
                                                                                retry_safe=True))).factory)
    process(db, run["id"], settings=SETTINGS, executor_factory=ScriptedExecutor().factory)
    with db.transaction() as conn:
        listed = conn.execute("SELECT fence, state FROM effects WHERE run_id = %(id)s ORDER BY created_at, fence, step",
                              {"id": run["id"]}).fetchall()
    assert [(e["fence"], e["state"]) for e in listed] == [(1, "failed"), (2, "settled")]
