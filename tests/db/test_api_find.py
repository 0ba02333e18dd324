"""Finding work that already exists (docs/api.md "Steering runs"), through the API handler on real PostgreSQL.

``GET /v1/runs`` (filters, keyset pages), ``last_run`` on every schedule, ``GET /v1/schedules/{id}/occurrences``
and ``GET /v1/conversations``. The paging tests are built to defeat the two usual mistakes: runs are
inserted between page fetches (OFFSET pages would repeat rows) and many rows share one instant across
page boundaries (a cursor of the instant alone would skip or repeat them). Rows get their instants from
the library's own ``now`` injection (``occurrences.record``: the tick's and the webhook's insert path).
"""

from __future__ import annotations

import base64
import itertools
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import pytest

from kairos import occurrences, pages
from kairos.calendar import Fire
from kairos.db import Database
from kairos.execution.execute import process
from kairos.settings import Settings
from kairos.states import Decision, Source
from tests import factories
from tests.support.api import Api, ApiClient, rows
from tests.support.executors import ScriptedExecutor

T = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
_fires = itertools.count()


def _schedule(api: Api, who: str = "alice", conversation_id: str | None = None, **fields: Any) -> dict[str, Any]:
    client = ApiClient(who)
    conversation_id = conversation_id or api.conversation(who)["id"]
    answer = client.post("/v1/schedules", {"conversation_id": conversation_id, "prompt": "brief me",
                                           "cron": "0 7 * * *", **fields})
    assert answer.status == 201, answer.text
    return dict(answer.json["schedule"])


def _record(db: Database, schedule_id: str, *, now: datetime | None, fire_at: datetime | None = None,
            source: Source = Source.SCHEDULED, decision: Decision = Decision.DISPATCHED,
            run: bool = True, covers: tuple[datetime, datetime, int] | None = None) -> dict[str, Any]:
    """One fire recorded the way the tick and the webhook record theirs, its rows stamped ``now``."""
    fire_at = fire_at or T - timedelta(days=1, minutes=next(_fires))
    fire = Fire(fire_at, (fire_at + timedelta(hours=1)).replace(tzinfo=None), timedelta(hours=1), 0,
                "Europe/Berlin", "test")
    key = str(uuid.uuid4()) if source in (Source.MANUAL, Source.WEBHOOK) else None
    planned = occurrences.planned(
        occurrence_id=uuid.uuid4(), schedule_id=uuid.UUID(schedule_id), source=source, fire=fire, revision=1,
        decision=decision, run_id=uuid.uuid4() if run else None, idempotency_key=key,
        covers_from=covers[0] if covers else None, covers_until=covers[1] if covers else None,
        covers_count=covers[2] if covers else 1)
    with db.transaction() as conn:
        recorded = occurrences.record(conn, [planned], now=now)
    assert len(recorded) == 1
    return {"occurrence_id": str(recorded[0]["occurrence_id"]),
            "run_id": None if recorded[0]["run_id"] is None else str(recorded[0]["run_id"])}


def _walk(client: ApiClient, target: str, plural: str, limit: int,
          between: Any = None) -> tuple[list[dict[str, Any]], list[list[str]]]:
    """Every row of a list, page by page (``between()`` runs after each page); the rows and each page's ids."""
    seen: list[dict[str, Any]] = []
    page_ids: list[list[str]] = []
    before: str | None = None
    sep = "&" if "?" in target else "?"
    for _ in range(50):  # a cursor that does not move on would page forever
        answer = client.get(f"{target}{sep}limit={limit}" + ("" if before is None else f"&before={quote(before)}"))
        assert answer.status == 200, answer.text
        assert set(answer.json) == {plural, "next_before"}
        batch = answer.json[plural]
        assert len(batch) <= limit
        seen.extend(batch)
        page_ids.append([r["id"] for r in batch])
        before = answer.json["next_before"]
        if before is None:
            return seen, page_ids
        assert len(batch) == limit, "a page that is not the last is full"
        if between is not None:
            between()
    raise AssertionError("the list did not end within 50 pages")


# ---- GET /v1/runs: keyset pages ----------------------------------------------------------------


def test_paging_through_runs_while_runs_are_created_never_skips_or_repeats_one(api: Api, db: Database) -> None:
    # Given 21 runs: 12 created at one instant (one tick's batch), 5 a second earlier, 4 an hour before.
    schedule = _schedule(api)
    stamps = [T] * 12 + [T - timedelta(seconds=1)] * 5 + [T - timedelta(hours=1)] * 4
    initial = {_record(db, schedule["id"], now=at)["run_id"]: at for at in stamps}
    later = itertools.count(1)

    def new_runs() -> None:  # what a tick does meanwhile: new runs, at later instants
        for _ in range(2):
            _record(db, schedule["id"], now=T + timedelta(seconds=next(later)))

    # When alice pages through with 5 a page, two new runs landing before every next page
    for target in ("/v1/runs", f"/v1/runs?schedule_id={schedule['id']}"):
        existing = {str(r["id"]): r["created_at"] for r in rows(api.url, "SELECT id, created_at FROM runs")}
        expected = sorted(existing, key=lambda rid: (existing[rid], uuid.UUID(rid)), reverse=True)
        seen, page_ids = _walk(api.alice, target, "runs", 5, between=new_runs)
        # Then she sees exactly the runs that existed when she started, newest first, each once
        assert [r["id"] for r in seen] == expected, target
        assert [len(p) for p in page_ids] == [5, 5, 5, 5, 1] if target == "/v1/runs" else [5] * 5 + [4]
    # The scenario is the hard one: instants are shared across page boundaries (a cursor of the
    # instant alone would skip or repeat), and new rows arrived between pages (OFFSET would repeat).
    first = sorted(initial, key=lambda rid: (initial[rid], uuid.UUID(rid)), reverse=True)
    assert initial[first[4]] == initial[first[5]] == T
    assert initial[first[14]] == initial[first[15]]
    assert len(rows(api.url, "SELECT id FROM runs")) == 21 + 2 * 4 + 2 * 5
    fresh = api.alice.get("/v1/runs?limit=12").json["runs"]
    assert all(r["id"] not in initial for r in fresh), "new runs show on a first page"


def test_runs_filter_by_schedule_conversation_state_and_source_and_hold_only_the_callers(api: Api) -> None:
    home = factories.conversation(api.url, owner="alice")
    other = factories.conversation(api.url, owner="alice")
    thread = factories.conversation(api.url, owner="alice")
    forked = factories.schedule(api.url, conversation_id=home["id"], mode="fork")
    hooked = factories.schedule(api.url, conversation_id=home["id"], kind="webhook")
    elsewhere = factories.schedule(api.url, conversation_id=other["id"])
    bobs = factories.schedule(api.url, owner="bob")
    made = {
        "fork_done": factories.run(api.url, schedule_row=forked, state="succeeded", conversation_id=thread["id"],
                                   fire_at=T),
        "fork_queued": factories.run(api.url, schedule_row=forked, fire_at=T + timedelta(hours=1)),
        "hook_failed": factories.run(api.url, schedule_row=hooked, state="failed", source="webhook"),
        "elsewhere": factories.run(api.url, schedule_row=elsewhere, state="running"),
    }
    factories.run(api.url, schedule_row=bobs)
    ids = {name: str(row["id"]) for name, row in made.items()}

    def listed(query: str, who: ApiClient = api.alice) -> set[str]:
        answer = who.get(f"/v1/runs{query}")
        assert answer.status == 200, answer.text
        return {r["id"] for r in answer.json["runs"]}

    assert listed("") == set(ids.values())
    assert listed(f"?schedule_id={forked['id']}") == {ids["fork_done"], ids["fork_queued"]}
    # conversation_id: runs scheduled from the conversation, and the run whose thread it is
    assert listed(f"?conversation_id={home['id']}") == {ids["fork_done"], ids["fork_queued"], ids["hook_failed"]}
    assert listed(f"?conversation_id={thread['id']}") == {ids["fork_done"]}
    assert listed("?state=failed") == {ids["hook_failed"]}
    assert listed("?source=webhook") == {ids["hook_failed"]}
    assert listed("?state=running&source=scheduled") == {ids["elsewhere"]}
    assert listed(f"?schedule_id={forked['id']}&state=queued") == {ids["fork_queued"]}
    # another owner's schedule or conversation as a filter: nothing of theirs, no error
    assert listed(f"?schedule_id={bobs['id']}") == set()
    assert listed(f"?conversation_id={home['id']}", api.bob) == set()
    assert listed("", api.bob) == {str(r["id"]) for r in rows(api.url, "SELECT id FROM runs WHERE owner = 'bob'")}
    one = api.alice.get(f"/v1/runs?conversation_id={thread['id']}").json["runs"][0]
    assert one["conversation_id"] == str(thread["id"]) and one["source_conversation_id"] == str(home["id"])
    assert {"prompt", "payload", "agent", "owner"}.isdisjoint(one)


def _cursor(kind: str) -> str:
    return pages.encode(kind, pages.Key(T, uuid.uuid4()))


@pytest.mark.parametrize(("query", "field", "rule"), [
    ("schedule_id=nope", "schedule_id", "type"),
    ("conversation_id=1234", "conversation_id", "type"),
    ("state=done", "state", "enum"),
    ("source=cron", "source", "enum"),
    ("limit=0", "limit", "min"),
    ("limit=101", "limit", "max"),
    ("limit=ten", "limit", "type"),
    ("before=not-a-cursor", "before", "cursor"),
    ("before=", "before", "cursor"),
    ("before=" + "A" * 400, "before", "cursor"),
    ("before=" + base64.urlsafe_b64encode(b"runs:9999999999999999999:" + b"0" * 32).decode().rstrip("="),
     "before", "cursor"),
    ("before=" + _cursor("occurrences"), "before", "cursor"),
    ("before=" + quote(_cursor("runs") + "\n"), "before", "cursor"),
])
def test_runs_query_parameters_are_validated(api: Api, query: str, field: str, rule: str) -> None:
    answer = api.alice.get(f"/v1/runs?{query}")
    assert answer.status == 422, answer.text
    assert [(f["field"], f["rule"]) for f in answer.error["fields"]] == [(field, rule)]
    assert answer.error["code"] == "validation_failed"


def test_list_cursors_are_validated_on_every_list(api: Api) -> None:
    schedule = _schedule(api)
    for target, kind in ((f"/v1/schedules/{schedule['id']}/occurrences", "runs"), ("/v1/conversations", "runs"),
                         ("/v1/runs", "conversations")):
        for query, field, rule in ((f"before={_cursor(kind)}", "before", "cursor"),
                                   ("before=%25%25", "before", "cursor"),
                                   ("limit=0", "limit", "min"), ("limit=101", "limit", "max")):
            answer = api.alice.get(f"{target}?{query}")
            assert answer.status == 422, (target, query, answer.text)
            assert [(f["field"], f["rule"]) for f in answer.error["fields"]] == [(field, rule)], (target, query)


def test_a_first_page_defaults_to_50_and_an_empty_list_has_no_cursor(api: Api, db: Database) -> None:
    assert api.alice.get("/v1/runs").json == {"runs": [], "next_before": None}
    schedule = _schedule(api)
    for _ in range(51):
        _record(db, schedule["id"], now=T)
    first = api.alice.get("/v1/runs").json
    assert len(first["runs"]) == 50 and first["next_before"] is not None
    rest = api.alice.get(f"/v1/runs?before={first['next_before']}").json
    assert len(rest["runs"]) == 1 and rest["next_before"] is None
    exactly = api.alice.get("/v1/runs?limit=51").json
    assert len(exactly["runs"]) == 51 and exactly["next_before"] is None, "no cursor to an empty page"


# ---- last_run on every schedule ----------------------------------------------------------------


def test_every_schedule_answer_carries_its_newest_run_as_last_run(api: Api, db: Database) -> None:
    created = _schedule(api)
    sid = created["id"]
    assert created["last_run"] is None, "a new schedule has run nothing"
    assert api.alice.get(f"/v1/schedules/{sid}").json["schedule"]["last_run"] is None

    # Given runs created at two instants, three of them at the newer one (ties broken by id)
    _record(db, sid, now=T - timedelta(minutes=5))
    newest = [_record(db, sid, now=T)["run_id"] for _ in range(3)]
    newest_id = max(newest, key=uuid.UUID)
    head = api.alice.get(f"/v1/runs?schedule_id={sid}&limit=1").json["runs"][0]
    expected = {"id": newest_id, "state": "queued", "source": "scheduled", "created_at": "2026-03-01T12:00:00Z",
                "finished_at": None}
    assert head["id"] == newest_id, "last_run is the first run GET /v1/runs lists"

    listed = {s["id"]: s for s in api.alice.get("/v1/schedules").json["schedules"]}
    assert listed[sid]["last_run"] == expected
    assert api.alice.get(f"/v1/schedules/{sid}").json["schedule"]["last_run"] == expected

    # When that run is cancelled, every answer shows its end
    assert api.alice.post(f"/v1/runs/{newest_id}/cancel").status == 200
    ended = api.alice.get(f"/v1/schedules/{sid}").json["schedule"]["last_run"]
    assert ended["state"] == "cancelled" and ended["finished_at"] is not None
    edited = api.alice.patch(f"/v1/schedules/{sid}", {"name": "renamed"})
    assert edited.status == 200 and edited.json["schedule"]["last_run"] == ended, edited.text
    for verb, call in (("pause", api.alice.post), ("resume", api.alice.post), ("", api.alice.delete)):
        answer = call(f"/v1/schedules/{sid}" + (f"/{verb}" if verb else ""))
        assert answer.status == 200, (verb, answer.text)
        assert answer.json["schedule"]["last_run"] == ended, verb
    # A schedule with no runs next to one with runs: each its own
    quiet = _schedule(api)
    both = {s["id"]: s["last_run"] for s in api.alice.get("/v1/schedules").json["schedules"]}
    assert both[quiet["id"]] is None and sid not in both, "the cancelled one is no longer listed"


def test_a_webhook_schedules_token_rotation_answers_its_last_run(api: Api) -> None:
    schedule, token = api.webhook_schedule()
    assert schedule["last_run"] is None
    fired = api.anonymous.post(f"/v1/hooks/{token}", {"n": 1})
    assert fired.status == 202, fired.text
    rotated = api.alice.post(f"/v1/schedules/{schedule['id']}/token", {"overlap_seconds": 0})
    assert rotated.status == 200, rotated.text
    assert rotated.json["schedule"]["last_run"]["id"] == fired.json["run_id"]
    assert rotated.json["schedule"]["last_run"]["source"] == "webhook"


# ---- GET /v1/schedules/{id}/occurrences --------------------------------------------------------


def test_occurrences_page_newest_first_with_decisions_and_ties_split_exactly_once(api: Api, db: Database) -> None:
    schedule = _schedule(api)
    sid = schedule["id"]
    # Given four occurrences of one instant (every source), a skipped range with no run, and older fires
    tied = {source: _record(db, sid, now=T, fire_at=T, source=source)
            for source in (Source.SCHEDULED, Source.BACKFILL, Source.MANUAL, Source.WEBHOOK)}
    skipped = _record(db, sid, now=T, fire_at=T - timedelta(hours=1), decision=Decision.SKIPPED_LATE, run=False,
                      covers=(T - timedelta(hours=5), T - timedelta(hours=1), 5))
    older = [_record(db, sid, now=T, fire_at=T - timedelta(days=d)) for d in (1, 2, 3)]
    existing = {str(r["id"]): r["fire_at"] for r in rows(api.url, "SELECT id, fire_at FROM occurrences")}
    expected = sorted(existing, key=lambda oid: (existing[oid], uuid.UUID(oid)), reverse=True)
    later = itertools.count(1)

    def new_fires() -> None:
        _record(db, sid, now=T, fire_at=T + timedelta(hours=next(later)))

    # When alice pages through three at a time while new fires are recorded
    seen, page_ids = _walk(api.alice, f"/v1/schedules/{sid}/occurrences", "occurrences", 3, between=new_fires)

    # Then each occurrence that existed shows once, newest first, the tied ones split across pages
    assert [o["id"] for o in seen] == expected
    assert [len(p) for p in page_ids] == [3, 3, 2]
    by_id = {o["id"]: o for o in seen}
    assert {by_id[t["occurrence_id"]]["source"] for t in tied.values()} == {s.value for s in tied}
    assert all(by_id[t["occurrence_id"]]["run_id"] == t["run_id"] for t in [*tied.values(), *older])
    assert by_id[skipped["occurrence_id"]] == {
        "id": skipped["occurrence_id"], "source": "scheduled", "fire_at": "2026-03-01T11:00:00Z",
        "dispatch_at": "2026-03-01T11:00:00Z",
        "local_time": "2026-03-01T12:00:00", "utc_offset": "+01:00", "fold": 0, "schedule_revision": 1,
        "decision": "skipped_late", "covers_from": "2026-03-01T07:00:00Z", "covers_until": "2026-03-01T11:00:00Z",
        "covers_count": 5, "run_id": None}


def test_another_owners_occurrences_answer_exactly_like_a_missing_schedule(api: Api, db: Database) -> None:
    schedule = _schedule(api)
    _record(db, schedule["id"], now=T)
    for query in ("", "?limit=1", f"?before={_cursor('occurrences')}"):
        foreign = api.bob.get(f"/v1/schedules/{schedule['id']}/occurrences{query}")
        missing = api.bob.get(f"/v1/schedules/{uuid.uuid4()}/occurrences{query}")
        assert foreign.status == missing.status == 404, foreign.text
        assert foreign.text == missing.text and foreign.headers == missing.headers
        assert schedule["id"] not in foreign.text
    assert len(api.alice.get(f"/v1/schedules/{schedule['id']}/occurrences").json["occurrences"]) == 1


# ---- GET /v1/conversations ---------------------------------------------------------------------


def test_conversations_page_newest_first_without_entries_or_agent_detail(api: Api, db: Database) -> None:
    from kairos import conversations

    agent = {"executor": "echo", "model": "echo", "system": "a private system prompt"}
    with db.transaction() as conn:
        mine = [conversations.create(conn, owner="alice", agent=agent, title=f"c{i}", now=T).id for i in range(7)]
        mine.append(conversations.create(conn, owner="alice", agent=agent, now=T - timedelta(days=1)).id)
        conversations.create(conn, owner="bob", agent=agent, now=T)
        conversations.append(conn, mine[0], role="user", content="an entry the list does not carry")
    expected = [str(c) for c in sorted(mine[:7], reverse=True)] + [str(mine[7])]

    seen, page_ids = _walk(api.alice, "/v1/conversations", "conversations", 3)

    assert [c["id"] for c in seen] == expected
    assert [len(p) for p in page_ids] == [3, 3, 2]
    for item in seen:
        assert set(item) == {"id", "title", "parent_id", "fork_seq", "created_at", "agent"}
        assert item["agent"] == {"executor": "echo", "model": "echo"}
    assert "private" not in api.alice.get("/v1/conversations").text
    assert len(api.bob.get("/v1/conversations").json["conversations"]) == 1


# ---- a fork-mode run's answer is reachable ------------------------------------------------------


def test_a_fork_runs_thread_is_found_from_its_schedule_its_conversation_and_the_list(api: Api, db: Database) -> None:
    home = api.conversation()
    schedule = _schedule(api, conversation_id=home["id"], mode="fork")
    run_id = _record(db, schedule["id"], now=None, fire_at=datetime.now(UTC).replace(microsecond=0))["run_id"]
    executor = ScriptedExecutor()
    assert process(db, uuid.UUID(run_id), settings=Settings(), executor_factory=executor.factory).result == "succeeded"

    # From the schedule: its last run, and its runs
    last = api.alice.get(f"/v1/schedules/{schedule['id']}").json["schedule"]["last_run"]
    assert last["id"] == run_id and last["state"] == "succeeded" and last["finished_at"]
    run = api.alice.get(f"/v1/runs?schedule_id={schedule['id']}").json["runs"][0]
    thread = run["conversation_id"]
    assert run["id"] == run_id and thread not in (None, home["id"])
    # From the conversation it was scheduled from, and from its own thread
    assert [r["id"] for r in api.alice.get(f"/v1/runs?conversation_id={home['id']}").json["runs"]] == [run_id]
    assert [r["id"] for r in api.alice.get(f"/v1/runs?conversation_id={thread}").json["runs"]] == [run_id]
    # The thread is in the conversations list (newest first) and holds the answer
    listed = api.alice.get("/v1/conversations").json["conversations"]
    assert listed[0]["id"] == thread and listed[0]["parent_id"] == home["id"]
    entries = api.alice.get(f"/v1/conversations/{thread}").json["conversation"]["entries"]
    assert entries[-1]["role"] == "assistant" and entries[-1]["run_id"] == run_id
    assert api.alice.get(f"/v1/runs/{run_id}/output").json["output"]["state"] == "available"


def test_threads_false_lists_only_the_conversations_the_owner_created(api: Api, db: Database) -> None:
    # Given two conversations alice made and the threads a fork run and a fresh run made from them
    home = api.conversation()
    other = api.conversation()
    threads = []
    for mode in ("fork", "fresh"):
        schedule = _schedule(api, conversation_id=home["id"], mode=mode)
        run_id = _record(db, schedule["id"], now=None, fire_at=datetime.now(UTC).replace(microsecond=0))["run_id"]
        executor = ScriptedExecutor()
        assert process(db, uuid.UUID(run_id), settings=Settings(), executor_factory=executor.factory).result == \
            "succeeded"
        threads.append(api.alice.get(f"/v1/runs/{run_id}").json["run"]["conversation_id"])

    everything = [c["id"] for c in api.alice.get("/v1/conversations").json["conversations"]]
    assert set(threads) <= set(everything) and len(everything) == 4
    # Without threads: the two alice created, newest first, in pages; a thread on no page
    seen, page_ids = _walk(api.alice, "/v1/conversations?threads=false", "conversations", 1)
    assert [c["id"] for c in seen] == [other["id"], home["id"]] and page_ids == [[other["id"]], [home["id"]]]
    assert [c["id"] for c in api.alice.get("/v1/conversations?threads=true").json["conversations"]] == everything
    assert api.bob.get("/v1/conversations?threads=false").json["conversations"] == []
    answer = api.alice.get("/v1/conversations?threads=maybe")
    assert answer.status == 422, answer.text
    assert [f["field"] for f in answer.error["fields"]] == ["threads"]


# ---- the plans ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("query", "index", "params"), [
    ("runs_list_owned", "runs_owner_created_idx", {"schedule_id": None, "conversation_id": None}),
    ("runs_list_owned", "runs_schedule_created_idx", {"schedule_id": uuid.uuid4(), "conversation_id": None}),
    ("runs_last_of_schedules", "runs_schedule_created_idx", {"schedule_ids": [uuid.uuid4(), uuid.uuid4()]}),
    ("occurrences_list", "occurrences_schedule_idx", {"schedule_id": uuid.uuid4()}),
    ("conversations_list_owned", "conversations_owner_idx", {"threads": True}),
    ("conversations_list_owned", "conversations_owner_idx", {"threads": False}),
])
def test_a_page_is_an_index_range_scan_in_list_order_with_no_sort(db: Database, query: str, index: str,
                                                                  params: dict[str, Any]) -> None:
    from kairos.db import q

    base = {"owner": "alice", "state": None, "source": None, "limit": 51, "before_at": T, "before_id": uuid.uuid4()}
    with db.transaction() as conn:
        conn.execute("SET LOCAL enable_seqscan = off")
        conn.execute("SET LOCAL enable_bitmapscan = off")
        plan = "\n".join(str(r["QUERY PLAN"]) for r in conn.execute(f"EXPLAIN {q(query)}", {**base, **params}))
    assert index in plan, plan
    assert "Sort" not in plan, plan
    if "before_at" in q(query):
        cond = next(line for line in plan.splitlines() if "Index Cond" in line)
        assert "ROW(" in cond, "the cursor bounds the index scan; it is not a filter on every row"


def test_a_chat_turn_of_no_schedule_is_found_by_its_conversation_and_source(api: Api) -> None:
    conversation = api.conversation()
    posted = api.alice.post(f"/v1/conversations/{conversation['id']}/messages", {"content": "hello"})
    assert posted.status == 202, posted.text
    run_id = posted.json["run_id"]
    by_conversation = api.alice.get(f"/v1/runs?conversation_id={conversation['id']}").json["runs"]
    assert [r["id"] for r in by_conversation] == [run_id]
    assert by_conversation[0]["schedule_id"] is None and by_conversation[0]["source"] == "chat"
    assert [r["id"] for r in api.alice.get("/v1/runs?source=chat").json["runs"]] == [run_id]
    assert api.alice.get("/v1/runs?source=scheduled").json["runs"] == []
    assert api.bob.get("/v1/runs?source=chat").json["runs"] == []
