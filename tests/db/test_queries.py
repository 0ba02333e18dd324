"""Every named query is used, every use names a query, and every query compiles against the schema.

Works for any ``sql/<table>.sql`` file and any module: engineers add queries concurrently, so nothing here
lists names by hand. References are found with ``ast`` (string constants compared exactly), not by
searching text, so a name in a comment does not count as a use.

"Compiles" means PostgreSQL accepts ``PREPARE`` of the statement with its named parameters turned
into ``$n`` and no types given: parse, name resolution (tables, columns, functions), type inference
and planning all run, nothing executes. A parameter whose type the statement does not fix (for
example ``%(x)s IS NULL``) fails here; such parameters need a cast in the SQL (``%(x)s::uuid``),
which also keeps them working when the caller passes None.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import psycopg

from kairos import db, trace
from kairos.db import Database
from kairos.runs import moves
from tests import factories

PACKAGE = Path(db.__file__).parent
# function -> index of the name
CALLS = {"q": 0, "fetch_one": 1, "fetch_row": 1, "expect_row": 1, "fetch_all": 1, "execute": 1, "change": 1}
_PARAM = re.compile(r"%\((\w+)\)s")


def _modules() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _string_constants() -> set[str]:
    found: set[str] = set()
    for _, tree in _modules():
        found.update(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str))
    return found


def _query_call_sites() -> list[tuple[str, int, str]]:
    """(file, line, name) of every ``q("…")``, ``fetch_one(conn, "…")``… with a literal name.

    Calls count when they are bare (imported from kairos.db) or spelled ``db.<function>`` (or
    ``trace.change``, which runs a named state change with its events); a
    ``conn.execute("SELECT …")`` is psycopg's own method and is not a named-query call.
    """
    sites: list[tuple[str, int, str]] = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Name) and func.id in CALLS:
                name = func.id
            elif (isinstance(func, ast.Attribute) and func.attr in CALLS and isinstance(func.value, ast.Name)
                  and func.value.id in ("db", "trace")):
                name = func.attr
            else:
                continue
            index = CALLS[name]
            if len(node.args) > index:
                arg = node.args[index]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    sites.append((str(path.relative_to(PACKAGE)), node.lineno, arg.value))
    return sites


def _positional(text: str) -> str:
    """``%(name)s`` -> ``$n`` (one number per distinct name), ``%%`` -> ``%``."""
    numbers: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        return f"${numbers.setdefault(match.group(1), len(numbers) + 1)}"

    return _PARAM.sub(number, text).replace("%%", "%")


def test_there_are_queries() -> None:
    assert len(db.QUERIES) > 0


def test_every_named_query_is_used_somewhere() -> None:
    constants = _string_constants()
    unused = sorted(name for name in db.QUERIES if name not in constants)
    assert unused == [], f"named queries no module refers to: {unused}"


def test_every_query_call_names_an_existing_query() -> None:
    sites = _query_call_sites()
    assert sites, "the scan found no named-query call at all; the scanner is broken"
    unknown = [site for site in sites if site[2] not in db.QUERIES]
    assert unknown == [], f"calls naming no query: {unknown}"


def test_queries_follow_the_house_rules() -> None:
    problems: list[str] = []
    for name, text in db.QUERIES.items():
        if not text.lstrip().startswith("--"):
            problems.append(f"{name}: no purpose comment under its name")
        if re.search(r"(?<!%)%s", text):
            problems.append(f"{name}: positional %s parameter (use %(name)s)")
    assert problems == []


def test_query_names_start_with_a_table(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        tables = {r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            " UNION SELECT viewname FROM pg_views WHERE schemaname = current_schema()").fetchall()}  # run_events
    wrong = sorted(n for n in db.QUERIES if not any(n.startswith(t + "_") for t in tables))
    assert wrong == [], f"query names must start with the main table they touch: {wrong}"


def test_each_query_lives_in_the_file_of_its_table(db_url: str) -> None:
    """One file per table (River): ``sql/<table>.sql`` holds exactly the queries named ``<table>_…``,
    so a table's statements are read in one place and a new query has one obvious home."""
    with psycopg.connect(db_url) as conn:
        tables = {r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            " UNION SELECT viewname FROM pg_views WHERE schemaname = current_schema()").fetchall()}  # run_events
    files = sorted((PACKAGE / "sql").glob("*.sql"))
    assert files, "no sql/*.sql file found"
    misplaced: list[str] = []
    for path in files:
        table = path.stem
        if table not in tables:
            misplaced.append(f"{path.name}: not named after a table")
        for name in db._HEADER.findall(path.read_text(encoding="utf-8")):
            if not name[0].startswith(table + "_"):
                misplaced.append(f"{name[0]} in {path.name}")
    assert misplaced == [], f"queries outside the file of their table: {misplaced}"


def _statements() -> dict[str, str]:
    """Every statement the package runs: each named query, and the template ``trace.change`` fills
    as what it becomes for each state change (named ``<query> (trace.change)``)."""
    statements = {name: text for name, text in db.QUERIES.items() if name != "run_events_with_change"}
    changes = [name for name, text in statements.items() if "%(events)s" in text]
    assert "runs_succeed" in changes
    return statements | {f"{name} (trace.change)": trace.change_sql(name) for name in changes}


def test_every_query_prepares_against_the_migrated_schema(db_url: str) -> None:
    failures: dict[str, str] = {}
    statements = _statements()
    with psycopg.connect(db_url) as conn:
        for name, text in sorted(statements.items()):
            statement = _positional(text).rstrip().rstrip(";")
            try:
                with conn.transaction():
                    conn.execute("PREPARE kairos_probe AS " + statement)
                    conn.execute("DEALLOCATE kairos_probe")
            except psycopg.Error as error:
                failures[name] = str(error).splitlines()[0]
    assert failures == {}


def test_prepared_queries_survive_a_migration_that_adds_columns(db_url: str) -> None:
    """A container keeps its prepared plans while a deploy migrates the schema. PostgreSQL refuses a
    cached plan whose result columns changed ("cached plan must not change result type"), which
    ``*`` of a table does when a column is added; a prepared query therefore names its columns."""
    prepared = {name: text for name, text in _statements().items() if name.split(" ")[0] in db.PREPARED}
    assert {"runs_claim", "runs_heartbeat", "run_events_append", "runs_succeed (trace.change)"} <= set(prepared)
    # The control: the same check catches a query that returns * of a table.
    prepared["control: SELECT * FROM runs"] = "SELECT * FROM runs WHERE id = %(run_id)s"
    names = sorted(prepared)
    broken: dict[str, str] = {}
    with psycopg.connect(db_url, autocommit=True) as conn:
        for i, name in enumerate(names):
            conn.execute(f"PREPARE probe_{i} AS " + _positional(prepared[name]).rstrip().rstrip(";"))
        tables = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")]
        for table in tables:
            conn.execute(f'ALTER TABLE "{table}" ADD COLUMN added_by_a_migration integer')
        for i, name in enumerate(names):
            arguments = ", ".join(["NULL"] * len(set(_PARAM.findall(prepared[name]))))
            try:
                with conn.transaction():
                    conn.execute(f"EXECUTE probe_{i}({arguments})")
            except psycopg.errors.FeatureNotSupported as error:
                broken[name] = str(error).splitlines()[0]
            except psycopg.Error:
                pass  # NULL arguments may break a constraint; the plan's result type was checked before
    assert broken == {"control: SELECT * FROM runs": "cached plan must not change result type"}


def test_named_queries_marked_prepared_run_prepared_and_only_those(db_url: str) -> None:
    for enabled in (True, False):
        database = Database(db_url, max_size=1, prepared_statements=enabled)
        try:
            run = factories.run(db_url)
            with database.transaction() as conn:
                assert moves.claim(conn, run["id"]) is not None
                db.fetch_one(conn, "runs_get", {"run_id": run["id"]})
                statements = [r["statement"] for r in conn.execute("SELECT statement FROM pg_prepared_statements")]
        finally:
            database.close()
        if enabled:
            assert len(statements) == 1 and "UPDATE runs" in statements[0]  # the claim, not the read
        else:
            assert statements == []


def test_the_scanners_find_what_they_should() -> None:
    """Guards the guards: the scans see this package's real uses."""
    sites = {(f, n) for f, _, n in _query_call_sites()}
    assert ("schedules/__init__.py", "schedules_insert") in sites
    assert ("conversations.py", "conversation_entries_append") in sites
    assert "schedules_clock" in _string_constants()
    converted = _positional("a = %(x)s AND b = %(y)s OR a = %(x)s AND c LIKE 'x%%'")
    assert converted == "a = $1 AND b = $2 OR a = $1 AND c LIKE 'x%'"
