"""Every metric name the code emits is in ``kairos.observability.METRIC_NAMES`` and in the metric table
of docs/operations.md, and nothing is listed that the code never emits.

The code is read, not run: every ``add_metric(name=...)``, every ``count(...)`` of ``kairos.runs.moves``
and the two places that pass a metric name on (``moves._end``'s ``metric`` and the claim's
``_REFUSAL_METRICS``). A metric name that is not a literal anywhere else fails the scan, so a new
indirection has to be added here rather than slip past it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from kairos.observability import METRIC_NAMES

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*(ROOT / "layers/common/kairos").rglob("*.py"), *(ROOT / "functions").rglob("*.py")])

# Calls that take a metric name, and the position of that name when passed positionally.
_NAME_ARGUMENT = {"add_metric": ("name", None), "count": ("name", 0), "_end": ("metric", 7)}
# Where a non-literal name is allowed, because its literals are scanned elsewhere: (module, expression).
_FORWARDED = {
    ("kairos/runs/moves.py", "name"),  # count(name): its callers pass literals
    ("kairos/runs/moves.py", "metric"),  # _end(..., metric, ...): its callers pass literals
    ("kairos/execution/claim.py", "_REFUSAL_METRICS[state]"),  # the dict's values are scanned
    ("kairos/observability.py", "name"),  # EmfProvider.add_metric passes its callers' names on to Powertools'
}


def _callee(node: ast.Call, module: str) -> str | None:
    """The metric call this is, if any: ``count`` only as ``moves.count`` or inside kairos.runs.moves
    (a list's or a string's ``count`` is not a metric)."""
    func = node.func
    if isinstance(func, ast.Attribute):
        if func.attr == "count" and not (isinstance(func.value, ast.Name) and func.value.id == "moves"):
            return None
        return func.attr
    if isinstance(func, ast.Name):
        if func.id in ("count", "_end") and module != "kairos/runs/moves.py":
            return None
        return func.id
    return None


def _emitted() -> tuple[set[str], list[str]]:
    names: set[str] = set()
    unknown: list[str] = []
    for path in SOURCES:
        module = path.relative_to(ROOT / "layers/common" if "layers" in path.parts else ROOT).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AnnAssign) else []
            value = getattr(node, "value", None)
            if isinstance(value, ast.Dict) and any(isinstance(t, ast.Name) and t.id.endswith("_METRICS")
                                                   for t in targets):
                names |= {v.value for v in value.values if isinstance(v, ast.Constant) and isinstance(v.value, str)}
            callee = _callee(node, module) if isinstance(node, ast.Call) else None
            if not isinstance(node, ast.Call) or callee not in _NAME_ARGUMENT:
                continue
            keyword, position = _NAME_ARGUMENT[callee]
            argument = next((k.value for k in node.keywords if k.arg == keyword), None)
            if argument is None and position is not None and len(node.args) > position:
                argument = node.args[position]
            if argument is None:
                continue
            if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                names.add(argument.value)
            elif (module, ast.unparse(argument)) not in _FORWARDED:
                unknown.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
    return names, unknown


def _documented() -> set[str]:
    text = (ROOT / "docs/operations.md").read_text(encoding="utf-8")
    table = re.search(r"^\| metric \| from \| meaning \|\n((?:\|.*\n)+)", text, re.M)
    assert table is not None, "docs/operations.md has no metric table"
    return {name for row in table[1].splitlines() for name in re.findall(r"`(\w+)`", row.split("|")[1])}


def test_the_scan_finds_the_metrics_it_is_meant_to_find() -> None:
    names, _ = _emitted()
    # one of each route: add_metric, moves.count, _end's argument, the refusal table
    assert {"FiresDispatched", "Claims", "RunFailed", "RunExpired"} <= names


def test_every_metric_name_is_a_literal_the_scan_can_read() -> None:
    _, unknown = _emitted()
    assert unknown == []


def test_metric_names_lists_exactly_what_the_code_emits() -> None:
    names, _ = _emitted()
    assert sorted(names - METRIC_NAMES) == [], "emitted but not in METRIC_NAMES"
    assert sorted(METRIC_NAMES - names) == [], "in METRIC_NAMES but never emitted"


def test_the_operations_metric_table_lists_exactly_metric_names() -> None:
    documented = _documented()
    assert sorted(METRIC_NAMES - documented) == [], "not in docs/operations.md's metric table"
    assert sorted(documented - METRIC_NAMES) == [], "in docs/operations.md but not in METRIC_NAMES"
