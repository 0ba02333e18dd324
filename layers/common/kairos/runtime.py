"""Per-container resources: settings, the database pool and the SQS client, built once.

Handlers call these at invocation time (not import time), so importing a handler stays cheap and
tests can point the environment elsewhere and call ``reset()``.

The SQS client is built on first use, from a plain botocore session: ``boto3.client("sqs")`` is the
same botocore client behind boto3's session, but importing boto3 also imports s3transfer and the
resource layer, which nothing here uses. ``LazySqs`` defers even that: the tick holds one on every
invocation and builds the client only when it has a run id to send, so a tick with nothing due never
loads botocore. Configuration is botocore's usual chain either way (``AWS_REGION`` /
``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL``, the function's role).
"""

from __future__ import annotations

import threading
from typing import Any

from kairos import db
from kairos.handoff import MAX_PARALLEL_CALLS
from kairos.settings import Settings

_lock = threading.Lock()
_settings: Settings | None = None
_sqs: Any = None


def settings() -> Settings:
    global _settings
    with _lock:
        if _settings is None:
            _settings = Settings.from_env()
        return _settings


def database() -> db.Database:
    """The container's pool: room for every run of a batch at once, each with its own connection and
    its heartbeat's (``KAIROS_RUN_CONCURRENCY_PER_INVOCATION`` x 2), never fewer than 4."""
    s = settings()
    return db.shared(s.resolve_database_url(), prepared_statements=s.prepared_statements, pipeline=s.pipeline,
                     max_size=pool_size(s))


def pool_size(s: Settings) -> int:
    """Connections a container may need at once: a run and its heartbeat per concurrent run."""
    return max(4, 2 * s.run_concurrency_per_invocation)


def sqs() -> Any:
    """The container's SQS client (thread-safe, built once)."""
    global _sqs
    with _lock:
        if _sqs is None:
            _sqs = _new_sqs_client()
        return _sqs


def _new_sqs_client() -> Any:
    import botocore.session
    from botocore.config import Config


    # One pooled connection per call the handoff may have in flight (botocore's default is 10).
    config = Config(max_pool_connections=MAX_PARALLEL_CALLS)
    return botocore.session.get_session().create_client("sqs", config=config)


def drop_sqs_connections() -> bool:
    """Closes the SQS client's pooled HTTP connections, keeping the client (its next call connects
    anew); whether there was a client. SnapStart's hooks: no connection is captured in a snapshot."""
    with _lock:
        client = _sqs
    if client is None:
        return False
    client.close()
    return True


class LazySqs:
    """Stands in for ``sqs()`` until a call needs the client: attribute access builds it (once per
    container) and forwards. Holding one costs nothing; a tick with nothing to send never builds it."""

    def __getattr__(self, name: str) -> Any:
        return getattr(sqs(), name)


def reset() -> None:
    """Forget cached settings and clients (tests, and the local stack between configurations)."""
    global _settings, _sqs
    with _lock:
        _settings = None
        _sqs = None
