"""Starting ``kairos dev`` for the end-to-end tests and reading its output line by line while it runs."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


def reader(stream: Any, lines: queue.Queue[str], log: list[str]) -> None:
    """Thread target: every line of ``stream`` into ``lines`` (to wait on) and ``log`` (to report)."""
    for line in iter(stream.readline, ""):
        log.append(line)
        lines.put(line)


def wait_for(lines: queue.Queue[str], pattern: str, log: list[str], timeout: float = 120) -> re.Match[str]:
    """The first line matching ``pattern`` within ``timeout`` seconds, else a failure showing the log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            break
        match = re.search(pattern, line)
        if match:
            return match
    raise AssertionError(f"no line matching {pattern!r}; output so far:\n{''.join(log)}")


def start_dev(cwd: Path, *, drop: tuple[str, ...] = (), args: tuple[str, ...] = ()
              ) -> tuple[subprocess.Popen[str], queue.Queue[str], list[str]]:
    """``kairos dev`` as a newcomer starts it, in ``cwd`` (a fresh data directory, a free port, a 1 s
    tick, none of this process's database or queue settings, nor the ``drop`` variables; ``args`` added,
    e.g. ``--reset``), with a thread reading its output into the returned queue and log. The caller
    stops it."""
    unset = ("DATABASE_URL", "AWS_ENDPOINT_URL", "RUN_QUEUE_URL", *drop)
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kairos", "dev", "--port", "0", "--tick-seconds", "1", "--data-dir", "state", *args],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    log: list[str] = []
    threading.Thread(target=reader, args=(proc.stdout, lines, log), daemon=True).start()
    return proc, lines, log


def stop_dev(proc: subprocess.Popen[str]) -> None:
    """Ctrl-C for a ``start_dev`` stack, as a user stops it; killed if it has not exited within a minute."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def http_json(method: str, url: str, body: dict[str, Any] | None = None, headers: dict[str, str] | None = None
              ) -> tuple[int, dict[str, Any]]:
    """One JSON request to the stack: its status and decoded body, whatever the status."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        request.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")
