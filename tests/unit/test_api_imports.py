"""What importing the API loads: the routers, and none of the library the listings do not need.

The routes import ``kairos.runs``, ``kairos.webhooks`` (with the calendar), ``kairos.handoff`` and
``kairos.idempotency`` when first called, so importing ``kairos.api.app`` does not load them. The
deployed handler is another matter: ``functions/webhook/app.py`` imports ``kairos.snapstart`` (and with
it ``kairos.handoff``) and warms the webhook path before the SnapStart snapshot, so a restored copy holds
all of them but ``kairos.runs``. A fresh interpreter shows each: ``sys.modules`` after the import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAZY = {"kairos.runs", "kairos.webhooks", "kairos.calendar", "kairos.handoff", "kairos.idempotency"}


def test_importing_the_api_loads_its_routers_and_none_of_the_lazy_library() -> None:
    code = "import json, sys; import kairos.api.app; print(json.dumps(sorted(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "layers" / "common")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    routers = {f"kairos.api.routes.{name}" for name in ("conversations", "schedules", "secrets", "hooks", "runs",
                                                                 "approvals")}
    assert routers <= loaded
    assert not LAZY & loaded, LAZY & loaded


def test_reading_a_run_loads_neither_the_worker_nor_the_executors() -> None:
    code = "import json, sys; import kairos.runs; print(json.dumps(sorted(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "layers" / "common")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    worker = {"kairos.execution.execute", "kairos.execution.claim", "kairos.execution.heartbeat",
              "kairos.execution.sqs",
              "kairos.executors", "kairos.executors.base", "kairos.effects", "kairos.conversations"}
    assert "kairos.runs.moves" in loaded
    assert not worker & loaded, worker & loaded


def test_the_deployed_api_handler_after_its_warm_step_holds_the_webhook_path_and_not_the_runs() -> None:
    """What a SnapStart copy of ApiFunction restores with: its handler module imported and its
    before-snapshot warm steps run (without the connections, which the snapshot does not keep)."""
    code = (
        "import importlib.util, json, sys\n"
        "spec = importlib.util.spec_from_file_location('app', sys.argv[1])\n"
        "app = importlib.util.module_from_spec(spec); spec.loader.exec_module(app)\n"
        "app._warm_api()\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "layers" / "common")}
    done = subprocess.run([sys.executable, "-c", code, str(ROOT / "functions" / "webhook" / "app.py")],
                          env=env, capture_output=True, text=True, check=True)
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert LAZY - loaded == {"kairos.runs"}
