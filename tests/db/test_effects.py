"""The effects ledger: reserve and close under the fence, with events; what blocks a replay."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from kairos import effects
from kairos.db import Database
from kairos.runs import moves
from tests import factories


def _claimed(db: Database, db_url: str) -> dict[str, Any]:
    run = factories.run(db_url)
    with db.transaction() as conn:
        row = moves.claim(conn, run["id"])
    assert row is not None
    return row


def _ledger(conn: psycopg.Connection[Any], run_id: Any) -> list[effects.Effect]:
    """Every effect of one run, oldest first (a test's read: no library code needs the whole ledger)."""
    rows = conn.execute("SELECT * FROM effects WHERE run_id = %(run_id)s ORDER BY created_at, fence, step",
                        {"run_id": run_id}).fetchall()
    return [effects.Effect.from_row(r) for r in rows]


def _events(db_url: str, run_id: Any) -> list[tuple[str, str | None, dict[str, Any]]]:
    with psycopg.connect(db_url, row_factory=dict_row, autocommit=True) as conn:
        rows = conn.execute("SELECT type, step, data FROM run_events WHERE run_id = %s ORDER BY seq",
                            (run_id,)).fetchall()
    return [(r["type"], r["step"], r["data"]) for r in rows]


def test_reserve_then_settle_records_the_effect_and_both_events(db: Database, db_url: str) -> None:
    run = _claimed(db, db_url)
    with db.transaction() as conn:
        effect = effects.reserve(conn, run["id"], 1, 1, "model", "model_call", False, "https://m/v1", "ab" * 32)
    assert effect is not None and effect.state == "reserved" and effect.settled_at is None

    with db.transaction() as conn:
        settled = effects.settle(conn, effect, fence=1, usage={"prompt_tokens": 7})
    assert settled is not None and settled.state == "settled" and settled.usage == {"prompt_tokens": 7}
    assert settled.settled_at is not None

    assert _events(db_url, run["id"]) == [
        ("run.claimed", None, {"attempt": 1, "mode": "fork"}),
        ("step.started", "model", {"attempt": 1}),
        ("effect.reserved", "model", {"effect_id": str(effect.id), "kind": "model_call", "mutation": False}),
        ("effect.settled", "model", {"effect_id": str(effect.id), "state": "settled"}),
    ]


def test_an_effect_closes_once(db: Database, db_url: str) -> None:
    run = _claimed(db, db_url)
    with db.transaction() as conn:
        effect = effects.reserve(conn, run["id"], 1, 1, "http", "http_call", True, "https://t/", "cd" * 32)
        assert effect is not None
        assert effects.mark_ambiguous(conn, effect, fence=1, error_code="timeout") is not None
        assert effects.settle(conn, effect, fence=1) is None
        assert effects.fail(conn, effect, fence=1, error_code="timeout") is None
    with db.transaction() as conn:
        (only,) = _ledger(conn, run["id"])
    assert only.state == "ambiguous" and only.error_code == "timeout"


def test_one_effect_per_step_and_fence(db: Database, db_url: str) -> None:
    run = _claimed(db, db_url)
    with db.transaction() as conn:
        assert effects.reserve(conn, run["id"], 1, 1, "model", "model_call", False, "t", "d") is not None
    with pytest.raises(psycopg.errors.UniqueViolation):
        with db.transaction() as conn:
            effects.reserve(conn, run["id"], 1, 1, "model", "model_call", False, "t", "d")


def test_reserve_needs_the_current_fence_attempt_and_a_running_run(db: Database, db_url: str) -> None:
    run = _claimed(db, db_url)
    queued = factories.run(db_url)
    with db.transaction() as conn:
        assert effects.reserve(conn, run["id"], 2, 1, "model", "model_call", False, "t", "d") is None
        assert effects.reserve(conn, run["id"], 1, 2, "model", "model_call", False, "t", "d") is None
        assert effects.reserve(conn, queued["id"], 0, 0, "model", "model_call", False, "t", "d") is None
        assert _ledger(conn, run["id"]) == []
    assert [e[0] for e in _events(db_url, run["id"])] == ["run.claimed", "step.started"]  # the claim's own


def test_replay_blockers_are_the_mutations_that_may_have_happened(db: Database, db_url: str) -> None:
    run = _claimed(db, db_url)
    with db.transaction() as conn:
        made = [effects.reserve(conn, run["id"], 1, 1, step, kind, mutation, "t", "d")
                for step, kind, mutation in [("a", "http_call", True), ("b", "http_call", True),
                                             ("c", "http_call", True), ("d", "model_call", False)]]
        a, b, c, d = made
        assert a and b and c and d
        effects.settle(conn, a, fence=1)
        effects.fail(conn, b, fence=1, error_code="connect_failed")  # known: nothing happened
        effects.settle(conn, d, fence=1)  # a model call changes nothing outside
        blockers = effects.replay_blockers(conn, run["id"])
    assert {e.step for e in blockers} == {"a", "c"}  # settled and still-reserved mutations


def test_a_new_claim_closes_what_an_earlier_fence_left_reserved(db: Database, db_url: str) -> None:
    run = _claimed(db, db_url)
    with db.transaction() as conn:
        effects.reserve(conn, run["id"], 1, 1, "http", "http_call", True, "t", "d")
        effects.reserve(conn, run["id"], 1, 1, "model", "model_call", False, "t", "d")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE runs SET state = 'queued', lease_token = NULL, lease_expires_at = NULL WHERE id = %s",
                     (run["id"],))
    with db.transaction() as conn:
        assert moves.claim(conn, run["id"]) is not None
        assert effects.close_stale(conn, run["id"], 1) == []  # only the current fence may close them
        closed = effects.close_stale(conn, run["id"], 2)
    assert sorted((e.step, e.state, e.error_code) for e in closed) == [
        ("http", "ambiguous", "lease_lost"), ("model", "failed", "lease_lost")]
    assert [t for t, _, _ in _events(db_url, run["id"])][-2:] == ["effect.settled", "effect.settled"]


def test_no_effect_is_reserved_once_a_cancel_was_requested(db: Database, db_url: str) -> None:
    run = _claimed(db, db_url)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE runs SET cancel_requested_at = now() WHERE id = %s", (run["id"],))
    with db.transaction() as conn:
        assert effects.reserve(conn, run["id"], 1, 1, "model", "model_call", False, "t", "d") is None
        assert _ledger(conn, run["id"]) == []
    assert [e[0] for e in _events(db_url, run["id"])] == ["run.claimed", "step.started"]


def test_a_run_cannot_succeed_while_its_answers_effect_is_still_reserved(db: Database, db_url: str) -> None:
    run = _claimed(db, db_url)
    with db.transaction() as conn:
        effect = effects.reserve(conn, run["id"], 1, 1, "model", "model_call", False, "https://m/v1", "ab" * 32)
        assert effect is not None
    output = {"conversation_id": str(run["source_conversation_id"]), "entry_seq": 1, "attempt": 1}

    # The terminal statement names the effect it publishes: reserved, nothing is written
    with db.transaction() as conn:
        assert moves.succeed(conn, run["id"], 1, output=output, settled=effect.id) is False
    # Settled earlier in the same transaction (as the worker sends them), the run succeeds
    with db.transaction() as conn:
        assert effects.settle(conn, effect, fence=1) is not None
        assert moves.succeed(conn, run["id"], 1, output=output, settled=effect.id) is True
    with db.connection() as conn:
        assert [e.state.value for e in _ledger(conn, run["id"])] == ["settled"]
