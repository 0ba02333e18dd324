"""Run now, retry and cancel_replace on real PostgreSQL, through the API handler and the tick.

Each names what it shows: a trigger is a ``manual`` occurrence under the current revision that
overlap applies to; a retry is a new run (``retry_of``) of the old run's revision, never a reopened
one, and only of a run that made no external change; ``cancel_replace`` cancels the run it replaces
when that run reserved no mutation, and otherwise blocks the new run (``not_replace_safe``).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from kairos.db import Database
from kairos.tick import Tick
from tests import factories
from tests.support.api import Api
from tests.support.executors import OPENAI_SETTINGS, FakeOpenAI, openai_agent


def rows(url: str, query: str, *args: Any) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        return conn.execute(query, args).fetchall()


def run_row(url: str, run_id: object) -> dict[str, Any]:
    [row] = rows(url, "SELECT * FROM runs WHERE id = %s", run_id)
    return row


def schedule(api: Api, **fields: Any) -> dict[str, Any]:
    conversation = api.conversation()
    answer = api.alice.post("/v1/schedules", {"conversation_id": conversation["id"], "prompt": "report",
                                              "cron": "0 * * * *", **fields})
    assert answer.status == 201, answer.text
    return dict(answer.json["schedule"])


def add_effect(url: str, run_id: object, *, state: str, mutation: bool = True) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO effects (id, run_id, fence, attempt, step, kind, mutation, target, request_digest, state,"
            " settled_at) VALUES (%s, %s, 1, 1, 'call', 'http_call', %s, 'https://t.example/', 'd', %s, %s)",
            (uuid.uuid4(), run_id, mutation, state, None if state == "reserved" else datetime.now(UTC)))


# --- trigger -------------------------------------------------------------------------------------------


def test_a_trigger_is_a_manual_occurrence_of_the_current_revision_handed_to_sqs(api: Api) -> None:
    s = schedule(api)
    assert api.alice.patch(f"/v1/schedules/{s['id']}", {"prompt": "report v2"}).status == 200

    answer = api.alice.post(f"/v1/schedules/{s['id']}/trigger")

    assert answer.status == 202, answer.text
    run = run_row(api.url, answer.json["run_id"])
    [occurrence] = rows(api.url, "SELECT * FROM occurrences WHERE id = %s", answer.json["occurrence_id"])
    assert occurrence["source"] == "manual" and occurrence["schedule_revision"] == 2
    assert occurrence["decision"] == "dispatched"
    assert run["source"] == "manual" and run["prompt"] == "report v2" and run["state"] == "queued"
    assert run["expires_at"] is None  # a run the owner asked for is not dropped for lateness
    assert [m["run_id"] for m in api.messages()] == [answer.json["run_id"]]
    assert run_row(api.url, answer.json["run_id"])["handoff_at"] is not None
    # Triggering again makes another run: a trigger is not deduplicated unless the caller says so.
    again = api.alice.post(f"/v1/schedules/{s['id']}/trigger")
    assert again.status == 202 and again.json["run_id"] != answer.json["run_id"]


def test_a_trigger_with_an_idempotency_key_runs_once(api: Api) -> None:
    s, other = schedule(api), schedule(api)
    key = {"Idempotency-Key": "trigger-1"}
    first = api.alice.post(f"/v1/schedules/{s['id']}/trigger", headers=key)
    replay = api.alice.post(f"/v1/schedules/{s['id']}/trigger", headers=key)
    assert first.status == replay.status == 202 and first.json == replay.json
    assert replay.headers.get("Idempotent-Replayed") == "true"
    assert len(rows(api.url, "SELECT 1 FROM runs WHERE schedule_id = %s", s["id"])) == 1
    elsewhere = api.alice.post(f"/v1/schedules/{other['id']}/trigger", headers=key)
    assert elsewhere.status == 422 and elsewhere.error["code"] == "idempotency_key_reused"
    assert rows(api.url, "SELECT 1 FROM runs WHERE schedule_id = %s", other["id"]) == []


def test_overlap_applies_to_a_trigger(api: Api) -> None:
    skip = schedule(api, overlap="skip")
    first = api.alice.post(f"/v1/schedules/{skip['id']}/trigger")
    refused = api.alice.post(f"/v1/schedules/{skip['id']}/trigger")
    assert refused.status == 409 and refused.error["code"] == "overlap"
    assert first.json["run_id"] in refused.error["message"]
    assert len(rows(api.url, "SELECT 1 FROM occurrences WHERE schedule_id = %s", skip["id"])) == 1

    queue = schedule(api, overlap="queue_one")
    active = api.alice.post(f"/v1/schedules/{queue['id']}/trigger").json["run_id"]
    api.messages()
    behind = api.alice.post(f"/v1/schedules/{queue['id']}/trigger")
    assert behind.status == 202
    waiting = run_row(api.url, behind.json["run_id"])
    assert str(waiting["blocked_by_run_id"]) == active and api.messages() == []  # not sent while blocked
    third = api.alice.post(f"/v1/schedules/{queue['id']}/trigger")
    assert third.status == 409 and behind.json["run_id"] in third.error["message"]


def test_only_an_active_schedule_of_your_own_can_be_triggered(api: Api) -> None:
    s = schedule(api)
    foreign = api.bob.post(f"/v1/schedules/{s['id']}/trigger")
    missing = api.bob.post(f"/v1/schedules/{uuid.uuid4()}/trigger")
    assert foreign.status == missing.status == 404 and foreign.text == missing.text
    assert api.alice.post(f"/v1/schedules/{s['id']}/pause").status == 200
    paused = api.alice.post(f"/v1/schedules/{s['id']}/trigger")
    assert paused.status == 409 and paused.error["fields"][0]["field"] == "status"
    assert rows(api.url, "SELECT 1 FROM runs WHERE schedule_id = %s", s["id"]) == []


# --- retry ---------------------------------------------------------------------------------------------


def test_a_retry_is_a_new_run_of_the_same_revision_and_the_old_one_stays_as_it_ended(api: Api) -> None:
    s = schedule(api)
    sched = rows(api.url, "SELECT * FROM schedules WHERE id = %s", s["id"])[0]
    failed = factories.run(api.url, schedule_row=sched, state="failed", payload={"order": 7})
    assert api.alice.patch(f"/v1/schedules/{s['id']}", {"prompt": "report v2"}).status == 200

    answer = api.alice.post(f"/v1/runs/{failed['id']}/retry")

    assert answer.status == 202, answer.text
    new = run_row(api.url, answer.json["run_id"])
    assert new["retry_of"] == failed["id"] and new["source"] == "manual" and new["state"] == "queued"
    assert new["payload"] == {"order": 7}
    assert new["prompt"] == "report"  # the failed run's revision (1), not the edit's
    assert run_row(api.url, failed["id"])["state"] == "failed"
    [event] = rows(api.url, "SELECT data FROM run_events WHERE run_id = %s", new["id"])
    assert event["data"]["retry_of"] == str(failed["id"])
    # The API shows it on the run, and null on a run no retry made.
    shown = api.alice.get(f"/v1/runs/{new['id']}").json["run"]
    assert shown["retry_of"] == str(failed["id"])
    assert api.alice.get(f"/v1/runs/{failed['id']}").json["run"]["retry_of"] is None
    listed = {r["id"]: r["retry_of"] for r in api.alice.get(f"/v1/runs?schedule_id={s['id']}").json["runs"]}
    assert listed == {str(new["id"]): str(failed["id"]), str(failed["id"]): None}
    # Retrying the same run again answers the run the first retry made.
    again = api.alice.post(f"/v1/runs/{failed['id']}/retry")
    assert again.status == 202 and again.json == answer.json
    assert len(rows(api.url, "SELECT 1 FROM runs WHERE retry_of = %s", failed["id"])) == 1


def test_what_cannot_be_retried_answers_409_and_records_nothing(api: Api) -> None:
    s = schedule(api)
    sched = rows(api.url, "SELECT * FROM schedules WHERE id = %s", s["id"])[0]
    at = iter(datetime(2026, 1, 1, hour, tzinfo=UTC) for hour in range(10))  # one fire instant each
    succeeded = factories.run(api.url, schedule_row=sched, state="succeeded", fire_at=next(at))
    queued = factories.run(api.url, schedule_row=sched, state="queued", fire_at=next(at))
    changed = factories.run(api.url, schedule_row=sched, state="failed", fire_at=next(at))
    add_effect(api.url, changed["id"], state="settled")
    unknown = factories.run(api.url, schedule_row=sched, state="failed", fire_at=next(at))
    add_effect(api.url, unknown["id"], state="ambiguous")
    harmless = factories.run(api.url, schedule_row=sched, state="failed", fire_at=next(at))
    add_effect(api.url, harmless["id"], state="settled", mutation=False)  # a model call changes nothing
    for run in (succeeded, queued, changed, unknown):
        answer = api.alice.post(f"/v1/runs/{run['id']}/retry")
        assert answer.status == 409 and answer.error["code"] == "not_retryable", answer.text
    assert rows(api.url, "SELECT 1 FROM runs WHERE retry_of IS NOT NULL") == []
    assert api.alice.post(f"/v1/runs/{harmless['id']}/retry").status == 202
    foreign = api.bob.post(f"/v1/runs/{harmless['id']}/retry")
    missing = api.bob.post(f"/v1/runs/{uuid.uuid4()}/retry")
    assert foreign.status == missing.status == 404 and foreign.text == missing.text


def test_a_pruned_run_is_not_retried_without_its_payload(api: Api) -> None:
    s = schedule(api)
    sched = rows(api.url, "SELECT * FROM schedules WHERE id = %s", s["id"])[0]
    pruned = factories.run(api.url, schedule_row=sched, state="failed", pruned_at=datetime.now(UTC))
    answer = api.alice.post(f"/v1/runs/{pruned['id']}/retry")
    assert answer.status == 409 and answer.error["code"] == "not_retryable"


# --- cancel_replace ------------------------------------------------------------------------------------


def due(url: str, schedule_id: object) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE schedules SET next_fire_at = now() - interval '5 seconds' WHERE id = %s", (schedule_id,))


def test_cancel_replace_cancels_a_queued_run_and_dispatches_the_new_one(api: Api, db: Database) -> None:
    s = schedule(api, overlap="cancel_replace")
    old = api.alice.post(f"/v1/schedules/{s['id']}/trigger").json["run_id"]
    api.messages()
    due(api.url, s["id"])

    Tick(db, api.sqs, api.queue_url, metrics=None).run()

    [new] = rows(api.url, "SELECT * FROM runs WHERE schedule_id = %s AND source = 'scheduled'", s["id"])
    assert new["state"] == "queued" and [m["run_id"] for m in api.messages()] == [str(new["id"])]
    replaced = run_row(api.url, old)
    assert replaced["state"] == "cancelled" and replaced["diagnosis"]["reason_code"] == "replaced"


def test_a_triggered_cancel_replace_sends_the_new_run_its_cancel_let_in(api: Api) -> None:
    # The cancel of the queued run frees its slot in the same transaction; the slot's release there
    # admits the new run, and the route that cancelled must send it (nobody else will).
    s = schedule(api, overlap="cancel_replace")
    old = api.alice.post(f"/v1/schedules/{s['id']}/trigger").json["run_id"]
    assert [m["run_id"] for m in api.messages()] == [old]
    new = api.alice.post(f"/v1/schedules/{s['id']}/trigger").json["run_id"]
    assert [m["run_id"] for m in api.messages()] == [new]
    assert run_row(api.url, old)["state"] == "cancelled" and run_row(api.url, new)["state"] == "queued"


def test_cancel_replace_asks_a_running_run_without_a_mutation_to_stop(api: Api) -> None:
    s = schedule(api, overlap="cancel_replace")
    sched = rows(api.url, "SELECT * FROM schedules WHERE id = %s", s["id"])[0]
    running = factories.run(api.url, schedule_row=sched, state="running")
    add_effect(api.url, running["id"], state="settled", mutation=False)
    answer = api.alice.post(f"/v1/schedules/{s['id']}/trigger")
    assert answer.status == 202
    assert run_row(api.url, running["id"])["cancel_requested_at"] is not None
    assert run_row(api.url, answer.json["run_id"])["state"] == "queued"


def test_cancel_replace_blocks_the_new_run_when_the_old_one_reserved_a_mutation(api: Api, db: Database) -> None:
    s = schedule(api, overlap="cancel_replace")
    sched = rows(api.url, "SELECT * FROM schedules WHERE id = %s", s["id"])[0]
    running = factories.run(api.url, schedule_row=sched, state="running")
    add_effect(api.url, running["id"], state="reserved")
    due(api.url, s["id"])

    Tick(db, api.sqs, api.queue_url, metrics=None).run()

    [new] = rows(api.url, "SELECT * FROM runs WHERE schedule_id = %s AND id <> %s", s["id"], running["id"])
    assert new["state"] == "policy_blocked" and new["diagnosis"]["reason_code"] == "not_replace_safe"
    assert new["finished_at"] is not None and api.messages() == []
    old = run_row(api.url, running["id"])
    assert old["state"] == "running" and old["cancel_requested_at"] is None
    types = [r["type"] for r in rows(api.url, "SELECT type FROM run_events WHERE run_id = %s ORDER BY seq", new["id"])]
    assert types == ["run.queued", "run.policy_blocked"]


def test_the_overlap_policies_are_the_schedule_fields_and_the_json(api: Api) -> None:
    s = schedule(api, overlap="cancel_replace")
    assert s["overlap"] == "cancel_replace"
    bad = api.alice.post("/v1/schedules", {"conversation_id": s["conversation_id"], "prompt": "p",
                                           "cron": "0 * * * *", "overlap": "replace"})
    assert bad.status == 422 and bad.error["fields"][0]["field"] == "overlap"
    assert rows(api.url, "SELECT overlap FROM schedules WHERE id = %s", s["id"]) == [{"overlap": "cancel_replace"}]


# --- retry of a chat turn ------------------------------------------------------------------------------


def test_a_failed_chat_turn_retries_into_the_same_conversation(api: Api, db: Database) -> None:
    from kairos.execution.execute import process
    from kairos.settings import Settings

    conversation = api.conversation()
    posted = api.alice.post(f"/v1/conversations/{conversation['id']}/messages", {"content": "What is new?"})
    assert posted.status == 202, posted.text
    api.messages()
    turn = posted.json["run_id"]
    with psycopg.connect(api.url, autocommit=True) as conn:  # the turn failed (its endpoint broke)
        conn.execute("""UPDATE runs SET state = 'failed', finished_at = now(), diagnosis = %s WHERE id = %s""",
                     ('{"summary": "x", "scope": "target", "reason_code": "peer_error", "retry_eligible": true, '
                      '"recovery_actions": ["retry_run"]}', turn))

    answer = api.alice.post(f"/v1/runs/{turn}/retry")

    assert answer.status == 202, answer.text
    new = run_row(api.url, answer.json["run_id"])
    assert (new["source"], new["schedule_id"], new["retry_of"], new["state"]) == ("chat", None, uuid.UUID(turn),
                                                                                  "queued")
    assert new["source_conversation_id"] == uuid.UUID(conversation["id"]) and new["prompt"] == "What is new?"
    assert [m["run_id"] for m in api.messages()] == [str(new["id"])]
    assert process(db, new["id"], settings=Settings()).result == "succeeded"
    entries = api.alice.get(f"/v1/conversations/{conversation['id']}").json["conversation"]["entries"]
    assert (entries[-1]["role"], entries[-2]["content"]) == ("assistant", "What is new?")
    # Idempotent per run; another owner's turn is the same 404 as a missing one.
    again = api.alice.post(f"/v1/runs/{turn}/retry")
    assert again.status == 202 and again.json == answer.json and api.messages() == []
    foreign = api.bob.post(f"/v1/runs/{turn}/retry")
    missing = api.bob.post(f"/v1/runs/{uuid.uuid4()}/retry")
    assert foreign.status == missing.status == 404 and foreign.text == missing.text
    # The retry is a finished turn now: a succeeded run is not retryable.
    assert api.alice.post(f"/v1/runs/{new['id']}/retry").error["code"] == "not_retryable"


def test_a_chat_turn_retry_waits_behind_the_conversations_unfinished_turn(api: Api) -> None:
    conversation = api.conversation()
    first = api.alice.post(f"/v1/conversations/{conversation['id']}/messages", {"content": "one"}).json["run_id"]
    with psycopg.connect(api.url, autocommit=True) as conn:
        conn.execute("UPDATE runs SET state = 'cancelled', finished_at = now() WHERE id = %s", (first,))
    second = api.alice.post(f"/v1/conversations/{conversation['id']}/messages", {"content": "two"}).json["run_id"]
    api.messages()

    answer = api.alice.post(f"/v1/runs/{first}/retry")

    assert answer.status == 202, answer.text
    new = run_row(api.url, answer.json["run_id"])
    assert new["blocked_by_run_id"] == uuid.UUID(second) and new["prompt"] == "one"
    assert api.messages() == []  # sent when the turn before it ends


def test_a_retried_chat_turn_asks_its_message_once_and_the_transcript_holds_it_once(
        api: Api, db: Database, fake_openai: FakeOpenAI) -> None:
    from kairos.execution.execute import process

    # Given a conversation with an earlier exchange, and a turn whose model call failed
    created = api.alice.post("/v1/conversations", {"agent": openai_agent(fake_openai)})
    assert created.status == 201, created.text
    conversation = created.json["conversation"]["id"]
    first = api.alice.post(f"/v1/conversations/{conversation}/messages", {"content": "Hello"}).json["run_id"]
    assert process(db, uuid.UUID(first), settings=OPENAI_SETTINGS).result == "succeeded"
    turn = api.alice.post(f"/v1/conversations/{conversation}/messages", {"content": "What is new?"}).json["run_id"]
    fake_openai.statuses = [400]
    failed = process(db, uuid.UUID(turn), settings=OPENAI_SETTINGS)
    assert failed.result == "failed", failed
    assert run_row(api.url, turn)["state"] == "failed"

    # When it is retried (twice: the first retry fails too)
    retry = api.alice.post(f"/v1/runs/{turn}/retry")
    assert retry.status == 202, retry.text
    fake_openai.statuses = [400]
    assert process(db, uuid.UUID(retry.json["run_id"]), settings=OPENAI_SETTINGS).result == "failed"
    again = api.alice.post(f"/v1/runs/{retry.json['run_id']}/retry")
    assert again.status == 202, again.text
    assert process(db, uuid.UUID(again.json["run_id"]), settings=OPENAI_SETTINGS).result == "succeeded"

    # Then each retry's model call carried the message once, as its last user message, after the history
    for body in fake_openai.bodies()[2:]:
        users = [m["content"] for m in body["messages"] if m["role"] == "user"]
        assert users == ["Hello", "What is new?"], body["messages"]
    assert len(fake_openai.requests) == 4
    # and the transcript holds it once (the first turn's entry), answered by the last retry
    entries = api.alice.get(f"/v1/conversations/{conversation}").json["conversation"]["entries"]
    assert [(e["role"], e["content"]) for e in entries] == [
        ("user", "Hello"), ("assistant", "Good morning from the fake model."),
        ("user", "What is new?"), ("assistant", "Good morning from the fake model.")]
