"""Settings read from the environment: ``KAIROS_RETENTION_DAYS`` (default, bounds, a clear refusal)."""

from __future__ import annotations

import pytest
from kairos.settings import DEFAULT_RETENTION_DAYS, MAX_RETENTION_DAYS, SettingInvalid, Settings


def test_retention_defaults_to_thirty_days_when_unset_or_empty() -> None:
    assert DEFAULT_RETENTION_DAYS == 30
    assert Settings.from_env({}).retention_days == 30
    assert Settings.from_env({"KAIROS_RETENTION_DAYS": "  "}).retention_days == 30
    assert Settings().retention_days == 30


@pytest.mark.parametrize(("raw", "days"), [("1", 1), ("7", 7), (" 90 ", 90), (str(MAX_RETENTION_DAYS), 3650)])
def test_retention_takes_whole_days_within_bounds(raw: str, days: int) -> None:
    assert Settings.from_env({"KAIROS_RETENTION_DAYS": raw}).retention_days == days


@pytest.mark.parametrize("raw", ["0", "-1", "3651", "1.5", "30d", "thirty", "1e3", "\u0663\u0660"])
def test_a_retention_that_means_nothing_is_refused_naming_the_variable_and_the_rule(raw: str) -> None:
    with pytest.raises(SettingInvalid) as refused:
        Settings.from_env({"KAIROS_RETENTION_DAYS": raw})
    assert refused.value.name == "KAIROS_RETENTION_DAYS"
    assert str(refused.value) == (
        f"KAIROS_RETENTION_DAYS must be a whole number of days from 1 to 3650, got {raw!r}")
    assert isinstance(refused.value, ValueError)
