"""Map: each partition's items through one model call per repair generation, under the run's fence.

Role: ``map_partitions`` leases pending partitions one at a time (up to
``KAIROS_CORPUS_MAX_CONCURRENCY`` at once, threads under the one run lease) and maps each
(``map_one``): the partition's input is built from the instructions and its items (input identity =
run, partition, generation: the request names all three, so its digest differs per generation); the
call is an effect of the run (``effects.reserve`` + ``budgets.reserve`` under the fence, settled
after) made through the agent's executor; the completed answer is checkpointed in the transaction
that settles the effect. The answer is then checked (``kairos.execution.corpus.answers``): valid, its lines are
committed and the partition succeeds; invalid, the partition's generation advances and it is requeued
in one fenced transaction — after ``MAX_REPAIRS`` it fails. A partition whose input is over the
agent's ``max_input_tokens`` (characters / 4) fails ``input_too_large`` without a call, as one whose
item changed since enumerate fails ``source_changed``. Partition leases are renewed while their
calls run (``_Renewer``); the run's heartbeat keeps the run lease.

Guarantees:
* A restart never repeats a completed call: a partition whose answer of its current generation is
  checkpointed is validated from the checkpoint, without a call.
* A pause or a cancel is honoured at a partition boundary: no partition is leased after one is seen;
  the partitions in flight finish (a cancel aborts their calls through the heartbeat).
* A corpus is not bounded by one invocation: once this invocation has mapped a partition and less
  than ``SLICE_RESERVE_SECONDS`` of its time is left (the run's deadline: its runtime limit or the
  Lambda's remaining time, whichever is sooner), no further partition is leased and ``map_partitions``
  answers ``slice`` — the run continues in a new invocation (``kairos.execution.corpus.phases``), so a time limit
  bounds a slice of the corpus, not the corpus.
* Every write checks the run's fence first (``Corpus.fenced``).

Must not: hold a transaction across a call; log or trace items, instructions or answers.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, NoReturn

from psycopg.types.json import Jsonb

from kairos import budgets, db, effects, trace
from kairos.execution.corpus import answers, manifest
from kairos.execution.corpus.context import Corpus
from kairos.execution.stops import Cancelled, Failure, LeaseLost
from kairos.executors.base import (
    CHARS_PER_TOKEN,
    DEFAULT_MAX_TOKENS,
    ExecutionRequest,
    ExecutorError,
    max_input_tokens,
    max_tokens,
)
from kairos.observability import logger
from kairos.states import EventType

MAX_REPAIRS = 2
PARTITION_LEASE_SECONDS = 120
RENEW_SECONDS = 20.0
CALL_TIMEOUT_CAP_SECONDS = 300.0
# Time a partition may need (its call, the checks, the commit): with less left, the slice ends.
SLICE_RESERVE_SECONDS = 120.0
ITEM_MAX_CHARS = 16_000

Stop = Literal["done", "pause", "cancel", "slice"]


class _Stopped(Exception):
    """Internal: a boundary saw a pause or cancel request, or the slice's end; no further partition is leased."""

    def __init__(self, why: Stop) -> None:
        super().__init__(why)
        self.why = why


def map_partitions(c: Corpus) -> Stop:
    """Maps every pending partition; ``done`` when none is left, else why it stopped early."""
    workers = max(1, min(c.run.settings.corpus_max_concurrency, MAX_WORKERS))
    stop = threading.Event()
    seen: list[Stop] = []
    renewer = _Renewer(c)

    def work() -> None:
        while not stop.is_set():
            try:
                if not _one(c, renewer):
                    return
            except _Stopped as stopped:
                seen.append(stopped.why)
                stop.set()
                return
            except BaseException:
                stop.set()
                raise

    renewer.start()
    try:
        if workers == 1:
            work()
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="corpus") as pool:
                futures = [pool.submit(work) for _ in range(workers)]
                errors = [f.exception() for f in futures]
            first = next((e for e in errors if e is not None), None)
            if first is not None:
                raise first
    finally:
        renewer.stop()
    if "cancel" in seen:
        return "cancel"
    if "pause" in seen:
        return "pause"
    return "slice" if "slice" in seen else "done"


MAX_WORKERS = 16


def _one(c: Corpus, renewer: _Renewer) -> bool:
    """Leases the next pending partition and maps it; False when none is left."""
    c.run.check_stop()
    with c.fenced() as (conn, row):
        if row["cancel_requested_at"] is not None:
            raise _Stopped("cancel")
        if row["pause_requested_at"] is not None:
            raise _Stopped("pause")
        part = db.fetch_one(conn, "corpus_partitions_next", {"run_id": c.run_id, "now": c.run.now,
                                                              "lease_seconds": PARTITION_LEASE_SECONDS})
        if part is not None and c.mapped and c.run.remaining() < SLICE_RESERVE_SECONDS:
            raise _Stopped("slice")  # rolls this lease back: the partition stays pending for the next slice
    if part is None:
        return False
    renewer.add(part["lease_token"])
    try:
        map_one(c, part)
    finally:
        renewer.discard(part["lease_token"])
    with c.lock:
        c.mapped += 1
    return True


def map_one(c: Corpus, part: db.Row) -> None:
    """One leased partition: its answer (checkpointed, or from one call), checked and committed."""
    n, generation = int(part["n"]), int(part["generation"])
    answer: str | None = part["answer"] if part["answer_generation"] == generation else None
    if answer is None:
        answer = _call(c, part)
        if answer is None:
            return  # the partition ended (failed) without an answer
    parsed = answers.parse(answer)
    with c.fenced() as (conn, _):
        base = {"run_id": c.run_id, "n": n, "lease_token": part["lease_token"], "now": c.run.now}
        if isinstance(parsed, answers.Invalid):
            moved = db.fetch_one(conn, "corpus_partitions_repair", {
                **base, "max_generation": MAX_REPAIRS, "error_code": f"invalid_jsonl:{parsed.code}"})
            if moved is None:
                raise LeaseLost()
            data = {"partition": n, "state": moved["state"], "generation": int(moved["generation"]),
                    "reason_code": "invalid_jsonl", "problem": parsed.code, "line": parsed.line}
        else:
            db.execute(conn, "corpus_outputs_insert", {"run_id": c.run_id, "n": n,
                                                       "lines": Jsonb([x.as_json() for x in parsed])})
            moved = db.fetch_one(conn, "corpus_partitions_succeed", {**base, "records": len(parsed)})
            if moved is None:
                raise LeaseLost()
            data = {"partition": n, "state": "succeeded", "generation": generation, "records": len(parsed)}
        c.events(conn, [trace.Event(EventType.CORPUS_PARTITION, None, data)])
    logger.info("corpus partition", extra={"action": "corpus_partition", "run_id": str(c.run_id), **data})


def _input(c: Corpus, part: db.Row) -> str | None:
    """The partition's model input (instructions, the identity line, its items); None when an item
    changed since enumerate (the partition then fails ``source_changed``)."""
    n, generation = int(part["n"]), int(part["generation"])
    with c.run.database.connection() as conn:
        items = db.fetch_all(conn, "corpus_items_range", {"run_id": c.run_id, "first": part["first_ordinal"],
                                                          "last": part["last_ordinal"]})
    lines = [c.spec["instructions"], "",
             'Answer with JSON Lines only: one JSON object per line, each with a string "id" and a string "kind".',
             f"Corpus run {c.run_id}, partition {n}, generation {generation}: items "
             f"{part['first_ordinal']} to {part['last_ordinal']}."]
    if generation > 0:
        lines.append(f"Your previous answer was not valid JSON Lines ({part['error_code'] or 'invalid'}). "
                     "Answer again with JSON Lines only.")
    for item in items:
        try:
            text = manifest.read(c.spec, manifest.Item(int(item["ordinal"]), item["key"], item["digest"],
                                                       int(item["bytes"])))
        except manifest.SourceChanged:
            return None
        lines += ["", f"--- item {item['ordinal']}: {item['key']}", text[:ITEM_MAX_CHARS]]
    return "\n".join(lines)


def _call(c: Corpus, part: db.Row) -> str | None:
    """Reserves, makes and settles the partition's call, checkpointing its answer; the answer, or
    None when the partition failed without one."""
    run, n, generation = c.run, int(part["n"]), int(part["generation"])
    base = {"run_id": c.run_id, "n": n, "lease_token": part["lease_token"], "now": run.now}
    try:
        content = _input(c, part)
    except Exception as error:
        logger.warning("corpus item unreadable", extra={"action": "corpus_item_unreadable",
                                                        "run_id": str(c.run_id), "partition": n,
                                                        "error": type(error).__name__})
        raise Failure("corpus_source_unavailable", retry_safe=True) from error
    if content is None:
        _fail_partition(c, base, n, generation, "source_changed")
        return None
    agent: dict[str, Any] = dict(run.claimed.row["agent"] or {})
    try:
        window = max_input_tokens(agent)
    except ExecutorError as error:
        raise Failure(error.reason_code) from error
    if len(content) // CHARS_PER_TOKEN > window:  # the agent's input bound: this partition cannot be sent
        _fail_partition(c, base, n, generation, "input_too_large")
        return None
    request = ExecutionRequest(run_id=str(c.run_id), attempt=run.claimed.attempt, owner=c.owner, agent=agent,
                               transcript=(), prompt=content)
    try:
        executor = run.executor_factory(str(agent.get("executor", "")), settings=run.settings)
        prepared = executor.prepare(request)
    except ExecutorError as error:
        raise Failure(error.reason_code, retry_safe=error.retry_safe) from error
    step = f"corpus:{n}:{generation}"
    effect = _reserve(c, step, prepared, agent, len(content) // 4)
    run.probes.fire("after_reserve", run_id=c.run_id, fence=c.fence, effect=effect)
    started = time.monotonic()
    remaining = run.remaining()
    try:
        if remaining <= 0:
            raise Failure("runtime_limit")
        reply = executor.send(dataclasses.replace(prepared, abort=run.heartbeat.abort),
                              timeout=max(0.001, min(remaining, CALL_TIMEOUT_CAP_SECONDS)))
    except (ExecutorError, Failure) as error:
        answered = error.usage if isinstance(error, ExecutorError) else None  # a refused reply still counts
        _call_failed(c, effect, base, error, None if answered is None else _priced(c, agent, answered, started))
    usage = _priced(c, agent, reply.usage, started)
    events: list[trace.Event] = []
    with c.fenced() as (conn, _):
        if effects.settle(conn, effect, fence=c.fence, usage=usage, trace_into=events, now=run.now) is None:
            raise LeaseLost()
        if db.fetch_one(conn, "corpus_partitions_checkpoint", {**base, "generation": generation,
                                                                "answer": reply.content}) is None:
            raise LeaseLost()
        c.events(conn, events)
    run.probes.fire("corpus_answer", run_id=c.run_id, fence=c.fence, partition=n, generation=generation)
    return str(reply.content)


def _reserve(c: Corpus, step: str, prepared: Any, agent: dict[str, Any], estimate: int) -> effects.Effect:
    run = c.run
    with c.fenced() as (conn, row):
        if row["cancel_requested_at"] is not None:
            raise Cancelled()
        effect = effects.reserve(conn, c.run_id, c.fence, run.claimed.attempt, step, prepared.kind,
                                 prepared.mutation, prepared.url, prepared.digest, now=run.now)
        if effect is None:
            raise LeaseLost()
        try:
            output_tokens = max_tokens(agent)
        except ExecutorError:
            output_tokens = DEFAULT_MAX_TOKENS
        if not budgets.reserve(conn, effect_id=effect.id, run_id=c.run_id, owner=c.owner, model=agent.get("model"),
                               input_tokens=max(estimate, len(prepared.body) // 4), max_output_tokens=output_tokens,
                               settings=run.settings, now=run.now):
            raise Failure("budget_exhausted")
    return effect


def _priced(c: Corpus, agent: dict[str, Any], counts: Mapping[str, Any], started: float) -> dict[str, Any]:
    """One answered call's usage: the provider's integer counts, ``calls`` 1, its duration, priced."""
    return budgets.priced({**{k: v for k, v in counts.items() if isinstance(v, int) and not isinstance(v, bool)},
                           "calls": 1, "duration_ms": int((time.monotonic() - started) * 1000)},
                          agent.get("model"), c.run.settings)


def _call_failed(c: Corpus, effect: effects.Effect, base: dict[str, Any], error: Exception,
                 usage: dict[str, Any] | None = None) -> NoReturn:
    """Closes the failed call's effect (settled with ``usage`` when the model answered and its reply was
    refused: the call counts) and puts the partition back; then the attempt stops: a cancel (the
    heartbeat aborted the call) ends the run cancelled, anything else fails or retries it."""
    code = error.reason_code if isinstance(error, ExecutorError | Failure) else "internal"
    events: list[trace.Event] = []
    with c.fenced() as (conn, row):
        if usage is not None:
            effects.settle(conn, effect, fence=c.fence, usage=usage, error_code=code, trace_into=events,
                           now=c.run.now)
        else:
            effects.fail(conn, effect, fence=c.fence, error_code=code, trace_into=events, now=c.run.now)
        db.fetch_one(conn, "corpus_partitions_release", base)
        c.events(conn, events)
        cancelled = row["cancel_requested_at"] is not None
    if cancelled or c.run.heartbeat.cancel_requested.is_set():
        raise Cancelled()
    if isinstance(error, Failure):
        raise error
    assert isinstance(error, ExecutorError)
    raise Failure(code, retry_safe=error.retry_safe and not error.outcome_unknown)


def _fail_partition(c: Corpus, base: dict[str, Any], n: int, generation: int, code: str) -> None:
    with c.fenced() as (conn, _):
        if db.fetch_one(conn, "corpus_partitions_fail", {**base, "error_code": code}) is None:
            raise LeaseLost()
        c.events(conn, [trace.Event(EventType.CORPUS_PARTITION, None, {
            "partition": n, "state": "failed", "generation": generation, "reason_code": code})])


class _Renewer:
    """Renews the leases of the partitions in flight every ``RENEW_SECONDS`` under the run's fence."""

    def __init__(self, c: Corpus) -> None:
        self.c = c
        self.tokens: set[Any] = set()
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="corpus-renew", daemon=True)

    def add(self, token: Any) -> None:
        with self.lock:
            self.tokens.add(token)

    def discard(self, token: Any) -> None:
        with self.lock:
            self.tokens.discard(token)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)

    def renew_once(self) -> int:
        with self.lock:
            tokens = list(self.tokens)
        if not tokens:
            return 0
        with self.c.run.database.transaction() as conn:
            rows = db.fetch_all(conn, "corpus_partitions_renew", {
                "run_id": self.c.run_id, "fence": self.c.fence, "tokens": tokens, "now": self.c.run.now,
                "lease_seconds": PARTITION_LEASE_SECONDS})
        return len(rows)

    def _loop(self) -> None:
        while not self.stopped.wait(RENEW_SECONDS):
            try:
                self.renew_once()
            except Exception:  # noqa: BLE001 - logged; the run's own heartbeat decides whether it lives
                logger.exception("corpus lease renewal failed", extra={"action": "corpus_renew_failed",
                                                                      "run_id": str(self.c.run_id)})
