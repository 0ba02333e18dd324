"""The library never checks a must-be-there value with ``assert <x> is not None``.

An assert vanishes under ``python -O`` and says nothing a reader of a log can act on. A row a named
query must return is read with ``db.fetch_row`` / ``db.expect_row`` (``MissingRow`` names the query);
any other value the code's own invariant sets is checked with an ``if … is None: raise``."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "layers/common/kairos"


def _is_not_none(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Compare) and any(isinstance(op, ast.IsNot) for op in n.ops)
               and any(isinstance(c, ast.Constant) and c.value is None for c in n.comparators)
               for n in ast.walk(node))


def _none_asserts(source: str, name: str) -> list[str]:
    tree = ast.parse(source, filename=name)
    return [f"{name}:{node.lineno}" for node in ast.walk(tree)
            if isinstance(node, ast.Assert) and _is_not_none(node.test)]


def test_the_scan_finds_such_an_assert() -> None:
    found = _none_asserts("def f(row):\n    if row:\n        assert row is not None and row['x'] is not None\n", "x.py")
    assert found == ["x.py:3"]
    assert _none_asserts("assert isinstance(x, str)\nif x is not None:\n    pass\n", "y.py") == []


def test_no_module_of_the_library_asserts_a_value_is_not_none() -> None:
    found = [hit for path in sorted(PACKAGE.rglob("*.py"))
             for hit in _none_asserts(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE)))]
    assert found == [], "use db.fetch_row / db.expect_row for rows, else `if x is None: raise …`: " + ", ".join(found)
