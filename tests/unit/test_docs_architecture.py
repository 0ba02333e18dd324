"""docs/architecture.md says what the code is: its layout names every module and package of
``layers/common/kairos`` and nothing that does not exist, its state diagrams draw exactly
``RUN_MOVES`` and ``SCHEDULE_MOVES``, and its trace event table lists exactly ``EventType``.

When code moves, these fail until the page moves with it."""

from __future__ import annotations

import re
from pathlib import Path

from kairos.states import RUN_MOVES, SCHEDULE_MOVES, EventType

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "layers/common/kairos"
PAGE = (ROOT / "docs/architecture.md").read_text(encoding="utf-8")

_BRACES = re.compile(r"([\w/.]*)\{([\w,]+)\}([\w/.]*)")
_MODULE = re.compile(r"(?<![\w/.{,])([\w/]+\.py)\b")


def _layout() -> list[str]:
    block = re.search(r"^### Layout\n\n```\n(.*?)```", PAGE, re.S | re.M)
    assert block is not None, "docs/architecture.md has no Layout block"
    return block[1].splitlines()


def _expand(text: str) -> list[str]:
    """Paths named in ``text``: ``a/{b,c}.py`` is ``a/b.py`` and ``a/c.py``."""
    text = re.sub(r"\{[^}]*\}", lambda m: re.sub(r"\s", "", m[0]), text)
    found = [f"{m[1]}{part}{m[3]}" for m in _BRACES.finditer(text) for part in m[2].split(",")]
    return found + _MODULE.findall(_BRACES.sub(" ", text))


def _entries() -> tuple[list[str], dict[str, str]]:
    """The top-level lines' paths, and the library's entries: first-column name -> the entry's text."""
    top: list[str] = []
    entries: dict[str, str] = {}
    current: list[str] = []
    for line in _layout():
        if not line.startswith(" "):
            top.append(re.split(r"\s{2,}", line.strip())[0])
        elif re.match(r"  \S", line):
            names, rest = [*re.split(r"\s{2,}", line.strip(), maxsplit=1), ""][:2]
            current = [n.strip() for n in names.split(",")]
            for name in current:
                entries[name] = rest
        else:
            for name in current:
                entries[name] += " " + line.strip()
    return top, entries


def test_the_layout_is_read() -> None:
    top, entries = _entries()
    assert "template.yaml" in top and "runs/" in entries and "states.py" in entries
    assert _expand("routes/{a,b}.py (x) c.py, d/__init__.py") == ["routes/a.py", "routes/b.py", "c.py", "d/__init__.py"]


def test_every_path_outside_the_library_exists() -> None:
    top, _ = _entries()
    missing = [path for line in top for path in (_expand(line) or [line]) if not (ROOT / path).exists()]
    assert missing == []


def test_every_module_and_package_of_the_library_has_its_entry() -> None:
    _, entries = _entries()
    actual = {p.name for p in PACKAGE.glob("*.py")} | {
        f"{p.name}/" for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"
    }
    assert sorted(actual - set(entries)) == [], "in the package, not in the layout"
    assert sorted(set(entries) - actual) == [], "in the layout, not in the package"


def test_every_package_entry_names_exactly_its_modules() -> None:
    _, entries = _entries()
    wrong = {}
    for name, text in entries.items():
        if not name.endswith("/"):
            continue
        package = PACKAGE / name
        actual = {p.relative_to(package).as_posix() for p in package.rglob("*.py") if "__pycache__" not in p.parts}
        listed = set(_expand(text))
        if listed != actual:
            wrong[name] = {"unlisted": sorted(actual - listed), "absent": sorted(listed - actual)}
    assert wrong == {}


def _diagram(table: str) -> set[tuple[str, str]]:
    for block in re.findall(r"```mermaid\n(.*?)```", PAGE, re.S):
        if f"%% {table}" in block:
            return {(m[1], m[2]) for m in re.finditer(r"^\s*(\w+) --> (\w+)", block, re.M)}
    raise AssertionError(f"docs/architecture.md has no diagram of {table}")


def test_the_run_diagram_draws_exactly_run_moves() -> None:
    declared = {(a.value, b.value) for a, targets in RUN_MOVES.items() for b in targets}
    assert _diagram("RUN_MOVES") == declared


def test_the_schedule_diagram_draws_exactly_schedule_moves() -> None:
    declared = {(a.value, b.value) for a, targets in SCHEDULE_MOVES.items() for b in targets}
    assert _diagram("SCHEDULE_MOVES") == declared


def test_the_event_table_lists_exactly_the_event_types() -> None:
    table = re.search(r"^\| event \| written when \|\n((?:\|.*\n)+)", PAGE, re.M)
    assert table is not None, "docs/architecture.md has no event table"
    listed = {name for row in table[1].splitlines()[1:] for name in re.findall(r"`([\w.]+)`", row.split("|")[1])}
    assert listed == {e.value for e in EventType}
