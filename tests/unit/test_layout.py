"""The test tree's own layout: what test modules share lives in ``tests/support`` (fixtures registered by a
conftest), so no test module imports another test module or a conftest — importing one runs its
module-level code and, under pytest, can register its tests or fixtures twice."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _is_test_module(name: str) -> bool:
    """A test module, or a conftest (pytest loads those itself; what they share belongs in tests/support)."""
    return name.startswith("test_") or name == "conftest"


def imported_test_modules(source: str, package: str) -> list[str]:
    """The ``test_*`` modules and conftests that ``source`` (a module of ``package``) imports, however spelled."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend(a.name for a in node.names if any(_is_test_module(p) for p in a.name.split(".")))
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            if any(_is_test_module(part) for part in module.split(".")):
                found.append(module)
            found.extend(f"{module}.{a.name}" for a in node.names if _is_test_module(a.name))
    return found


def test_no_test_module_imports_another() -> None:
    offenders = {}
    for path in sorted(TESTS.rglob("*.py")):
        package = ".".join(path.relative_to(TESTS.parent).parent.parts)
        imported = imported_test_modules(path.read_text(encoding="utf-8"), package)
        if imported:
            offenders[str(path.relative_to(TESTS.parent))] = imported
    assert offenders == {}


def test_the_scan_sees_every_spelling() -> None:
    spellings = {
        "from tests.db.test_api import Api": ["tests.db.test_api"],
        "from tests.db import test_runs": ["tests.db.test_runs"],
        "import tests.unit.test_layout": ["tests.unit.test_layout"],
        "from .test_webhooks import hook": ["tests.db.test_webhooks"],
        "from . import test_webhooks": ["tests.db.test_webhooks"],
        "def f():\n    from tests.aws.test_run_handler import sqs_event": ["tests.aws.test_run_handler"],
        "from tests.conftest import PgServer": ["tests.conftest"],
        "from tests.support.api import Api\nfrom tests import factories": [],
    }
    for source, expected in spellings.items():
        assert imported_test_modules(source, "tests.db") == expected, source
