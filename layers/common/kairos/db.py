"""Database access: named queries, a small connection pool, and transactions.

Runtime SQL lives in ``kairos/sql/<table>.sql`` as named queries (Procrastinate-style): each block
starts with ``-- name: <table>_<verb>`` and a one-line purpose, and is loaded once into ``QUERIES``.
One file per table: ``runs.sql`` holds every ``runs_…`` statement, whichever component runs it
(tests/db/test_queries.py holds each query to the file of its table). Only code that talks to the
database reads them. No SQL is built from input; the one statement assembled at run time is
``trace.change``'s, by design: it splices a shipped guarded ``UPDATE runs`` (a named query) into the
shipped ``run_events_with_change`` template so a state change and its trace events are one statement.
Tests prepare every such combination against the schema.

Compiled: every named query is converted once, when it is loaded, from its ``%(name)s`` placeholders
to PostgreSQL's ``$n`` (``compile_query``), and runs through psycopg's ``RawCursor`` with its values in
that order: psycopg would otherwise split and re-map the text on every execution (it caches that
only for texts under 4 KB, and the claim is longer), which was a tenth of the run worker's own CPU.
The semantics are psycopg's: each distinct name is one parameter, ``%%`` is a literal ``%``, values
are adapted the same way (``tests/unit/test_db_compile.py`` holds the two side by side).

Prepared statements: a query headed ``-- name: <name> (prepared)`` is run as a server-side prepared
statement (no parse and plan per execution: the run worker's claim, heartbeat, trace appends and
terminal updates, where planning was most of the server's work). Such a query names its result
columns — never ``*`` of a table — so a migration that adds columns cannot invalidate the plan of a
running container. Every other query is never prepared. With ``prepared_statements=False`` (behind
RDS Proxy, which pins a session that prepares) nothing is.

Batches: the run worker's hot transactions are spelled out (``BEGIN`` … ``COMMIT`` as statements on
an autocommit connection, ``Database.explicit``) and sent in pipeline mode (``batch``): statements
whose answers the code does not need before sending the next travel together and cost one round
trip. psycopg syncs after every ``BEGIN`` it issues itself and after ``commit()`` in a pipeline;
spelled-out ``BEGIN`` and ``COMMIT`` ride with the statements around them. With ``pipeline=False``
the same code runs statement by statement (one round trip each), same results.

Connections: one small pool per process (a Lambda container runs the records of a batch at once,
each with its connection and its heartbeat's: ``kairos.runtime`` sizes the pool for that; the
local stack and tests call handlers from several threads, which must never share a connection).
What a database restart or failover (Aurora behind RDS Proxy) does to them, and what the pool does:

* a connection the server ended while it sat in the pool (a restart, a failover, ``pg_terminate_backend``)
  is never handed out: the pool's ``check`` looks at its socket first (a zero-timeout poll, no round
  trip: the server's goodbye or a closed socket is there to read) and runs psycopg_pool's own
  ``check_connection`` on anything the poll finds, and on every connection idle longer than
  ``CHECK_AFTER_IDLE_SECONDS``. A quiet socket returned a moment ago is handed out without a round
  trip — the run path's counted round trips stay what they were;
* a connection that fails, in the check or in use, is discarded (psycopg_pool closes a broken
  connection when it comes back) and the pool is drained: the other idle connections died in the
  same event, and each would otherwise cost its own failed check and back-off pause;
* a caller waits at most ``CONNECTION_WAIT_SECONDS`` for a working connection (``PoolTimeout``, an
  ``OperationalError``), well inside API Gateway's 29 s: ``unavailable`` tells such errors from a
  fault of the request, and the API answers them 503 with ``Retry-After`` (a GET is tried once more
  first when a connection failed in use: ``lost``);
* reconnecting gives up after the same wait (``reconnect_timeout``) instead of backing off for
  minutes, and the next caller connects at once: the pool recovers as soon as the database does;
  a connection attempt to an unreachable host gives up after ``CONNECT_TIMEOUT_SECONDS``.

Time: every named query that needs "now" takes ``%(now)s`` and uses ``coalesce(%(now)s::timestamptz,
now())``, so the database clock is the authority and tests can move it (``tests/unit/test_sql_time.py``
holds every query to it; only the migrations' column defaults read the clock directly).
"""

from __future__ import annotations

import re
import select
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from importlib import resources
from typing import Any, LiteralString, NamedTuple, cast

import psycopg
from psycopg.adapt import PyFormat, Transformer
from psycopg.conninfo import conninfo_to_dict
from psycopg.generators import execute as _wait_results
from psycopg.rows import RowMaker, dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

Row = dict[str, Any]
Params = Mapping[str, Any]

_HEADER = re.compile(r"^--\s*name:\s*(?P<name>[a-z][a-z0-9_]*)(?P<prepared>\s+\(prepared\))?\s*$",
                     re.MULTILINE)


def load_queries(prepared: set[str] | None = None) -> dict[str, LiteralString]:
    """Every named query of every ``sql/*.sql`` file (a duplicate name is an error); the names of
    those headed ``(prepared)`` are added to ``prepared`` when given."""
    queries: dict[str, LiteralString] = {}
    for entry in sorted(resources.files("kairos.sql").iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        text = entry.read_text(encoding="utf-8")
        matches = list(_HEADER.finditer(text))
        for i, match in enumerate(matches):
            end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
            body = text[match.end() : end].strip()
            name = match.group("name")
            if name in queries:
                raise ValueError(f"query {name} defined twice")
            if not body:
                raise ValueError(f"query {name} is empty")
            queries[name] = cast(LiteralString, body)  # shipped with the package, never user input
            if match.group("prepared") and prepared is not None:
                prepared.add(name)
    return queries


_PLACEHOLDER = re.compile(r"%\((?P<name>[^)]+)\)s|%%|%.?", re.DOTALL)


class Compiled(NamedTuple):
    """A query as the server takes it: its text with ``$n`` placeholders, and the parameter name each
    ``$n`` stands for (``names[n - 1]``)."""

    text: bytes
    names: tuple[str, ...]

    def values(self, params: Params) -> list[Any]:
        """The values of ``params`` in placeholder order (other keys are ignored, as psycopg does)."""
        try:
            return [params[name] for name in self.names]
        except KeyError as missing:
            raise psycopg.ProgrammingError(f"query parameter missing: {missing.args[0]}") from None


def compile_query(text: str) -> Compiled:
    """``text`` with its ``%(name)s`` placeholders numbered ``$1``, ``$2``… in order of first use (a
    name used twice is one parameter) and ``%%`` made ``%``; any other ``%`` is an error (psycopg's
    positional ``%s`` and binary ``%(name)b`` have no use in the shipped queries)."""
    order: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        name = match.group("name")
        if name is not None:
            return f"${order.setdefault(name, len(order) + 1)}"
        if match.group(0) == "%%":
            return "%"
        raise ValueError(f"only '%(name)s' placeholders and '%%' may follow '%', got {match.group(0)!r}")

    return Compiled(_PLACEHOLDER.sub(number, text).encode(), tuple(order))


_prepared: set[str] = set()
QUERIES: dict[str, LiteralString] = load_queries(_prepared)
PREPARED: frozenset[str] = frozenset(_prepared)
COMPILED: dict[str, Compiled] = {name: compile_query(text) for name, text in QUERIES.items()}


def q(name: str) -> LiteralString:
    """The text of one named query."""
    return QUERIES[name]


@contextmanager
def atomic(conn: psycopg.Connection[Row]) -> Iterator[None]:
    """The caller's transaction when there is one; a transaction of our own on autocommit.

    A row lock only serializes writers while its transaction lasts: on an autocommit connection
    each statement would commit (and unlock) on its own, so the block gets a transaction. Inside a
    caller's transaction the block simply joins it (no savepoint: an error aborts the whole).
    """
    with conn.transaction() if conn.autocommit else nullcontext():
        yield


# A connection returned to the pool less than this long ago, whose socket has nothing to read, is
# handed out without a round trip: it was healthy a moment ago, and a session the server ended since
# (a restart, a failover, ``pg_terminate_backend``, an idle timeout) has left its FATAL message or a
# closed socket to read. Older ones (a Lambda container thawed after minutes) always get psycopg_pool's
# check. The return time is stamped by Database's own context managers, not by a pool ``reset``
# callback: with one, psycopg_pool hands every returned connection to a worker thread.
CHECK_AFTER_IDLE_SECONDS = 5.0
_RETURNED_AT = "kairos_returned_at"

# How long a caller waits for a working connection before ``PoolTimeout``: the API must answer (503)
# well inside API Gateway's 29 s, and the tick and the run worker fail their invocation instead of
# spending it. Reconnection attempts (1 s, 2 s… apart) give up after the same time, so a caller that
# comes once the database is back connects at once. Nothing Kairos does holds a connection this long.
CONNECTION_WAIT_SECONDS = 5.0
# libpq's connect_timeout (whole seconds) unless the URL sets one: a host that drops packets (a
# failed-over writer) cannot hold the pool's one growing attempt for the kernel's minutes.
CONNECT_TIMEOUT_SECONDS = 5


def _mark_returned(conn: psycopg.Connection[Any]) -> None:
    setattr(conn, _RETURNED_AT, time.monotonic())


def _has_input(conn: psycopg.Connection[Any]) -> bool:
    """Whether an idle connection's socket has something to read (or hung up): PostgreSQL never speaks
    unasked to an idle session that does not ``LISTEN`` except to end it. A zero-timeout poll."""
    try:
        fd = conn.fileno()
    except psycopg.Error:  # closed
        return True
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLPRI)
        return bool(poller.poll(0))
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable)


def _check_connection(conn: psycopg.Connection[Any]) -> None:
    """The pool's check (see ``CHECK_AFTER_IDLE_SECONDS``): raises for a connection that does not work."""
    returned = getattr(conn, _RETURNED_AT, None)
    if returned is not None and time.monotonic() - returned <= CHECK_AFTER_IDLE_SECONDS \
            and not _has_input(conn):
        return
    ConnectionPool.check_connection(conn)


# SQLSTATEs of a session the server ended or would not begin: admin_shutdown (a restart, a failover,
# pg_terminate_backend), crash_shutdown, cannot_connect_now (starting up, shutting down, recovering),
# too_many_connections. Class 08 (connection_exception) is the rest.
_UNAVAILABLE_STATES = frozenset({"57P01", "57P02", "57P03", "53300"})


def unavailable(error: BaseException) -> bool:
    """Whether ``error`` is the database out of reach for the moment — no working connection within
    ``CONNECTION_WAIT_SECONDS`` (``PoolTimeout``), or a connection that failed or was ended by the
    server — rather than a fault of the request: a caller may try again shortly (API: 503)."""
    if not isinstance(error, psycopg.OperationalError):
        return False
    state = error.sqlstate
    return state is None or state.startswith("08") or state in _UNAVAILABLE_STATES


def lost(error: BaseException) -> bool:
    """Whether ``error`` is a connection that failed in use (``unavailable``, not the pool's wait
    running out): an idempotent request may be tried once more, on a fresh connection."""
    return unavailable(error) and not isinstance(error, PoolTimeout)


# psycopg prepares a statement after this many executions unless told per call; every named query
# tells (``prepare=``), so this only keeps other statements (tests, tools) from ever being prepared.
_ONLY_WHEN_ASKED = 2**31 - 1


class Database:
    """A small thread-safe pool of autocommit-off connections returning dict rows."""

    def __init__(self, url: str, *, max_size: int = 4, prepared_statements: bool = True,
                 pipeline: bool = True) -> None:
        self.url = url
        self.prepared_statements = prepared_statements
        self.pipeline = pipeline
        kwargs: dict[str, Any] = {"row_factory": dict_row,
                                  "prepare_threshold": _ONLY_WHEN_ASKED if prepared_statements else None}
        if "connect_timeout" not in conninfo_to_dict(url):
            kwargs["connect_timeout"] = CONNECT_TIMEOUT_SECONDS
        self._pool = ConnectionPool(
            url,
            min_size=0,
            max_size=max_size,
            kwargs=kwargs,
            check=self._check,
            timeout=CONNECTION_WAIT_SECONDS,
            reconnect_timeout=CONNECTION_WAIT_SECONDS,
            open=True,
            name="kairos",
        )

    def _check(self, conn: psycopg.Connection[Any]) -> None:
        try:
            _check_connection(conn)
        except psycopg.Error:
            self._drain()
            raise

    def _drain(self) -> None:
        """A connection failed: its idle siblings most likely died in the same event (a restart, a
        failover), so they are closed and replaced now rather than found dead one checkout at a time."""
        self._pool.drain()

    @contextmanager
    def _borrowed(self) -> Iterator[psycopg.Connection[Row]]:
        """A pooled connection (the pool's transaction handling: commit on exit, roll back on error); one
        that broke in use is discarded by the pool when it comes back, and the idle ones are drained.
        psycopg_pool's ``connection()`` spelled out (``getconn``, the connection's own context, ``putconn``
        and the pool's usage statistic), with this pool's steps inside it: one generator fewer around
        each of a run's three checkouts."""
        pool = self._pool
        conn = cast("psycopg.Connection[Row]", pool.getconn())
        try:
            started = time.monotonic()
            with conn:
                try:
                    yield conn
                except BaseException:
                    if conn.broken:
                        self._drain()
                    raise
                finally:
                    _mark_returned(conn)
        finally:
            pool.putconn(conn)
            pool._stats[pool._USAGE_MS] += int(1000.0 * (time.monotonic() - started))

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection[Row]]:
        """A connection inside one transaction: committed on exit, rolled back on error."""
        with self._borrowed() as conn:
            yield conn

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Row]]:
        """A connection in autocommit mode, for callers that manage statements one by one."""
        with self._borrowed() as conn:
            _set_autocommit(conn, True)
            try:
                yield conn
            finally:
                if not conn.closed:  # a lost connection refuses the setting; the pool discards it anyway
                    _set_autocommit(conn, False)

    @contextmanager
    def explicit(self) -> Iterator[psycopg.Connection[Row]]:
        """An autocommit connection for a transaction the caller spells out (``begin`` … ``commit``
        as statements, so that a pipeline sends them with the statements around them). Should the
        block raise with the transaction open, it is rolled back here. Built on ``transaction()`` (so
        a pool that wraps that — a test injecting a fault — wraps this too): nothing is open yet when
        the connection is switched to autocommit."""
        with self.transaction() as conn:
            _set_autocommit(conn, True)
            try:
                yield conn
            except BaseException:
                _roll_back_open(conn)
                raise
            else:
                if _roll_back_open(conn):
                    raise RuntimeError("an explicit transaction was left open (rolled back)")
            finally:
                if conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                    _set_autocommit(conn, False)

    def batch(self, conn: psycopg.Connection[Row]) -> AbstractContextManager[Any]:
        """Pipeline mode on ``conn`` (see the module doc), unless this pool was built without it."""
        return conn.pipeline() if self.pipeline else nullcontext()

    @contextmanager
    def trip(self, conn: psycopg.Connection[Row]) -> Iterator[None]:
        """One transaction of the statements sent in the block, on an ``explicit()`` connection, in one
        round trip and without ``BEGIN`` and ``COMMIT`` statements: in pipeline mode the statements
        before a Sync are one implicit transaction of the extended protocol, which that Sync — the
        pipeline's end — commits (reading an answer inside the block flushes, it does not sync).
        Without pipeline mode: ``BEGIN`` … ``COMMIT`` around them, one trip each.
        The Sync ends the pipeline whether the block raised or not, so a block that raises midway
        commits what it had already sent: only for a transaction every prefix of which is whole on
        its own (the fork claim: a lock, one writing statement, a read)."""
        if self.pipeline:
            with conn.pipeline():
                yield
            return
        begin(conn)
        yield
        commit(conn)

    def close(self) -> None:
        self._pool.close()


def _set_autocommit(conn: psycopg.Connection[Any], value: bool) -> None:
    """``conn.autocommit = value``. With nothing open and no pipeline, psycopg's setter only stores the value
    under the connection's lock (through a property, two methods and a generator: some 2 % of a run's
    client CPU for its six switches), as is done here; anything else is psycopg's own (sync or refusal)."""
    with conn.lock:
        if conn.pgconn.transaction_status == _IDLE and not conn._pipeline:
            conn._autocommit = value
            return
    conn.autocommit = value


def _roll_back_open(conn: psycopg.Connection[Any]) -> bool:
    """Rolls back a transaction left open on a usable connection; whether there was one."""
    if conn.pgconn.status != psycopg.pq.ConnStatus.OK \
            or conn.pgconn.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        return False
    conn.execute("ROLLBACK")
    return True


def begin(conn: psycopg.Connection[Row]) -> None:
    """``BEGIN`` as a statement (``Database.explicit``): queued in a pipeline, not synced alone.
    Sent as the compiled statements are (``Statement``): ``Connection.execute`` would convert its
    text for placeholders first."""
    Statement(conn).command(b"BEGIN")


def commit(conn: psycopg.Connection[Row]) -> None:
    """``COMMIT`` as a statement (``Database.explicit``): in a pipeline it travels with the statements
    before it, and the pipeline's end waits for it (a failed commit raises there)."""
    Statement(conn).command(b"COMMIT")


class _NamedRows:
    """The row factory of one statement marked prepared: dict rows (as ``dict_row``) whose column
    names are read from its first result and kept. Such a statement names its result columns (the
    module doc), so its text fixes them; ``dict_row`` would read and decode every name again for each
    result (some 2 % of a run's client CPU in all). A result of another width, or one without rows,
    is left to ``dict_row``."""

    __slots__ = ("names",)

    def __init__(self) -> None:
        self.names: tuple[str, ...] | None = None

    def __call__(self, cursor: Any) -> RowMaker[Row]:
        names = self.names
        result = cursor.pgresult
        if names is None or result is None or result.status not in _ROWS_STATUS or result.nfields != len(names):
            if result is None or result.status not in _ROWS_STATUS:
                return dict_row(cursor)
            names = self.names = tuple(column.name for column in cursor.description or ())

        def make(values: Sequence[Any]) -> Row:
            return dict(zip(names, values, strict=False))

        return make


_ROWS_STATUS = frozenset({psycopg.pq.ExecStatus.TUPLES_OK, psycopg.pq.ExecStatus.SINGLE_TUPLE,
                          psycopg.pq.ExecStatus.TUPLES_CHUNK})
_named_rows: dict[bytes, _NamedRows] = {}


_AUTO = PyFormat.AUTO
_IDLE = psycopg.pq.TransactionStatus.IDLE
_TEXT = psycopg.pq.Format.TEXT
_NO_TRACEBACK = (psycopg.Error, KeyboardInterrupt)


class Statement(psycopg.RawCursor[Row]):
    """psycopg's ``RawCursor``, with a short way for the run path's two commonest sends: a statement
    this connection has already prepared (``prepared``), and ``BEGIN`` / ``COMMIT`` in a pipeline
    (``command``). They do what ``execute`` does in those cases — the same protocol messages, the same
    bookkeeping of psycopg's prepared statements and pipeline queues, the same results on the cursor —
    without its generic steps (a query object, its conversion, the generators around each step); in a
    pipeline the messages go into libpq's buffer and travel with the next flush or sync (every read of
    an answer flushes), instead of each being flushed on its own: some 15 % of a run's client CPU was
    psycopg's work around its ten statements. Anything else (a statement not prepared yet, one that
    would open a transaction on a connection outside autocommit, a closed cursor) is ``execute``'s."""

    __slots__ = ()

    def __init__(self, connection: psycopg.Connection[Any], *, row_factory: Any = None) -> None:
        """psycopg's ``Cursor.__init__``, except that the cursor reads the connection's adapters instead of
        a copy of its own (a copy lets a cursor register adapters of its own; nothing here does)."""
        self._conn = connection
        self.format = _TEXT
        self._pgconn = connection.pgconn
        self._adapters = connection.adapters
        self.arraysize = 1
        self._closed = False
        self._last_query = None
        self._reset()
        self._row_factory = row_factory or connection.row_factory

    def prepared(self, text: bytes, values: list[Any]) -> Statement:
        """``execute(text, values, prepare=True)``."""
        conn = self._conn
        if self._closed or not (conn.autocommit or self._pgconn.transaction_status != _IDLE):
            return self.execute(text, values, prepare=True)  # psycopg opens the transaction
        tx = Transformer(self)
        params = tx.dump_sequence(values, [_AUTO] * len(values))
        key = (text, tx.types or ())
        manager = conn._prepared
        name = manager._names.get(key)
        if name is None:  # not prepared on this connection yet (or its cache was cleared): psycopg prepares it
            return self.execute(text, values, prepare=True)
        try:
            with conn.lock:
                self._reset()
                self._tx = tx
                manager._names.move_to_end(key)  # psycopg's PrepareManager.maybe_add_to_cache, for a name it has
                pipeline = conn._pipeline
                if pipeline:
                    self._queue(pipeline, lambda: self._pgconn.send_query_prepared(
                        name, params, param_formats=tx.formats, result_format=_TEXT))
                else:
                    self._pgconn.send_query_prepared(name, params, param_formats=tx.formats, result_format=_TEXT)
                    results = conn.wait(_wait_results(self._pgconn))
                    self._check_results(results)
                    self._set_results(results)
                self._last_query = text
                if manager._to_flush:
                    conn.wait(manager.maintain_gen(conn))
        except _NO_TRACEBACK as error:
            raise error.with_traceback(None)  # noqa: B904 - as psycopg raises it: the same error, no frames of its own
        return self

    def command(self, text: bytes) -> Statement:
        """``execute(text, prepare=False)`` of a statement without parameters (``BEGIN``, ``COMMIT``)."""
        conn = self._conn
        pipeline = conn._pipeline
        if self._closed or not pipeline or not conn.autocommit:
            return self.execute(text, prepare=False)
        try:
            with conn.lock:
                self._reset()
                self._tx = Transformer(self)
                self._queue(pipeline, lambda: self._pgconn.send_query_params(
                    text, None, param_formats=None, param_types=(), result_format=_TEXT))
                self._last_query = text
        except _NO_TRACEBACK as error:
            raise error.with_traceback(None)  # noqa: B904 - as psycopg raises it: the same error, no frames of its own
        return self

    def _queue(self, pipeline: Any, send: Any) -> None:
        """One command of a pipeline and the cursor its results go to: straight into libpq's buffer when
        psycopg has no command waiting (it sends its queue in order before anything newer), else behind
        them in its queue."""
        if pipeline.command_queue:
            pipeline.command_queue.append(send)
        else:
            send()
        pipeline.result_queue.append((self, None))


def run(conn: psycopg.Connection[Row], query: Compiled, params: Params, *, prepare: bool) -> psycopg.RawCursor[Row]:
    """Runs one compiled statement and returns its cursor without reading it (queued in a pipeline).
    A statement marked prepared builds its rows with its kept column names (``_NamedRows``) and goes
    the short way once prepared (``Statement``)."""
    if not prepare:
        return Statement(conn).execute(query.text, query.values(params), prepare=False)
    rows = _named_rows.get(query.text)
    if rows is None:
        rows = _named_rows.setdefault(query.text, _NamedRows())
    return Statement(conn, row_factory=rows).prepared(query.text, query.values(params))


def send(conn: psycopg.Connection[Row], name: str, params: Params | None = None) -> psycopg.RawCursor[Row]:
    """Runs one named statement and returns its cursor without reading it: in a pipeline the statement
    is queued, and its rows (``fetchone`` / ``fetchall``) are read after a later sync."""
    return run(conn, COMPILED[name], params or {}, prepare=name in PREPARED)


def fetch_one(conn: psycopg.Connection[Row], name: str, params: Params | None = None) -> Row | None:
    return send(conn, name, params).fetchone()


class MissingRow(RuntimeError):
    """A named query returned no row where its caller's invariant says one exists (a query that always
    answers one row, an INSERT … RETURNING, a row locked or written earlier in the same transaction).
    A fault of the code or the schema, never of the request: nothing maps it to a 4xx."""

    def __init__(self, name: str) -> None:
        super().__init__(f"named query {name} returned no row, and one must exist")
        self.query = name


def expect_row(row: Row | None, name: str) -> Row:
    """``row``, the answer of the named query ``name``, which must be there; else ``MissingRow``.
    For a row read from a cursor ``send`` returned (in a pipeline); otherwise use ``fetch_row``."""
    if row is None:
        raise MissingRow(name)
    return row


def fetch_row(conn: psycopg.Connection[Row], name: str, params: Params | None = None) -> Row:
    """``fetch_one`` for a row that must exist: ``MissingRow`` (naming the query) when there is none.
    Unlike an ``assert``, it holds under ``python -O`` too."""
    return expect_row(fetch_one(conn, name, params), name)


def fetch_all(conn: psycopg.Connection[Row], name: str, params: Params | None = None) -> list[Row]:
    return send(conn, name, params).fetchall()


def execute(conn: psycopg.Connection[Row], name: str, params: Params | None = None) -> int:
    """Runs one named statement and returns the number of rows it touched."""
    return send(conn, name, params).rowcount


_databases: dict[str, Database] = {}
_lock = threading.Lock()


def shared(url: str, *, prepared_statements: bool = True, pipeline: bool = True, max_size: int = 4) -> Database:
    """The process-wide pool for ``url`` (one per Lambda container, reused across invocations), of at
    most ``max_size`` connections (the first caller's size; connections open only when borrowed)."""
    with _lock:
        db = _databases.get(url)
        if db is None:
            db = _databases[url] = Database(url, prepared_statements=prepared_statements, pipeline=pipeline,
                                            max_size=max_size)
        return db


def close_shared() -> int:
    """Closes every process-wide pool and forgets it (the next ``shared`` opens a new one); returns how
    many were closed. SnapStart's hooks call it: no connection may be captured in a snapshot."""
    with _lock:
        pools = list(_databases.values())
        _databases.clear()
    for pool in pools:
        pool.close()
    return len(pools)
