"""Fixtures of the console's browser tests (``tests/support/browser.py``; ``api`` for the OIDC sign-in,
which serves the API in-process on the test's own database)."""

from tests.support.api import api_fixture  # noqa: F401 - the api fixture
from tests.support.browser import browser, model, page, provider, stack  # noqa: F401 - the fixtures
