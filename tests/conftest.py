"""Shared fixtures: a real PostgreSQL, a migrated template database, a fresh clone per test.

The server is ``DATABASE_URL`` when set (its database is used only to create and drop others), else
an embedded server started once for the session. The schema is built once, by the real migration
runner, into a template database; every test that asks for ``db_url`` gets its own clone, so tests
are isolated and the suite stays fast (a clone costs milliseconds; migrating costs far more).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from kairos import migrations
from kairos.db import Database
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

TEMPLATE = "kairos_template"


@dataclass
class PgServer:
    admin_url: str
    bin_dir: str | None = None

    def url(self, database: str) -> str:
        params: dict[str, Any] = conninfo_to_dict(self.admin_url)
        params["dbname"] = database
        return make_conninfo(**params)

    def admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.admin_url, autocommit=True)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    given = os.environ.get("DATABASE_URL")
    if given:
        yield PgServer(given)
        return
    from kairos.localdb import LocalPostgres

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


@pytest.fixture
def db_url(pg_server: PgServer, template_db: str) -> Iterator[str]:
    """A fresh database cloned from the migrated template, dropped after the test."""
    name = f"kairos_test_{os.getpid()}_{next(_counter)}"
    with pg_server.admin() as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template_db))
        )
    try:
        yield pg_server.url(name)
    finally:
        with pg_server.admin() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


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
