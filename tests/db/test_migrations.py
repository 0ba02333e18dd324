"""Migrations: applied once each under the advisory lock, checksummed, forward only."""

from __future__ import annotations

import threading

import psycopg
import pytest
from kairos import migrations
from kairos.migrations import Migration, MigrationError


def _applied(url: str) -> list[tuple[int, str]]:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT version, checksum FROM kairos_migrations ORDER BY version").fetchall()


def test_apply_creates_every_table_and_records_checksums(empty_db_url: str) -> None:
    applied = migrations.apply(empty_db_url)
    assert [m.version for m in applied] == [m.version for m in migrations.discover()]
    with psycopg.connect(empty_db_url) as conn:
        tables = {
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
            )
        }
    assert {
        "schedules", "occurrences", "runs", "run_events", "effects", "webhook_receipts",
        "conversations", "conversation_entries", "inbox_notes", "kairos_migrations",
    } <= tables
    assert _applied(empty_db_url) == [(m.version, m.checksum) for m in migrations.discover()]


def test_second_apply_is_a_no_op(empty_db_url: str) -> None:
    migrations.apply(empty_db_url)
    assert migrations.apply(empty_db_url) == []


def test_concurrent_runners_apply_each_migration_once(empty_db_url: str) -> None:
    # Given a migration that fails if it runs twice (CREATE TABLE without IF NOT EXISTS) and a
    # slow one before it, so runners overlap inside the lock window
    extra = [
        *migrations.discover(),
        Migration(9001, "slow", "SELECT pg_sleep(0.2)"),
        Migration(9002, "once_only", "CREATE TABLE applied_once (x int)"),
    ]
    results: list[list[Migration]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def runner() -> None:
        barrier.wait()
        try:
            results.append(migrations.apply(empty_db_url, extra))
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=runner) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    # Then no runner failed, and every migration was applied by exactly one of them
    assert errors == []
    applied_versions = sorted(m.version for batch in results for m in batch)
    assert applied_versions == sorted(m.version for m in extra)
    assert [v for v, _ in _applied(empty_db_url)] == sorted(m.version for m in extra)


def test_changed_applied_file_is_refused(empty_db_url: str) -> None:
    original = [Migration(9101, "thing", "CREATE TABLE thing (x int)")]
    migrations.apply(empty_db_url, original)
    edited = [Migration(9101, "thing", "CREATE TABLE thing (x int, y int)")]
    with pytest.raises(MigrationError, match="changed after it was applied"):
        migrations.apply(empty_db_url, edited)
