"""The executor registry: an agent's ``executor`` name to the object that runs its calls.

``get(name, settings=…)`` builds the executor for one name; an unknown name is
``ExecutorError("agent_invalid")``. Executor modules are imported on first use so a worker that only
runs ``echo`` or ``openai`` agents never pays boto3's import time for ``bedrock``. The contract every
executor keeps is in ``kairos.executors.base``; the names and what each executor can do are in
``kairos.executors.catalog``.
"""

from __future__ import annotations

import importlib
from typing import cast

from kairos.executors.base import Executor, ExecutorError
from kairos.executors.catalog import CATALOG
from kairos.executors.catalog import NAMES as NAMES
from kairos.settings import Settings


def get(name: str, *, settings: Settings) -> Executor:
    """The executor called ``name``, configured from ``settings`` (egress allow list)."""
    entry = CATALOG.get(name)
    if entry is not None:
        cls = getattr(importlib.import_module(f"kairos.executors.{entry.module}"), entry.cls)
        return cast(Executor, cls(allow=settings.egress_allow) if entry.egress else cls())
    raise ExecutorError("agent_invalid", f"agent.executor {name!r} is unknown; use one of: {', '.join(NAMES)}")
