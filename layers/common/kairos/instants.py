"""How Kairos writes an instant, and the range of instants it accepts.

``rfc3339`` is the one writer every API time goes through: RFC 3339 in UTC with ``Z``. Its own
module (``kairos.calendar`` re-exports it) so that modules which only *write* times — conversations,
schedule listings — do not import the calendar, whose evaluator (and its import and compile time)
only the paths that compute fires need.

``EARLIEST`` .. ``LATEST`` is the range an instant given by a caller (a schedule's ``starts_at`` /
``ends_at``, a preview's ``after``) must fall in. Far beyond it, converting an offset time to UTC
overflows (``9999-12-31T23:59:59-01:00``) and the calendar's look-ahead runs out of years; nothing a
schedule means lies outside it. ``out_of_range`` compares without converting, so it never overflows.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kairos.errors import MAX, MIN, FieldError

EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)


def rfc3339(instant: datetime) -> str:
    """A UTC instant as the API writes every time: RFC 3339 with ``Z`` (``2026-03-08T07:00:00Z``)."""
    return instant.astimezone(UTC).isoformat().replace("+00:00", "Z")


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
