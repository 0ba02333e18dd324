"""Fixtures of the console's browser tests (``tests/support/browser.py``)."""

from tests.support.browser import browser, model, page, stack  # noqa: F401 - the fixtures
