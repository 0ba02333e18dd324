"""Fixtures of the end-to-end tests: the API driven in-process (``api``)."""

from tests.support.api import api_fixture  # noqa: F401 - the api fixture
