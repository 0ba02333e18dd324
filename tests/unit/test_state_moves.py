"""Every statement that moves a run or a schedule writes only moves ``kairos.states`` declares.

The scan reads every named query (``kairos/sql/*.sql``) and every Python string constant of the
package and the Lambda functions that holds ``UPDATE runs … SET`` / ``UPDATE schedules … SET``. For
each one that assigns ``runs.state`` / ``schedules.status`` it finds

* the states it can write: a literal (``state = 'failed'``), every branch of a ``CASE`` (a branch
  that keeps the column, ``ELSE s.status``, writes nothing), or for a parameter (``state =
  %(state)s``) the states its callers pass, declared in ``PARAMETER_WRITES`` below;
* the states it moves from: the guard of its top-level ``WHERE`` (``state = 'queued'`` or
  ``state IN (…)``). A state write without such a guard is an error: every move is one guarded
  ``UPDATE``.

and holds each (from, to) pair to ``states.RUN_MOVES`` / ``states.SCHEDULE_MOVES``. A new statement
that writes an undeclared state, or a parameter-driven write nobody declared, fails here.

It also records which module runs each named query that writes ``runs.state`` (the modules whose
code names it) and requires that module to be in ``kairos/runs/``: the run state machine is read in
``sql/runs.sql`` plus that one package, and every other layer calls ``kairos.runs.*``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from kairos import db, states

PACKAGE = Path(db.__file__).parent
FUNCTIONS = PACKAGE.parents[2] / "functions"

# table -> (the state column, the move table, the state set)
TABLES: dict[str, tuple[str, dict[str, frozenset[str]]]] = {
    "runs": ("state", {k.value: frozenset(v.value for v in vs) for k, vs in states.RUN_MOVES.items()}),
    "schedules": ("status", {k.value: frozenset(v.value for v in vs) for k, vs in states.SCHEDULE_MOVES.items()}),
}

# Where the Python caller of every statement that writes runs.state lives.
RUN_MOVES_HOME = "kairos/runs/"

# Statements whose new state is a parameter: the states their callers pass, and who the callers are.
PARAMETER_WRITES: dict[str, frozenset[str]] = {
    # kairos.runs.rescue: a rescue that does not requeue ends the run as one of these (_Outcome).
    "runs_end_rescued": frozenset({"abandoned", "failed", "cancelled"}),
}

_UPDATE = re.compile(r"\bUPDATE\s+(runs|schedules)\b(?:\s+(?:AS\s+)?(?!SET\b)(\w+))?\s+SET\b", re.IGNORECASE)
_COMMENT = re.compile(r"--[^\n]*")
_LITERAL = re.compile(r"'(\w+)'")


def _masked(text: str, start: int) -> str:
    """``text[start:]`` up to the parenthesis that closes the enclosing one, with everything nested
    inside parentheses blanked (the outermost parentheses kept), so keywords and commas found in it
    are top-level ones, at the same offsets as in ``text``."""
    out: list[str] = []
    depth = 0
    for char in text[start:]:
        if char == "(":
            depth += 1
            out.append("(" if depth == 1 else " ")
        elif char == ")":
            depth -= 1
            if depth < 0:
                break
            out.append(")" if depth == 0 else " ")
        else:
            out.append(char if depth == 0 else " ")
    return "".join(out)


def _split_top(text: str) -> list[str]:
    """``text`` split at its top-level commas."""
    masked = _masked(text, 0)
    parts, last = [], 0
    for match in re.finditer(",", masked):
        parts.append(text[last : match.start()])
        last = match.end()
    parts.append(text[last : len(masked)])
    return parts


def _written(expression: str, column: str, statement: str) -> set[str] | str:
    """The states an assigned expression can write, or why that cannot be told."""
    expression = expression.strip()
    if literal := re.fullmatch(r"'(\w+)'", expression):
        return {literal.group(1)}
    if re.fullmatch(r"%\(\w+\)s(::\w+)?", expression):
        declared = PARAMETER_WRITES.get(statement)
        return set(declared) if declared is not None else "a parameter not declared in PARAMETER_WRITES"
    if re.match(r"CASE\b", expression, re.IGNORECASE):
        values: set[str] = set()
        for branch in re.finditer(r"\b(?:THEN|ELSE)\s+([^\s,]+)", _masked(expression, 0), re.IGNORECASE):
            value = branch.group(1)
            if literal := re.fullmatch(r"'(\w+)'", value):
                values.add(literal.group(1))
            elif not re.fullmatch(rf"(?:\w+\.)?{column}", value):  # a branch keeping the column writes nothing
                return f"a CASE branch it cannot read: {value}"
        return values
    return f"an expression it cannot read: {expression[:60]}"


def _moves(statement: str, text: str) -> Iterator[tuple[str, set[str], set[str] | str]]:
    """(table, from states, written states or a problem) of every state-writing UPDATE in ``text``."""
    text = _COMMENT.sub("", text)
    for match in _UPDATE.finditer(text):
        table = match.group(1).lower()
        column, _ = TABLES[table]
        rest = _masked(text, match.end())
        clause_end = re.search(r"\b(FROM|WHERE)\b", rest, re.IGNORECASE)
        set_clause = text[match.end() : match.end() + (clause_end.start() if clause_end else len(rest))]
        written: set[str] | str | None = None
        for item in _split_top(set_clause):
            tuple_form = re.fullmatch(r"\s*\(([^)]*)\)\s*=\s*\((.*)\)\s*", item, re.DOTALL)
            if tuple_form:
                names = [n.strip() for n in tuple_form.group(1).split(",")]
                if column in names:
                    select = tuple_form.group(2).strip()
                    select = re.sub(r"^SELECT\s+", "", select, flags=re.IGNORECASE)
                    end = re.search(r"\bFROM\b", _masked(select, 0), re.IGNORECASE)
                    expressions = _split_top(select[: end.start()] if end else select)
                    written = _written(expressions[names.index(column)], column, statement)
                continue
            single = re.fullmatch(rf"\s*(?:\w+\.)?{column}\s*=\s*(.*)", item, re.DOTALL)
            if single:
                written = _written(single.group(1), column, statement)
        if written is None:
            continue  # an UPDATE that does not touch the state column
        where = re.search(r"\bWHERE\b", rest, re.IGNORECASE)
        sources: set[str] = set()
        if where:
            guard_text = rest[where.end() :]
            stop = re.search(r"\bRETURNING\b|;", guard_text, re.IGNORECASE)
            guard_text = guard_text[: stop.start()] if stop else guard_text
            offset = match.end() + where.end()
            for guard in re.finditer(rf"(?<![\w.])(?:\w+\.)?{column}\s*=\s*'(\w+)'", guard_text):
                sources.add(guard.group(1))
            for guard in re.finditer(rf"(?<![\w.])(?:\w+\.)?{column}\s+IN\s*\(", guard_text, re.IGNORECASE):
                inside = text[offset + guard.end() :]
                sources.update(_LITERAL.findall(inside[: inside.index(")")]))
        yield table, sources, written


def _problems(statement: str, text: str) -> list[str]:
    problems: list[str] = []
    for table, sources, written in _moves(statement, text):
        _, moves = TABLES[table]
        if isinstance(written, str):
            problems.append(f"{statement}: {table} writes {written}")
            continue
        if not sources:
            problems.append(f"{statement}: {table} state write with no state guard in its WHERE")
        for source in sorted(sources):
            if source not in moves:
                problems.append(f"{statement}: {table} guard names an unknown state {source!r}")
                continue
            for target in sorted(written - moves[source]):
                problems.append(f"{statement}: {table} {source} -> {target} is not in the move table")
    return problems


def _statements() -> dict[str, str]:
    """Every named query, and every Python string of the package and functions that updates runs or
    schedules (named ``<file>:<line>``)."""
    found = dict(db.QUERIES)
    for path in sorted([*PACKAGE.rglob("*.py"), *FUNCTIONS.rglob("*.py")]):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _UPDATE.search(node.value):
                found[f"{path.name}:{node.lineno}"] = node.value
    return found


def _writes() -> dict[str, list[tuple[str, set[str], set[str] | str]]]:
    return {name: moves for name, text in _statements().items() if (moves := list(_moves(name, text)))}


def test_the_scan_finds_the_state_moves() -> None:
    writes = _writes()
    # The control: statements known to move state are found, with what they write.
    known = {"runs_claim", "runs_succeed", "runs_end_rescued", "schedules_cancel", "schedules_advance_cursor"}
    assert known <= set(writes)
    assert writes["runs_claim"] == [("runs", {"queued"}, {"running", "abandoned", "expired", "cancelled"})]
    assert writes["runs_cancel_waiting"] == [("runs", {"queued", "awaiting_approval", "awaiting_input"}, {"cancelled"})]
    assert writes["schedules_advance_cursor"] == [("schedules", {"active"}, {"completed"})]
    # Writes that touch runs without moving state are not moves.
    assert "runs_stamp_handoff" not in writes and "runs_heartbeat" not in writes


def test_every_state_write_is_a_declared_move() -> None:
    problems = [p for name, text in sorted(_statements().items()) for p in _problems(name, text)]
    assert problems == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("UPDATE runs SET state = 'succeeded' WHERE id = %(id)s AND state = 'queued'", "queued -> succeeded"),
        ("UPDATE runs AS r SET updated_at = now(), state = 'running' WHERE r.id = %(id)s", "no state guard"),
        ("UPDATE runs SET state = %(state)s WHERE state = 'running'", "not declared in PARAMETER_WRITES"),
        ("UPDATE schedules SET status = CASE WHEN x THEN 'active' ELSE status END WHERE status = 'cancelled'",
         "cancelled -> active"),
        ("WITH m AS (UPDATE schedules s SET status = 'paused' WHERE s.status IN ('completed') RETURNING id) "
         "SELECT * FROM m", "completed -> paused"),
    ],
)
def test_an_undeclared_move_is_caught(text: str, problem: str) -> None:
    """Controls: the scan fails a statement that writes a move the tables do not declare."""
    found = _problems("control", text)
    assert any(problem in p for p in found), found


def _run_state_queries() -> set[str]:
    """The named queries that write ``runs.state``."""
    return {name for name, text in db.QUERIES.items() if any(table == "runs" for table, _, _ in _moves(name, text))}


def _modules_naming(names: set[str]) -> dict[str, set[str]]:
    """name -> the modules (``kairos/...`` or ``functions/...`` paths) whose code holds the name as a
    string: the query's callers (``db.fetch_one(conn, "runs_…")``, ``trace.change(conn, "runs_…", …)``)
    and any constant that names it for one."""
    found: dict[str, set[str]] = {name: set() for name in names}
    for path in sorted([*PACKAGE.rglob("*.py"), *FUNCTIONS.rglob("*.py")]):
        module = str(path.relative_to(PACKAGE.parent if path.is_relative_to(PACKAGE) else FUNCTIONS.parent))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in found:
                found[node.value].add(module)
    return found


def test_every_run_state_write_is_run_from_kairos_runs() -> None:
    callers = _modules_naming(_run_state_queries())
    # The control: the scan finds the statements and who runs them.
    assert {"runs_claim", "runs_succeed", "runs_cancel_waiting"} <= set(callers)
    assert callers["runs_claim"] == {"kairos/runs/moves.py"}
    unused = sorted(name for name, modules in callers.items() if not modules)
    assert unused == [], f"state-writing statements no module names (dead, or named in a way the scan misses): {unused}"
    outside = {name: sorted(m for m in modules if not m.startswith(RUN_MOVES_HOME))
               for name, modules in sorted(callers.items())}
    assert {name: modules for name, modules in outside.items() if modules} == {}


def test_every_state_has_a_row_in_each_move_table() -> None:
    assert set(states.RUN_MOVES) == set(states.RunState)
    assert set(states.SCHEDULE_MOVES) == set(states.ScheduleStatus)
    for state in states.TERMINAL_RUN_STATES:
        assert states.RUN_MOVES[state] == frozenset()
