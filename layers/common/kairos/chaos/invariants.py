"""What a rehearsal must leave true, checked over the database and the local targets' counters.

Role: ``check(url, sink_counts, model_usage)`` answers one ``Check`` per invariant (what it counted,
how many violated it, the first violating run) and ``timeline`` a run's events, for the report:

* fires once per instant — no schedule has two scheduled occurrences at one ``fire_at``;
* one terminal run per occurrence — an occurrence that was dispatched (or queued behind another run)
  has exactly one run and it has ended; a skipped one has none;
* ended once — every ended run has exactly one terminal event (``run.succeeded`` … ``run.policy_blocked``):
  a run executed again after it ended (a claim without its guard) shows here;
* nothing stuck — after the drain, no run is still queued, running or waiting;
* nothing internal — no run failed with reason ``internal``: every fault the rehearsal injects is one
  the code classifies (a retry, a rescue, a deadline), never an error it did not expect;
* no mutation sent twice — every ``http_post`` target (one unique path per chat turn) received at most
  one request, and each settled ``http_call`` effect exactly one;
* traces gap-free — each run's events are numbered 1..n with no gap, and ``runs.last_seq`` is n;
* usage equals the ledger — the ledger's tokens and calls equal the sum over settled model-call
  effects, and the model server answered at least that (an answer lost to a crash is counted by the
  server only: reported, not a violation).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg.rows import dict_row

from kairos.states import TERMINAL_RUN_STATES

TERMINAL = tuple(sorted(state.value for state in TERMINAL_RUN_STATES))


@dataclass(frozen=True)
class Check:
    name: str
    counted: int
    violations: int
    first_run: str | None = None
    detail: str = ""

    @property
    def held(self) -> bool:
        return self.violations == 0


_FIRES = """
SELECT count(*) AS counted,
       count(*) FILTER (WHERE n > 1) AS violations
  FROM (SELECT schedule_id, fire_at, count(*) AS n FROM occurrences WHERE source = 'scheduled'
         GROUP BY schedule_id, fire_at) f"""

_ONE_TERMINAL = """
WITH o AS (
  SELECT o.id, o.decision,
         count(r.id) AS runs,
         count(r.id) FILTER (WHERE r.state = ANY(%(terminal)s)) AS ended,
         min(r.id::text) AS run_id
    FROM occurrences o LEFT JOIN runs r ON r.occurrence_id = o.id
   GROUP BY o.id, o.decision)
SELECT count(*) AS counted,
       count(*) FILTER (WHERE (decision IN ('dispatched', 'queued_behind') AND (runs <> 1 OR ended <> 1))
                           OR (decision NOT IN ('dispatched', 'queued_behind') AND runs <> 0)) AS violations,
       min(run_id) FILTER (WHERE decision IN ('dispatched', 'queued_behind') AND (runs <> 1 OR ended <> 1))
         AS first_run
  FROM o"""

_ENDED_ONCE = """
WITH t AS (SELECT run_id, count(*) AS n FROM run_events WHERE type = ANY(%(events)s) GROUP BY run_id)
SELECT count(*) AS counted,
       count(*) FILTER (WHERE coalesce(t.n, 0) <> 1) AS violations,
       min(r.id::text) FILTER (WHERE coalesce(t.n, 0) <> 1) AS first_run
  FROM runs r LEFT JOIN t ON t.run_id = r.id
 WHERE r.state = ANY(%(terminal)s) AND r.pruned_at IS NULL"""

_STUCK = """
SELECT count(*) AS counted,
       count(*) FILTER (WHERE NOT (state = ANY(%(terminal)s))) AS violations,
       min(id::text) FILTER (WHERE NOT (state = ANY(%(terminal)s))) AS first_run,
       string_agg(DISTINCT state, ',') FILTER (WHERE NOT (state = ANY(%(terminal)s))) AS states
  FROM runs"""

_INTERNAL = """
SELECT count(*) FILTER (WHERE state IN ('failed', 'abandoned')) AS counted,
       count(*) FILTER (WHERE diagnosis->>'reason_code' = 'internal') AS violations,
       min(id::text) FILTER (WHERE diagnosis->>'reason_code' = 'internal') AS first_run
  FROM runs"""

_TRACES = """
WITH e AS (SELECT run_id, count(*) AS n, min(seq) AS lo, max(seq) AS hi FROM run_events GROUP BY run_id)
SELECT count(*) AS counted,
       count(*) FILTER (WHERE e.n IS NULL OR e.lo <> 1 OR e.hi <> e.n OR r.last_seq <> e.hi) AS violations,
       min(r.id::text) FILTER (WHERE e.n IS NULL OR e.lo <> 1 OR e.hi <> e.n OR r.last_seq <> e.hi) AS first_run
  FROM runs r LEFT JOIN e ON e.run_id = r.id"""

_HTTP_EFFECTS = """
SELECT run_id::text AS run_id, target, state FROM effects WHERE kind = 'http_call' ORDER BY created_at, id"""

_EFFECT_USAGE = """
SELECT coalesce(sum((usage->>'input_tokens')::bigint), 0) AS input_tokens,
       coalesce(sum((usage->>'output_tokens')::bigint), 0) AS output_tokens,
       count(*) AS calls
  FROM effects WHERE kind = 'model_call' AND state = 'settled'"""

_LEDGER = """
SELECT coalesce(sum(input_tokens), 0) AS input_tokens, coalesce(sum(output_tokens), 0) AS output_tokens,
       coalesce(sum(calls), 0) AS calls
  FROM usage_ledger"""

_TIMELINE = """
SELECT seq, type, at, attempt, fence, step, data FROM run_events WHERE run_id = %(run_id)s ORDER BY seq"""


def check(url: str, sink_counts: Mapping[str, int], model_usage: Mapping[str, int]) -> list[Check]:
    params = {"terminal": list(TERMINAL)}
    with psycopg.connect(url, row_factory=dict_row) as conn:
        fires = conn.execute(_FIRES).fetchone() or {}
        one = conn.execute(_ONE_TERMINAL, params).fetchone() or {}
        stuck = conn.execute(_STUCK, params).fetchone() or {}
        ended = conn.execute(_ENDED_ONCE, {**params, "events": [f"run.{t}" for t in TERMINAL]}).fetchone() or {}
        traces = conn.execute(_TRACES).fetchone() or {}
        internal = conn.execute(_INTERNAL).fetchone() or {}
        http = conn.execute(_HTTP_EFFECTS).fetchall()
        effects = conn.execute(_EFFECT_USAGE).fetchone() or {}
        ledger = conn.execute(_LEDGER).fetchone() or {}
    checks = [
        Check("fires recorded once per instant", int(fires.get("counted") or 0), int(fires.get("violations") or 0)),
        Check("one terminal run per occurrence (or a skip)", int(one.get("counted") or 0),
              int(one.get("violations") or 0), one.get("first_run")),
        Check("each ended run ended once (one terminal event)", int(ended.get("counted") or 0),
              int(ended.get("violations") or 0), ended.get("first_run")),
        Check("nothing stuck after the drain", int(stuck.get("counted") or 0), int(stuck.get("violations") or 0),
              stuck.get("first_run"), f"states {stuck['states']}" if stuck.get("states") else ""),
        Check("no run failed 'internal' (an unclassified error)", int(internal.get("counted") or 0),
              int(internal.get("violations") or 0), internal.get("first_run")),
        _mutations(http, sink_counts),
        Check("every trace gap-free", int(traces.get("counted") or 0), int(traces.get("violations") or 0),
              traces.get("first_run")),
        _usage(effects, ledger, model_usage),
    ]
    return checks


def _mutations(http: list[dict[str, Any]], sink_counts: Mapping[str, int]) -> Check:
    twice = {path: n for path, n in sink_counts.items() if n > 1}
    first: str | None = None
    settled_wrong = 0
    for effect in http:
        path = urlsplit(str(effect["target"]).split(" ", 1)[-1]).path
        received = sink_counts.get(path, 0)
        wrong = received > 1 or (effect["state"] == "settled" and received != 1)
        if wrong:
            settled_wrong += 1
            first = first or effect["run_id"]
    return Check("no mutation sent twice", len(sink_counts), len(twice) + settled_wrong, first,
                 f"{sum(sink_counts.values())} requests to {len(sink_counts)} targets, {len(http)} effects")


def _usage(effects: Mapping[str, Any], ledger: Mapping[str, Any], model: Mapping[str, int]) -> Check:
    keys = ("input_tokens", "output_tokens", "calls")
    mine = tuple(int(effects.get(k) or 0) for k in keys)
    booked = tuple(int(ledger.get(k) or 0) for k in keys)
    served = (int(model.get("prompt_tokens", 0)), int(model.get("completion_tokens", 0)), int(model.get("calls", 0)))
    # Tokens only against the server: echo runs are model calls too, answered without it.
    violations = int(mine != booked) + int(served[0] < booked[0] or served[1] < booked[1])
    return Check("usage equal to the ledger (<= model server)", booked[2], violations, None,
                 f"ledger {booked}, effects {mine}, model server {served} (tokens in, out, calls)")


def timeline(url: str, run_id: str) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row) as conn:
        return list(conn.execute(_TIMELINE, {"run_id": run_id}).fetchall())
