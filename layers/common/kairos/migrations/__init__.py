"""Schema migrations: ``NNNN_name.sql`` files applied in order, once each, forward only.

``apply(url)`` takes a session advisory lock, so concurrent runners (two deploys, a deploy and a
test) serialize and each file is applied exactly once; each file runs in its own transaction with
its row in ``kairos_migrations`` (version, name, SHA-256). An applied file whose text changed is an
error, never re-applied: write a new migration instead. Migrations run at deploy time (a pipeline
step or ``kairos migrate``), never on a Lambda cold start.

Numbers need not be contiguous: files apply in the order of their numbers and each is recorded by
its own. ``0013`` was never committed (``0014_corpus`` followed ``0012`` directly), so no database
has one to miss; a number once released is never reused.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from typing import LiteralString, cast

import psycopg

# An arbitrary constant: the advisory lock key every Kairos migration runner agrees on.
LOCK_KEY = 0x4B41_4952_4F53  # "KAIROS"

_FILE = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")


class MigrationError(RuntimeError):
    pass


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()


def discover() -> list[Migration]:
    found: list[Migration] = []
    for entry in resources.files(__name__).iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(
                Migration(int(match["version"]), match["name"], entry.read_text(encoding="utf-8"))
            )
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migrations share a version: {versions}")
    return found


def apply(url: str, migrations: list[Migration] | None = None) -> list[Migration]:
    """Applies what is missing; returns the migrations this call applied (often none)."""
    todo = discover() if migrations is None else migrations
    applied_now: list[Migration] = []
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (LOCK_KEY,))
        try:
            conn.execute(
                """CREATE TABLE IF NOT EXISTS kairos_migrations (
                       version    integer PRIMARY KEY,
                       name       text NOT NULL,
                       checksum   text NOT NULL,
                       applied_at timestamptz NOT NULL DEFAULT now())"""
            )
            rows = conn.execute("SELECT version, name, checksum FROM kairos_migrations").fetchall()
            done = {version: (name, checksum) for version, name, checksum in rows}
            for migration in todo:
                if migration.version in done:
                    name, checksum = done[migration.version]
                    if checksum != migration.checksum:
                        raise MigrationError(
                            f"migration {migration.version:04d}_{name} changed after it was applied; "
                            "write a new migration instead of editing an applied one"
                        )
                    continue
                with conn.transaction():
                    conn.execute(cast(LiteralString, migration.sql))
                    conn.execute(
                        "INSERT INTO kairos_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                        (migration.version, migration.name, migration.checksum),
                    )
                applied_now.append(migration)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (LOCK_KEY,))
    return applied_now
