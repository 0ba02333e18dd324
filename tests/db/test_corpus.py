"""Corpus runs on real PostgreSQL and moto's S3, with a scripted model that answers from its input:
the worker killed at every phase boundary, in the middle of a partition and of the export, restarted
until done — each partition's call made once per generation and the export byte-identical to an
uninterrupted run's; a partition whose answers stay invalid failing after two repairs while the
others publish; nothing exported when no partition succeeds; pause and resume; cancel; concurrency."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from kairos.db import Database
from kairos.execution.execute import process
from kairos.probes import Probes
from kairos.runs import corpus_control
from kairos.settings import Settings
from kairos.tick.repair import Repair
from tests import factories
from tests.support.aws import LambdaContext, SqsQueue, run_body, sqs_event
from tests.support.corpus import EXPORTS, SETTINGS, SOURCE, Model, rows
from tests.support.corpus import s3 as s3


class Crash(BaseException):
    """The worker process dies here."""


def put_items(s3: Any, count: int, prefix: str = "alice/docs/") -> None:
    for i in range(count):
        s3.put_object(Bucket=SOURCE, Key=f"{prefix}{i:05d}.txt", Body=f"document {i} body".encode())


def corpus_run(url: str, spec: dict[str, Any]) -> uuid.UUID:
    run = factories.run(url, source="manual", corpus=json.dumps(
        {"partition_size": 20, "max_items": 10_000, "formats": ["jsonl"], "instructions": "Summarise.", **spec}))
    return uuid.UUID(str(run["id"]))


def s3_spec(**more: Any) -> dict[str, Any]:
    return {"source": {"s3": {"bucket": SOURCE, "prefix": "alice/docs/"}}, **more}


def work(db: Database, run_id: uuid.UUID, model: Model, *, settings: Settings = SETTINGS,
         probes: Probes | None = None) -> Any:
    return process(db, run_id, settings=settings, executor_factory=model.executor.factory, probes=probes)


def restart(db: Database, url: str, run_id: uuid.UUID, sqs_queue: SqsQueue) -> None:
    """The dead worker's lease runs out; the tick's rescuer requeues the run."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE runs SET lease_expires_at = now() - interval '1 second' WHERE id = %s", (run_id,))
    report = Repair(db, sqs_queue.client, sqs_queue.url, restart_limit=100).rescue_once()
    assert report.requeued == 1


def exported(s3: Any, run_id: uuid.UUID, fmt: str = "jsonl") -> bytes:
    body: bytes = s3.get_object(Bucket=EXPORTS, Key=f"exports/alice/{run_id}/records.{fmt}")["Body"].read()
    return body


def crash_once(probes: Probes, point: Any, when: Callable[..., bool]) -> list[bool]:
    fired: list[bool] = []

    def handler(**context: Any) -> None:
        if not fired and when(**context):
            fired.append(True)
            raise Crash(point)

    probes.on(point, handler)
    return fired


def test_a_corpus_killed_at_every_boundary_exports_the_same_bytes_with_each_call_made_once(
        db: Database, db_url: str, s3: Any, sqs_queue: SqsQueue) -> None:
    put_items(s3, 1_000)
    baseline_model, model = Model(), Model()
    baseline = corpus_run(db_url, s3_spec())
    assert work(db, baseline, baseline_model).result == "succeeded"

    run_id = corpus_run(db_url, s3_spec())
    kills: list[tuple[Any, Callable[..., bool]]] = [
        ("corpus_phase", lambda phase, **_: phase == "map"),  # enumerate committed
        ("after_reserve", lambda effect, **_: effect.step == "corpus:3:0"),  # mid-partition, before the call
        ("corpus_answer", lambda partition, **_: partition == 7),  # mid-partition, answer stored, not committed
        ("corpus_phase", lambda phase, **_: phase == "reconcile"),
        ("corpus_phase", lambda phase, **_: phase == "reduce"),
        ("corpus_phase", lambda phase, **_: phase == "export"),
        ("corpus_part", lambda part, **_: part == 2),  # mid-export: two parts uploaded and checkpointed
        ("corpus_phase", lambda phase, **_: phase == "publish"),
    ]
    for point, when in kills:
        probes = Probes()
        fired = crash_once(probes, point, when)
        with pytest.raises(Crash):
            work(db, run_id, model, probes=probes)
        assert fired == [True]
        restart(db, db_url, run_id, sqs_queue)
    outcome = work(db, run_id, model)

    assert outcome.result == "succeeded"
    assert set(model.calls) == {(n, 0) for n in range(50)} and set(model.calls.values()) == {1}
    assert exported(s3, run_id) == exported(s3, baseline)
    [export_row] = rows(db_url, "SELECT * FROM corpus_exports WHERE run_id = %s", run_id)
    assert len(export_row["parts"]) > 2  # the restart resumed the upload, it did not start over
    [run] = rows(db_url, "SELECT state, attempt, output FROM runs WHERE id = %s", run_id)
    assert run["state"] == "succeeded" and run["attempt"] == len(kills) + 1
    assert run["output"]["corpus"]["coverage"] == {"partitions_total": 50, "succeeded": 50, "failed": 0,
                                                   "items_total": 1000, "items_covered": 1000}
    records = rows(db_url, "SELECT kind, count(*) AS n FROM corpus_records WHERE run_id = %s GROUP BY kind "
                           "ORDER BY kind", run_id)
    assert [(r["kind"], r["n"]) for r in records] == [("doc", 1000), ("topic", 7)]

    # A replay of the finished run reads what it wrote and never calls the model.
    assert work(db, run_id, model).result == "skipped"
    assert sum(model.calls.values()) == 50


@pytest.mark.parametrize(("answer", "code"), [
    ('{"id": "a", "kind": "doc", "score": NaN}', "unstorable"),
    ('{"id": "a", "kind": "doc", "score": 1e999}', "unstorable"),
    ('{"id": "a", "kind": "doc", "text": "LEAKMARK\\u0000"}', "unstorable"),
    ('{"id": "a\\u0000", "kind": "doc"}', "unstorable"),
    ('{"id": "a", "kind": "doc", "deep": ' + "[" * 5_000 + "]" * 5_000 + "}", "not_json"),
])
def test_an_answer_the_database_cannot_store_is_an_invalid_answer_not_a_stuck_run(
        db: Database, db_url: str, s3: Any, caplog: pytest.LogCaptureFixture, answer: str, code: str) -> None:
    # Given a map answer that is JSON Lines but holds a NUL, NaN or 1e999 (or nests past the parser)
    put_items(s3, 40)
    model = Model(invalid=lambda n, g: n == 1, invalid_answer=answer)
    run_id = corpus_run(db_url, s3_spec())

    outcome = work(db, run_id, model)

    # Then that partition is repaired like any invalid answer and fails; the run publishes the rest
    assert outcome.result == "succeeded"
    assert [model.calls[(1, g)] for g in range(3)] == [1, 1, 1]
    [part] = rows(db_url, "SELECT state, error_code FROM corpus_partitions WHERE run_id = %s AND n = 1", run_id)
    assert (part["state"], part["error_code"]) == ("failed", f"invalid_jsonl:{code}")
    assert "LEAKMARK" not in caplog.text


def test_merge_keeps_every_partition_field_and_later_partitions_win(
        db: Database, db_url: str, s3: Any) -> None:
    put_items(s3, 40)
    run_id = corpus_run(db_url, s3_spec())
    assert work(db, run_id, Model()).result == "succeeded"
    [topic] = rows(db_url, "SELECT data, lineage FROM corpus_records WHERE run_id = %s AND kind = 'topic' "
                           "AND id = 't0'", run_id)
    # t0 comes from items 0, 7, 14 (partition 0) and 21, 28, 35 (partition 1): the last line of the last
    # partition wins `last`; each partition's own field stays.
    assert topic["data"] == {"last": "alice/docs/00035.txt", "seen_0": True, "seen_1": True}
    assert topic["lineage"] == {"partitions": [{"n": 0, "items": [0, 19]}, {"n": 1, "items": [20, 39]}]}


def test_a_partition_that_stays_invalid_fails_after_two_repairs_and_the_others_publish(
        db: Database, db_url: str, s3: Any) -> None:
    put_items(s3, 100)
    model = Model(invalid=lambda n, g: n == 2)
    run_id = corpus_run(db_url, s3_spec())

    outcome = work(db, run_id, model)

    assert outcome.result == "succeeded"
    assert [model.calls[(2, g)] for g in range(3)] == [1, 1, 1] and (2, 3) not in model.calls
    assert all(model.calls[(n, 0)] == 1 for n in (0, 1, 3, 4))
    [part] = rows(db_url, "SELECT state, generation, error_code FROM corpus_partitions WHERE run_id = %s AND n = 2",
                  run_id)
    assert (part["state"], part["generation"], part["error_code"]) == ("failed", 2, "invalid_jsonl:not_json")
    [run] = rows(db_url, "SELECT output FROM runs WHERE id = %s", run_id)
    assert run["output"]["corpus"]["coverage"] == {"partitions_total": 5, "succeeded": 4, "failed": 1,
                                                   "items_total": 100, "items_covered": 80}
    lines = exported(s3, run_id).decode().splitlines()
    assert len([x for x in lines if json.loads(x)["kind"] == "doc"]) == 80
    # The three calls of partition 2 had three input identities (one effect digest each).
    digests = rows(db_url, "SELECT DISTINCT request_digest FROM effects WHERE run_id = %s AND step LIKE 'corpus:2:%%'",
                   run_id)
    assert len(digests) == 3
    events = rows(db_url, "SELECT data FROM run_events WHERE run_id = %s AND type = 'corpus.partition' "
                          "AND data ->> 'partition' = '2' ORDER BY seq", run_id)
    assert [(e["data"]["state"], e["data"]["generation"]) for e in events] == [
        ("pending", 1), ("pending", 2), ("failed", 2)]


def test_no_partition_succeeding_fails_the_run_and_exports_nothing(db: Database, db_url: str, s3: Any) -> None:
    put_items(s3, 30)
    run_id = corpus_run(db_url, s3_spec())

    outcome = work(db, run_id, Model(invalid=lambda n, g: True))

    assert (outcome.result, outcome.reason_code) == ("failed", "corpus_no_partition_succeeded")
    assert s3.list_objects_v2(Bucket=EXPORTS).get("KeyCount", 0) == 0
    assert rows(db_url, "SELECT count(*) AS n FROM corpus_exports WHERE run_id = %s", run_id)[0]["n"] == 0


def test_inline_items_export_jsonl_and_graphml(db: Database, db_url: str, s3: Any) -> None:
    run_id = corpus_run(db_url, {"source": {"items": ["alpha", {"title": "beta"}, "gamma"]},
                                 "formats": ["jsonl", "graphml"], "partition_size": 2})
    assert work(db, run_id, Model()).result == "succeeded"
    graph = exported(s3, run_id, "graphml").decode()
    assert graph.startswith("<?xml") and graph.count("<node ") == 3 + 3 and graph.endswith("</graphml>\n")
    [run] = rows(db_url, "SELECT output FROM runs WHERE id = %s", run_id)
    handles = run["output"]["corpus"]["exports"]
    assert [h["format"] for h in handles] == ["jsonl", "graphml"]
    import hashlib
    assert handles[0]["sha256"] == hashlib.sha256(exported(s3, run_id)).hexdigest()


def pause_when(db_url: str, run_id: uuid.UUID, point: Any, when: Callable[..., bool], probes: Probes) -> None:
    def handler(**context: Any) -> None:
        if when(**context):
            with psycopg.connect(db_url, row_factory=dict_row) as conn:
                corpus_control.pause(conn, run_id, owner="alice")

    probes.on(point, handler)


@pytest.mark.parametrize("phase", ["map", "reconcile", "reduce", "export", "publish"])
def test_pause_at_a_boundary_then_resume_keeps_everything_committed(
        db: Database, db_url: str, s3: Any, phase: str) -> None:
    put_items(s3, 60)
    model = Model()
    run_id = corpus_run(db_url, s3_spec())
    probes = Probes()
    if phase == "map":  # in the middle of map: after partition 1's answer
        pause_when(db_url, run_id, "corpus_answer", lambda partition, **_: partition == 1, probes)
    else:
        pause_when(db_url, run_id, "corpus_phase", lambda **c: c["phase"] == phase, probes)

    assert work(db, run_id, model, probes=probes).result == "paused"
    [run] = rows(db_url, "SELECT state, lease_token, paused_at, expires_at FROM runs WHERE id = %s", run_id)
    assert run["state"] == "queued" and run["lease_token"] is None and run["paused_at"] is not None
    calls_before = sum(model.calls.values())
    assert work(db, run_id, model).result == "skipped"  # a paused run is not claimed
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        resumed = corpus_control.resume(conn, run_id, owner="alice")
    assert resumed.send and not resumed.run["paused"]

    assert work(db, run_id, model).result == "succeeded"
    assert set(model.calls.values()) == {1} and len(model.calls) == 3
    assert sum(model.calls.values()) - calls_before == (1 if phase == "map" else 0)  # only partition 2 was left
    types = [r["type"] for r in rows(db_url, "SELECT type FROM run_events WHERE run_id = %s ORDER BY seq", run_id)]
    assert types.count("run.paused") == 1 and types.count("run.resumed") == 1
    assert types.index("run.paused") < types.index("run.resumed") < types.index("run.succeeded")


@pytest.mark.parametrize("phase", ["map", "reconcile", "reduce", "export", "publish"])
def test_cancel_in_each_phase_ends_the_run_cancelled(db: Database, db_url: str, s3: Any, phase: str) -> None:
    from kairos import runs

    put_items(s3, 60)
    run_id = corpus_run(db_url, s3_spec())
    probes = Probes()

    def cancel(**context: Any) -> None:
        if context["phase"] == phase:
            with psycopg.connect(db_url, row_factory=dict_row) as conn:
                runs.cancel(conn, run_id, owner="alice")

    probes.on("corpus_phase", cancel)
    outcome = work(db, run_id, Model(), probes=probes)

    assert outcome.result == "cancelled"
    [run] = rows(db_url, "SELECT state, output FROM runs WHERE id = %s", run_id)
    assert run["state"] == "cancelled" and run["output"] is None


def test_a_paused_queued_run_is_not_resent_and_does_not_expire(
        db: Database, db_url: str, s3: Any, sqs_queue: SqsQueue) -> None:
    put_items(s3, 20)
    run_id = corpus_run(db_url, s3_spec())
    with psycopg.connect(db_url, row_factory=dict_row) as conn:
        paused = corpus_control.pause(conn, run_id, owner="alice")
    assert paused["paused"] and paused["state"] == "queued"
    old = datetime.now(UTC) - timedelta(hours=1)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE runs SET handoff_at = %s, created_at = %s WHERE id = %s", (old, old, run_id))
    report = Repair(db, sqs_queue.client, sqs_queue.url).resend_once()
    assert report.resent == 0 and sqs_queue.run_ids() == []


def test_concurrency_four_exports_what_concurrency_one_does(db: Database, db_url: str, s3: Any) -> None:
    put_items(s3, 200)
    one, four = Model(), Model()
    first = corpus_run(db_url, s3_spec())
    second = corpus_run(db_url, s3_spec())
    assert work(db, first, one).result == "succeeded"
    wide = Settings(corpus_buckets=(SOURCE,), export_bucket=EXPORTS, corpus_max_concurrency=4)

    assert work(db, second, four, settings=wide).result == "succeeded"

    assert exported(s3, first) == exported(s3, second)
    assert set(four.calls.values()) == {1} and len(four.calls) == 10


def test_a_scheduled_corpus_run_whose_worker_died_is_requeued_not_abandoned(
        db: Database, db_url: str, s3: Any, sqs_queue: SqsQueue) -> None:
    put_items(s3, 40)
    model = Model()
    run = factories.run(db_url, source="scheduled", corpus=json.dumps(
        {"partition_size": 20, "max_items": 10_000, "formats": ["jsonl"], "instructions": "Summarise.",
         **s3_spec()}))
    run_id = uuid.UUID(str(run["id"]))
    assert run["catch_up"] is False
    probes = Probes()
    crash_once(probes, "corpus_answer", lambda partition, **_: partition == 0)
    with pytest.raises(Crash):
        work(db, run_id, model, probes=probes)

    restart(db, db_url, run_id, sqs_queue)  # requeued (a plain scheduled run would end abandoned_late)

    assert work(db, run_id, model).result == "succeeded"
    assert dict(model.calls) == {(0, 0): 1, (1, 0): 1}


def test_a_corpus_longer_than_an_invocation_continues_in_the_next_and_exports_the_same_bytes(
        db: Database, db_url: str, s3: Any) -> None:
    # Given a 3-partition corpus, mapped once without a time limit as the baseline
    put_items(s3, 60)
    baseline_model, model = Model(), Model()
    baseline = corpus_run(db_url, s3_spec())
    assert work(db, baseline, baseline_model).result == "succeeded"
    # and the same corpus as a scheduled run without catch-up, with a delivery deadline
    run = factories.run(db_url, source="scheduled", corpus=json.dumps(
        {"partition_size": 20, "max_items": 10_000, "formats": ["jsonl"], "instructions": "Summarise.",
         **s3_spec()}))
    run_id = uuid.UUID(str(run["id"]))
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE runs SET expires_at = now() + interval '1 hour' WHERE id = %s", (run_id,))

    # When each invocation has 60 s left (45 s after the worker's margin: less than a partition's
    # reserve, so each maps one partition and hands the rest to the next invocation)
    results = []
    for _ in range(6):
        outcome = process(db, run_id, settings=SETTINGS, executor_factory=model.executor.factory,
                          lambda_remaining_ms=lambda: 60_000)
        results.append(outcome.result)
        if outcome.result != "continued":
            break
        [queued] = rows(db_url, "SELECT state, lease_token, expires_at, paused_at, usage FROM runs WHERE id = %s",
                        run_id)
        assert (queued["state"], queued["lease_token"], queued["expires_at"], queued["paused_at"]) == (
            "queued", None, None, None)
        assert queued["usage"]["calls"] == len(results)  # the usage so far is on the row
        assert outcome.retry_delay_seconds == 0

    # Then it continued twice and succeeded, each partition called once, the export the baseline's bytes
    assert results == ["continued", "continued", "succeeded"]
    assert set(model.calls) == {(0, 0), (1, 0), (2, 0)} and set(model.calls.values()) == {1}
    assert exported(s3, run_id) == exported(s3, baseline)
    [done] = rows(db_url, "SELECT state, restarts, usage, output FROM runs WHERE id = %s", run_id)
    [whole] = rows(db_url, "SELECT usage FROM runs WHERE id = %s", baseline)
    assert done["state"] == "succeeded" and done["restarts"] == 0
    assert {k: done["usage"][k] for k in ("calls", "input_tokens", "output_tokens")} == \
        {k: whole["usage"][k] for k in ("calls", "input_tokens", "output_tokens")} == \
        {"calls": 3, "input_tokens": 300, "output_tokens": 150}
    assert done["output"]["corpus"]["coverage"]["succeeded"] == 3
    queued_events = rows(db_url, "SELECT data FROM run_events WHERE run_id = %s AND type = 'run.queued' "
                                 "ORDER BY seq", run_id)
    assert [(e["data"]["reason"], e["data"]["partitions_pending"]) for e in queued_events] == [
        ("continue", 2), ("continue", 1)]


def test_through_sqs_each_invocation_re_sends_the_id_until_the_corpus_is_done(
        db: Database, db_url: str, s3: Any, sqs_queue: SqsQueue) -> None:
    from kairos.execution import sqs

    put_items(s3, 60)
    model = Model()
    run_id = corpus_run(db_url, s3_spec())
    settings = Settings(corpus_buckets=(SOURCE,), export_bucket=EXPORTS, run_queue_url=sqs_queue.url)
    sender = sqs.sqs_retry_sender(db, settings, sqs=sqs_queue.client)
    bodies, invocations = [run_body(run_id)], 0
    while bodies and invocations < 6:  # each invocation has 60 s left: one partition a slice
        [body] = bodies
        response = sqs.handle_batch(sqs_event(body), LambdaContext(remaining_ms=60_000), db=db, settings=settings,
                                    send_retry=sender, executor_factory=model.executor.factory)
        assert response == {"batchItemFailures": []}  # acknowledged: the id went back as a new message
        invocations += 1
        bodies = sqs_queue.drain()

    assert invocations == 3
    assert rows(db_url, "SELECT state FROM runs WHERE id = %s", run_id) == [{"state": "succeeded"}]
    assert set(model.calls) == {(0, 0), (1, 0), (2, 0)} and set(model.calls.values()) == {1}


def test_a_slice_ends_only_after_a_partition_and_a_pause_request_wins_over_it(
        db: Database, db_url: str, s3: Any) -> None:
    put_items(s3, 40)
    model = Model()
    run_id = corpus_run(db_url, s3_spec())
    # An invocation with less than a partition's reserve still maps one partition: no empty slices.
    probes = Probes()
    pause_when(db_url, run_id, "corpus_answer", lambda partition, **_: partition == 0, probes)

    outcome = process(db, run_id, settings=SETTINGS, executor_factory=model.executor.factory, probes=probes,
                      lambda_remaining_ms=lambda: 60_000)

    assert outcome.result == "paused" and dict(model.calls) == {(0, 0): 1}
    [run] = rows(db_url, "SELECT state, paused_at, usage FROM runs WHERE id = %s", run_id)
    assert run["state"] == "queued" and run["paused_at"] is not None and run["usage"]["calls"] == 1


def test_map_calls_are_reserved_against_the_owners_daily_budget(db: Database, db_url: str, s3: Any) -> None:
    put_items(s3, 40)
    model = Model()
    run_id = corpus_run(db_url, s3_spec())
    poor = Settings(corpus_buckets=(SOURCE,), export_bucket=EXPORTS, owner_daily_tokens=100)

    outcome = work(db, run_id, model, settings=poor)

    assert (outcome.result, outcome.reason_code) == ("failed", "budget_exhausted")
    assert sum(model.calls.values()) == 0
    assert rows(db_url, "SELECT count(*) AS n FROM effects WHERE run_id = %s", run_id)[0]["n"] == 0


def test_a_partitions_lease_is_renewed_while_its_call_runs(
        db: Database, db_url: str, s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from kairos.execution.corpus import mapping

    put_items(s3, 20)
    run_id = corpus_run(db_url, s3_spec())
    monkeypatch.setattr(mapping, "RENEW_SECONDS", 0.05)
    monkeypatch.setattr(mapping, "PARTITION_LEASE_SECONDS", 600)
    renewed: list[bool] = []
    model = Model()
    answer = model.answer

    def slow(prepared: Any, timeout: float) -> Any:
        # Given the partition's lease as leased, when the call is in flight, then the renewer extends it.
        [leased] = rows(db_url, "SELECT lease_expires_at FROM corpus_partitions WHERE run_id = %s", run_id)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not renewed:
            [now] = rows(db_url, "SELECT lease_expires_at FROM corpus_partitions WHERE run_id = %s", run_id)
            if now["lease_expires_at"] > leased["lease_expires_at"]:
                renewed.append(True)
            time.sleep(0.02)
        return answer(prepared, timeout)

    model.executor.on_send = slow
    assert work(db, run_id, model).result == "succeeded"
    assert renewed == [True]
    with psycopg.connect(db_url, row_factory=dict_row) as conn:  # a stale fence renews nothing
        stale = conn.execute(
            "UPDATE corpus_partitions SET state = 'running', lease_token = gen_random_uuid(), "
            "lease_expires_at = now() WHERE run_id = %s RETURNING lease_token", (run_id,)).fetchone()
        assert stale is not None
        from kairos import db as kdb
        assert kdb.fetch_all(conn, "corpus_partitions_renew", {
            "run_id": run_id, "fence": 1, "tokens": [stale["lease_token"]], "now": None,
            "lease_seconds": 120}) == []  # the run is no longer running under fence 1


def test_a_partition_over_the_agents_input_bound_fails_without_a_call(db: Database, db_url: str, s3: Any) -> None:
    for i in range(4):
        s3.put_object(Bucket=SOURCE, Key=f"alice/docs/{i:05d}.txt", Body=(b"x" * (3_000 if i < 2 else 10)))
    model = Model()
    run = factories.run(db_url, source="manual", agent=json.dumps({"executor": "echo", "max_input_tokens": 1_000}),
                        corpus=json.dumps({"partition_size": 2, "max_items": 10, "formats": ["jsonl"],
                                           "instructions": "Summarise.", **s3_spec()}))

    assert work(db, uuid.UUID(str(run["id"])), model).result == "succeeded"

    assert dict(model.calls) == {(1, 0): 1}  # partition 0 (6,000 characters) was never sent
    states = rows(db_url, "SELECT n, state, error_code FROM corpus_partitions WHERE run_id = %s ORDER BY n", run["id"])
    assert [(p["state"], p["error_code"]) for p in states] == [("failed", "input_too_large"), ("succeeded", None)]


@pytest.mark.parametrize("prefix", ["alice/docs/", "", "bobby/", "bob"])
def test_a_stored_source_outside_its_owners_namespace_fails_the_run_before_any_listing(
        db: Database, db_url: str, s3: Any, prefix: str) -> None:
    # Given alice's objects, and a run of bob's whose stored spec names alice's prefix (written before the
    # rule, or edited in the database), or the whole bucket, or a namespace that only starts like his.
    put_items(s3, 20)
    s3.put_object(Bucket=SOURCE, Key="bobby/x.txt", Body=b"bobby's")
    bob = factories.schedule(db_url, owner="bob")
    run = factories.run(db_url, schedule_row=bob, source="manual", corpus=json.dumps(
        {"partition_size": 20, "max_items": 100, "formats": ["jsonl"], "instructions": "Summarise.",
         "source": {"s3": {"bucket": SOURCE, "prefix": prefix}}}))
    model = Model()

    outcome = work(db, uuid.UUID(str(run["id"])), model)

    # Then the run fails at once, not retry-eligible, with nothing listed, read or sent.
    assert (outcome.result, outcome.reason_code) == ("failed", "corpus_source_refused")
    assert sum(model.calls.values()) == 0
    [ended] = rows(db_url, "SELECT state, diagnosis FROM runs WHERE id = %s", run["id"])
    assert ended["state"] == "failed" and ended["diagnosis"]["reason_code"] == "corpus_source_refused"
    assert ended["diagnosis"]["retry_eligible"] is False
    assert rows(db_url, "SELECT count(*) AS n FROM corpus_items WHERE run_id = %s", run["id"])[0]["n"] == 0


def test_a_source_inside_its_owners_namespace_reads_only_that_namespace(
        db: Database, db_url: str, s3: Any) -> None:
    put_items(s3, 20)  # alice's
    put_items(s3, 3, prefix="bob/docs/")
    bob = factories.schedule(db_url, owner="bob")
    run = factories.run(db_url, schedule_row=bob, source="manual", corpus=json.dumps(
        {"partition_size": 20, "max_items": 100, "formats": ["jsonl"], "instructions": "Summarise.",
         "source": {"s3": {"bucket": SOURCE, "prefix": "bob/"}}}))

    assert work(db, uuid.UUID(str(run["id"])), Model()).result == "succeeded"

    keys = [r["key"] for r in rows(db_url, "SELECT key FROM corpus_items WHERE run_id = %s ORDER BY ordinal",
                                   run["id"])]
    assert keys == [f"bob/docs/{i:05d}.txt" for i in range(3)]


def test_the_export_bucket_is_never_a_corpus_source_even_when_listed(db: Database, db_url: str, s3: Any) -> None:
    from kairos.errors import ValidationFailed
    from kairos.schedules import corpus_spec

    # Given alice's finished export, and an operator who listed the export bucket among the corpus buckets
    run_id = corpus_run(db_url, {"source": {"items": ["a", "b"]}})
    assert work(db, run_id, Model()).result == "succeeded"
    both = Settings(corpus_buckets=(SOURCE, EXPORTS), export_bucket=EXPORTS)
    # When an owner named "exports" (whose namespace is the exports' prefix) maps it
    with pytest.raises(ValidationFailed) as refused:
        corpus_spec.validate({"source": {"s3": {"bucket": EXPORTS}}, "instructions": "x"}, owner="exports",
                      buckets=both.readable_corpus_buckets)
    assert [(f.field, f.rule) for f in refused.value.fields] == [("corpus.source.s3.bucket", "bucket_not_allowed")]
    thief = factories.schedule(db_url, owner="exports")
    stored = factories.run(db_url, schedule_row=thief, source="manual", corpus=json.dumps(
        {"partition_size": 20, "max_items": 100, "formats": ["jsonl"], "instructions": "Summarise.",
         "source": {"s3": {"bucket": EXPORTS, "prefix": "exports/"}}}))
    model = Model()

    outcome = work(db, uuid.UUID(str(stored["id"])), model, settings=both)

    # Then nothing of the bucket is read
    assert (outcome.result, outcome.reason_code) == ("failed", "corpus_source_refused")
    assert sum(model.calls.values()) == 0
