"""docs/schema.sql is the schema the migrations build: the migrations are applied to a fresh database
on the test server and its normalised ``pg_dump --schema-only`` must equal the file. After a new
migration, ``./scripts/schema`` rewrites it."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from psycopg import sql

from kairos.local import schema
from tests.support.postgres import PgServer


def _pg_dump(pg_server: PgServer) -> str:
    found = str(Path(pg_server.bin_dir) / "pg_dump") if pg_server.bin_dir else shutil.which("pg_dump")
    if found is None:
        pytest.skip("no pg_dump for DATABASE_URL's server on PATH")
    return found


def test_the_normalised_dump_keeps_statements_only() -> None:
    dump = "--\n-- PostgreSQL database dump\n--\n\\restrict abc123\nSET lock_timeout = 0;\n" \
           "SELECT pg_catalog.set_config('search_path', '', false);\n\n\n\nCREATE TABLE public.t (\n" \
           "    id integer\n);\n\n\n-- Name: t; Type: TABLE\n\\unrestrict abc123\n"
    assert schema.normalise(dump) == "CREATE TABLE public.t (\n    id integer\n);\n"


def test_docs_schema_sql_is_what_the_migrations_build(pg_server: PgServer) -> None:
    pg_dump = _pg_dump(pg_server)
    written = schema.FILE.read_text(encoding="utf-8")
    major = re.search(r"^-- pg_dump major version: (\d+)$", written, re.M)
    assert major is not None, "docs/schema.sql has no pg_dump version line"
    if schema.pg_dump_major(pg_dump) != int(major[1]):
        pytest.skip(f"docs/schema.sql was written by pg_dump {major[1]}; this server's pg_dump differs")
    name = "kairos_schema_check"
    url = schema.migrated(pg_server.admin_url, pg_server.url, name)
    try:
        dumped = schema.dump(url, pg_dump)
    finally:
        with pg_server.admin() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    assert dumped == written, "docs/schema.sql is stale: run ./scripts/schema"
