"""The transcript store against real PostgreSQL: forks, appends (also concurrent), notes, scoping."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from kairos import conversations
from kairos.db import Database
from kairos.errors import NotFound, ValidationFailed
from tests import factories
from tests.support.db import wait_until_blocked

ECHO = {"executor": "echo", "model": "echo"}


def contents(conn: psycopg.Connection[Any], cid: uuid.UUID) -> list[tuple[int, str]]:
    return [(e.seq, e.content) for e in conversations.entries(conn, cid)]


def test_create_validates_the_agent_and_get_is_owner_scoped(db: Database) -> None:
    with db.transaction() as conn:
        created = conversations.create(conn, owner="alice", agent=ECHO, title="t")
        with pytest.raises(ValidationFailed) as info:
            conversations.create(conn, owner="alice", agent={"executor": "openai", "api_key_secret": "sk-1"})
    assert {(f.field, f.rule) for f in info.value.fields} >= {("agent.api_key_secret", "secret_reference"),
                                                              ("agent.model", "required")}
    with db.transaction() as conn:
        assert conversations.get(conn, created.id, owner="alice") == created
        with pytest.raises(NotFound) as foreign:
            conversations.get(conn, created.id, owner="bob")
        with pytest.raises(NotFound) as missing:
            conversations.get(conn, uuid.uuid4(), owner="bob")
    assert foreign.value.as_body() == missing.value.as_body()
    assert created.agent == ECHO and created.parent_id is None and created.fork_seq is None


def test_transcript_is_the_owners_conversation_with_its_merged_entries(db_url: str, db: Database) -> None:
    parent = factories.conversation(db_url, owner="alice", entries=[("user", "p1"), ("assistant", "p2")])
    with db.transaction() as conn:
        child = conversations.fork(conn, parent["id"])
        conversations.append(conn, child.id, role="user", content="c3")
        transcript = conversations.transcript(conn, child.id, owner="alice")
        assert transcript.conversation == conversations.get(conn, child.id, owner="alice")
        assert transcript.entries == conversations.entries(conn, child.id)
        assert [(e.seq, e.content) for e in transcript.entries] == [(1, "p1"), (2, "p2"), (3, "c3")]
        assert transcript.as_json() == {**child.as_json(), "entries": [e.as_json() for e in transcript.entries]}
        with pytest.raises(NotFound) as foreign:
            conversations.transcript(conn, child.id, owner="bob")
        with pytest.raises(NotFound) as missing:
            conversations.transcript(conn, uuid.uuid4(), owner="alice")
    assert foreign.value.as_body() == missing.value.as_body()


def test_append_numbers_entries_and_latest_seq_counts_them(db: Database) -> None:
    with db.transaction() as conn:
        c = conversations.create(conn, owner="alice", agent=ECHO)
        assert conversations.latest_seq(conn, c.id) == 0
        assert conversations.entries(conn, c.id) == []
        first = conversations.append(conn, c.id, role="user", content="hi")
        second = conversations.append(conn, c.id, role="assistant", content="hello", run_id=uuid.uuid4())
        assert (first.seq, second.seq) == (1, 2)
        assert conversations.latest_seq(conn, c.id) == 2
        assert contents(conn, c.id) == [(1, "hi"), (2, "hello")]
        with pytest.raises(ValidationFailed):
            conversations.append(conn, c.id, role="robot", content="x")
        with pytest.raises(NotFound):
            conversations.append(conn, uuid.uuid4(), role="user", content="x")


def test_fork_reads_parent_up_to_the_fork_point_and_leaves_the_parent_unchanged(db_url: str, db: Database) -> None:
    parent_row = factories.conversation(db_url, entries=[("user", "p1"), ("assistant", "p2")])
    pid = parent_row["id"]
    run_id = uuid.uuid4()
    with db.transaction() as conn:
        child = conversations.fork(conn, pid, origin_run_id=run_id)
        assert (child.parent_id, child.fork_seq, child.origin_run_id) == (pid, 2, run_id)
        assert (child.owner, child.agent) == (parent_row["owner"], parent_row["agent"])
        # Both go on: the parent's new entry is not the child's, and seqs continue after the fork point.
        conversations.append(conn, pid, role="user", content="p3")
        own = conversations.append(conn, child.id, role="user", content="c3")
        conversations.append(conn, child.id, role="assistant", content="c4")
        assert own.seq == 3
        assert contents(conn, child.id) == [(1, "p1"), (2, "p2"), (3, "c3"), (4, "c4")]
        assert contents(conn, pid) == [(1, "p1"), (2, "p2"), (3, "p3")]
        assert conversations.latest_seq(conn, child.id) == 4
        # A fork of the fork inherits through both levels, cut at each fork point.
        grandchild = conversations.fork(conn, child.id)
        conversations.append(conn, child.id, role="user", content="c5")
        conversations.append(conn, grandchild.id, role="user", content="g5")
        assert grandchild.fork_seq == 4
        assert contents(conn, grandchild.id) == [(1, "p1"), (2, "p2"), (3, "c3"), (4, "c4"), (5, "g5")]
        # No entry was copied.
        copied = conn.execute("SELECT count(*) AS n FROM conversation_entries WHERE conversation_id = %s",
                              (grandchild.id,)).fetchone()
        assert copied is not None and copied["n"] == 1
    with psycopg.connect(db_url) as raw:
        row = raw.execute("SELECT parent_id, fork_seq FROM conversations WHERE id = %s", (pid,)).fetchone()
    assert row == (None, None)


def test_fork_of_an_empty_conversation_and_of_a_missing_one(db: Database) -> None:
    with db.transaction() as conn:
        c = conversations.create(conn, owner="alice", agent=ECHO)
        child = conversations.fork(conn, c.id)
        assert child.fork_seq == 0
        assert conversations.append(conn, child.id, role="user", content="x").seq == 1
        with pytest.raises(NotFound):
            conversations.fork(conn, uuid.uuid4())


def _run_two_appenders(db_url: str, cid: uuid.UUID, *, first_holds: bool) -> list[int]:
    """Two writers append to one conversation; returns the seqs they got, the first writer's first
    (each thread records its own: their commits are ordered by the lock, their bookkeeping after the
    commit is not).

    With ``first_holds``, the first writer appends and keeps its transaction open until the second
    is seen waiting on a lock, then commits: the exact interleaving that collides without the lock.
    """
    results: dict[str, int] = {}
    errors: list[BaseException] = []
    appended = threading.Event()
    second_done = threading.Event()
    pids: dict[str, int] = {}
    release = threading.Event()

    def first() -> None:
        with psycopg.connect(db_url, row_factory=dict_row) as conn:
            entry = conversations.append(conn, cid, role="user", content="first")
            appended.set()
            release.wait(30)
            conn.commit()
            results["first"] = entry.seq

    def second() -> None:
        try:
            with psycopg.connect(db_url, row_factory=dict_row) as conn:
                pids["second"] = conn.info.backend_pid
                appended.wait(30)
                entry = conversations.append(conn, cid, role="user", content="second")
                conn.commit()
                results["second"] = entry.seq
        except BaseException as exc:  # reported by the test
            errors.append(exc)
        finally:
            second_done.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    appended.wait(30)
    if first_holds:
        while "second" not in pids:
            second_done.wait(0.005)
        wait_until_blocked(db_url, pids["second"], second_done)
    release.set()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return [results["first"], results["second"]]


def test_a_second_appender_waits_for_the_first_and_takes_the_next_seq(db_url: str) -> None:
    cid = factories.conversation(db_url, entries=[("user", "e1")])["id"]
    seqs = _run_two_appenders(db_url, cid, first_holds=True)
    assert seqs == [2, 3]


def test_concurrent_appends_get_distinct_consecutive_seqs(db_url: str) -> None:
    cid = factories.conversation(db_url)["id"]
    workers = 8
    barrier = threading.Barrier(workers)
    seqs: list[int] = []
    errors: list[BaseException] = []
    database = Database(db_url, max_size=workers)

    def append(i: int) -> None:
        try:
            with database.transaction() as conn:
                barrier.wait(30)
                seqs.append(conversations.append(conn, cid, role="user", content=f"m{i}").seq)
        except BaseException as exc:
            errors.append(exc)

    try:
        threads = [threading.Thread(target=append, args=(i,)) for i in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        database.close()
    assert not errors, errors
    assert sorted(seqs) == list(range(1, workers + 1))


def test_append_on_an_autocommit_connection_still_serializes(db_url: str, db: Database) -> None:
    cid = factories.conversation(db_url)["id"]
    with db.connection() as conn:
        assert conn.autocommit
        assert conversations.append(conn, cid, role="user", content="a").seq == 1
        assert conversations.append(conn, cid, role="user", content="b").seq == 2
    with db.transaction() as conn:
        assert contents(conn, cid) == [(1, "a"), (2, "b")]


def _insert_queued(db_url: str, cid: uuid.UUID, n: int) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        for i in range(n):
            conn.execute("INSERT INTO inbox_notes (conversation_id, box, kind, body) VALUES (%s, 'queued', 'msg', %s)",
                         (cid, f'{{"i": {i}}}'))


def test_notes_keep_the_newest_50_and_leave_queued_untouched(db_url: str, db: Database) -> None:
    cid = factories.conversation(db_url)["id"]
    _insert_queued(db_url, cid, 3)
    with db.transaction() as conn:
        for i in range(55):
            conversations.note(conn, cid, kind="schedule_paused", body={"i": i})
    with db.transaction() as conn:
        notes = conversations.inbox(conn, cid, owner="alice")
    kept = [n for n in notes if n.box == "notes"]
    queued = [n for n in notes if n.box == "queued"]
    assert [n.body["i"] for n in kept] == list(range(54, 4, -1))  # the newest 50, newest first
    assert len(queued) == 3
    assert [n.id for n in notes] == sorted((n.id for n in notes), reverse=True)


def test_note_for_a_missing_conversation_is_ignored(db: Database) -> None:
    with db.transaction() as conn:
        conversations.note(conn, uuid.uuid4(), kind="x", body={})
        n = conn.execute("SELECT count(*) AS n FROM inbox_notes").fetchone()
    assert n is not None and n["n"] == 0


def test_inbox_is_owner_scoped(db_url: str, db: Database) -> None:
    cid = factories.conversation(db_url, owner="alice")["id"]
    with db.transaction() as conn:
        conversations.note(conn, cid, kind="k", body={"a": 1})
        with pytest.raises(NotFound):
            conversations.inbox(conn, cid, owner="bob")
        assert [n.kind for n in conversations.inbox(conn, cid, owner="alice")] == ["k"]


def test_lineage_has_run(db: Database) -> None:
    with db.transaction() as conn:
        root = conversations.create(conn, owner="alice", agent=ECHO)
        plain_fork = conversations.fork(conn, root.id)
        run_fork = conversations.fork(conn, root.id, origin_run_id=uuid.uuid4())
        descendant = conversations.fork(conn, run_fork.id)
        fresh = conversations.create(conn, owner="alice", agent=ECHO, origin_run_id=uuid.uuid4())
        check: Callable[[uuid.UUID], bool] = lambda cid: conversations.lineage_has_run(conn, cid)  # noqa: E731
        assert (check(root.id), check(plain_fork.id)) == (False, False)
        assert (check(run_fork.id), check(descendant.id), check(fresh.id)) == (True, True, True)
        assert check(uuid.uuid4()) is False


def test_as_json_shapes(db: Database) -> None:
    with db.transaction() as conn:
        c = conversations.create(conn, owner="alice", agent=ECHO, title="t",
                                 now=datetime(2030, 1, 1, tzinfo=UTC))
        e = conversations.append(conn, c.id, role="user", content="hi", now=datetime(2030, 1, 1, 0, 1, tzinfo=UTC))
    assert c.as_json() == {"id": str(c.id), "title": "t", "agent": ECHO, "parent_id": None, "fork_seq": None,
                           "created_at": "2030-01-01T00:00:00Z"}
    assert "owner" not in c.as_json()
    assert e.as_json() == {"seq": 1, "role": "user", "content": "hi", "run_id": None,
                           "created_at": "2030-01-01T00:01:00Z"}
