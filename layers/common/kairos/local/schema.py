"""The current schema as one file: ``docs/schema.sql`` is ``pg_dump --schema-only`` of a database the
migrations built, so a reader sees every table, index, constraint and trigger without replaying
twenty-odd migrations in their head.

``python -m kairos.local.schema`` (or ``./scripts/schema``) rewrites the file: it starts the embedded
PostgreSQL (whose ``bin`` has the matching ``pg_dump``), applies the migrations to a new database and
writes the dump. ``tests/db/test_schema_file.py`` applies the migrations the same way and fails when
the file is not what they build.

The dump is normalised so that it depends on the schema alone: no owners or grants, no ``--`` comment
lines (pg_dump's own name its version and each object; the file's header says which major
version wrote it), no ``SET`` /
``set_config`` preamble and no ``\\restrict`` lines (a random key per dump), one blank line between
statements. Development tooling: not part of the Lambda layer, never run by a function.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psycopg
from psycopg import sql

from kairos import migrations

FILE = Path(__file__).resolve().parents[4] / "docs" / "schema.sql"
HEADER = (
    "-- The current Kairos schema: pg_dump --schema-only of a database the migrations in\n"
    "-- layers/common/kairos/migrations/ built, normalised (kairos.local.schema). Generated: do not edit;\n"
    "-- regenerate with ./scripts/schema. tests/db/test_schema_file.py holds it equal to the migrations.\n"
    "-- pg_dump major version: {major}\n"
)
_DROPPED = re.compile(r"^(--.*|SET .*;|SELECT pg_catalog\.set_config\(.*\);|\\(?:un)?restrict .*)$")


def normalise(dump: str) -> str:
    """The statements of a pg_dump text, without comments, settings or per-dump keys."""
    lines = [line.rstrip() for line in dump.splitlines() if not _DROPPED.match(line)]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    return text + "\n"


def pg_dump_major(pg_dump: str) -> int:
    version = subprocess.run([pg_dump, "--version"], capture_output=True, text=True, check=True).stdout  # noqa: S603
    found = re.search(r"(\d+)(?:\.\d+)?", version)
    if found is None:
        raise RuntimeError(f"cannot read pg_dump's version from {version!r}")
    return int(found[1])


def dump(url: str, pg_dump: str) -> str:
    """The normalised schema of the database at ``url``, with the file's header."""
    out = subprocess.run(  # noqa: S603 - our own pg_dump, arguments are ours
        [pg_dump, "--schema-only", "--no-owner", "--no-privileges", "--dbname", url],
        capture_output=True, text=True, check=True,
    ).stdout
    return HEADER.format(major=pg_dump_major(pg_dump)) + "\n" + normalise(out)


def migrated(admin_url: str, url_of: Callable[[str], str], name: str = "kairos_schema") -> str:
    """A fresh database ``name`` on the server, built by the migration runner; returns its URL.
    ``url_of(name)`` makes a database's URL from the server's."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = url_of(name)
    migrations.apply(url)
    return url


def main() -> int:
    from kairos.local.postgres import running

    with running() as server:
        url = migrated(server.url(), server.url)
        FILE.write_text(dump(url, str(server.bin_dir / "pg_dump")), encoding="utf-8")
    print(f"wrote {FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
