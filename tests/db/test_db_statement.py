"""``db.Statement``: the short way of a statement already prepared on its connection, and of ``BEGIN`` /
``COMMIT`` in a pipeline, answers what psycopg's ``execute`` answers (rows, row counts, status, errors),
in autocommit, inside a transaction and in pipeline mode; anything else goes psycopg's way."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from kairos import db as kdb
from kairos.db import Database, Statement, compile_query

SELECT = compile_query("SELECT %(a)s::int AS a, %(b)s::text AS b, %(c)s::uuid AS c, %(d)s::jsonb AS d "
                       "WHERE %(a)s::int > 0")
INSERT = compile_query("INSERT INTO statement_probe (n) SELECT g FROM generate_series(1, %(n)s::int) g RETURNING n")
UPDATE = compile_query("UPDATE statement_probe SET n = n WHERE n <= %(n)s::int")
DIVIDE = compile_query("SELECT 1 / %(n)s::int AS q")
COUNT = compile_query("SELECT count(*) AS n FROM statement_probe")


@pytest.fixture
def probe(db: Database) -> Database:
    with db.connection() as conn:
        conn.execute("DROP TABLE IF EXISTS statement_probe")
        conn.execute("CREATE TABLE statement_probe (n int NOT NULL)")
    return db


def _answer(cursor: psycopg.Cursor[Any]) -> tuple[Any, ...]:
    rows = cursor.fetchall() if cursor.description is not None else None
    return rows, cursor.rowcount, cursor.statusmessage, [c.name for c in cursor.description or ()]


def _native(conn: psycopg.Connection[Any], query: kdb.Compiled, params: dict[str, Any]) -> psycopg.Cursor[Any]:
    return psycopg.RawCursor(conn, row_factory=kdb._NamedRows()).execute(query.text, query.values(params),
                                                                        prepare=True)


def _short(conn: psycopg.Connection[Any], query: kdb.Compiled, params: dict[str, Any]) -> psycopg.Cursor[Any]:
    return Statement(conn, row_factory=kdb._NamedRows()).prepared(query.text, query.values(params))


class _Spy:
    """Counts the sends that went psycopg's way (``execute``) rather than the short one."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.generic = 0
        original = Statement.execute

        def execute(cursor: Statement, *args: Any, **kwargs: Any) -> Any:
            self.generic += 1
            return original(cursor, *args, **kwargs)

        monkeypatch.setattr(Statement, "execute", execute)


def _cases() -> list[tuple[kdb.Compiled, dict[str, Any]]]:
    thing = uuid.uuid4()
    return [(SELECT, {"a": 1, "b": "one", "c": thing, "d": psycopg.types.json.Jsonb({"k": [1, 2]})}),
            (SELECT, {"a": 0, "b": "none", "c": thing, "d": psycopg.types.json.Jsonb(None)}),
            (INSERT, {"n": 3}), (UPDATE, {"n": 2}), (COUNT, {})]


def test_the_short_way_answers_what_execute_answers_in_autocommit_and_in_a_transaction(
        probe: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = _Spy(monkeypatch)
    for opened in (probe.connection, probe.transaction):
        with opened() as conn:
            for query, params in _cases():
                first = _answer(_short(conn, query, params))  # prepares it (psycopg's way)
                before = spy.generic
                again = _answer(_short(conn, query, params))
                assert spy.generic == before  # the short way
                native = _answer(_native(conn, query, params))
                assert again[1:] == native[1:] == first[1:]
                if query is not INSERT and query is not UPDATE:
                    assert again == native == first


def test_in_a_pipeline_the_short_way_answers_in_order_beside_psycopgs_own_statements(
        probe: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = _Spy(monkeypatch)
    with probe.explicit() as conn:
        for query, params in _cases():
            _short(conn, query, params).fetchall() if query is not UPDATE else _short(conn, query, params)
        _short(conn, DIVIDE, {"n": 1}).fetchone()
        before = spy.generic

        def body() -> list[Any]:
            with conn.pipeline():
                kdb.begin(conn)
                own = conn.execute("SELECT 'psycopg' AS who")  # psycopg's own, sent at once
                inserted = _short(conn, INSERT, {"n": 2})  # into libpq's buffer, not flushed yet
                read_own = own.fetchone()  # psycopg's read of the earlier statement flushes both
                counted = _short(conn, COUNT, {})
                divided = _short(conn, DIVIDE, {"n": 2})
                kdb.commit(conn)
                answers = [read_own, inserted.fetchall(), counted.fetchone(), divided.fetchone()]
            return answers

        answers = _within(body, seconds=60)
        assert spy.generic == before  # every kairos statement went the short way
        assert answers == [{"who": "psycopg"}, [{"n": 1}, {"n": 2}], {"n": 5}, {"q": 0}]
        assert conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE  # committed
    with probe.connection() as conn:
        assert conn.execute("SELECT count(*) AS n FROM statement_probe").fetchone() == {"n": 5}


def test_a_failing_statement_in_a_pipeline_raises_as_execute_does_and_its_transaction_writes_nothing(
        probe: Database) -> None:
    # psycopg may raise an error it read early at a later send of the block; the short way raises it at
    # the pipeline's end. Either way it leaves the block, and nothing of the transaction is written.
    outcomes = []
    for n, send in enumerate((_native, _short), start=1):
        with probe.explicit() as conn:
            _short(conn, DIVIDE, {"n": 1}).fetchone()
            _short(conn, INSERT, {"n": 1})  # autocommit: stays
            with pytest.raises(psycopg.errors.DivisionByZero) as raised, conn.pipeline():
                kdb.begin(conn)
                send(conn, INSERT, {"n": 1})
                send(conn, DIVIDE, {"n": 0})
                send(conn, INSERT, {"n": 1})
                kdb.commit(conn)
            outcomes.append((type(raised.value), raised.value.sqlstate))
            conn.execute("ROLLBACK")
        with probe.connection() as conn:
            assert conn.execute("SELECT count(*) AS n FROM statement_probe").fetchone() == {"n": n}
            assert _short(conn, COUNT, {}).fetchone() == {"n": n}  # the connection works on
    assert outcomes[0] == outcomes[1]


def test_a_statement_outside_autocommit_with_no_transaction_goes_psycopgs_way_which_opens_one(
        probe: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = _Spy(monkeypatch)
    with probe.transaction() as conn:
        _short(conn, COUNT, {}).fetchone()
        conn.commit()  # idle again, outside autocommit
        before = spy.generic
        assert _short(conn, COUNT, {}).fetchone() == {"n": 0}
        assert spy.generic == before + 1
        assert conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.INTRANS


def test_after_psycopg_forgets_its_prepared_statements_the_next_send_prepares_again(
        probe: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = _Spy(monkeypatch)
    with probe.connection() as conn:
        _short(conn, COUNT, {}).fetchone()
        conn.execute("BEGIN")
        conn.execute("ROLLBACK")  # psycopg deallocates every statement it prepared
        before = spy.generic
        assert _short(conn, COUNT, {}).fetchone() == {"n": 0}
        assert spy.generic == before + 1
        assert _short(conn, COUNT, {}).fetchone() == {"n": 0}
        assert spy.generic == before + 1


def _within(body: Callable[[], list[Any]], *, seconds: float) -> list[Any]:
    """``body()`` in a thread, failing (instead of hanging the suite) when it does not return in time."""
    result: list[Any] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            result.extend(body())
        except BaseException as error:  # re-raised below
            errors.append(error)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the pipeline did not answer"
    if errors:
        raise errors[0]
    return result
