"""The library's dependencies run one way: no import cycle between kairos modules.

Every import counts — at module level, inside a function (the lazy imports that keep cold starts
short) and under ``TYPE_CHECKING`` — because a cycle is a design fault whether or not Python happens
to resolve it at run time. A package's ``__init__`` counts as the package, and ``from kairos.p import m``
depends on package ``kairos.p`` as well as on module ``kairos.p.m`` (Python runs ``kairos.p``'s
``__init__`` first, and that is how other tools read it too): a package's ``__init__`` that imports its
own submodules, lazily or not, while they import a sibling through it, is a cycle (the executor
registry once was; it now lives in ``kairos.executors.registry``).
"""

from __future__ import annotations

import ast

from tests.support.imports import PACKAGE, graph, imports_of


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_in_the_library() -> None:
    assert cycles(graph()) == []


def test_the_check_sees_lazy_and_relative_imports_and_finds_cycles() -> None:
    """The check itself: imports inside a function or under TYPE_CHECKING count, and a cycle is found."""
    modules = {"kairos.a", "kairos.b", "kairos.p", "kairos.p.c"}
    lazy = "def f():\n    from kairos import b\nif TYPE_CHECKING:\n    from kairos.p import c\n"
    assert imports_of(lazy, "kairos.a", is_package=False, modules=modules) == {"kairos.b", "kairos.p", "kairos.p.c"}
    assert imports_of("from .. import a\n", "kairos.p.c", is_package=False, modules=modules) == {"kairos.a"}
    # A package whose __init__ imports a submodule that imports a sibling through the package: a cycle.
    registry = {"kairos.p": imports_of("def get():\n    from kairos.p import c\n", "kairos.p", is_package=True,
                                       modules=modules),
                "kairos.p.c": imports_of("from kairos.p import b\n", "kairos.p.c", is_package=False,
                                         modules=modules | {"kairos.p.b"})}
    assert cycles(registry) == [["kairos.p", "kairos.p.c"]]
    edges = {"kairos.a": {"kairos.b"}, "kairos.b": {"kairos.c"}, "kairos.c": {"kairos.a"}, "kairos.d": set()}
    assert cycles(edges) == [["kairos.a", "kairos.b", "kairos.c"]]


# A ``kairos`` import inside a function is allowed only for these modules, each for its reason; every
# other one sits at its module's top, so the import graph above is the real dependency graph (every
# function runs under SnapStart, whose before-snapshot step imports and warms the function's path).
LAZY_ALLOWED = {
    "kairos.local": "development only (moto, embedded PostgreSQL): not in the Lambda layer",
    "kairos.chaos.rehearse": "the rehearsal's driver needs kairos.local: not in the Lambda layer",
    "kairos.api.openapi": "builds the OpenAPI document from every model: only GET /v1/openapi.json needs it",
}


def lazy_imports(source: str) -> list[tuple[int, set[str]]]:
    """The ``kairos`` imports inside a function (not under ``TYPE_CHECKING``): line and modules named."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("kairos"):
            named = {node.module or "", *(f"{node.module}.{alias.name}" for alias in node.names)}
        elif isinstance(node, ast.Import) and any(a.name.startswith("kairos") for a in node.names):
            named = {alias.name for alias in node.names}
        else:
            continue
        up = parents.get(node)
        while up is not None and not isinstance(up, ast.FunctionDef | ast.AsyncFunctionDef):
            if isinstance(up, ast.If) and "TYPE_CHECKING" in ast.unparse(up.test):
                break
            up = parents.get(up)
        if isinstance(up, ast.FunctionDef | ast.AsyncFunctionDef):
            found.append((node.lineno, named))
    return found


def _allowed(named: set[str]) -> str | None:
    return next((prefix for name in named for prefix in LAZY_ALLOWED
                 if name == prefix or name.startswith(prefix + ".")), None)


def test_kairos_imports_sit_at_module_top_but_for_the_allowlist() -> None:
    stray, used = [], set()
    for path in sorted(PACKAGE.rglob("*.py")):
        for line, named in lazy_imports(path.read_text(encoding="utf-8")):
            prefix = _allowed(named)
            if prefix is None:
                stray.append(f"{path.relative_to(PACKAGE)}:{line}: {sorted(named)}")
            else:
                used.add(prefix)
    assert stray == [], "move these kairos imports to the module's top (or allowlist them, with the reason)"
    assert used == set(LAZY_ALLOWED), "an allowlist entry nothing needs any more"


def test_the_lazy_import_scan_skips_type_checking_and_sees_functions() -> None:
    source = ("from kairos import db\nif TYPE_CHECKING:\n    from kairos import calendar\n"
              "def f():\n    from kairos.runs import moves\n    import kairos.local.stack\n")
    assert lazy_imports(source) == [(5, {"kairos.runs", "kairos.runs.moves"}), (6, {"kairos.local.stack"})]
    assert _allowed({"kairos.local.stack"}) == "kairos.local" and _allowed({"kairos.runs"}) is None
