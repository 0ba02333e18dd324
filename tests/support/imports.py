"""The library's import graph, read from the source: which kairos modules each module imports."""

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
