"""Fixtures of the database tests: the API driven in-process (``api``) and a local OpenAI server."""

from tests.support.api import api_fixture  # noqa: F401 - the api fixture
from tests.support.executors import fake_openai  # noqa: F401 - the fake_openai fixture
