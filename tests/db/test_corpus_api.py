"""Corpus runs through the API: ``corpus`` validated on schedules and chat turns (field + rule, nothing
written), a chat turn's corpus run executed, its progress and records read in keyset pages, pause and
resume, and another owner's run answering the same 404 as a missing one."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from kairos.db import Database
from kairos.execution.execute import process
from kairos.settings import Settings
from tests import factories
from tests.support.api import Api
from tests.support.corpus import EXPORTS, SOURCE, Model, rows
from tests.support.corpus import corpus_env as corpus_env
from tests.support.corpus import s3 as s3


def turn(api: Api, corpus: Any, content: str = "summarise these") -> Any:
    conversation = api.conversation()
    return api.alice.post(f"/v1/conversations/{conversation['id']}/messages", {"content": content, "corpus": corpus})


def test_corpus_is_validated_with_field_and_rule_and_writes_nothing(api: Api, corpus_env: Any) -> None:
    conversation = api.conversation()
    cases = [
        ({"source": {"s3": {"bucket": "someone-elses"}}, "instructions": "x"}, "corpus.source.s3.bucket",
         "bucket_not_allowed"),
        ({"source": {"s3": {"bucket": SOURCE}, "items": ["a"]}, "instructions": "x"}, "corpus.source", "one_source"),
        ({"source": {"items": ["a"]}, "instructions": "x", "partition_size": 101}, "corpus.partition_size", "max"),
        ({"source": {"items": ["a"]}, "instructions": "x", "max_items": 10_001}, "corpus.max_items", "max"),
        ({"source": {"items": ["a"]}, "instructions": "x", "formats": ["csv"]}, "corpus.formats.0", "enum"),
        ({"source": {"items": ["a"]}}, "corpus.instructions", "required"),
    ]
    for corpus, field, rule in cases:
        answer = api.alice.post(f"/v1/conversations/{conversation['id']}/messages", {"content": "go", "corpus": corpus})
        assert answer.status == 422, answer.text
        assert {"field": field, "rule": rule} in [{k: f[k] for k in ("field", "rule")}
                                                  for f in answer.json["error"]["fields"]], answer.text
        created = api.alice.post("/v1/schedules", {"conversation_id": conversation["id"], "prompt": "p",
                                                   "cron": "0 7 * * *", "corpus": corpus})
        assert created.status == 422 and created.json["error"]["fields"][0]["field"] == field, created.text
    assert rows(api.url, "SELECT count(*) AS n FROM runs")[0]["n"] == 0
    assert rows(api.url, "SELECT count(*) AS n FROM schedules")[0]["n"] == 0


def test_a_corpus_prefix_outside_the_owners_namespace_is_refused_at_create_patch_and_turn(
        api: Api, corpus_env: Any) -> None:
    # Given bob, who wants to read alice's objects (or the whole bucket, or a look-alike namespace).
    conversation = api.conversation("bob")
    for prefix in ("alice/", "alice/docs/", "", "bo", "bobby/", "/bob/"):
        corpus = {"source": {"s3": {"bucket": SOURCE, "prefix": prefix}}, "instructions": "Summarise."}
        turned = api.bob.post(f"/v1/conversations/{conversation['id']}/messages", {"content": "go", "corpus": corpus})
        created = api.bob.post("/v1/schedules", {"conversation_id": conversation["id"], "prompt": "p",
                                                 "cron": "0 7 * * *", "corpus": corpus})
        for answer in (turned, created):
            assert answer.status == 422, (prefix, answer.text)
            [problem] = answer.json["error"]["fields"]
            assert (problem["field"], problem["rule"]) == ("corpus.source.s3.prefix", "prefix_not_owned")
            assert "bob/" in problem["message"]
    assert rows(api.url, "SELECT count(*) AS n FROM runs")[0]["n"] == 0
    assert rows(api.url, "SELECT count(*) AS n FROM schedules")[0]["n"] == 0

    # His own namespace is his: given, or by default.
    mine = api.bob.post("/v1/schedules", {"conversation_id": conversation["id"], "prompt": "p", "cron": "0 7 * * *",
                                          "corpus": {"source": {"s3": {"bucket": SOURCE}}, "instructions": "S."}})
    assert mine.status == 201, mine.text
    schedule_id = mine.json["schedule"]["id"]
    [revision] = rows(api.url, "SELECT definition FROM schedule_revisions WHERE schedule_id = %s", schedule_id)
    assert revision["definition"]["corpus"]["source"] == {"s3": {"bucket": SOURCE, "prefix": "bob/"}}
    moved = api.bob.patch(f"/v1/schedules/{schedule_id}", {
        "corpus": {"source": {"s3": {"bucket": SOURCE, "prefix": "alice/docs/"}}, "instructions": "S."}})
    assert moved.status == 422 and [(f["field"], f["rule"]) for f in moved.json["error"]["fields"]] == [
        ("corpus.source.s3.prefix", "prefix_not_owned")], moved.text
    deeper = api.bob.patch(f"/v1/schedules/{schedule_id}", {
        "corpus": {"source": {"s3": {"bucket": SOURCE, "prefix": "bob/reports/2026-"}}, "instructions": "S."}})
    assert deeper.status == 200, deeper.text


def test_an_owner_that_is_not_a_plain_segment_has_the_hashed_namespace_of_its_secrets() -> None:
    from kairos import secrets
    from kairos.errors import ValidationFailed
    from kairos.schedules import corpus_spec

    owner = "auth0|alice/.."
    mine = corpus_spec.namespace(owner)
    assert mine.startswith("=") and mine.endswith("/") and mine.count("/") == 1
    assert secrets.namespace(owner, secrets.Policy()) == f"kairos/{mine}"
    checked = corpus_spec.validate({"source": {"s3": {"bucket": SOURCE}}, "instructions": "x"},
                                   buckets=[SOURCE], owner=owner)
    assert checked["source"]["s3"]["prefix"] == mine
    with pytest.raises(ValidationFailed) as refused:
        corpus_spec.validate({"source": {"s3": {"bucket": SOURCE, "prefix": "auth0|alice/"}}, "instructions": "x"},
                      buckets=[SOURCE], owner=owner)
    assert [(f.field, f.rule) for f in refused.value.fields] == [("corpus.source.s3.prefix", "prefix_not_owned")]


def test_a_schedule_carries_its_corpus_into_its_revision(api: Api, corpus_env: Any) -> None:
    conversation = api.conversation()
    corpus = {"source": {"s3": {"bucket": SOURCE, "prefix": "alice/docs/"}}, "instructions": "Summarise."}
    created = api.alice.post("/v1/schedules", {"conversation_id": conversation["id"], "prompt": "nightly",
                                               "cron": "0 2 * * *", "corpus": corpus})
    assert created.status == 201, created.text
    [revision] = rows(api.url, "SELECT definition FROM schedule_revisions WHERE schedule_id = %s",
                      created.json["schedule"]["id"])
    assert revision["definition"]["corpus"]["partition_size"] == 20
    assert revision["definition"]["corpus"]["source"] == corpus["source"]
    schedule_id = created.json["schedule"]["id"]
    refused = api.alice.patch(f"/v1/schedules/{schedule_id}", {
        "corpus": {"source": {"s3": {"bucket": "someone-elses"}}, "instructions": "x"}})
    assert refused.status == 422 and refused.json["error"]["fields"][0]["rule"] == "bucket_not_allowed"
    renamed = api.alice.patch(f"/v1/schedules/{schedule_id}", {"name": "renamed"})
    assert renamed.status == 200, renamed.text
    latest = rows(api.url, "SELECT definition FROM schedule_revisions WHERE schedule_id = %s ORDER BY revision DESC "
                           "LIMIT 1", schedule_id)[0]["definition"]
    assert latest["corpus"]["source"] == corpus["source"]  # an edit keeps the corpus it does not name


def test_a_chat_turn_runs_a_corpus_and_the_api_shows_progress_and_records(
        api: Api, db: Database, corpus_env: Any) -> None:
    items = [f"note {i}" for i in range(30)]
    answer = turn(api, {"source": {"items": items}, "instructions": "Extract.", "partition_size": 10})
    assert answer.status == 202, answer.text
    run_id = uuid.UUID(answer.json["run_id"])
    settings = Settings(corpus_buckets=(SOURCE,), export_bucket=EXPORTS)

    assert process(db, run_id, settings=settings, executor_factory=Model().executor.factory).result == "succeeded"

    progress = api.alice.get(f"/v1/runs/{run_id}/corpus")
    assert progress.status == 200, progress.text
    corpus = progress.json["corpus"]
    assert corpus["phase"] == "complete"
    assert corpus["coverage"] == {"partitions_total": 3, "succeeded": 3, "failed": 0, "items_total": 30,
                                  "items_covered": 30}
    assert corpus["partitions"] == {"pending": 0, "running": 0, "succeeded": 3, "failed": 0}
    [handle] = corpus["exports"]
    assert handle["key"] == f"exports/alice/{run_id}/records.jsonl" and handle["bucket"] == EXPORTS
    output = api.alice.get(f"/v1/runs/{run_id}/output").json["output"]
    assert output["state"] == "available" and output["corpus"]["exports"] == corpus["exports"]
    thread = api.alice.get(f"/v1/conversations/{output['conversation_id']}").json["conversation"]["entries"]
    assert thread[-1]["role"] == "assistant" and thread[-1]["content"].startswith("Corpus run complete: 3 of 3")

    seen: list[tuple[str, str]] = []
    after = None
    while True:
        page = api.alice.get(f"/v1/runs/{run_id}/corpus/records?limit=7" + (f"&after={after}" if after else ""))
        assert page.status == 200, page.text
        seen += [(r["kind"], r["id"]) for r in page.json["records"]]
        after = page.json["next_after"]
        if after is None:
            break
    assert seen == sorted(seen) and len(seen) == 30 + 7 and len(set(seen)) == len(seen)
    assert api.alice.get(f"/v1/runs/{run_id}/corpus/records?after=garbage").status == 422

    missing = api.bob.get(f"/v1/runs/{uuid.uuid4()}/corpus")
    foreign = api.bob.get(f"/v1/runs/{run_id}/corpus")
    assert missing.status == foreign.status == 404 and missing.text == foreign.text
    assert api.bob.get(f"/v1/runs/{run_id}/corpus/records").text == missing.text
    assert api.bob.post(f"/v1/runs/{run_id}/pause").text == api.bob.post(f"/v1/runs/{uuid.uuid4()}/pause").text
    finished = api.alice.post(f"/v1/runs/{run_id}/pause")
    assert finished.status == 409 and finished.json["error"]["code"] == "not_corpus_run"


def test_retention_deletes_an_old_corpus_runs_records_and_keeps_its_coverage_and_exports(
        api: Api, db: Database, corpus_env: Any) -> None:
    from kairos.tick.prune import Prune

    answer = turn(api, {"source": {"items": [f"note {i}" for i in range(12)]}, "instructions": "Extract.",
                        "partition_size": 6})
    run_id = uuid.UUID(answer.json["run_id"])
    settings = Settings(corpus_buckets=(SOURCE,), export_bucket=EXPORTS)
    assert process(db, run_id, settings=settings, executor_factory=Model().executor.factory).result == "succeeded"
    progress = api.alice.get(f"/v1/runs/{run_id}/corpus").json
    output = api.alice.get(f"/v1/runs/{run_id}/output").json
    listed = api.alice.get(f"/v1/runs/{run_id}/corpus/records?limit=200").json["records"]
    counts = [rows(api.url, f"SELECT count(*) AS n FROM {table} WHERE run_id = %s", run_id)[0]["n"]
              for table in ("corpus_outputs", "corpus_records")]
    assert listed and all(counts)
    factories.ended_ago(api.url, run_id)

    report = Prune(db).run_once()

    assert (report.runs, report.corpus_rows) == (1, sum(counts))
    for table in ("corpus_outputs", "corpus_records"):
        assert rows(api.url, f"SELECT count(*) AS n FROM {table} WHERE run_id = %s", run_id)[0]["n"] == 0
    page = api.alice.get(f"/v1/runs/{run_id}/corpus/records")
    assert page.status == 200, page.text
    assert (page.json["records"], page.json["next_after"]) == ([], None) and page.json["pruned_at"]
    # Coverage, partitions and the export handles are metadata: they stay, as does the output's reference.
    assert api.alice.get(f"/v1/runs/{run_id}/corpus").json == progress
    assert api.alice.get(f"/v1/runs/{run_id}/output").json == output


def test_pause_and_resume_a_queued_corpus_run_through_the_api(api: Api, corpus_env: Any) -> None:
    answer = turn(api, {"source": {"items": ["a", "b"]}, "instructions": "Extract."})
    run_id = answer.json["run_id"]
    api.messages()
    assert api.alice.post(f"/v1/runs/{run_id}/resume").json["error"]["code"] == "not_paused"

    paused = api.alice.post(f"/v1/runs/{run_id}/pause")
    assert paused.status == 202 and paused.json["run"]["paused"] is True and paused.json["run"]["state"] == "queued"
    resumed = api.alice.post(f"/v1/runs/{run_id}/resume")
    assert resumed.status == 202 and resumed.json["run"]["paused"] is False
    assert [m["run_id"] for m in api.messages()] == [run_id]  # sent again on resume

    plain = api.alice.post(f"/v1/conversations/{api.conversation()['id']}/messages", {"content": "hi"})
    refused = api.alice.post(f"/v1/runs/{plain.json['run_id']}/pause")
    assert refused.status == 409 and refused.json["error"]["code"] == "not_corpus_run"
