"""The SnapStart hooks (``kairos.snapstart``): nothing connected survives ``before_snapshot``, and
``after_restore`` rebuilds what a restored copy needs (a fresh handoff pool, fresh randomness).

Real PostgreSQL (a pool that has served a query), a real botocore client that has talked to the local
SQS stand-in over HTTP: the test looks at the connections themselves, not at mocks.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from kairos import db, handoff, runtime, snapstart
from tests.support.standin import SqsStandin


def open_http_connections(client: Any) -> int:
    """The kept-alive connections in the client's urllib3 pools (a queue slot holds one or None)."""
    manager = client._endpoint.http_session._manager
    return sum(1 for pool in list(manager.pools._container.values()) if pool.pool is not None
               for conn in list(pool.pool.queue) if conn is not None)


def server_connections(db_url: str) -> int:
    """Backends connected to the test database other than the asking one."""
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                           " AND pid <> pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def container(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[SqsStandin]:
    """A container's resources pointed at the test database and the SQS stand-in."""
    with SqsStandin() as standin:
        for key, value in {"DATABASE_URL": db_url, "RUN_QUEUE_URL": standin.queue_url,
                           "AWS_ENDPOINT_URL": standin.url, "AWS_DEFAULT_REGION": "us-east-1",
                           "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}.items():
            monkeypatch.setenv(key, value)
        runtime.reset()
        db.close_shared()
        try:
            yield standin
        finally:
            db.close_shared()
            runtime.reset()


def use_everything(standin: SqsStandin) -> None:
    """What an invocation leaves behind: a pooled database connection and a kept-alive SQS connection."""
    with runtime.database().transaction() as conn:
        conn.execute("SELECT 1")
    result = handoff.send_batch(runtime.sqs(), standin.queue_url, [uuid.uuid4() for _ in range(30)])
    assert len(result.sent) == 30


def test_before_snapshot_leaves_no_connection_open(container: SqsStandin, db_url: str) -> None:
    use_everything(container)
    pool = runtime.database()
    assert server_connections(db_url) >= 1
    assert open_http_connections(runtime.sqs()) >= 1

    warmed: list[str] = []
    snapstart.before_snapshot(warm=(lambda: warmed.append("warm"),))

    assert warmed == ["warm"]
    assert db._databases == {} and pool._pool.closed  # the pool is closed and forgotten
    # A closed connection's backend exits on its own time: asked again until it has (bounded, no sleep).
    assert any(server_connections(db_url) == 0 for _ in range(500))
    client = runtime.sqs()
    assert open_http_connections(client) == 0  # the client is kept (warm), its sockets are not
    assert handoff._pool is not None  # the pool object is built; it holds threads only once used


def test_before_snapshot_builds_the_sqs_client_without_connecting(container: SqsStandin) -> None:
    assert runtime._sqs is None
    snapstart.before_snapshot()
    assert runtime._sqs is not None
    assert container.stats.calls == 0
    assert open_http_connections(runtime._sqs) == 0


def test_after_restore_rebuilds_the_pools_and_reseeds(container: SqsStandin, db_url: str) -> None:
    use_everything(container)
    snapstart.before_snapshot()
    pool_before = handoff.pool()
    random.seed(1234)  # what every restored copy would share without a re-seed
    shared = [random.random() for _ in range(3)]
    random.seed(1234)

    snapstart.after_restore()

    assert [random.random() for _ in range(3)] != shared
    assert handoff.pool() is not pool_before
    assert db._databases == {}
    # The first invocation after the restore connects afresh and works.
    use_everything(container)
    assert server_connections(db_url) >= 1


def test_after_restore_drops_a_pool_that_was_left_open(container: SqsStandin, db_url: str) -> None:
    """Even if something connected after before_snapshot, a restored copy never reuses it."""
    use_everything(container)
    stale = runtime.database()
    snapstart.after_restore()
    assert stale._pool.closed and db._databases == {}
    assert open_http_connections(runtime.sqs()) == 0


def test_register_adds_each_hook_once_per_function() -> None:
    import snapshot_restore_py as library

    before = len(library._before_snapshot_registry), len(library._after_restore_registry)
    assert snapstart.register("test-function")
    assert snapstart.register("test-function")
    after = len(library._before_snapshot_registry), len(library._after_restore_registry)
    assert after == (before[0] + 1, before[1] + 1)
