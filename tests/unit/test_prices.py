"""Model prices (kairos.budgets.price_per_million): a model's name matched case-folded, a dated or
versioned snapshot at its model's price, ``"*"`` for the rest, and without ``"*"`` the highest price
listed, never nothing."""

from __future__ import annotations

import pytest

from kairos.budgets import price, price_per_million
from kairos.settings import Settings

PRICES = {"gpt-4o": (2.5, 10.0), "Claude-3-5-Sonnet": (3.0, 15.0), "anthropic.claude-3-haiku": (0.25, 1.25),
          "cheap": (0.1, 0.2)}


@pytest.mark.parametrize(("model", "expected"), [
    ("gpt-4o", (2.5, 10.0)),
    ("GPT-4o", (2.5, 10.0)),
    ("\tGPT-4O \n", (2.5, 10.0)),
    ("gpt-4o-2024-08-06", (2.5, 10.0)),
    ("gpt-4o@2024-08-06", (2.5, 10.0)),
    ("claude-3-5-sonnet", (3.0, 15.0)),
    ("claude-3-5-sonnet-20240620", (3.0, 15.0)),
    ("claude-3-5-sonnet-20240620-v1:0", (3.0, 15.0)),
    ("anthropic.claude-3-haiku-20240307-v1:0", (0.25, 1.25)),
    ("gpt-4o-mini", (3.0, 15.0)),  # another model, not a snapshot: unknown, so the highest price
    ("gpt-4o-2024", (3.0, 15.0)),  # not a date
    ("mystery", (3.0, 15.0)),
    (None, (3.0, 15.0)),
])
def test_a_model_costs_its_price_whatever_its_spelling_and_an_unknown_one_the_highest(
        model: object, expected: tuple[float, float]) -> None:
    assert price_per_million(PRICES, model) == expected


def test_the_star_entry_prices_every_model_not_named() -> None:
    prices = {**PRICES, "*": (1.0, 1.0)}
    assert price_per_million(prices, "Mystery-2024-01-01") == (1.0, 1.0)
    assert price_per_million(prices, "CHEAP-2024-01-01") == (0.1, 0.2)


def test_two_spellings_of_one_name_take_the_higher_price_and_no_prices_cost_nothing() -> None:
    assert price_per_million({"m": (1.0, 5.0), "M": (2.0, 3.0)}, "m") == (2.0, 5.0)
    assert price_per_million({}, "anything") == (0.0, 0.0)


def test_price_charges_per_million_tokens() -> None:
    settings = Settings(model_prices={"pricey": (100.0, 1000.0)})
    assert price(settings, "Pricey-2024-08-06", 1_000, 1_000) == pytest.approx(1.1)
