"""``kairos.db.compile_query`` against psycopg's own conversion of ``%(name)s`` queries.

The named queries run through psycopg's ``RawCursor`` with ``$n`` placeholders compiled once
(``kairos.db``, "Compiled"); psycopg's ``PostgresQuery`` is what they ran through before, and is the
oracle here: for every shipped query, the same text reaches the server and the same values go in
the same order.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg._queries import PostgresQuery
from psycopg.adapt import Transformer

from kairos import db, trace


def _psycopg(text: str, params: dict[str, Any]) -> tuple[bytes, list[Any]]:
    """What psycopg itself sends for ``text`` with ``params``: the query and the values in order."""
    converted = PostgresQuery(Transformer())
    converted.convert(text, params)
    order = converted._order or []
    return converted.query, [params[name] for name in order]


def _params_of(compiled: db.Compiled) -> dict[str, Any]:
    """One distinct value per name (and a key no query uses, which both sides ignore)."""
    values: dict[str, Any] = {name: f"v-{name}" for name in compiled.names}
    values["not_in_any_query"] = object()
    return values


@pytest.mark.parametrize("name", sorted(db.QUERIES))
def test_every_shipped_query_compiles_to_what_psycopg_sends(name: str) -> None:
    compiled = db.COMPILED[name]
    params = _params_of(compiled)
    text, values = _psycopg(db.QUERIES[name], params)
    assert compiled.text == text
    assert compiled.values(params) == values


def test_the_trace_change_statements_compile_to_what_psycopg_sends() -> None:
    # The same set tests/db/test_queries.py prepares: every query but the template that takes events.
    changes = [name for name, text in db.QUERIES.items() if name != "run_events_with_change" and "%(events)s" in text]
    assert "runs_succeed" in changes
    for name in changes:
        text = trace.change_sql(name)
        compiled = db.compile_query(text)
        params = _params_of(compiled)
        assert (compiled.text, compiled.values(params)) == _psycopg(text, params)


@pytest.mark.parametrize(("text", "expected", "names"), [
    ("SELECT %(a)s, %(b)s, %(a)s", b"SELECT $1, $2, $1", ("a", "b")),
    ("SELECT 'x%%y', %(a)s", b"SELECT 'x%y', $1", ("a",)),
    ("SELECT 1", b"SELECT 1", ()),
])
def test_placeholders_are_numbered_in_order_of_first_use(text: str, expected: bytes, names: tuple[str, ...]) -> None:
    compiled = db.compile_query(text)
    assert (compiled.text, compiled.names) == (expected, names)


@pytest.mark.parametrize("text", ["SELECT %s", "SELECT 50%", "SELECT %(a)d", "SELECT %(a)b"])
def test_any_other_percent_is_refused_when_the_query_is_loaded(text: str) -> None:
    with pytest.raises(ValueError, match="only '%\\(name\\)s' placeholders"):
        db.compile_query(text)


def test_a_missing_value_names_the_parameter() -> None:
    compiled = db.compile_query("SELECT %(run_id)s, %(fence)s")
    with pytest.raises(psycopg.ProgrammingError, match="query parameter missing: fence"):
        compiled.values({"run_id": uuid.uuid4()})


def test_values_keep_their_python_types_for_psycopg_to_adapt() -> None:
    compiled = db.compile_query("SELECT %(at)s, %(id)s, %(n)s")
    at, ident = datetime(2026, 1, 1, tzinfo=UTC), uuid.uuid4()
    assert compiled.values({"n": None, "id": ident, "at": at}) == [at, ident, None]
