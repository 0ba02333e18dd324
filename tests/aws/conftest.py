"""Fixtures of the handler tests: the API driven in-process (``api``), for tests that create through it."""

from tests.support.api import api_fixture  # noqa: F401 - the api fixture
