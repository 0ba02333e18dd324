"""A run's steps as stored: one row a model turn or tool call, with bounded, redacted previews.

Role: the data-access layer of ``run_steps`` (``sql/run_steps.sql``). The worker's tool loop
(``kairos.execution.tool_loop``, through ``kairos.execution.steps``) opens a step with ``begin`` in
the transaction that reserves its effect, may grow a running model step's output with ``progress``,
and ends it with ``finish`` (or ``send_finish`` in a pipeline) in the transaction that settles the
effect; ``close_open`` ends what an attempt leaves running when it fails or is cancelled, and
``end_with_run`` what a run ended without its worker leaves (the tick's rescue, a cancel). The API
reads them with ``page`` (``GET /v1/runs/{id}/steps``) after ``kairos.runs.get`` checked the owner.

Previews (``preview``): a value is redacted (``kairos.redact``) and then, when its JSON text is over
``PREVIEW_BYTES`` (4 KiB) in UTF-8, replaced by ``{"truncated": true, "bytes", "sha256", "head"}``:
the size and SHA-256 of the whole (redacted) JSON text and its beginning, the whole marker within
``PREVIEW_BYTES``. ``target`` is an outbound call's ``{"method", "host", "path"}`` (no query, no
userinfo: ``recorded_target``).

Guarantees: every write joins the run row and requires its fence and ``running`` state, so a worker
that lost its lease writes nothing (a ``False`` answer; the caller stops with ``LeaseLost``); a step
that already ended is never rewritten by a write of the worker. Nothing is stored unredacted except
the fold ``record``'s tool-call arguments (a later attempt must send exactly what the model asked
for and was approved; see ``kairos.execution.steps``).

Must not: log previews; import the worker.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from kairos import db, redact, trace
from kairos.states import StepState

PREVIEW_BYTES = 4_096
HEAD_BYTES = 2_048  # the beginning of a cut preview's JSON text, at most
MAX_PAGE = 100


def preview(value: Any, secrets: Iterable[str] = ()) -> Any:
    """``value`` redacted and bounded (see the module doc)."""
    cleaned = redact.redact(value, secrets)
    text = json.dumps(cleaned, ensure_ascii=False, sort_keys=True, default=str)
    data = text.encode("utf-8")
    if len(data) <= PREVIEW_BYTES:
        return cleaned
    return {"truncated": True, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "head": data[:HEAD_BYTES].decode("utf-8", errors="ignore")}


def target(method: str, url: str, secrets: Iterable[str] = ()) -> dict[str, str]:
    """An outbound call's ``{"method", "host", "path"}`` (the port kept with the host when given)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return {"method": method.upper(), "host": host, "path": redact.redact(parts.path or "/", secrets)}


def model_input(body: bytes) -> dict[str, Any]:
    """A model turn's input as its step shows it: the model, the messages new in this turn (after the
    model's last answer: the prompt on the first turn, the tools' answers later), how many messages
    were sent in all, and the tools offered by name."""
    try:
        document = json.loads(body)
    except ValueError:
        return {"bytes": len(body)}
    if not isinstance(document, dict):
        return {"bytes": len(body)}
    messages = document.get("messages") or []
    if not isinstance(messages, list):  # another executor's request shape: shown whole, bounded
        return document
    last = max((i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "assistant"),
               default=-1)
    tools_offered = [t.get("function", {}).get("name") for t in document.get("tools") or () if isinstance(t, dict)]
    return {"model": document.get("model"), "messages": messages[last + 1:], "messages_total": len(messages),
            "tools": tools_offered}


@dataclass(frozen=True)
class Row:
    """A stored step as the API shows it."""

    step: int
    attempt: int
    kind: str
    name: str
    state: str
    started_at: datetime
    finished_at: datetime | None
    input: Any
    output: Any
    target: Any
    usage: Any
    effect_id: UUID | None
    pruned_at: datetime | None

    def as_json(self) -> dict[str, Any]:
        return {"step": self.step, "attempt": self.attempt, "kind": self.kind, "name": self.name,
                "state": self.state, "started_at": trace.rfc3339(self.started_at),
                "finished_at": trace.rfc3339(self.finished_at), "input": self.input, "output": self.output,
                "target": self.target, "usage": self.usage,
                "effect_id": None if self.effect_id is None else str(self.effect_id),
                "pruned_at": trace.rfc3339(self.pruned_at)}


def page(conn: psycopg.Connection[db.Row], run_id: UUID, *, after: int = 0,
         limit: int = 50) -> tuple[list[Row], int]:
    """Steps numbered after ``after`` (``limit`` capped at ``MAX_PAGE``) and the ``next_after`` cursor:
    the last listed step, or ``after`` when none is listed (a reader resumes from it)."""
    after = max(0, int(after))
    limit = max(1, min(int(limit), MAX_PAGE))
    found = [Row(int(r["n"]), int(r["attempt"]), r["kind"], r["name"], r["state"], r["started_at"],
                 r["finished_at"], r["input"], r["output"], r["target"], r["usage"], r["effect_id"], r["pruned_at"])
             for r in db.fetch_all(conn, "run_steps_page", {"run_id": run_id, "after": after, "limit": limit})]
    return found, (found[-1].step if found else after)


def _json(value: Any) -> Jsonb | None:
    return None if value is None else Jsonb(value)


def begin(conn: psycopg.Connection[db.Row], run_id: UUID, fence: int, *, n: int, kind: str, name: str,
          call_id: str | None = None, input: Any = None, target: Any = None, effect_id: UUID | None = None,
          state: StepState = StepState.RUNNING, now: datetime | None = None) -> bool:
    """Opens step ``n`` (``running``, or ``waiting_approval``) for the fence holder; previews given here
    are already ``preview``-ed. False when the fence no longer holds (nothing written)."""
    return db.fetch_one(conn, "run_steps_begin", {
        "run_id": run_id, "fence": fence, "n": n, "kind": kind, "name": name, "call_id": call_id,
        "state": state.value, "input": _json(input), "target": _json(target), "effect_id": effect_id,
        "now": now}) is not None


def progress(conn: psycopg.Connection[db.Row], run_id: UUID, fence: int, n: int, output: Any) -> bool:
    """Replaces running step ``n``'s output preview (a streamed answer so far; already ``preview``-ed)
    for the fence holder. False when the fence no longer holds or the step is no longer running."""
    return db.fetch_one(conn, "run_steps_progress", {
        "run_id": run_id, "fence": fence, "n": n, "output": _json(output)}) is not None


def _finish_params(run_id: UUID, fence: int, n: int, kind: str, name: str, call_id: str | None,
                   record: dict[str, Any] | None, state: StepState, input: Any, output: Any, target: Any,
                   usage: Any, effect_id: UUID | None, now: datetime | None,
                   answered: bool = False) -> dict[str, Any]:
    return {"run_id": run_id, "fence": fence, "n": n, "kind": kind, "name": name, "call_id": call_id,
            "record": _json(record), "state": state.value, "input": _json(input), "output": _json(output),
            "target": _json(target), "usage": _json(usage), "effect_id": effect_id, "now": now,
            "answered": answered}


def finish(conn: psycopg.Connection[db.Row], run_id: UUID, fence: int, *, n: int, kind: str, name: str,
           call_id: str | None = None, record: dict[str, Any] | None = None,
           state: StepState = StepState.SUCCEEDED, input: Any = None, output: Any = None, target: Any = None,
           usage: Any = None, effect_id: UUID | None = None, now: datetime | None = None) -> bool:
    """Ends step ``n`` for the fence holder (writes it ended when it was never opened). False when the
    fence no longer holds or the step had already ended (nothing written)."""
    return db.fetch_one(conn, "run_steps_finish", _finish_params(
        run_id, fence, n, kind, name, call_id, record, state, input, output, target, usage, effect_id,
        now)) is not None


def send_finish(conn: psycopg.Connection[db.Row], run_id: UUID, fence: int, *, n: int, kind: str, name: str,
                call_id: str | None = None, record: dict[str, Any] | None = None,
                state: StepState = StepState.SUCCEEDED, input: Any = None, output: Any = None,
                target: Any = None, usage: Any = None, effect_id: UUID | None = None,
                now: datetime | None = None, answered: bool = False) -> Callable[[], bool]:
    """``finish`` sent now (queued, in a pipeline); the function returned reads whether it wrote.
    ``answered``: the step whose answer is being published, written only while no cancel is requested
    (``run_steps_finish``)."""
    cursor = db.send(conn, "run_steps_finish", _finish_params(
        run_id, fence, n, kind, name, call_id, record, state, input, output, target, usage, effect_id, now,
        answered))
    return lambda: cursor.fetchone() is not None


def close_open(conn: psycopg.Connection[db.Row], run_id: UUID, fence: int, *, now: datetime | None = None) -> int:
    """Ends the run's running steps (``ambiguous`` when their effect is, else ``failed``) for the fence
    holder; how many it ended."""
    return len(db.fetch_all(conn, "run_steps_close_open", {"run_id": run_id, "fence": fence, "now": now}))


def end_with_run(conn: psycopg.Connection[db.Row], run_id: UUID, *, now: datetime | None = None) -> int:
    """Ends the steps a run left running or waiting when it ended without its worker (a rescue, a
    cancel while waiting): ``ambiguous`` when their effect may have been applied, else ``failed``.
    Only for a run that has ended; the caller ended it in this transaction. How many it ended."""
    return len(db.fetch_all(conn, "run_steps_end_with_run", {"run_id": run_id, "now": now}))


def close_waiting(conn: psycopg.Connection[db.Row], run_id: UUID, state: StepState, *,
                  now: datetime | None = None) -> int:
    """Ends the run's step parked for a person (``denied``, or ``failed`` when the request lapsed); the
    caller holds the run's lock in the transaction that blocks it."""
    return len(db.fetch_all(conn, "run_steps_close_waiting", {"run_id": run_id, "state": state.value, "now": now}))
