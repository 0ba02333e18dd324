"""SnapStart runtime hooks: what a function's snapshot holds, and what every restored copy rebuilds.

Role: TickFunction, RunFunction and ApiFunction run with Lambda SnapStart (``template.yaml``:
``SnapStart: ApplyOn: PublishedVersions``, invoked through the alias ``live``). Lambda initializes a
published version once, snapshots the memory and restores copies of it as new execution
environments. Each function's ``app.py`` calls ``register(...)`` at import; the Lambda runtime then
calls ``before_snapshot`` (once, before the snapshot) and ``after_restore`` (in every restored copy,
before its first invocation).

* ``before_snapshot`` does the slow first-use work so that restored copies start warm: the given
  ``warm`` steps (imports and caches of the function's own path), the SQS client (botocore imported,
  the service model loaded, the endpoint resolved) and the handoff's bounded pool; then it closes
  every connection: the database pools are closed and forgotten, the SQS client's HTTP connections
  closed.
* ``after_restore`` re-seeds ``random`` from the OS (restored copies would otherwise share one
  sequence; ``uuid4`` and ``secrets`` read ``os.urandom`` and need nothing), drops any database pool
  and SQS connection again (none should be there; nothing captured may ever be reused), and rebuilds
  the handoff pool, so the first invocation connects afresh.

Guarantees: no socket that existed before the snapshot is used after a restore; both hooks are
idempotent and safe where there is no SnapStart (nothing calls them). Must not: resolve secrets or
open connections in ``before_snapshot`` (the snapshot would hold them).

The library ``snapshot-restore-py`` is part of the Lambda Python runtime (3.12+); it is imported
guarded, so the handlers load where it is absent (``register`` then returns False). The dev extra pins
it for the tests.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence

from kairos import db, handoff, runtime
from kairos.observability import logger

Warm = Callable[[], object]

_lock = threading.Lock()
_registered: set[str] = set()


def before_snapshot(warm: Sequence[Warm] = ()) -> None:
    """Warm the function's path and the clients, then close every connection (see the module docstring)."""
    for step in warm:
        step()
    runtime.sqs()
    handoff.pool()
    closed = _drop_connections()
    logger.info("before snapshot: warmed, connections closed", extra={"action": "snapstart_before_snapshot",
                                                                      "database_pools_closed": closed})


def after_restore() -> None:
    """Re-seed randomness, drop whatever connection state came with the snapshot, rebuild the handoff pool."""
    random.seed()
    closed = _drop_connections()
    handoff.close_pool()
    handoff.pool()
    logger.info("after restore: reseeded, pools rebuilt", extra={"action": "snapstart_after_restore",
                                                                 "database_pools_closed": closed})


def _drop_connections() -> int:
    closed = db.close_shared()
    runtime.drop_sqs_connections()
    return closed


def register(function: str, warm: Sequence[Warm] = ()) -> bool:
    """Registers the two hooks for ``function`` (once per process); False when the runtime library is
    absent (not on Lambda, no dev extra)."""
    try:
        from snapshot_restore_py import register_after_restore, register_before_snapshot
    except ImportError:
        return False
    with _lock:
        if function in _registered:
            return True
        _registered.add(function)
    register_before_snapshot(before_snapshot, tuple(warm))
    register_after_restore(after_restore)
    return True
