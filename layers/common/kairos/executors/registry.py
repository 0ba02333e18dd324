"""The executor registry: an agent's ``executor`` name to the object that runs its calls.

``get(name, settings=…)`` builds the executor for one name; an unknown name is
``ExecutorError("agent_invalid")``. Executor modules are imported on first use so a worker that only
runs ``echo`` or ``openai`` agents never pays boto3's import time for ``bedrock``. The contract every
executor keeps is in ``kairos.executors.base``.
"""

from __future__ import annotations

from kairos.executors.base import Executor, ExecutorError
from kairos.settings import Settings

NAMES: tuple[str, ...] = ("bedrock", "echo", "http", "openai")


def get(name: str, *, settings: Settings) -> Executor:
    """The executor called ``name``, configured from ``settings`` (egress allow list)."""
    if name == "echo":
        from kairos.executors.echo import EchoExecutor

        return EchoExecutor()
    if name == "openai":
        from kairos.executors.openai import OpenAIExecutor

        return OpenAIExecutor(allow=settings.egress_allow)
    if name == "http":
        from kairos.executors.http import HttpExecutor

        return HttpExecutor(allow=settings.egress_allow)
    if name == "bedrock":
        from kairos.executors.bedrock import BedrockExecutor

        return BedrockExecutor()
    raise ExecutorError("agent_invalid", f"agent.executor {name!r} is unknown; use one of: {', '.join(NAMES)}")
