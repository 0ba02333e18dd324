"""Schema migrations: ``NNNN_name.sql`` files applied in order, once each, forward only.

``apply(url)`` takes a session advisory lock, so concurrent runners (two deploys, a deploy and a
test) serialize and each file is applied exactly once; each file runs in its own transaction with
its row in ``kairos_migrations`` (version, name, SHA-256). An applied file whose text changed is an
error, never re-applied: write a new migration instead. Migrations run at deploy time (a pipeline
step or ``kairos migrate``), never on a Lambda cold start.

Numbers need not be contiguous: files apply in the order of their numbers and each is recorded by
its own. ``0013`` was never committed (``0014_corpus`` followed ``0012`` directly), so no database
has one to miss; a number once released is never reused.

One edit of applied files was made on purpose: the opening comments of the migrations in ``REWORDED``
pointed readers at a document outside the repository and were reworded, comment lines only. A database
that recorded the text before keeps it valid: the file's previous digest is accepted once and the row
is brought up to the new one, in the same locked pass. Any other change is still refused.
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

# version -> the SHA-256 of the file before its opening comment was reworded (comment lines only).
REWORDED: dict[int, str] = {
    1: "1baf36e9916c5f31faf45ccbc5b9c5debd262956d7e311680ce4995eb44b0c02",
    3: "f83fb0d240d3f3644d47bde4047c04b2efa892c34dad4056363ad370288eb16d",
    4: "43cb95e0827d4cff6df600fc95a3d2e7890258469974d315ddde5b6cf810e43f",
    7: "bc41fa3cce53b2bc9219827d8ec3455c0d3701d0dede9d50897f08d9e577cd75",
    8: "ef83f6f72136798080c13ddb72b329ceea43d187406f65d6ce7fe6149af1138c",
    9: "fd6e17a250273907af8e6c780c6a692c387802357bedb6e291956390a155e1ab",
    10: "d51e6ed69d0f0785945d84579b113bfa23017f1bc5d4386fa9affdd947131532",
    11: "c128b1ebf7a01e66e8e106a06775bd12186c23f04edeb969bac4cef38dd69c1b",
    12: "dea57736aa6c0aacaa0f3b722ecfc87bff8468efb8dbb7fcd968cab2dc04cba9",
    14: "be6d4ca8c6a2dd17aaf68c11ffe278a18910413939747aef61bf362157af2934",
    15: "f4a64aaf0b80d8b3b3a63b2da5798fd58b413995203d0975940d424d666f63bf",
}

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
                    if checksum == REWORDED.get(migration.version) != migration.checksum:
                        conn.execute(
                            "UPDATE kairos_migrations SET checksum = %s WHERE version = %s AND checksum = %s",
                            (migration.checksum, migration.version, checksum),
                        )
                    elif checksum != migration.checksum:
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
