"""The keyset cursor (``kairos.pages``): it round-trips exactly, names its list, and refuses anything else by rule."""

from __future__ import annotations

import base64
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from kairos import pages
from kairos.errors import ValidationFailed

ID = uuid.UUID("0b8f6a4e-3c1d-4f6e-9a53-2f1d8c7b6a01")


@pytest.mark.parametrize("at", [
    datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC),
    datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    datetime(2026, 3, 29, 3, 30, tzinfo=UTC) + timedelta(microseconds=1),
    datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
])
def test_a_cursor_round_trips_to_the_microsecond(at: datetime) -> None:
    cursor = pages.encode("runs", pages.Key(at, ID))
    assert pages.decode("runs", cursor) == pages.Key(at, ID)
    assert cursor.isascii() and "=" not in cursor and len(cursor) <= pages.CURSOR_MAX_CHARS


def test_an_offset_instant_is_the_same_key_in_utc() -> None:
    from zoneinfo import ZoneInfo

    berlin = datetime(2026, 3, 1, 13, 0, tzinfo=ZoneInfo("Europe/Berlin"))
    assert pages.decode("runs", pages.encode("runs", pages.Key(berlin, ID))) == pages.Key(berlin, ID)


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


@pytest.mark.parametrize("cursor", [
    "", "not a cursor", "%%%", "A" * 200,
    pages.encode("occurrences", pages.Key(datetime(2026, 1, 1, tzinfo=UTC), ID)),  # another list's
    _b64(f"runs:1767225600000000:{ID.hex}") + "\n",
    _b64(f"runs:1767225600000000:{ID.hex}x"),
    _b64(f"runs:9999999999999999999:{ID.hex}"),  # beyond year 9999
    _b64(f"runs:12.5:{ID.hex}"),
    _b64("runs:1767225600000000"),
    _b64("\xff\xfe"),
])
def test_anything_else_is_refused_naming_before_and_the_cursor_rule(cursor: str) -> None:
    with pytest.raises(ValidationFailed) as refused:
        pages.decode("runs", cursor)
    assert [(f.field, f.rule) for f in refused.value.fields] == [("before", "cursor")]


def test_no_cursor_is_the_first_page() -> None:
    assert pages.decode("runs", None) is None


@pytest.mark.parametrize(("limit", "rule"), [(0, "min"), (-1, "min"), (101, "max")])
def test_a_limit_outside_1_to_100_is_refused(limit: int, rule: str) -> None:
    with pytest.raises(ValidationFailed) as refused:
        pages.check_limit(limit)
    assert [(f.field, f.rule) for f in refused.value.fields] == [("limit", rule)]
    assert pages.check_limit(1) == 1 and pages.check_limit(100) == 100


def test_cut_gives_a_cursor_only_when_a_row_was_left_over() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [pages.Key(at, uuid.UUID(int=n)) for n in (5, 4, 3)]
    page, cursor = pages.cut("runs", rows, 2, lambda k: k)
    assert page == rows[:2] and pages.decode("runs", cursor) == rows[1]
    assert pages.cut("runs", rows, 3, lambda k: k) == (rows, None)
    assert pages.cut("runs", [], 3, lambda k: k) == ([], None)
