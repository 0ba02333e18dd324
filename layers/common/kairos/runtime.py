"""Per-container resources: settings, the database pool and the SQS client, built once.

Handlers call these at invocation time (not import time), so importing a handler stays cheap and
tests can point the environment elsewhere and call ``reset()``.
"""

from __future__ import annotations

import threading
from typing import Any

from kairos import db
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
    s = settings()
    return db.shared(s.resolve_database_url(), prepared_statements=s.prepared_statements)


def sqs() -> Any:
    global _sqs
    with _lock:
        if _sqs is None:
            import boto3

            _sqs = boto3.client("sqs")
        return _sqs


def reset() -> None:
    """Forget cached settings and clients (tests, and the local stack between configurations)."""
    global _settings, _sqs
    with _lock:
        _settings = None
        _sqs = None
