"""How Kairos writes an instant, and the range of instants it accepts.

``rfc3339`` is the one writer every API time goes through: RFC 3339 in UTC with ``Z``. Its own
module (``kairos.calendar`` re-exports it) so that modules which only *write* times — conversations,
schedule listings — do not import the calendar, whose evaluator (and its import and compile time)
only the paths that compute fires need.

``RFC3339Instant`` and ``IsoDay`` are what a caller's instant and UTC day must look like where the API
documents RFC 3339 (a preview's ``after``, a backfill's ``from`` / ``until``) or ``YYYY-MM-DD`` (usage):
that text, and nothing pydantic would also take (unix seconds, a bare number, a date for an instant).

``EARLIEST`` .. ``LATEST`` is the range an instant given by a caller (a schedule's ``starts_at`` /
``ends_at``, a preview's ``after``) must fall in. Far beyond it, converting an offset time to UTC
overflows (``9999-12-31T23:59:59-01:00``) and the calendar's look-ahead runs out of years; nothing a
schedule means lies outside it. ``out_of_range`` compares without converting, so it never overflows.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from typing import Annotated

from pydantic import AwareDatetime, BeforeValidator
from pydantic_core import PydanticCustomError

from kairos.errors import MAX, MIN, TYPE, FieldError

EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)


def rfc3339(instant: datetime) -> str:
    """A UTC instant as the API writes every time: RFC 3339 with ``Z`` (``2026-03-08T07:00:00Z``)."""
    return instant.astimezone(UTC).isoformat().replace("+00:00", "Z")


def iso_text(value: datetime) -> str:
    """``value.isoformat()``, remembered, for statement parameters PostgreSQL parses (never for the API's
    text): a tick writes the same few instants — its batch's cursor, the fires' minute, their wall
    times — into every row of a batch of 500. Two equal aware values in different offsets share the
    first one's text, which names the same instant. The key holds ``fold``: Python compares two values
    of one zone by their wall time alone, so 01:30 EDT equals 01:30 EST (an hour later) but for it."""
    return _iso_text(value, value.fold)


@lru_cache(maxsize=4096)
def _iso_text(value: datetime, fold: int) -> str:
    return value.isoformat()


def offset_text(delta: timedelta) -> str:
    """A UTC offset as the API writes it: ``+02:00``, ``-03:30`` (seconds only when there are some)."""
    seconds = int(delta.total_seconds())
    sign = "-" if seconds < 0 else "+"
    seconds = abs(seconds)
    text = f"{sign}{seconds // 3600:02d}:{seconds % 3600 // 60:02d}"
    return text + (f":{seconds % 60:02d}" if seconds % 60 else "")


def out_of_range(instant: datetime, field: str) -> FieldError | None:
    """``min`` / ``max`` naming ``field`` when an aware instant lies outside [EARLIEST, LATEST], else None."""
    if EARLIEST <= instant <= LATEST:
        return None
    message = f"give a time between {rfc3339(EARLIEST)} and {rfc3339(LATEST)}"
    return FieldError(field, MIN if instant < EARLIEST else MAX, message)


# RFC 3339's date-time: full date, time, optional fraction, and an offset (Z or +hh:mm). A missing
# offset passes this shape check so that it is named as such (``timezone_aware``) by AwareDatetime.
_RFC3339 = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?"
                      r"(?:[Zz]|[+-][0-9]{2}:[0-9]{2})?")
_DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
RFC3339_HINT = "give an RFC 3339 time with an offset, e.g. 2030-01-01T07:00:00Z"
DAY_HINT = "give a day as YYYY-MM-DD, e.g. 2030-01-01"


def _rfc3339_only(value: object) -> object:
    """Text in RFC 3339's shape (pydantic then parses it), or an aware datetime from a Python caller."""
    if isinstance(value, datetime) or (isinstance(value, str) and _RFC3339.fullmatch(value)):
        return value
    raise PydanticCustomError(TYPE, RFC3339_HINT)


def _day_only(value: object) -> object:
    if isinstance(value, date) or (isinstance(value, str) and _DAY.fullmatch(value)):
        return value
    raise PydanticCustomError(TYPE, DAY_HINT)


RFC3339Instant = Annotated[AwareDatetime, BeforeValidator(_rfc3339_only)]
IsoDay = Annotated[date, BeforeValidator(_day_only)]
