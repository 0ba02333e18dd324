"""``kairos.instants.iso_text``: the remembered ``isoformat`` the tick's statement parameters go through."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from kairos import instants
from kairos.instants import iso_text


def test_a_remembered_text_is_the_text_of_an_equal_value() -> None:
    """A wall time (naive) never takes an instant's text, nor one wall time another's; an instant given
    in another offset may take the first one's text, which names the same instant."""
    instants._iso_text.cache_clear()
    instant = datetime(2026, 3, 2, 7, 0, tzinfo=UTC)
    assert iso_text(instant) == "2026-03-02T07:00:00+00:00"
    assert iso_text(datetime(2026, 3, 2, 7, 0)) == "2026-03-02T07:00:00"
    assert iso_text(datetime(2026, 3, 2, 7, 1)) == "2026-03-02T07:01:00"
    assert iso_text(datetime(2026, 3, 2, 7, 0, 0, 1, tzinfo=UTC)) == "2026-03-02T07:00:00.000001+00:00"
    berlin = instant.astimezone(timezone(timedelta(hours=1)))
    assert datetime.fromisoformat(iso_text(berlin)) == berlin
    assert instants._iso_text.cache_info().hits == 1  # the Berlin reading of the same instant


def test_the_two_passes_through_a_repeated_wall_time_keep_their_own_offsets() -> None:
    """A connection whose session zone is not UTC reads timestamptz values in that zone: 01:30 EDT and
    01:30 EST (an hour later) then differ only by ``fold``, and Python holds them equal."""
    instants._iso_text.cache_clear()
    new_york = ZoneInfo("America/New_York")
    first = datetime(2026, 11, 1, 5, 30, tzinfo=UTC).astimezone(new_york)
    second = datetime(2026, 11, 1, 6, 30, tzinfo=UTC).astimezone(new_york)
    assert first == second and (first.fold, second.fold) == (0, 1)  # what a memo by value alone would merge
    assert iso_text(first) == "2026-11-01T01:30:00-04:00"
    assert iso_text(second) == "2026-11-01T01:30:00-05:00"
