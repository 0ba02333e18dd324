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
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "layers" / "common" / "kairos"


def module_name(path: Path) -> str:
    parts = ["kairos", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, me: str, *, is_package: bool, modules: set[str]) -> set[str]:
    """The kairos modules ``source`` (module ``me``) imports. ``from kairos.x import y`` names
    ``kairos.x``, and module ``kairos.x.y`` too when y is one."""
    found: set[str] = set()
    package = me if is_package else me.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = parts[: len(parts) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name in modules and name != me}


def graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports_of(p.read_text(encoding="utf-8"), module_name(p),
                                       is_package=p.name == "__init__.py", modules=modules) for p in paths}


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
