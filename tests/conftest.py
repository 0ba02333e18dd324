"""Shared fixtures: a real PostgreSQL, a migrated template database, a fresh clone per test.

The server is ``DATABASE_URL`` when set (its database is used only to create and drop others), else
an embedded server started once for the session. The schema is built once, by the real migration
runner, into a template database; every test that asks for ``db_url`` gets its own clone, so tests
are isolated and the suite stays fast (a clone costs milliseconds; migrating costs far more).

Also every test's ``lambda_context`` and ``sqs_queue`` (``tests.support.aws``); ``tests/db/conftest.py``
adds ``api`` and ``fake_openai``, ``tests/e2e/conftest.py`` adds ``api``.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from kairos import migrations
from kairos.db import Database
from tests.support.aws import lambda_context, sqs_queue  # noqa: F401 - fixtures for every test
from tests.support.postgres import PgServer

TEMPLATE = "kairos_template"


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    given = os.environ.get("DATABASE_URL")
    if given:
        yield PgServer(given)
        return
    from kairos.local.postgres import LocalPostgres

    server = LocalPostgres()
    try:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            # Durability is not under test here; the clone-per-test pattern checkpoints a lot.
            conn.execute("ALTER SYSTEM SET fsync = off")
            conn.execute("ALTER SYSTEM SET synchronous_commit = off")
            conn.execute("ALTER SYSTEM SET full_page_writes = off")
            conn.execute("SELECT pg_reload_conf()")
        yield PgServer(server.url(), str(server.bin_dir))
    finally:
        server.stop()


@pytest.fixture(scope="session")
def template_db(pg_server: PgServer) -> str:
    with pg_server.admin() as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(TEMPLATE)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE)))
    migrations.apply(pg_server.url(TEMPLATE))
    return TEMPLATE


_counter = itertools.count()


class ClonePool:
    """Clones of the template made ahead of time, and dropped behind, by one background thread.

    ``CREATE DATABASE … STRATEGY FILE_COPY`` costs ~0.1 s (more on a busy machine); doing it while
    the previous test runs takes it off the critical path. Each test still gets a fresh clone.
    """

    def __init__(self, server: PgServer, template: str, ahead: int = 2) -> None:
        self._server = server
        self._template = template
        self._ready: queue.Queue[str | BaseException] = queue.Queue(maxsize=ahead)
        self._drop: queue.Queue[str | None] = queue.Queue()
        self._stop = threading.Event()
        self._maker = threading.Thread(target=self._make, name="clone-maker", daemon=True)
        self._dropper = threading.Thread(target=self._dropping, name="clone-dropper", daemon=True)
        self._maker.start()
        self._dropper.start()

    def _make(self) -> None:
        with self._server.admin() as conn:
            while not self._stop.is_set():
                name = f"kairos_test_{os.getpid()}_{next(_counter)}"
                try:
                    conn.execute(
                        sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                            sql.Identifier(name), sql.Identifier(self._template)
                        )
                    )
                    item: str | BaseException = name
                except psycopg.Error as exc:
                    item = exc
                while not self._stop.is_set():
                    try:
                        self._ready.put(item, timeout=0.2)
                        break
                    except queue.Full:
                        continue

    def _dropping(self) -> None:
        with self._server.admin() as conn:
            while True:
                name = self._drop.get()
                if name is None:
                    return
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def take(self) -> str:
        item = self._ready.get(timeout=120)
        if isinstance(item, BaseException):
            raise item
        return item

    def give_back(self, name: str) -> None:
        self._drop.put(name)

    def close(self) -> None:
        self._stop.set()
        self._maker.join(timeout=30)
        while not self._ready.empty():
            item = self._ready.get_nowait()
            if isinstance(item, str):
                self._drop.put(item)
        self._drop.put(None)
        self._dropper.join(timeout=120)


@pytest.fixture(scope="session")
def clone_pool(pg_server: PgServer, template_db: str) -> Iterator[ClonePool]:
    pool = ClonePool(pg_server, template_db)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def db_url(pg_server: PgServer, clone_pool: ClonePool) -> Iterator[str]:
    """A fresh database cloned from the migrated template, dropped after the test."""
    name = clone_pool.take()
    try:
        yield pg_server.url(name)
    finally:
        clone_pool.give_back(name)


@pytest.fixture
def empty_db_url(pg_server: PgServer) -> Iterator[str]:
    """A fresh database with no schema at all (for migration tests)."""
    name = f"kairos_empty_{os.getpid()}_{next(_counter)}"
    with pg_server.admin() as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield pg_server.url(name)
    finally:
        with pg_server.admin() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = Database(db_url, max_size=8)
    try:
        yield database
    finally:
        database.close()
