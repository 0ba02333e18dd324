"""The executor catalog: every executor's name and what it can do, in one table.

Role: ``CATALOG`` is the one list of executors. Everything else that names executors is derived
from it: the registry's ``NAMES`` and the class it builds (``kairos.executors.registry``), the
executors whose models call tools (``kairos.executors.base.TOOL_EXECUTORS``), the executors that send
the transcript to a model (``kairos.execution.execute.MODEL_EXECUTORS``), the fields each executor needs
(``kairos.agents.EXECUTOR_NEEDS``) and the agent model's ``executor`` type. Adding an executor is its
module plus one row here; ``tests/unit/test_executors_registry.py`` fails on a second list.

Guarantees: importing this module imports nothing of ``kairos`` and no executor module, so the
agent model, the worker and the registry read it without loading boto3 or the network code.

Must not: hold configuration or build executors (that is the registry's job).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    """One executor: where its class lives and what it can do."""

    module: str  # under kairos.executors, imported on first use
    cls: str
    needs: tuple[str, ...] = ()  # agent fields it cannot work without (checked when the agent is written)
    model_call: bool = False  # sends the transcript to a model: its input is bounded by max_input_tokens
    tools: bool = False  # its model calls tools: an agent's ``tools`` and a loop need it
    egress: bool = False  # calls out through kairos.executors.egress: built with the egress allow list


# In the order the agent model's ``executor`` type lists them (pydantic's literal_error names them so).
CATALOG: dict[str, Entry] = {
    "openai": Entry("openai", "OpenAIExecutor", needs=("model", "base_url"), model_call=True, tools=True,
                    egress=True),
    "bedrock": Entry("bedrock", "BedrockExecutor", needs=("model",), model_call=True, tools=True),
    "http": Entry("http", "HttpExecutor", needs=("base_url",), egress=True),
    "echo": Entry("echo", "EchoExecutor"),
}

NAMES: tuple[str, ...] = tuple(sorted(CATALOG))
TOOL_EXECUTORS: frozenset[str] = frozenset(name for name, entry in CATALOG.items() if entry.tools)
MODEL_EXECUTORS: frozenset[str] = frozenset(name for name, entry in CATALOG.items() if entry.model_call)
EXECUTOR_NEEDS: dict[str, tuple[str, ...]] = {name: entry.needs for name, entry in CATALOG.items()}
