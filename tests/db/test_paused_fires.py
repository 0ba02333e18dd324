"""Fires while paused, on real PostgreSQL through the API handler: a pause carries an optional reason,
shown with the schedule; at resume the fires that fell in the pause are recorded as one
``skipped_paused`` occurrence with the covered range and count (none when no fire fell in it)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from tests.support.api import Api


def rows(url: str, query: str, *args: Any) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        return conn.execute(query, args).fetchall()


def yearly(api: Api) -> dict[str, Any]:
    """A schedule that fires at 00:00 UTC on every 1 January."""
    conversation = api.conversation()
    created = api.alice.post("/v1/schedules", {"conversation_id": conversation["id"], "prompt": "new year",
                                               "cron": "0 0 1 1 *", "timezone": "UTC"})
    assert created.status == 201, created.text
    return dict(created.json["schedule"])


def skipped_paused(api: Api, schedule_id: str) -> list[dict[str, Any]]:
    listed = api.alice.get(f"/v1/schedules/{schedule_id}/occurrences").json["occurrences"]
    return [o for o in listed if o["decision"] == "skipped_paused"]


def test_a_resume_records_the_fires_that_fell_in_the_pause_once(api: Api) -> None:
    schedule = yearly(api)
    sid = schedule["id"]

    # Given a schedule paused with a reason, its pause begun in mid-2020 (as if paused then)
    paused = api.alice.post(f"/v1/schedules/{sid}/pause", {"reason": "vendor outage, see ticket 42"})
    assert paused.status == 200, paused.text
    assert paused.json["schedule"]["paused_reason"] == "vendor outage, see ticket 42"
    assert paused.json["schedule"]["paused_at"] is not None
    shown = api.alice.get(f"/v1/schedules/{sid}").json["schedule"]
    assert (shown["status"], shown["paused_reason"]) == ("paused", "vendor outage, see ticket 42")
    with psycopg.connect(api.url, autocommit=True) as conn:
        conn.execute("UPDATE schedules SET paused_at = '2020-06-01T00:00:00Z' WHERE id = %s", (sid,))

    # When it is resumed
    resumed = api.alice.post(f"/v1/schedules/{sid}/resume")

    # Then one skipped_paused occurrence covers every 1 January since, with no run, and the reason is gone
    assert resumed.status == 200, resumed.text
    assert (resumed.json["schedule"]["paused_reason"], resumed.json["schedule"]["paused_at"]) == (None, None)
    year = datetime.now(UTC).year
    [occurrence] = skipped_paused(api, sid)
    assert occurrence["covers_from"] == "2021-01-01T00:00:00Z"
    assert occurrence["covers_until"] == f"{year}-01-01T00:00:00Z"
    assert occurrence["covers_count"] == year - 2020
    assert (occurrence["source"], occurrence["run_id"]) == ("scheduled", None)
    assert rows(api.url, "SELECT 1 FROM runs WHERE schedule_id = %s", sid) == []

    # and the pause is state, not definition: no revision records it
    kept = rows(api.url, "SELECT definition ? 'paused_at' OR definition ? 'paused_reason' AS has "
                         "FROM schedule_revisions WHERE schedule_id = %s", sid)
    assert len(kept) == 3 and not any(r["has"] for r in kept)

    # And a pause in which no fire falls records nothing
    assert api.alice.post(f"/v1/schedules/{sid}/pause").status == 200
    assert api.alice.get(f"/v1/schedules/{sid}").json["schedule"]["paused_reason"] is None
    assert api.alice.post(f"/v1/schedules/{sid}/resume").status == 200
    assert len(skipped_paused(api, sid)) == 1


def test_a_pause_reason_is_bounded(api: Api) -> None:
    sid = yearly(api)["id"]
    long = api.alice.post(f"/v1/schedules/{sid}/pause", {"reason": "x" * 501})
    assert long.status == 422, long.text
    assert long.json["error"]["fields"][0]["field"] == "reason"
    assert api.alice.post(f"/v1/schedules/{sid}/pause", {"why": "x"}).status == 422
    assert api.alice.get(f"/v1/schedules/{sid}").json["schedule"]["status"] == "active"
    assert api.alice.post(f"/v1/schedules/{sid}/pause", {"reason": "x" * 500}).status == 200


def test_the_cli_pauses_with_a_reason(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    from kairos import cli

    sid = yearly(api)["id"]
    assert cli.main(["schedules", "pause", sid, "--reason", "quiet week", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["paused_reason"] == "quiet week"
    assert cli.main(["schedules", "pause", sid, "--reason", "y" * 501]) == 1
