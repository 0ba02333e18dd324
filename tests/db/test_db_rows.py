"""``db.fetch_row`` / ``db.expect_row``: a row a named query must return is there, or ``MissingRow``
names the query; unlike the ``assert row is not None`` they replace, the check holds under ``python -O``."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime

import psycopg
import pytest

from kairos.db import Database, MissingRow, compile_query, expect_row, fetch_row, run, send


def test_fetch_row_returns_the_row_a_query_answers(db: Database) -> None:
    instant = datetime(2026, 3, 1, 12, tzinfo=UTC)
    with db.transaction() as conn:
        assert fetch_row(conn, "schedules_clock", {"now": instant}) == {"now": instant}


def test_fetch_row_raises_missing_row_naming_the_query(db: Database) -> None:
    missing = "named query runs_get_owned returned no row"
    with db.transaction() as conn, pytest.raises(MissingRow, match=missing) as raised:
        fetch_row(conn, "runs_get_owned", {"run_id": uuid.uuid4(), "owner": "nobody"})
    assert raised.value.query == "runs_get_owned"
    assert isinstance(raised.value, RuntimeError)  # an internal fault, never a domain error mapped to a 4xx


def test_expect_row_checks_a_row_read_from_a_pipelined_cursor(db: Database) -> None:
    with db.transaction() as conn:
        cursor = send(conn, "runs_get_owned", {"run_id": uuid.uuid4(), "owner": "nobody"})
        with pytest.raises(MissingRow, match="runs_get_owned"):
            expect_row(cursor.fetchone(), "runs_get_owned")
    assert expect_row({"a": 1}, "any") == {"a": 1}


def test_the_check_holds_under_python_dash_o(db_url: str) -> None:
    # Given an interpreter that drops asserts, when a must-exist row is missing, then MissingRow is raised
    script = ("import sys, uuid\nfrom kairos import db\nassert False, 'asserts are on'\n"
              "database = db.Database(sys.argv[1], max_size=1)\n"
              "with database.transaction() as conn:\n"
              "    try:\n"
              "        db.fetch_row(conn, 'runs_get_owned', {'run_id': uuid.uuid4(), 'owner': 'nobody'})\n"
              "    except db.MissingRow as e:\n"
              "        print('missing', e.query)\n"
              "database.close()\n")
    done = subprocess.run([sys.executable, "-O", "-c", script, db_url], capture_output=True, text=True, timeout=60,
                          env=os.environ, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "missing runs_get_owned"



def test_a_prepared_statement_keeps_its_column_names_and_builds_the_rows_dict_row_builds(db: Database) -> None:
    # Given a statement run prepared (its column names kept from its first result: db._NamedRows) and the
    # same text run the ordinary way (psycopg's dict_row), with rows and without
    query = compile_query("SELECT %(a)s::int AS a, %(b)s::text AS b, 'c' AS c WHERE %(a)s::int > 0")
    star = compile_query("SELECT * FROM (VALUES (1, 2)) AS t(x, y) WHERE %(n)s::int > 0")
    with db.connection() as conn:
        for a, b in ((1, "one"), (2, "two"), (0, "none"), (3, "three")):
            kept = run(conn, query, {"a": a, "b": b}, prepare=True).fetchall()
            plain = run(conn, query, {"a": a, "b": b}, prepare=False).fetchall()
            # Then each prepared answer is the ordinary one, row for row
            assert kept == plain == ([{"a": a, "b": b, "c": "c"}] if a > 0 else [])
        assert run(conn, star, {"n": 1}, prepare=True).fetchone() == {"x": 1, "y": 2}
        # A command without rows answers as dict_row's: no result to read
        done = run(conn, compile_query("SET application_name = 'kept-names'"), {}, prepare=True)
        with pytest.raises(psycopg.ProgrammingError):
            done.fetchone()
