"""A schedule's status is written only from ``kairos/schedules/`` and ``kairos/tick/``.

The scan reads every named query (``kairos/sql/*.sql``) that assigns ``schedules.status`` in an
``UPDATE schedules … SET``, then every call in the package and the Lambda functions that runs a named
query by its literal name (``db.fetch_one(conn, "…")``, ``db.fetch_all``, ``db.execute``,
``trace.change``…), and requires each call of such a statement to live in one of those two packages:
a loop's moves after its goal report are ``kairos.schedules.loops``' functions, the owner's pause,
resume and cancel ``kairos.schedules``', the tick's pause and cursor ``kairos.tick``'s. A statement
that moves a schedule but is run some other way (its name in a variable) fails too: the scan must
see every writer.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from kairos import db

PACKAGE = Path(db.__file__).parent
FUNCTIONS = PACKAGE.parents[2] / "functions"
HOMES = ("schedules", "tick")
# function -> index of the query name among its positional arguments (as tests/db/test_queries.py reads them)
CALLS = {"q": 0, "fetch_one": 1, "fetch_row": 1, "expect_row": 1, "fetch_all": 1, "execute": 1, "change": 1}

_UPDATE = re.compile(r"\bUPDATE\s+schedules\b(?:\s+(?:AS\s+)?(?!SET\b)\w+)?\s+SET\b", re.IGNORECASE)
_COMMENT = re.compile(r"--[^\n]*")


def _top_level(text: str) -> str:
    """``text`` with everything inside parentheses blanked, at the same offsets."""
    out, depth = [], 0
    for char in text:
        depth += char == "("
        out.append(char if depth == 0 else " ")
        depth -= char == ")"
    return "".join(out)


def writes_status(text: str) -> bool:
    """Whether ``text`` holds an ``UPDATE schedules … SET`` that assigns ``status`` (alone or in a
    ``(…, status, …) = (…)`` tuple)."""
    text = _COMMENT.sub("", text)
    for match in _UPDATE.finditer(text):
        rest = text[match.end() :]
        end = re.search(r"\b(FROM|WHERE|RETURNING)\b|;", _top_level(rest), re.IGNORECASE)
        set_clause = rest[: end.start() if end else len(rest)]
        start = 0
        for comma in [*(m.start() for m in re.finditer(",", _top_level(set_clause))), len(set_clause)]:
            assigned = set_clause[start:comma].split("=", 1)[0]  # the column, or the tuple of columns
            start = comma + 1
            if re.search(r"(?<![\w.])(?:\w+\.)?status\b", assigned):
                return True
    return False


def status_writers() -> set[str]:
    return {name for name, text in db.QUERIES.items() if writes_status(text)}


def call_sites(source: str) -> Iterator[tuple[int, str]]:
    """(line, query name) of every named-query call with a literal name in ``source``."""
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in CALLS:
            index = CALLS[func.id]
        elif isinstance(func, ast.Attribute) and func.attr in CALLS and isinstance(func.value, ast.Name) \
                and func.value.id in ("db", "trace"):
            index = CALLS[func.attr]
        else:
            continue
        if len(node.args) > index and isinstance(node.args[index], ast.Constant) \
                and isinstance(node.args[index].value, str):
            yield node.lineno, node.args[index].value


def _sources() -> Iterator[tuple[str, str]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield str(path.relative_to(PACKAGE)), path.read_text(encoding="utf-8")
    for path in sorted(FUNCTIONS.rglob("*.py")):
        yield str(path.relative_to(FUNCTIONS.parent)), path.read_text(encoding="utf-8")


def test_the_scan_finds_the_statements_that_write_a_schedules_status() -> None:
    writers = status_writers()
    # The control: known moves are found, and statements that touch a schedule without moving it are not.
    assert {"schedules_pause", "schedules_cancel", "schedules_advance_cursor", "schedules_pause_by_tick"} <= writers
    assert not writers & {"schedules_edit", "schedules_set_failures", "schedules_rotate_token"}
    assert writes_status("WITH m AS (UPDATE schedules s SET (status, revision) = (SELECT 'paused', 2) "
                         "WHERE s.id = %(id)s RETURNING id) SELECT * FROM m")
    assert not writes_status("UPDATE schedules SET next_fire_at = CASE WHEN status = 'active' THEN 1 END "
                             "WHERE id = %(id)s")
    sites = dict(call_sites('def f(conn):\n    db.fetch_one(conn, "schedules_pause", {})\n'
                            '    ToolSpec("schedules_cancel", "x")\n'))
    assert sites == {2: "schedules_pause"}


def test_a_schedules_status_is_written_only_from_schedules_and_tick() -> None:
    writers = status_writers()
    called: set[str] = set()
    outside: list[str] = []
    for path, source in _sources():
        for line, name in call_sites(source):
            if name in writers:
                called.add(name)
                if path.split("/")[0] not in HOMES:
                    outside.append(f"{path}:{line} runs {name}")
    assert outside == []
    assert sorted(writers - called) == [], "a statement that writes schedules.status is run where the scan cannot see"
