"""The effects ledger: every external call of a run is reserved before it is made and closed after.

A worker reserves an ``effects`` row under its fence (with an ``effect.reserved`` event) before it
calls a model or an HTTP target, and closes it afterwards (with ``effect.settled``): ``settled``
when the call answered, ``failed`` when the outcome is known and nothing happened outside,
``ambiguous`` when a mutation may or may not have taken effect; a test run's mutation is reserved and
closed ``not_sent_test`` in one transaction, never sent. Each write checks and locks the run
row under the caller's fence in the same statement, so a worker that lost its lease records nothing
and the caller learns it from ``None``.

Guarantees: a mutation that is still ``reserved`` or is ``settled``/``ambiguous`` makes its run
non-replayable (``replay_blockers``): neither a retry nor a re-claim after a crash calls it again.
A reserved non-mutation (a model call) left behind by a vanished worker is closed as ``failed``
by the next claim and may be replayed: it changed nothing outside, and the restart limit bounds the
tokens a replay can cost.

Must not: make calls, read prompts or replies, or write anything but ids, kinds, digests, usage
and input counts and reason codes. Events carry no target URL or digest (trace data stays minimal).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from kairos import db, trace
from kairos.executors.base import recorded_target
from kairos.states import EffectState, EventType


@dataclass(frozen=True)
class Effect:
    id: UUID
    run_id: UUID
    fence: int
    attempt: int
    step: str
    kind: str
    mutation: bool
    target: str
    request_digest: str
    state: EffectState
    usage: dict[str, Any] | None
    error_code: str | None
    created_at: datetime
    settled_at: datetime | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Effect:
        return cls(
            id=row["id"],
            run_id=row["run_id"],
            fence=int(row["fence"]),
            attempt=int(row["attempt"]),
            step=row["step"],
            kind=row["kind"],
            mutation=bool(row["mutation"]),
            target=row["target"],
            request_digest=row["request_digest"],
            state=EffectState(row["state"]),
            usage=row["usage"],
            error_code=row["error_code"],
            created_at=row["created_at"],
            settled_at=row["settled_at"],
        )


def reserve(
    conn: psycopg.Connection[db.Row],
    run_id: UUID,
    fence: int,
    attempt: int,
    step: str,
    kind: str,
    mutation: bool,
    target: str,
    digest: str,
    *,
    data: Mapping[str, Any] | None = None,
    now: datetime | None = None,
    effect_id: UUID | None = None,
) -> Effect | None:
    """Reserves one effect and traces ``effect.reserved`` (one statement); None when the fence no
    longer holds or a cancel was requested (no call may start after one). ``target`` is kept without
    userinfo, query or fragment (``recorded_target``), whatever the executor passed. ``data`` adds
    keys to the event (counts only, never content), e.g. ``{"input": …}`` for a model call's window.
    ``effect_id`` names the new effect (else the database picks one)."""
    row = db.fetch_one(
        conn,
        "effects_reserve",
        {
            "run_id": run_id,
            "fence": fence,
            "attempt": attempt,
            "step": step,
            "kind": kind,
            "mutation": mutation,
            "target": recorded_target(target),
            "digest": digest,
            "data": None if data is None else Jsonb(dict(data)),
            "now": now,
            "effect_id": effect_id,
        },
    )
    return None if row is None else Effect.from_row(row)


def reserve_charged(
    conn: psycopg.Connection[db.Row],
    run_id: UUID,
    fence: int,
    attempt: int,
    step: str,
    kind: str,
    mutation: bool,
    target: str,
    digest: str,
    *,
    effect_id: UUID,
    charge: Mapping[str, Any],
    data: Mapping[str, Any] | None = None,
    now: datetime | None = None,
) -> tuple[bool, Effect | None]:
    """``reserve`` and the budget charge of a model call (``kairos.budgets.charge``) in one statement:
    (authorized, the effect). Not authorized — the fence no longer holds or a cancel was requested —
    or authorized without an effect — the charge would pass a daily ceiling —: nothing was written."""
    row = db.fetch_row(
        conn,
        "effects_reserve_charged",
        {
            "run_id": run_id,
            "fence": fence,
            "attempt": attempt,
            "step": step,
            "kind": kind,
            "mutation": mutation,
            "target": recorded_target(target),
            "digest": digest,
            "data": None if data is None else Jsonb(dict(data)),
            "now": now,
            "effect_id": effect_id,
            **charge,
        },
    )
    return bool(row["authorized"]), None if row["id"] is None else Effect.from_row(row)


def settle(
    conn: psycopg.Connection[db.Row],
    effect: Effect,
    *,
    fence: int,
    usage: Mapping[str, int] | None = None,
    trace_into: list[trace.Event] | None = None,
    now: datetime | None = None,
    error_code: str | None = None,
) -> Effect | None:
    """The call answered: ``reserved -> settled`` with its usage. ``error_code``: the answer came (and
    counts) but was refused (``unstorable_reply``)."""
    return _close(conn, effect, fence=fence, state=EffectState.SETTLED, usage=usage, error_code=error_code,
                  trace_into=trace_into, now=now)


def fail(
    conn: psycopg.Connection[db.Row],
    effect: Effect,
    *,
    fence: int,
    error_code: str,
    trace_into: list[trace.Event] | None = None,
    now: datetime | None = None,
) -> Effect | None:
    """The outcome is known and nothing happened outside (or it was a non-mutation): ``failed``."""
    return _close(conn, effect, fence=fence, state=EffectState.FAILED, usage=None, error_code=error_code,
                  trace_into=trace_into, now=now)


def mark_ambiguous(
    conn: psycopg.Connection[db.Row],
    effect: Effect,
    *,
    fence: int,
    error_code: str,
    trace_into: list[trace.Event] | None = None,
    now: datetime | None = None,
) -> Effect | None:
    """A mutation whose outcome cannot be proven: ``ambiguous``; its run is never replayed."""
    return _close(conn, effect, fence=fence, state=EffectState.AMBIGUOUS, usage=None, error_code=error_code,
                  trace_into=trace_into, now=now)


def not_sent_test(
    conn: psycopg.Connection[db.Row],
    effect: Effect,
    *,
    fence: int,
    trace_into: list[trace.Event] | None = None,
    now: datetime | None = None,
) -> Effect | None:
    """A test run's mutation, reserved and closed unsent in the same transaction: ``not_sent_test``
    (never a call, never a kept change)."""
    return _close(conn, effect, fence=fence, state=EffectState.NOT_SENT_TEST, usage=None, error_code=None,
                  trace_into=trace_into, now=now)


def _close(
    conn: psycopg.Connection[db.Row],
    effect: Effect,
    *,
    fence: int,
    state: EffectState,
    usage: Mapping[str, int] | None,
    error_code: str | None,
    trace_into: list[trace.Event] | None,
    now: datetime | None,
) -> Effect | None:
    """Closes a reserved effect under the fence and traces ``effect.settled`` — appended now, or,
    with ``trace_into``, added to that list for the caller's state change to write (``trace.change``)
    in the same transaction."""
    closed = _send_close(conn, effect, fence=fence, state=state, usage=usage, error_code=error_code, now=now)()
    if closed is None:
        return None
    data = _settled_data(closed.id, closed.state, error_code)
    if trace_into is not None:
        trace_into.append(trace.Event(EventType.EFFECT_SETTLED, effect.step, data))
    else:
        trace.append(conn, effect.run_id, EventType.EFFECT_SETTLED, data=data, fence=fence, step=effect.step,
                     now=now)
    return closed


def _send_close(conn: psycopg.Connection[db.Row], effect: Effect, *, fence: int, state: EffectState,
                usage: Mapping[str, int] | None, error_code: str | None,
                now: datetime | None) -> Callable[[], Effect | None]:
    cursor = db.send(
        conn,
        "effects_close",
        {
            "run_id": effect.run_id,
            "effect_id": effect.id,
            "fence": fence,
            "state": state.value,
            "usage": None if usage is None else Jsonb(dict(usage)),
            "error_code": error_code,
            "now": now,
        },
    )

    def read() -> Effect | None:
        row = cursor.fetchone()
        return None if row is None else Effect.from_row(row)

    return read


def _settled_data(effect_id: UUID, state: EffectState, error_code: str | None) -> dict[str, Any]:
    data: dict[str, Any] = {"effect_id": str(effect_id), "state": state.value}
    if error_code:
        data["reason_code"] = error_code
    return data


def close_stale(
    conn: psycopg.Connection[db.Row], run_id: UUID, fence: int, *, now: datetime | None = None
) -> list[Effect]:
    """Closes effects an earlier fence left reserved: mutations ``ambiguous``, others ``failed``.

    Called by a new claim, in its transaction. The earlier worker is gone or fenced out, so nobody
    can settle them any more; what they did outside is unknown.
    """
    rows = db.fetch_all(conn, "effects_close_stale", {"run_id": run_id, "fence": fence, "now": now})
    closed = [Effect.from_row(r) for r in rows]
    for effect in closed:
        trace.append(
            conn,
            run_id,
            EventType.EFFECT_SETTLED,
            data={"effect_id": str(effect.id), "state": effect.state.value, "reason_code": "lease_lost"},
            fence=fence,
            step=effect.step,
            now=now,
        )
    return closed


def replay_blockers(conn: psycopg.Connection[db.Row], run_id: UUID) -> list[Effect]:
    """Mutations of this run that may have reached the outside (reserved, settled or ambiguous)."""
    return [Effect.from_row(r) for r in db.fetch_all(conn, "effects_replay_blockers", {"run_id": run_id})]
