"""Conversations: the minimal transcript store that runs read and write, and the agent config.

A conversation has an owner, an agent (JSON, validated by ``kairos.agents``)
and entries numbered ``seq`` = 1, 2, 3… A fork is its parent plus a fork point (``fork_seq``):
nothing is copied, the fork reads its ancestors' entries up to each fork point and then its own,
and its own entries continue the parent's numbering after the fork point, so a seq names one entry
of the merged transcript. Inbox notes are bounded: the ``notes`` box keeps the newest 50; ``queued``
is never pruned here.

Guarantees:
* ``append`` is safe under concurrency: it locks the conversation row (``FOR NO KEY UPDATE``) and
  then reads the last seq in a new statement, so two appenders get distinct consecutive seqs. It
  must run inside the caller's transaction (on an autocommit connection it opens its own).
* ``get``, ``transcript`` and ``inbox`` are scoped to the owner; another owner's conversation raises the same
  ``NotFound("conversation")`` as a missing one. ``page`` lists only the owner's conversations (roots
  and the threads fork and fresh runs made, or without ``threads`` only the ones the owner created),
  newest first, in keyset pages (``kairos.pages``), each
  without entries and with only its agent's executor and model.
* An agent is accepted only as ``kairos.agents.validate`` accepts it: declared fields, and only
  *references* to secrets that the owner may send to the agent's ``base_url``, never a literal key.

Must not: log or return secrets; log prompts or entry contents; rewrite or delete entries.
``entries``, ``window``, ``latest_seq``, ``append``, ``fork``, ``note`` and ``lineage_has_run`` are internal
(the caller has already checked ownership) and take no owner.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from kairos import agents, db, pages
from kairos.errors import (
    MAX_LENGTH,
    REQUIRED,
    TYPE,
    UNKNOWN_FIELD,
    FieldError,
    NotFound,
    ValidationFailed,
)
from kairos.instants import rfc3339
from kairos.observability import logger

NOTES_KEPT = 50
PAGE = "conversations"  # the list kairos.pages cursors of GET /v1/conversations name
TITLE_MAX = 200
ROLES = ("system", "user", "assistant", "tool")

# --- Records -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Conversation:
    id: uuid.UUID
    owner: str
    title: str | None
    agent: dict[str, Any]
    parent_id: uuid.UUID | None
    fork_seq: int | None
    origin_run_id: uuid.UUID | None
    created_at: datetime

    @classmethod
    def from_row(cls, row: db.Row) -> Conversation:
        return cls(
            id=row["id"],
            owner=row["owner"],
            title=row["title"],
            agent=dict(row["agent"]),
            parent_id=row["parent_id"],
            fork_seq=row["fork_seq"],
            origin_run_id=row["origin_run_id"],
            created_at=row["created_at"],
        )

    def as_json(self) -> dict[str, Any]:
        """API shape (without entries; the API adds them). No owner, no origin run."""
        return {
            "id": str(self.id),
            "title": self.title,
            "agent": self.agent,
            "parent_id": None if self.parent_id is None else str(self.parent_id),
            "fork_seq": self.fork_seq,
            "created_at": rfc3339(self.created_at),
        }

    def summary_json(self) -> dict[str, Any]:
        """The list shape: no entries, and of the agent only what it is (executor, model) — its
        system prompt, endpoint and key reference stay on the conversation's own page."""
        return {
            "id": str(self.id),
            "title": self.title,
            "parent_id": None if self.parent_id is None else str(self.parent_id),
            "fork_seq": self.fork_seq,
            "created_at": rfc3339(self.created_at),
            "agent": {"executor": self.agent.get("executor"), "model": self.agent.get("model")},
        }


@dataclass(frozen=True)
class Entry:
    seq: int
    role: str
    content: str
    run_id: uuid.UUID | None
    created_at: datetime

    @classmethod
    def from_row(cls, row: db.Row) -> Entry:
        return cls(row["seq"], row["role"], row["content"], row["run_id"], row["created_at"])

    def as_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "role": self.role,
            "content": self.content,
            "run_id": None if self.run_id is None else str(self.run_id),
            "created_at": rfc3339(self.created_at),
        }


@dataclass(frozen=True)
class Transcript:
    """A conversation with its merged transcript: what the API answers for one."""

    conversation: Conversation
    entries: list[Entry]

    def as_json(self) -> dict[str, Any]:
        return {**self.conversation.as_json(), "entries": [e.as_json() for e in self.entries]}


@dataclass(frozen=True)
class Note:
    id: int
    box: str
    kind: str
    body: dict[str, Any]
    created_at: datetime

    @classmethod
    def from_row(cls, row: db.Row) -> Note:
        return cls(row["id"], row["box"], row["kind"], dict(row["body"]), row["created_at"])

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "box": self.box, "kind": self.kind, "body": self.body,
                "created_at": rfc3339(self.created_at)}


# --- Operations --------------------------------------------------------------------------------



def create(
    conn: psycopg.Connection[db.Row],
    *,
    owner: str,
    agent: object,
    title: str | None = None,
    origin_run_id: uuid.UUID | None = None,
    now: datetime | None = None,
) -> Conversation:
    """A new root conversation; the agent is validated (``ValidationFailed`` naming ``agent.<name>``)."""
    return _create(conn, owner=owner, agent=agent, title=title, origin_run_id=origin_run_id, now=now, problems=[])


CREATE_FIELDS = ("agent", "title")


def create_from_body(conn: psycopg.Connection[db.Row], *, owner: str, raw: object,
                     now: datetime | None = None) -> Conversation:
    """``POST /v1/conversations``: the whole body judged at once — undeclared fields, a missing agent,
    every problem of the agent and of the title in one ``ValidationFailed``."""
    if not isinstance(raw, Mapping):
        raise ValidationFailed([FieldError("body", TYPE, "give the conversation as a JSON object")])
    problems = [FieldError(str(name), UNKNOWN_FIELD, "unknown field; remove it (only the declared fields are "
                           "accepted)") for name in raw if name not in CREATE_FIELDS]
    if raw.get("agent") is None:
        problems.append(FieldError("agent", REQUIRED, "this field is required"))
    return _create(conn, owner=owner, agent=raw.get("agent"), title=raw.get("title"), origin_run_id=None,
                   now=now, problems=problems)


def _create(conn: psycopg.Connection[db.Row], *, owner: str, agent: object, title: object,
            origin_run_id: uuid.UUID | None, now: datetime | None, problems: list[FieldError]) -> Conversation:

    config: dict[str, Any] = {}
    if agent is not None or not problems:  # a missing agent is already named (``required``)
        try:
            # A run's own thread (origin_run_id) copies an agent checked when it was written; the executor
            # checks its secret reference again before every call.
            config = agents.validate(agent, owner=None if origin_run_id is not None else owner)
        except ValidationFailed as error:
            problems.extend(error.fields)
    if title is not None and not isinstance(title, str):
        problems.append(FieldError("title", TYPE, "give the title as a string"))
    elif title is not None and len(title) > TITLE_MAX:
        problems.append(FieldError("title", MAX_LENGTH, f"at most {TITLE_MAX} characters"))
    if problems:
        raise ValidationFailed(problems)
    row = db.fetch_row(
        conn,
        "conversations_insert",
        {"id": uuid.uuid4(), "owner": owner, "title": title, "agent": Jsonb(config),
         "origin_run_id": origin_run_id, "now": now},
    )
    conversation = Conversation.from_row(row)
    logger.info("conversation created", extra={"action": "conversation_created",
                                                 "conversation_id": str(conversation.id)})
    return conversation


def get(conn: psycopg.Connection[db.Row], conversation_id: uuid.UUID, *, owner: str) -> Conversation:
    """One conversation of ``owner``; ``NotFound("conversation")`` for a missing or foreign one."""
    row = db.fetch_one(conn, "conversations_get", {"conversation_id": conversation_id, "owner": owner})
    if row is None:
        raise NotFound("conversation")
    return Conversation.from_row(row)


def page(conn: psycopg.Connection[db.Row], *, owner: str, before: str | None = None,
         limit: int = pages.LIMIT_DEFAULT, threads: bool = True) -> tuple[list[Conversation], str | None]:
    """One page of ``owner``'s conversations, newest first (``created_at``, then id), below the cursor
    ``before``, and the next page's cursor (None at the end). Without ``threads``, only the ones the
    owner created: not the threads fork and fresh runs made. A bad cursor or limit is ``ValidationFailed``."""
    key = pages.decode(PAGE, before)
    limit = pages.check_limit(limit)
    rows = db.fetch_all(conn, "conversations_list_owned", {
        "owner": owner, "threads": threads, "before_at": None if key is None else key.at,
        "before_id": None if key is None else key.id, "limit": limit + 1})
    found, next_before = pages.cut(PAGE, rows, limit, lambda r: pages.Key(r["created_at"], r["id"]))
    return [Conversation.from_row(r) for r in found], next_before


def transcript(conn: psycopg.Connection[db.Row], conversation_id: uuid.UUID, *, owner: str) -> Transcript:
    """One conversation of ``owner`` with its entries (``entries``); ``NotFound`` as ``get``."""
    conversation = get(conn, conversation_id, owner=owner)
    return Transcript(conversation, entries(conn, conversation.id))


def lock(conn: psycopg.Connection[db.Row], conversation_id: uuid.UUID, *, owner: str | None = None) -> Conversation:
    """Locks the conversation row for the rest of the caller's transaction (writers serialize on it).

    With ``owner``, a foreign conversation is neither locked nor revealed: ``NotFound``.
    """
    row = db.fetch_one(conn, "conversations_lock", {"conversation_id": conversation_id, "owner": owner})
    if row is None:
        raise NotFound("conversation")
    return Conversation.from_row(row)


def entries(conn: psycopg.Connection[db.Row], conversation_id: uuid.UUID) -> list[Entry]:
    """The merged transcript, oldest first: ancestors up to each fork point, then its own entries.

    A missing conversation has no entries.
    """
    return [Entry.from_row(r) for r in db.fetch_all(conn, "conversation_entries_list",
                                                    {"conversation_id": conversation_id})]


@dataclass(frozen=True)
class Window:
    """The newest entries of a transcript that fit a budget (oldest first) and how many were left out."""

    entries: tuple[Entry, ...]
    elided: int

    def narrowed(self, budget_chars: int, entry_overhead: int) -> Window:
        """The window a smaller budget chooses from the same transcript: the newest entries that fit
        are a newest-first prefix of these, so the oldest are dropped until the rest fit (exact for
        any budget up to the one this window was read with)."""
        kept = list(self.entries)
        used = sum(len(e.content) + entry_overhead for e in kept)
        while kept and used > max(0, budget_chars):
            used -= len(kept.pop(0).content) + entry_overhead
        return Window(tuple(kept), self.elided + len(self.entries) - len(kept))


def window(conn: psycopg.Connection[db.Row], conversation_id: uuid.UUID, *, budget_chars: int,
           entry_overhead: int, exclude_run: uuid.UUID | None = None,
           exclude_runs: Sequence[uuid.UUID] = ()) -> Window:
    """As many of the newest entries of the merged transcript as fit ``budget_chars``, each costing
    its length plus ``entry_overhead``, leaving out ``exclude_run``'s and ``exclude_runs``' own entries
    (a run's, and a retry's: those of the runs it retries). Chosen in SQL: only the entries that fit
    are read into memory, however long the transcript."""
    return send_window(conn, conversation_id, budget_chars=budget_chars, entry_overhead=entry_overhead,
                       exclude_run=exclude_run, exclude_runs=exclude_runs)()


def send_window(conn: psycopg.Connection[db.Row], conversation_id: uuid.UUID, *, budget_chars: int,
                entry_overhead: int, exclude_run: uuid.UUID | None = None,
                exclude_runs: Sequence[uuid.UUID] = ()) -> Callable[[], Window]:
    """``window`` in two halves: the query is sent now (queued, in a pipeline) and the returned
    function reads its answer (after the pipeline's sync)."""
    if entry_overhead < 1:
        raise ValueError("entry_overhead must be positive")
    cursor = db.send(conn, "conversation_entries_window",
                     {"conversation_id": conversation_id,
                      "run_ids": [*([] if exclude_run is None else [exclude_run]), *exclude_runs],
                      "budget": max(0, budget_chars), "overhead": entry_overhead})

    def read() -> Window:
        rows = cursor.fetchall()
        kept = tuple(Entry.from_row(r) for r in rows if r["seq"] is not None)
        return Window(kept, int(rows[0]["elided"]) if rows else 0)

    return read


def claimed_window(row: db.Row) -> Window:
    """The window a fork's claim read with its row (``kairos.runs.moves.send_claim``'s ``window_budget``):
    the same entries ``window`` reads of the new thread."""
    kept = tuple(Entry(int(seq), str(role), str(content), None if run_id is None else uuid.UUID(run_id),
                       datetime.fromisoformat(created_at))
                 for seq, role, content, run_id, created_at in row["window_entries"] or ())
    return Window(kept, int(row["window_elided"]))


def latest_seq(conn: psycopg.Connection[db.Row], conversation_id: uuid.UUID) -> int:
    """The seq of the last entry of the merged transcript (inherited ones count); 0 when empty."""
    row = db.fetch_one(conn, "conversations_latest_seq", {"conversation_id": conversation_id})
    if row is None:
        raise NotFound("conversation")
    return int(row["latest_seq"])


def append(
    conn: psycopg.Connection[db.Row],
    conversation_id: uuid.UUID,
    *,
    role: str,
    content: str,
    run_id: uuid.UUID | None = None,
    now: datetime | None = None,
) -> Entry:
    """Appends one entry at the next seq. Concurrent appenders serialize on the conversation row.

    The lock and the insert are two statements on purpose: under READ COMMITTED the insert's new
    snapshot sees the entry a previous lock holder committed. (One statement would read the last
    seq from the snapshot taken before it waited for the lock, and collide.)
    """
    if role not in ROLES:
        raise ValidationFailed([FieldError("role", "enum", f"role must be one of {', '.join(ROLES)}")])
    with db.atomic(conn):
        lock(conn, conversation_id)
        row = db.fetch_row(
            conn,
            "conversation_entries_append",
            {"conversation_id": conversation_id, "role": role, "content": content, "run_id": run_id, "now": now},
        )
    return Entry.from_row(row)


def fork(
    conn: psycopg.Connection[db.Row],
    conversation_id: uuid.UUID,
    *,
    origin_run_id: uuid.UUID | None = None,
    now: datetime | None = None,
) -> Conversation:
    """A new conversation that reads the parent up to its latest entry; the parent is not changed."""
    row = db.fetch_one(
        conn,
        "conversations_fork",
        {"id": uuid.uuid4(), "conversation_id": conversation_id, "origin_run_id": origin_run_id, "now": now},
    )
    if row is None:
        raise NotFound("conversation")
    child = Conversation.from_row(row)
    logger.info("conversation forked", extra={"action": "conversation_forked", "conversation_id": str(child.id),
                                               "parent_id": str(conversation_id), "fork_seq": child.fork_seq})
    return child


def note(
    conn: psycopg.Connection[db.Row],
    conversation_id: uuid.UUID,
    *,
    kind: str,
    body: Mapping[str, Any],
    now: datetime | None = None,
) -> None:
    """Adds a note to the ``notes`` box, keeping the newest 50; ``queued`` is untouched.

    A conversation that is gone is ignored. The insert and the prune are one statement; two notes
    written concurrently to one conversation may leave 51 until the next note prunes again.
    """
    row = db.fetch_one(
        conn,
        "inbox_notes_add",
        {"conversation_id": conversation_id, "kind": kind, "body": Jsonb(dict(body)), "keep": NOTES_KEPT,
         "now": now},
    )
    if row is None or row["id"] is None:
        logger.info("note for a missing conversation ignored",
                    extra={"action": "inbox_note_ignored", "conversation_id": str(conversation_id)})


def inbox(conn: psycopg.Connection[db.Row], conversation_id: uuid.UUID, *, owner: str) -> list[Note]:
    """The notes of an owned conversation (both boxes), newest first."""
    get(conn, conversation_id, owner=owner)
    return [Note.from_row(r) for r in db.fetch_all(conn, "inbox_notes_list", {"conversation_id": conversation_id})]


def lineage_has_run(conn: psycopg.Connection[db.Row], conversation_id: uuid.UUID) -> bool:
    """True when the conversation or any ancestor was created by a run (``origin_run_id`` set)."""
    row = db.fetch_one(conn, "conversations_lineage_has_run", {"conversation_id": conversation_id})
    return bool(row and row["has_run"])
