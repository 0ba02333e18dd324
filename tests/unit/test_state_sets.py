"""State sets live in ``kairos.states``: no module spells a set of state values as string literals.

A tuple, list or set literal (also the inside of a ``Literal[...]``) of two or more strings that are all
values of one ``StrEnum`` of ``kairos.states`` is a second copy of that state set: it goes stale when
the enum changes. Outside ``states.py`` a module derives the set from the enum
(``tuple(s.value for s in ApprovalState)``) or names the members (``(RunState.QUEUED, RunState.RUNNING)``).
"""

from __future__ import annotations

import ast
import enum
from pathlib import Path

from kairos import states

PACKAGE = Path(states.__file__).resolve().parent
ENUMS: dict[str, frozenset[str]] = {
    value.__name__: frozenset(member.value for member in value)
    for value in vars(states).values()
    if isinstance(value, type) and issubclass(value, enum.StrEnum) and value.__module__ == states.__name__
}


def _state_literals(tree: ast.AST) -> list[tuple[int, str, list[str]]]:
    """(line, enum name, values) for each literal collection whose strings all belong to one enum."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Tuple, ast.List, ast.Set)) or len(node.elts) < 2:
            continue
        if not all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
            continue
        values = [e.value for e in node.elts if isinstance(e, ast.Constant)]
        owner = next((name for name, members in ENUMS.items() if set(values) <= members), None)
        if owner is not None:
            found.append((node.lineno, owner, values))
    return found


def test_the_scan_sees_a_state_set_spelled_as_literals() -> None:
    tree = ast.parse('STATES = ("pending", "approved", "denied")\nok = ("pending", "tea")\n'
                     'State = Literal["queued", "running"]\n')
    assert [(line, name) for line, name, _ in _state_literals(tree)] == [(1, "ApprovalState"), (3, "RunState")]


def test_no_module_outside_states_spells_a_state_set() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "states.py":
            continue
        for line, name, values in _state_literals(ast.parse(path.read_text(encoding="utf-8"))):
            found.append(f"{path.relative_to(PACKAGE)}:{line}: {values} (kairos.states.{name})")
    assert not found, "state sets spelled outside kairos/states.py; derive them from the enum:\n" + "\n".join(found)


def test_the_derived_state_sets_follow_their_enums() -> None:
    import typing

    from kairos import approvals, input_requests
    from kairos.api.routes import approvals as approval_routes
    from kairos.api.routes import input_requests as input_request_routes
    from kairos.execution.corpus import phases

    assert approvals.STATES == tuple(s.value for s in states.ApprovalState)
    assert typing.get_args(approval_routes.State) == approvals.STATES
    assert typing.get_args(input_request_routes.State) == input_requests.STATES
    assert phases.PHASES == tuple(p.value for p in states.CorpusPhase)
