"""The API models' bounds are the library's constants, not copies of them: the OpenAPI document and
the request validation promise what the library enforces (``kairos.api.models``'s docstring)."""

from __future__ import annotations

import ast
from pathlib import Path

import annotated_types
import pytest
from pydantic import BaseModel

from kairos import conversations, input_requests
from kairos.api import models
from kairos.schedules import loop_policy
from kairos.schedules.request import PAUSE_REASON_MAX

# (model, field, bound) -> the library constant it must equal
BOUNDS: list[tuple[type[BaseModel], str, type, int]] = [
    (models.ConversationCreate, "title", annotated_types.MaxLen, conversations.TITLE_MAX),
    (models.LoopGoal, "outcome", annotated_types.MaxLen, loop_policy.OUTCOME_MAX),
    (models.LoopGoal, "constraints", annotated_types.MaxLen, loop_policy.CONSTRAINTS_MAX),
    (models.LoopGoal, "verification", annotated_types.MaxLen, loop_policy.VERIFICATION_MAX),
    (models.LoopCreate, "max_occurrences", annotated_types.Le, loop_policy.MAX_OCCURRENCES),
    (models.InputAnswer, "answer", annotated_types.MaxLen, input_requests.ANSWER_MAX),
    (models.PauseRequest, "reason", annotated_types.MaxLen, PAUSE_REASON_MAX),
]


def _bound(model: type[BaseModel], field: str, kind: type) -> int:
    found = [m for m in model.model_fields[field].metadata if isinstance(m, kind)]
    assert len(found) == 1, f"{model.__name__}.{field} has no {kind.__name__}"
    value = getattr(found[0], "max_length", None) if kind is annotated_types.MaxLen else getattr(found[0], "le", None)
    assert isinstance(value, int)
    return value


@pytest.mark.parametrize(("model", "field", "kind", "constant"), BOUNDS,
                         ids=[f"{m.__name__}.{f}" for m, f, _, _ in BOUNDS])
def test_each_bound_is_its_library_constant(model: type[BaseModel], field: str, kind: type, constant: int) -> None:
    assert _bound(model, field, kind) == constant


def test_the_goal_model_and_the_library_goal_agree_on_every_field() -> None:
    """``LoopGoal`` documents ``goals.policy.Goal``: the same fields."""
    assert set(models.LoopGoal.model_fields) == set(loop_policy.Goal.model_fields)


def test_no_bound_is_written_as_a_number() -> None:
    """A literal bound (``max_length=2_000``) is a second copy of a library limit; 0 and 1 are not limits."""
    source = Path(models.__file__).read_text(encoding="utf-8")
    literals = [
        f"line {node.lineno}: {kw.arg}={kw.value.value}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Field"
        for kw in node.keywords
        if kw.arg in ("max_length", "min_length", "le", "lt", "ge", "gt")
        and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, int) and kw.value.value > 1
    ]
    assert literals == []
