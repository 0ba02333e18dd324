"""Test factories: rows built straight in SQL with defaults consistent with the requested state.

They bypass the library on purpose, so a test of one component does not depend on another's code
(River-style). Each returns the row it inserted as a dict.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row

ECHO_AGENT: dict[str, Any] = {"executor": "echo", "model": "echo", "system": "You are a test agent."}
TERMINAL = {"succeeded", "failed", "cancelled", "expired", "abandoned", "policy_blocked"}


def _connect(url: str) -> psycopg.Connection[dict[str, Any]]:
    return psycopg.connect(url, row_factory=dict_row, autocommit=True)


def conversation(url: str, *, owner: str = "alice", agent: dict[str, Any] | None = None,
                 entries: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    cid = uuid.uuid4()
    with _connect(url) as conn:
        row = conn.execute(
            "INSERT INTO conversations (id, owner, title, agent) VALUES (%s, %s, 'test', %s) RETURNING *",
            (cid, owner, json.dumps(agent or ECHO_AGENT)),
        ).fetchone()
        for seq, (role, content) in enumerate(entries or [], start=1):
            conn.execute(
                "INSERT INTO conversation_entries (conversation_id, seq, role, content) VALUES (%s, %s, %s, %s)",
                (cid, seq, role, content),
            )
    assert row is not None
    return row


def schedule(url: str, *, owner: str = "alice", conversation_id: uuid.UUID | None = None,
             kind: str = "cron", cron: str | None = "0 * * * *", interval_seconds: int | None = None,
             starts_at: datetime | None = None, next_fire_at: datetime | None = None,
             status: str = "active", **columns: Any) -> dict[str, Any]:
    """A schedule row. ``next_fire_at`` defaults to one minute ago (due now) for timed kinds."""
    if conversation_id is None:
        conversation_id = conversation(url, owner=owner)["id"]
    now = datetime.now(UTC)
    if kind == "interval":
        cron = None
        interval_seconds = interval_seconds or 3600
        starts_at = starts_at or now - timedelta(hours=1)
    elif kind == "once":
        cron = None
        starts_at = starts_at or now - timedelta(minutes=1)
    elif kind == "webhook":
        cron = None
        columns.setdefault("token_hash", uuid.uuid4().hex + uuid.uuid4().hex)
    if kind != "webhook" and next_fire_at is None:
        next_fire_at = now - timedelta(minutes=1)
    values: dict[str, Any] = {
        "id": uuid.uuid4(), "owner": owner, "conversation_id": conversation_id, "name": "test",
        "prompt": "say hello", "kind": kind, "cron": cron, "interval_seconds": interval_seconds,
        "starts_at": starts_at, "next_fire_at": next_fire_at, "status": status,
        **columns,
    }
    for key in ("agent", "signing", "notify"):
        if isinstance(values.get(key), dict):
            values[key] = json.dumps(values[key])
    cols = ", ".join(values)
    params = ", ".join(f"%({k})s" for k in values)
    with _connect(url) as conn:
        row = conn.execute(f"INSERT INTO schedules ({cols}) VALUES ({params}) RETURNING *", values).fetchone()
    assert row is not None
    return row


def run(url: str, *, schedule_row: dict[str, Any] | None = None, state: str = "queued",
        fire_at: datetime | None = None, source: str = "scheduled", **columns: Any) -> dict[str, Any]:
    """An occurrence (dispatched) and its run in ``state``, with lease/finish columns to match."""
    sched = schedule_row or schedule(url)
    fire_at = fire_at or datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    occurrence_id = uuid.uuid4()
    now = datetime.now(UTC)
    values: dict[str, Any] = {
        "id": uuid.uuid4(), "occurrence_id": occurrence_id, "schedule_id": sched["id"],
        "owner": sched["owner"], "source": source,
        "source_conversation_id": sched["conversation_id"], "mode": sched["mode"],
        "prompt": sched["prompt"], "agent": json.dumps(sched.get("agent") or ECHO_AGENT),
        "catch_up": sched["catch_up"], "state": state,
    }
    if state == "running":
        values.update(attempt=1, fence=1, lease_token=uuid.uuid4(),
                      lease_expires_at=now + timedelta(seconds=120), started_at=now)
    if state in TERMINAL:
        values.update(finished_at=now)
    if state in ("failed", "abandoned"):
        values["diagnosis"] = json.dumps({"summary": "test", "scope": "run", "reason_code": "peer_error",
                                          "retry_eligible": False, "recovery_actions": []})
    if state == "succeeded":
        values["output"] = json.dumps({"conversation_id": str(sched["conversation_id"]), "entry_seq": 1})
    values.update(columns)
    for key in ("output", "diagnosis", "usage", "payload"):
        if isinstance(values.get(key), dict):
            values[key] = json.dumps(values[key])
    with _connect(url) as conn:
        conn.execute(
            """INSERT INTO occurrences (id, schedule_id, source, fire_at, local_time, utc_offset, fold,
                   timezone, tzdata_version, schedule_revision, decision, idempotency_key)
               VALUES (%s, %s, %s, %s, %s, interval '0', 0, 'UTC', 'test', 1, 'dispatched', %s)""",
            (occurrence_id, sched["id"], source, fire_at, fire_at.replace(tzinfo=None),
             None if source in ("scheduled", "backfill") else str(uuid.uuid4())),
        )
        cols = ", ".join(values)
        params = ", ".join(f"%({k})s" for k in values)
        row = conn.execute(f"INSERT INTO runs ({cols}) VALUES ({params}) RETURNING *", values).fetchone()
    assert row is not None
    return row


def approval(url: str, *, run_row: dict[str, Any], state: str = "pending", **columns: Any) -> dict[str, Any]:
    """A request of ``run_row``'s tool call (step 2, an ``http_post``) that expires in a day."""
    values: dict[str, Any] = {
        "id": uuid.uuid4(), "run_id": run_row["id"], "owner": run_row["owner"], "state": state,
        "attempt": max(1, int(run_row["attempt"])), "step": 2, "call_id": f"call-{uuid.uuid4().hex[:8]}",
        "tool": "http_post", "args_digest": "0" * 64,
        "preview": json.dumps({"tool": "http_post", "arguments": "{}", "truncated": False}),
        "expires_at": datetime.now(UTC) + timedelta(days=1),
        "decided_at": None if state == "pending" else datetime.now(UTC),
        **columns,
    }
    cols = ", ".join(values)
    params = ", ".join(f"%({k})s" for k in values)
    with _connect(url) as conn:
        row = conn.execute(f"INSERT INTO approvals ({cols}) VALUES ({params}) RETURNING *", values).fetchone()
    assert row is not None
    return row


def loop(url: str, *, owner: str = "alice", conversation_id: uuid.UUID | None = None, **columns: Any) -> dict[str, Any]:
    """A goal loop row (``POST /v1/loops``'s fixed policies), active, its goal at revision 1."""
    goal = {"outcome": "test outcome", "constraints": [], "verification": None, "verification_digest": None,
            "schedule_id": None, "revision": 1, "agent_digest": "0" * 64, "digest": "0" * 64}
    values: dict[str, Any] = {
        "loop": True, "goal": json.dumps(goal), "goal_revision": 1, "mode": "append", "overlap": "skip",
        "catch_up": False, "ends_at": datetime.now(UTC) + timedelta(days=30), "max_occurrences": 10, **columns}
    return schedule(url, owner=owner, conversation_id=conversation_id, **values)


def input_request(url: str, *, run_row: dict[str, Any], state: str = "pending", **columns: Any) -> dict[str, Any]:
    """A question of ``run_row`` (a loop run awaiting input) to its owner."""
    values: dict[str, Any] = {
        "id": uuid.uuid4(), "owner": run_row["owner"], "run_id": run_row["id"],
        "attempt": max(1, int(run_row["attempt"])), "step": 2, "call_id": f"call-{uuid.uuid4().hex[:8]}",
        "schedule_id": run_row["schedule_id"], "revision": 1, "conversation_id": run_row["source_conversation_id"],
        "question": "Which one?", "question_digest": "0" * 64, "state": state,
        "decided_at": None if state == "pending" else datetime.now(UTC), **columns,
    }
    cols = ", ".join(values)
    params = ", ".join(f"%({k})s" for k in values)
    with _connect(url) as conn:
        row = conn.execute(f"INSERT INTO input_requests ({cols}) VALUES ({params}) RETURNING *", values).fetchone()
    assert row is not None
    return row


def ended_ago(url: str, *run_ids: uuid.UUID, days: int = 31, settled: bool = True) -> None:
    """Moves the end of ended runs back by ``days`` (past the default retention of 30); settled as the
    tick's settle step would have."""
    with _connect(url) as conn:
        conn.execute("""UPDATE runs SET finished_at = finished_at - make_interval(days => %s),
                                        settled_at = CASE WHEN %s THEN now() END
                         WHERE id = ANY(%s)""", (days, settled, list(run_ids)))
