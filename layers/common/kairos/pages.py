"""Keyset pages: the one cursor every list of the API hands out (``next_before``) and takes back (``before``).

A list is ordered newest first by a key (an instant, then an id to break ties: runs by
``(created_at, id)``, occurrences by ``(fire_at, id)``, conversations by ``(created_at, id)``) and
a page is "the ``limit`` rows whose key is strictly below the cursor". Paging by key, never by
OFFSET, is what keeps a reader from skipping or repeating a row while rows are being added: a new
row sorts above every key already handed out, so it only ever shows on a first page; and the id in
the key means rows that share an instant (one tick's batch, an injected clock) are split across
pages exactly once.

What "new" means: a row's instant is its transaction's clock (``coalesce(%(now)s, now())``), taken
when the transaction began. A row committed while a reader pages, by a transaction that began before
the reader's first page, may carry an instant below a cursor already handed out: the reader then
meets it on a later page (or, if it sorts above the reader's position, not in this walk). Either
way no row that existed at the first page is skipped or shown twice — the guarantee the tests hold.

The cursor is opaque to callers: base64url of ``<list>:<microseconds since the epoch>:<id hex>``.
It names the list it belongs to, so a runs cursor given to the occurrences list is refused, not
silently read as a position. Anything this module did not write is ``ValidationFailed`` naming the
field with rule ``cursor`` (never a 500). A cursor is not a secret and grants nothing: every list
query is scoped to its owner, so a forged one only moves within the caller's own rows.

Also the one page size rule (``limit`` 1..``LIMIT_MAX``, default ``LIMIT_DEFAULT``) and ``cut``, which
turns the ``limit + 1`` rows a list query fetched into the page and its ``next_before``.

Must not: talk to the database or know any table.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TypeVar
from uuid import UUID

from kairos.errors import CURSOR, MAX, MIN, FieldError, ValidationFailed

LIMIT_DEFAULT = 50
LIMIT_MAX = 100
CURSOR_MAX_CHARS = 128

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_BASE64URL = re.compile(r"[A-Za-z0-9_-]+")
_PLAIN = re.compile(r"(?P<kind>[a-z_]+):(?P<micros>-?[0-9]{1,19}):(?P<id>[0-9a-f]{32})")

T = TypeVar("T")


@dataclass(frozen=True)
class Key:
    """A row's place in a newest-first list: its instant, then its id."""

    at: datetime
    id: UUID


def encode(kind: str, key: Key) -> str:
    """The cursor for "rows of list ``kind`` strictly below ``key``"."""
    delta = key.at.astimezone(UTC) - _EPOCH
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    plain = f"{kind}:{micros}:{key.id.hex}"
    return base64.urlsafe_b64encode(plain.encode("ascii")).decode("ascii").rstrip("=")


def decode(kind: str, cursor: str | None, *, field: str = "before") -> Key | None:
    """The key a cursor of list ``kind`` names; None for no cursor (the first page). Anything else
    — not base64url, not ours, another list's, an instant out of range — is ``ValidationFailed``."""
    if cursor is None:
        return None
    key = _parse(kind, cursor)
    if key is None:
        raise ValidationFailed([FieldError(field, CURSOR,
                                           "not a cursor of this list: pass next_before from the previous page")])
    return key


def _parse(kind: str, cursor: str) -> Key | None:
    if not 0 < len(cursor) <= CURSOR_MAX_CHARS or not _BASE64URL.fullmatch(cursor):
        return None
    try:
        plain = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except (binascii.Error, ValueError):
        return None
    match = _PLAIN.fullmatch(plain)
    if match is None or match["kind"] != kind:
        return None
    try:
        at = _EPOCH + timedelta(microseconds=int(match["micros"]))
    except OverflowError:
        return None
    return Key(at, UUID(hex=match["id"]))


def check_limit(limit: int, *, field: str = "limit") -> int:
    """``limit`` when it is 1..``LIMIT_MAX``, else ``ValidationFailed`` naming ``field`` (min / max)."""
    if limit < 1:
        raise ValidationFailed([FieldError(field, MIN, "give at least 1")])
    if limit > LIMIT_MAX:
        raise ValidationFailed([FieldError(field, MAX, f"give at most {LIMIT_MAX}")])
    return limit


def cut(kind: str, rows: Sequence[T], limit: int, key: Callable[[T], Key]) -> tuple[list[T], str | None]:
    """A page from the ``limit + 1`` rows a query fetched: the first ``limit`` and, when there was one
    more, the cursor after the last of them (else None: the list ends here)."""
    page = list(rows[:limit])
    if len(rows) <= limit or not page:
        return page, None
    return page, encode(kind, key(page[-1]))
