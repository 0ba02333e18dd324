"""The corpus run's phases: enumerate → map → reconcile → reduce → export → publish → complete.

Role: ``execute`` is the adapter the run worker calls instead of its single model call when the
claimed run carries ``corpus`` (``kairos.execution.execute``). It resumes at the phase the run's
``corpus_runs`` row records and moves phase by phase, each move committed in a fenced transaction with
its ``corpus.phase`` event (and the probe ``corpus_phase`` after the commit):

* enumerate — the source checked again against the owner's namespace and the allowed buckets
  (``corpus_source_refused`` otherwise), the manifest (``kairos.execution.corpus.manifest``) page by page, then
  the partitions;
* map — ``kairos.execution.corpus.mapping`` (partitions leased, called once per generation, committed);
* reconcile — no partition succeeded: the run fails ``corpus_no_partition_succeeded`` and nothing
  is exported; otherwise on;
* reduce — ``kairos.execution.corpus.reduce`` in the transaction of its phase move;
* export — ``kairos.execution.corpus.export`` (checkpointed multipart uploads);
* publish — the output (coverage and export handles), the phase ``complete`` and ``succeeded``
  in one transaction.

A corpus outlives an invocation: when map ends a slice (``kairos.execution.corpus.mapping``: the invocation's
time is nearly spent), ``kairos.runs.moves.corpus_continue`` puts the run back to ``queued`` with its lease cleared
and ``run.queued`` (reason ``continue``), and the worker's caller re-sends its id at once (``process``
answers ``continued``); the next claim resumes what this one committed. The run's usage spans its
invocations: each map call's effect is settled with that call's usage, and every move of the run out
of ``running`` (a slice, a pause, a retry, a rescue, its end) writes the sum of its settled effects
(``kairos.budgets``).

The run stays the one authority: its claim, heartbeat, fence, cancellation and terminal moves are the
worker's. A pause request is honoured at a partition or phase boundary (``kairos.runs.moves.corpus_pause``:
``run.paused``, the run back to ``queued`` with its lease cleared and ``paused_at`` set, the claim's
step closed ``paused``); a cancel request raises ``Cancelled`` (the worker ends the run).

Must not: call the model outside ``mapping``; publish without the fence; export when no partition
succeeded.
"""

from __future__ import annotations

from typing import Any

from kairos import db, trace
from kairos.diagnosis import diagnose
from kairos.execution.claim import Outcome
from kairos.execution.corpus import export, manifest, mapping
from kairos.execution.corpus.context import Corpus, Execution
from kairos.execution.corpus.reduce import reduce
from kairos.execution.stops import Cancelled, Failure, LeaseLost
from kairos.observability import logger
from kairos.runs import moves
from kairos.schedules import corpus_spec
from kairos.states import CorpusPhase, EventType, RunState

PHASES = tuple(p.value for p in CorpusPhase)


def execute(run: Execution) -> Outcome:
    """Runs the claimed corpus run from its recorded phase to an end (see the module doc)."""
    c = Corpus(run, dict(run.claimed.row["corpus"]))
    with c.fenced() as (conn, _):
        db.execute(conn, "corpus_runs_start", {"run_id": c.run_id, "owner": c.owner, "now": run.now})
        db.execute(conn, "corpus_partitions_release_stale", {"run_id": c.run_id, "now": run.now})
        state = db.fetch_row(conn, "corpus_runs_get", {"run_id": c.run_id})
    phase = str(state["phase"])
    while True:
        stop = _boundary(c)
        if stop is not None:
            return stop
        if phase == "enumerate":
            phase = _enumerate(c)
        elif phase == "map":
            why = mapping.map_partitions(c)
            if why == "cancel":
                raise Cancelled()
            if why == "pause":
                continue  # _boundary pauses
            if why == "slice":
                continued = _continue(c)
                if continued is None:
                    continue  # a pause or cancel request came first: _boundary handles it
                return continued
            phase = _move(c, "map", "reconcile")
        elif phase == "reconcile":
            counts = _counts(c)
            if counts["succeeded"] == 0:
                return _fail_empty(c, counts)
            phase = _move(c, "reconcile", "reduce")
        elif phase == "reduce":
            phase = _move(c, "reduce", "export", work=lambda conn: {"records": reduce(conn, c.run_id)})
        elif phase == "export":
            export.export_all(c)
            phase = _move(c, "export", "publish")
        else:  # publish (complete is only ever written with the terminal move)
            return _publish(c)


def _boundary(c: Corpus) -> Outcome | None:
    """At a boundary: a cancel raises, a pause parks the run (its Outcome), else None."""
    c.run.check_stop()
    with c.fenced() as (conn, row):
        if row["cancel_requested_at"] is not None:
            raise Cancelled()
        if row["pause_requested_at"] is None:
            return None
        state = db.fetch_one(conn, "corpus_runs_get", {"run_id": c.run_id})
        if not moves.corpus_pause(conn, c.run_id, c.fence, step=c.run.claimed.step,
                                  phase=None if state is None else state["phase"], now=c.run.now):
            raise LeaseLost()
    logger.info("corpus run paused", extra={"action": "corpus_paused", "run_id": str(c.run_id)})
    return Outcome(c.run_id, "paused", RunState.QUEUED)


def _continue(c: Corpus) -> Outcome | None:
    """Ends this invocation's slice: the run back to ``queued`` (not paused), its usage so far
    recorded, to be re-sent at once; None when a cancel or pause request is there to be honoured."""
    with c.fenced() as (conn, row):
        if row["cancel_requested_at"] is not None or row["pause_requested_at"] is not None:
            return None
        counts = db.fetch_row(conn, "corpus_partitions_counts", {"run_id": c.run_id})
        if not moves.corpus_continue(conn, c.run_id, c.fence, step=c.run.claimed.step,
                                     pending=int(counts["pending"]), now=c.run.now):
            raise LeaseLost()
    logger.info("corpus run continues in a new invocation", extra={
        "action": "corpus_continued", "run_id": str(c.run_id), "mapped": c.mapped,
        "partitions_pending": int(counts["pending"])})
    return Outcome(c.run_id, "continued", RunState.QUEUED, retry_delay_seconds=0)


def _move(c: Corpus, from_phase: str, to_phase: str, *, work: Any = None,
          totals: dict[str, int] | None = None) -> str:
    """One phase move with its ``corpus.phase`` event (and ``work`` done in the same transaction)."""
    with c.fenced() as (conn, _):
        data: dict[str, Any] = {"phase": to_phase, "from": from_phase}
        if work is not None:
            data.update(work(conn))
        moved = db.fetch_one(conn, "corpus_runs_set_phase", {
            "run_id": c.run_id, "from_phase": from_phase, "phase": to_phase, "now": c.run.now,
            "items_total": (totals or {}).get("items"), "partitions_total": (totals or {}).get("partitions")})
        if moved is None:
            raise LeaseLost()
        c.events(conn, [trace.Event(EventType.CORPUS_PHASE, None, {**data, **(totals or {})})])
    c.run.probes.fire("corpus_phase", run_id=c.run_id, fence=c.fence, phase=to_phase)
    return to_phase


def _enumerate(c: Corpus) -> str:
    """The manifest page by page (each page its own fenced transaction), then the partitions.

    The stored source is checked again first (``corpus_spec.out_of_scope``): a prefix outside the owner's
    namespace or a bucket no longer allowed fails the run ``corpus_source_refused`` before any listing.
    """
    refused = corpus_spec.out_of_scope(c.spec, owner=c.owner, buckets=c.run.settings.readable_corpus_buckets)
    if refused is not None:
        logger.warning("corpus source refused", extra={"action": "corpus_source_refused",
                                                       "run_id": str(c.run_id), "rule": refused})
        raise Failure("corpus_source_refused")
    try:
        for page in manifest.pages(c.spec):
            c.run.check_stop()
            with c.fenced() as (conn, _):
                db.execute(conn, "corpus_items_insert", {"run_id": c.run_id,
                                                         "items": db_json([i.as_json() for i in page])})
    except (LeaseLost, Cancelled):
        raise
    except Exception as error:
        logger.warning("corpus source unavailable", extra={"action": "corpus_source_unavailable",
                                                           "run_id": str(c.run_id), "error": type(error).__name__})
        raise Failure("corpus_source_unavailable", retry_safe=True) from error
    size = int(c.spec["partition_size"])

    def partitions(conn: Any) -> dict[str, int]:
        row = db.fetch_one(conn, "corpus_items_totals", {"run_id": c.run_id})
        items = 0 if row is None else int(row["items"])
        if items:
            db.execute(conn, "corpus_partitions_create", {"run_id": c.run_id, "size": size, "items": items,
                                                          "now": c.run.now})
        return {"items": items, "partitions": -(-items // size)}

    with c.fenced() as (conn, _):
        totals = partitions(conn)
    return _move(c, "enumerate", "map", totals=totals)


def db_json(value: Any) -> Any:
    from psycopg.types.json import Jsonb

    return Jsonb(value)


def _counts(c: Corpus) -> dict[str, int]:
    with c.run.database.connection() as conn:
        row = db.fetch_row(conn, "corpus_partitions_counts", {"run_id": c.run_id})
        state = db.fetch_row(conn, "corpus_runs_get", {"run_id": c.run_id})
    return {**{k: int(v) for k, v in row.items()}, "items_total": int(state["items_total"])}


def coverage(counts: dict[str, int]) -> dict[str, int]:
    return {"partitions_total": counts["total"], "succeeded": counts["succeeded"], "failed": counts["failed"],
            "items_total": counts["items_total"], "items_covered": counts["covered"]}


def _fail_empty(c: Corpus, counts: dict[str, int]) -> Outcome:
    """No partition succeeded: the run fails, nothing is exported."""
    events = [trace.Event(EventType.STEP_FINISHED, c.run.claimed.step,
                          {"outcome": "failed", "reason_code": "corpus_no_partition_succeeded"})]
    with c.fenced() as (conn, _):
        if not moves.fail(conn, c.run_id, c.fence, diagnosis=diagnose("corpus_no_partition_succeeded"),
                          events=events, now=c.run.now):
            raise LeaseLost()
    logger.info("corpus run failed", extra={"action": "run_failed", "run_id": str(c.run_id),
                                            "reason_code": "corpus_no_partition_succeeded", **coverage(counts)})
    return Outcome(c.run_id, "failed", RunState.FAILED, "corpus_no_partition_succeeded")


def handles(rows: list[db.Row]) -> list[dict[str, Any]]:
    return [{"format": r["format"], "bucket": r["bucket"], "key": r["key"], "bytes": int(r["bytes"]),
             "sha256": r["sha256"]} for r in rows if r["done"]]


def _summary(cover: dict[str, int], exported: list[dict[str, Any]]) -> str:
    keys = ", ".join(f"s3://{e['bucket']}/{e['key']} ({e['bytes']} bytes)" for e in exported)
    return (f"Corpus run complete: {cover['succeeded']} of {cover['partitions_total']} partitions succeeded "
            f"({cover['failed']} failed), {cover['items_covered']} of {cover['items_total']} items covered. "
            f"Exports: {keys or 'none'}.")


def _publish(c: Corpus) -> Outcome:
    """The output (coverage, export handles), phase ``complete`` and ``succeeded``: one transaction."""
    counts = _counts(c)
    with c.fenced() as (conn, row):
        if row["cancel_requested_at"] is not None:
            raise Cancelled()
        exported = handles(db.fetch_all(conn, "corpus_exports_list", {"run_id": c.run_id}))
        # The run's thread gets a one-line account (counts and export keys, no content), as a chat turn's answer.
        seq = moves.append_entry(conn, c.run_id, c.fence, c.run.claimed.conversation_id, role="assistant",
                                 content=_summary(coverage(counts), exported), now=c.run.now)
        if seq is None:
            raise LeaseLost()
        output = {"corpus": {"coverage": coverage(counts), "exports": exported}, "attempt": c.run.claimed.attempt,
                  "conversation_id": str(c.run.claimed.conversation_id), "entry_seq": seq}
        if db.fetch_one(conn, "corpus_runs_set_phase", {"run_id": c.run_id, "from_phase": "publish",
                                                         "phase": "complete", "now": c.run.now,
                                                         "items_total": None, "partitions_total": None}) is None:
            raise LeaseLost()
        events = [trace.Event(EventType.CORPUS_PHASE, None, {"phase": "complete", "from": "publish"}),
                  trace.Event(EventType.OUTPUT_PUBLISHED, c.run.claimed.step, {"exports": len(exported)}),
                  trace.Event(EventType.STEP_FINISHED, c.run.claimed.step, {"outcome": "succeeded"})]
        if not moves.succeed(conn, c.run_id, c.fence, output=output, events=events, now=c.run.now):
            raise LeaseLost()
    logger.info("corpus run succeeded", extra={"action": "run_succeeded", "run_id": str(c.run_id),
                                               **coverage(counts)})
    return Outcome(c.run_id, "succeeded", RunState.SUCCEEDED)
