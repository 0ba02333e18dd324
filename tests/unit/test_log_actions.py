"""Log lines name what happened in one style: ``"action": "<noun>_<what>"``, lower snake_case.

Operators filter CloudWatch Logs Insights on ``action``; one style (``secret_refused``, not
``secret.refused`` beside ``tick_started``) keeps their queries guessable.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "layers" / "common" / "kairos"
STYLE = re.compile(r"[a-z]+(_[a-z0-9]+)*")


def actions() -> list[tuple[str, int, str]]:
    """Every literal ``"action": "…"`` in a dict of the library, with where it is."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Dict):
                continue
            for key, value in zip(node.keys, node.values, strict=True):
                if (isinstance(key, ast.Constant) and key.value == "action" and isinstance(value, ast.Constant)
                        and isinstance(value.value, str)):
                    found.append((str(path.relative_to(PACKAGE)), node.lineno, value.value))
    return found


def test_every_log_action_is_lower_snake_case() -> None:
    found = actions()
    assert len(found) > 50, "the scan must see the library's log lines"
    assert [f for f in found if not STYLE.fullmatch(f[2])] == []
