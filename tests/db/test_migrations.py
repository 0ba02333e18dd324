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


DIRTY_TARGETS = [
    ("https://gw.example/v1/chat/completions?api-key=K1", "https://gw.example/v1/chat/completions"),
    ("https://gw.example/v1?api-version=2024&key=K2#frag", "https://gw.example/v1"),
    ("https://user:K3@gw.example:8443/hook", "https://gw.example:8443/hook"),
    ("http://K4@gw.example/hook#x?y", "http://gw.example/hook"),
    ("https://gw.example/a@b/c", "https://gw.example/a@b/c"),  # an @ in the path is no userinfo
    ("https://bedrock-runtime.us-east-1.amazonaws.com/model/m/converse",
     "https://bedrock-runtime.us-east-1.amazonaws.com/model/m/converse"),
]


def test_0006_scrubs_query_fragment_and_userinfo_from_recorded_effect_targets(db_url: str) -> None:
    from kairos.executors.base import recorded_target
    from tests import factories

    # Given effects recorded before the scrub, with keys in their targets
    run = factories.run(db_url, state="running")
    with psycopg.connect(db_url, autocommit=True) as conn:
        for step, (dirty, _) in enumerate(DIRTY_TARGETS):
            conn.execute(
                """INSERT INTO effects (id, run_id, fence, attempt, step, kind, mutation, target, request_digest,
                                        state, settled_at)
                   VALUES (gen_random_uuid(), %s, 1, 1, %s, 'model_call', false, %s, 'd', 'settled', now())""",
                (run["id"], f"s{step}", dirty))
        (scrub,) = [m for m in migrations.discover() if m.version == 6]

        # When the migration runs over them
        conn.execute(scrub.sql)

        rows = dict(conn.execute("SELECT step, target FROM effects WHERE run_id = %s", (run["id"],)).fetchall())
    # Then each keeps only scheme, host, port and path: what recorded_target keeps for a new row
    for step, (dirty, clean) in enumerate(DIRTY_TARGETS):
        assert rows[f"s{step}"] == clean == recorded_target(dirty)


def test_a_database_that_recorded_a_reworded_file_keeps_it_valid(empty_db_url: str) -> None:
    """Files in REWORDED had their opening comment reworded after they were applied: the digest a
    database recorded before is accepted once and replaced by the current one; nothing is re-applied."""
    migrations.apply(empty_db_url)
    with psycopg.connect(empty_db_url) as conn:
        for version, previous in migrations.REWORDED.items():
            conn.execute("UPDATE kairos_migrations SET checksum = %s WHERE version = %s", (previous, version))
    assert migrations.apply(empty_db_url) == []
    assert _applied(empty_db_url) == [(m.version, m.checksum) for m in migrations.discover()]


def test_a_reworded_file_with_any_other_recorded_digest_is_still_refused(empty_db_url: str) -> None:
    migrations.apply(empty_db_url)
    version = min(migrations.REWORDED)
    with psycopg.connect(empty_db_url) as conn:
        conn.execute("UPDATE kairos_migrations SET checksum = %s WHERE version = %s", ("0" * 64, version))
    with pytest.raises(MigrationError, match="changed after it was applied"):
        migrations.apply(empty_db_url)
    assert dict(_applied(empty_db_url))[version] == "0" * 64


def test_every_reworded_version_is_a_file_whose_text_did_change() -> None:
    current = {m.version: m.checksum for m in migrations.discover()}
    assert migrations.REWORDED and all(
        version in current and current[version] != previous
        for version, previous in migrations.REWORDED.items()
    )
