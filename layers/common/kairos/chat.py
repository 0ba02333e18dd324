"""Chat turns: ``POST /v1/conversations/{id}/messages`` — a person's message becomes a ``chat`` run.

Role: a turn is an occurrence and a run of no schedule (source ``chat``), recorded through
``kairos.occurrences`` like every fire: the run appends to the conversation (the message is its
prompt, the conversation's agent answers it) and is handed to SQS after commit. Turns of one
conversation run one at a time in the order they were posted: a turn posted while an earlier one has
not ended waits for it (``queued_behind``), so two answers never interleave in the transcript.

A chat run is the only kind the ``schedules`` tool works in (docs/architecture.md "Schedules and
time": no schedule created from inside a run), and only in a conversation no run created.

Guarantees: a refused message (not a string, empty, over ``MAX_CONTENT_BYTES``, unknown field) writes
nothing; another owner's conversation is the same ``NotFound`` as a missing one; a turn over the owner's
queue cap is ``QueueFull`` (429 ``queue_full``) and writes nothing, under the owner's queue lock as
every fire is (two turns in two conversations cannot both take the last place).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg

from kairos import calendar, conversations, db, identity, occurrences, runtime
from kairos.errors import FieldError, ValidationFailed
from kairos.observability import logger
from kairos.schedules import corpus_spec
from kairos.states import Decision, Source

MAX_CONTENT_BYTES = 32_768


@dataclass(frozen=True)
class Turn:
    conversation_id: uuid.UUID
    occurrence_id: uuid.UUID
    run_id: uuid.UUID
    waiting: bool  # queued behind an earlier turn (sent to SQS when that one ends)

    def as_json(self) -> dict[str, str]:
        return {"run_id": str(self.run_id), "occurrence_id": str(self.occurrence_id)}


def content_of(raw: object) -> str:
    """The message of a ``{"content": "...", "corpus"?}`` body, or ``ValidationFailed`` naming the field and rule."""
    if not isinstance(raw, Mapping):
        raise ValidationFailed([FieldError("body", "type", 'give the message as {"content": "..."}')])
    problems = [FieldError(str(k), "unknown_field", f"{k} is not a message field")
                for k in raw if k not in ("content", "corpus")]
    content = raw.get("content")
    if "content" not in raw:
        problems.append(FieldError("content", "required", "give the message text"))
    elif not isinstance(content, str):
        problems.append(FieldError("content", "type", "the message is a string"))
    elif not content.strip():
        problems.append(FieldError("content", "min_length", "the message is empty"))
    elif len(content.encode("utf-8")) > MAX_CONTENT_BYTES:
        problems.append(FieldError("content", "max_bytes", f"a message is at most {MAX_CONTENT_BYTES} bytes"))
    if problems:
        raise ValidationFailed(problems)
    assert isinstance(content, str)
    return content


def post(conn: psycopg.Connection[db.Row], conversation_id: uuid.UUID, *, owner: str, raw: object,
         now: datetime | None = None) -> Turn:
    """Records the turn (see the module doc); the caller commits, then hands a non-waiting run to SQS."""
    content = content_of(raw)
    corpus = _corpus_of(raw, owner=owner)
    with db.atomic(conn):
        conversation = conversations.lock(conn, conversation_id, owner=owner)
        row = db.fetch_one(conn, "runs_last_chat_turn", {"conversation_id": conversation.id})
        blocker = None if row is None else row["id"]
        occurrence_id = identity.occurrence_id(conversation.id, Source.CHAT, key=uuid.uuid4().hex)
        run_id = identity.run_id(occurrence_id)
        clock = db.fetch_row(conn, "schedules_clock", {"now": now})
        occurrences.refuse_over_cap(occurrences.record(conn, [occurrences.planned(
            occurrence_id=occurrence_id, schedule_id=None, source=Source.CHAT,
            fire=calendar.describe(clock["now"].astimezone(UTC), "UTC"), revision=0,
            decision=Decision.DISPATCHED if blocker is None else Decision.QUEUED_BEHIND, run_id=run_id,
            blocked_by=blocker, chat=(conversation.id, content), corpus=corpus)], now=now))  # 429 queue_full
    logger.info("chat turn posted", extra={"action": "chat_turn_posted", "conversation_id": str(conversation.id),
                                           "run_id": str(run_id), "waiting": blocker is not None})
    return Turn(conversation.id, occurrence_id, run_id, waiting=blocker is not None)


def _corpus_of(raw: object, *, owner: str) -> dict[str, Any] | None:
    """A turn's checked ``corpus`` (``kairos.schedules.corpus_spec``), or None when it carries none."""
    if not isinstance(raw, Mapping) or raw.get("corpus") is None:
        return None

    return corpus_spec.validate(raw["corpus"], buckets=runtime.settings().readable_corpus_buckets, owner=owner)
