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


# --- per-owner budgets --------------------------------------------------------------------------------


def test_budgets_default_to_the_design_values() -> None:
    settings = Settings.from_env({})
    assert (settings.owner_concurrency, settings.owner_queue_max) == (4, 200)
    assert (settings.owner_daily_tokens, settings.owner_daily_cost_usd) == (2_000_000, 50.0)
    assert settings.model_prices == {}
    assert Settings() == settings


def test_budgets_are_read_from_the_environment() -> None:
    settings = Settings.from_env({
        "KAIROS_OWNER_CONCURRENCY": " 2 ", "KAIROS_OWNER_QUEUE_MAX": "10", "KAIROS_OWNER_DAILY_TOKENS": "5000",
        "KAIROS_OWNER_DAILY_COST_USD": "2.5",
        "KAIROS_MODEL_PRICES": '{"gpt-4o-mini": [0.15, 0.6], "*": [1, 2]}'})
    assert (settings.owner_concurrency, settings.owner_queue_max, settings.owner_daily_tokens) == (2, 10, 5000)
    assert settings.owner_daily_cost_usd == 2.5
    assert settings.model_prices == {"gpt-4o-mini": (0.15, 0.6), "*": (1.0, 2.0)}


@pytest.mark.parametrize(("name", "raw"), [
    ("KAIROS_OWNER_CONCURRENCY", "0"), ("KAIROS_OWNER_CONCURRENCY", "four"), ("KAIROS_OWNER_CONCURRENCY", "1001"),
    ("KAIROS_OWNER_QUEUE_MAX", "-5"), ("KAIROS_OWNER_QUEUE_MAX", "2.5"), ("KAIROS_OWNER_DAILY_TOKENS", "1e6"),
    ("KAIROS_OWNER_DAILY_TOKENS", "_"), ("KAIROS_OWNER_DAILY_COST_USD", "0"), ("KAIROS_OWNER_DAILY_COST_USD", "nan"),
    ("KAIROS_OWNER_DAILY_COST_USD", "inf"), ("KAIROS_OWNER_DAILY_COST_USD", "$5"),
    ("KAIROS_MODEL_PRICES", "not json"), ("KAIROS_MODEL_PRICES", "[1, 2]"), ("KAIROS_MODEL_PRICES", '{"m": 1}'),
    ("KAIROS_MODEL_PRICES", '{"m": [1]}'), ("KAIROS_MODEL_PRICES", '{"m": [1, -2]}'),
    ("KAIROS_MODEL_PRICES", '{"m": [1, "2"]}'), ("KAIROS_MODEL_PRICES", '{"m": [true, 2]}'),
    ("KAIROS_MODEL_PRICES", '{"": [1, 2]}'),
])
def test_a_budget_that_means_nothing_is_refused_naming_the_variable(name: str, raw: str) -> None:
    with pytest.raises(SettingInvalid) as refused:
        Settings.from_env({name: raw})
    assert refused.value.name == name
    assert str(refused.value).startswith(f"{name} must be ")


def test_the_limit_caps_have_defaults_and_are_read_from_the_environment() -> None:
    default = Settings.from_env({})
    assert (default.max_runtime_seconds, default.max_attempts, default.max_steps,
            default.max_rate_per_minute) == (840, 10, 64, 600)
    read = Settings.from_env({"KAIROS_MAX_RUNTIME_SECONDS": "120", "KAIROS_MAX_ATTEMPTS": "4",
                              "KAIROS_MAX_STEPS": "12", "KAIROS_MAX_RATE_PER_MINUTE": "30"})
    assert (read.max_runtime_seconds, read.max_attempts, read.max_steps, read.max_rate_per_minute) == (120, 4, 12, 30)


@pytest.mark.parametrize(("name", "raw"), [
    ("KAIROS_MAX_RUNTIME_SECONDS", "900"), ("KAIROS_MAX_RUNTIME_SECONDS", "0"), ("KAIROS_MAX_ATTEMPTS", "many"),
    ("KAIROS_MAX_STEPS", "257"), ("KAIROS_MAX_RATE_PER_MINUTE", "-1"),
])
def test_a_limit_cap_that_means_nothing_is_refused_naming_the_variable(name: str, raw: str) -> None:
    with pytest.raises(SettingInvalid) as refused:
        Settings.from_env({name: raw})
    assert refused.value.name == name
