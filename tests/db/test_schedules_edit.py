"""Editing a schedule (PATCH) on real PostgreSQL: revisions kept, If-Match, the same validation as a
create, and the rule that a run executes the revision its occurrence recorded."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row

from kairos.db import Database
from kairos.execution.execute import process
from kairos.settings import Settings
from kairos.tick import Tick
from tests.support.api import Api
from tests.support.executors import ScriptedExecutor


def rows(url: str, query: str, *args: Any) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        return conn.execute(query, args).fetchall()


def hourly(api: Api, **fields: Any) -> dict[str, Any]:
    conversation = api.conversation()
    answer = api.alice.post("/v1/schedules", {"conversation_id": conversation["id"], "prompt": "first prompt",
                                              "cron": "0 * * * *", **fields})
    assert answer.status == 201, answer.text
    return dict(answer.json["schedule"])


def test_an_edit_is_a_new_revision_and_every_revision_is_kept(api: Api) -> None:
    schedule = hourly(api, name="n1")
    read = api.alice.get(f"/v1/schedules/{schedule['id']}")
    assert read.headers["ETag"] == '"1"'

    answer = api.alice.patch(f"/v1/schedules/{schedule['id']}", {"prompt": "second prompt", "cron": "30 7 * * *",
                                                                "timezone": "Europe/Berlin"},
                             headers={"If-Match": read.headers["ETag"]})

    assert answer.status == 200, answer.text
    edited = answer.json["schedule"]
    assert edited["revision"] == 2 and answer.headers["ETag"] == '"2"'
    assert edited["prompt"] == "second prompt" and edited["cron"] == "30 7 * * *" and edited["name"] == "n1"
    # The next fire is recomputed from now with the new rule: 07:30 in Berlin.
    next_fire = datetime.fromisoformat(edited["next_fire_at"]).astimezone(UTC)
    assert next_fire.minute == 30 and next_fire.hour in (5, 6)
    revisions = rows(api.url, "SELECT revision, definition, valid_from FROM schedule_revisions "
                              "WHERE schedule_id = %s ORDER BY revision", schedule["id"])
    assert [r["revision"] for r in revisions] == [1, 2]
    assert revisions[0]["definition"]["prompt"] == "first prompt"
    assert revisions[1]["definition"]["prompt"] == "second prompt"
    assert revisions[1]["definition"]["timezone"] == "Europe/Berlin"
    assert revisions[0]["valid_from"] < revisions[1]["valid_from"]
    assert "token_hash" not in revisions[1]["definition"] and "owner" not in revisions[1]["definition"]


def test_a_stale_if_match_answers_412_and_changes_nothing(api: Api) -> None:
    schedule = hourly(api)
    assert api.alice.patch(f"/v1/schedules/{schedule['id']}", {"name": "a"}).status == 200  # revision 2

    stale = api.alice.patch(f"/v1/schedules/{schedule['id']}", {"name": "b"}, headers={"If-Match": '"1"'})

    assert stale.status == 412, stale.text
    assert stale.error["code"] == "precondition_failed"
    assert stale.error["fields"][0]["field"] == "If-Match"
    current = api.alice.get(f"/v1/schedules/{schedule['id']}").json["schedule"]
    assert current["name"] == "a" and current["revision"] == 2
    malformed = api.alice.patch(f"/v1/schedules/{schedule['id']}", {"name": "b"}, headers={"If-Match": "two"})
    assert malformed.status == 422 and malformed.error["fields"][0] == {
        "field": "If-Match", "rule": "revision", "message": malformed.error["fields"][0]["message"]}
    assert api.alice.patch(f"/v1/schedules/{schedule['id']}", {"name": "c"}, headers={"If-Match": "*"}).status == 200


def test_an_edit_is_checked_like_a_create_and_a_refused_one_changes_nothing(api: Api) -> None:
    schedule = hourly(api)
    path = f"/v1/schedules/{schedule['id']}"
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"cron": "61 * * * *"}, "cron", "cron_syntax"),
        ({"cron": "* * * * *"}, "cron", "min_interval"),
        ({"colour": "red"}, "colour", "unknown_field"),
        ({"conversation_id": api.conversation()["id"]}, "conversation_id", "immutable"),
        ({"kind": "webhook", "cron": None}, "kind", "immutable"),
        ({"max_delay_seconds": 5}, "max_delay_seconds", "min"),
        ({"timezone": "Mars/Olympus"}, "timezone", "known_zone"),
    ]
    for patch, field, rule in cases:
        answer = api.alice.patch(path, patch)
        assert answer.status == 422, (patch, answer.text)
        assert (field, rule) in {(f["field"], f["rule"]) for f in answer.error["fields"]}, (patch, answer.text)
    assert rows(api.url, "SELECT revision FROM schedules WHERE id = %s", schedule["id"]) == [{"revision": 1}]
    assert len(rows(api.url, "SELECT 1 FROM schedule_revisions WHERE schedule_id = %s", schedule["id"])) == 1
    not_object = api.alice.patch(path, [1, 2])
    assert not_object.status == 422 and not_object.error["fields"][0]["field"] == "body"


def test_null_resets_a_field_to_its_default_and_kind_can_change_between_timed_kinds(api: Api) -> None:
    schedule = hourly(api, name="named", overlap="skip")
    answer = api.alice.patch(f"/v1/schedules/{schedule['id']}", {
        "name": None, "overlap": None, "kind": "interval", "cron": None, "interval_seconds": 3600})
    assert answer.status == 200, answer.text
    edited = answer.json["schedule"]
    assert edited["name"] == "" and edited["overlap"] == "allow"
    assert edited["kind"] == "interval" and edited["cron"] is None and edited["interval_seconds"] == 3600


def test_another_owners_schedule_is_the_same_404_as_a_missing_one(api: Api) -> None:
    schedule = hourly(api)
    foreign = api.bob.patch(f"/v1/schedules/{schedule['id']}", {"name": "mine"})
    missing = api.bob.patch("/v1/schedules/00000000-0000-4000-8000-000000000000", {"name": "mine"})
    assert foreign.status == missing.status == 404 and foreign.text == missing.text
    assert api.alice.get(f"/v1/schedules/{schedule['id']}").json["schedule"]["name"] == ""


def test_a_cancelled_schedule_cannot_be_edited_and_a_paused_one_stays_paused(api: Api) -> None:
    paused = hourly(api)
    assert api.alice.post(f"/v1/schedules/{paused['id']}/pause").status == 200
    answer = api.alice.patch(f"/v1/schedules/{paused['id']}", {"prompt": "later"})
    assert answer.status == 200 and answer.json["schedule"]["status"] == "paused"
    cancelled = hourly(api)
    assert api.alice.delete(f"/v1/schedules/{cancelled['id']}").status == 200
    refused = api.alice.patch(f"/v1/schedules/{cancelled['id']}", {"prompt": "later"})
    assert refused.status == 409, refused.text


def test_max_occurrences_cannot_drop_to_the_fires_already_made(api: Api) -> None:
    schedule = hourly(api)
    with psycopg.connect(api.url, autocommit=True) as conn:
        conn.execute("UPDATE schedules SET fire_count = 3 WHERE id = %s", (schedule["id"],))
    answer = api.alice.patch(f"/v1/schedules/{schedule['id']}", {"max_occurrences": 3})
    assert answer.status == 422 and answer.error["fields"][0]["rule"] == "above_fire_count"
    assert api.alice.patch(f"/v1/schedules/{schedule['id']}", {"max_occurrences": 4}).status == 200


def test_a_run_fired_before_an_edit_executes_the_revision_it_fired_under(api: Api, db: Database) -> None:
    schedule = hourly(api, mode="fresh", agent={"executor": "echo", "model": "before"})
    with psycopg.connect(api.url, autocommit=True) as conn:
        conn.execute("UPDATE schedules SET next_fire_at = now() - interval '5 seconds' WHERE id = %s",
                     (schedule["id"],))
    # The tick fires under revision 1 ...
    Tick(db, api.sqs, api.queue_url, metrics=None).run()
    [run] = rows(api.url, "SELECT r.id, o.schedule_revision FROM runs r JOIN occurrences o ON o.id = r.occurrence_id "
                          "WHERE r.schedule_id = %s", schedule["id"])
    assert run["schedule_revision"] == 1
    # ... the owner edits prompt and agent before any worker claims the run ...
    edited = api.alice.patch(f"/v1/schedules/{schedule['id']}", {
        "prompt": "second prompt", "agent": {"executor": "echo", "model": "after"}})
    assert edited.status == 200 and edited.json["schedule"]["revision"] == 2
    # ... and the claimed run executes revision 1's prompt and agent.
    executor = ScriptedExecutor()
    outcome = process(db, run["id"], settings=Settings(), executor_factory=executor.factory)
    assert outcome.result == "succeeded"
    [request] = executor.requests
    assert request.prompt == "first prompt" and request.agent["model"] == "before"

    # The next fire executes revision 2.
    with psycopg.connect(api.url, autocommit=True) as conn:
        conn.execute("UPDATE schedules SET next_fire_at = now() - interval '1 second' WHERE id = %s",
                     (schedule["id"],))
    Tick(db, api.sqs, api.queue_url, metrics=None).run(now=datetime.now(UTC) + timedelta(seconds=1))
    [second] = rows(api.url, "SELECT r.id, r.prompt, o.schedule_revision FROM runs r "
                             "JOIN occurrences o ON o.id = r.occurrence_id WHERE r.schedule_id = %s AND r.id <> %s",
                    schedule["id"], run["id"])
    assert second["schedule_revision"] == 2 and second["prompt"] == "second prompt"


def test_every_writer_that_bumps_the_revision_records_it(api: Api) -> None:
    schedule = hourly(api)
    path = f"/v1/schedules/{schedule['id']}"
    assert api.alice.post(f"{path}/pause").status == 200
    assert api.alice.post(f"{path}/resume").status == 200
    assert api.alice.patch(path, {"name": "x"}).status == 200
    assert api.alice.delete(path).status == 200
    recorded = rows(api.url, "SELECT s.revision AS current, array_agg(r.revision ORDER BY r.revision) AS kept "
                             "FROM schedules s JOIN schedule_revisions r ON r.schedule_id = s.id "
                             "WHERE s.id = %s GROUP BY s.revision", schedule["id"])
    assert recorded == [{"current": 5, "kept": [1, 2, 3, 4, 5]}]
    with psycopg.connect(api.url, autocommit=True) as conn:
        try:
            conn.execute("UPDATE schedule_revisions SET definition = '{}' WHERE schedule_id = %s", (schedule["id"],))
        except psycopg.errors.RestrictViolation:
            pass
        else:
            raise AssertionError("a revision was rewritten")
