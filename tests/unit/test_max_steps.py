"""A tool loop's step limits have one definition (``kairos.executors.base``): the agent model's bound
and the loop's bound are that constant, never a second copy of it."""

from __future__ import annotations

import ast
from pathlib import Path

import annotated_types

from kairos import agents
from kairos.executors import base


def test_max_steps_is_defined_once() -> None:
    package = Path(base.__file__).resolve().parents[1]
    defined: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            for target in targets:
                if isinstance(target, ast.Name) and target.id.startswith("MAX_STEPS_"):
                    defined.setdefault(target.id, []).append(str(path.relative_to(package)))
    assert defined == {"MAX_STEPS_DEFAULT": ["executors/base.py"], "MAX_STEPS_CAP": ["executors/base.py"]}


def test_the_agent_model_bounds_max_steps_by_the_cap() -> None:
    bounds = [m.le for m in agents.AgentConfig.model_fields["max_steps"].metadata if isinstance(m, annotated_types.Le)]
    assert bounds == [base.MAX_STEPS_CAP]
    assert base.MAX_STEPS_DEFAULT <= base.MAX_STEPS_CAP
