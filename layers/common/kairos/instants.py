"""How Kairos writes an instant: RFC 3339 in UTC with ``Z`` — the one writer every API time goes through.

Its own module (``kairos.calendar`` re-exports it) so that modules which only *write* times —
conversations, schedule listings — do not import the calendar, whose evaluator (and its import and
compile time) only the paths that compute fires need.
"""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339(instant: datetime) -> str:
    """A UTC instant as the API writes every time: RFC 3339 with ``Z`` (``2026-03-08T07:00:00Z``)."""
    return instant.astimezone(UTC).isoformat().replace("+00:00", "Z")
