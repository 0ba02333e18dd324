"""What the deployed API handler holds when SnapStart takes its snapshot, and what a run read loads.

Every ``kairos`` import sits at its module's top (``tests/unit/test_imports.py`` allows three lazy
paths), so importing ``functions/webhook/app.py`` loads the whole request path, and its before-snapshot
warm step loads the one lazy module the API has (``kairos.api.openapi``): a restored copy imports
nothing on its first request. A fresh interpreter shows each: ``sys.modules`` after the import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.imports import graph

ROOT = Path(__file__).resolve().parents[2]
NEVER_DEPLOYED = ("kairos.local", "kairos.chaos")  # development tooling, not in the Lambda layer


def _loaded(code: str, *args: str) -> set[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "layers" / "common")}
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, check=True)
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def _reachable(start: str) -> set[str]:
    edges, seen, todo = graph(), set(), [start]
    while todo:
        module = todo.pop()
        if module in seen or module.startswith(NEVER_DEPLOYED):
            continue
        seen.add(module)
        todo.extend(edges.get(module, ()))
    return seen


def test_the_deployed_api_handler_after_its_warm_step_holds_everything_a_request_can_import() -> None:
    """What a SnapStart copy of ApiFunction restores with: its handler module imported and its
    before-snapshot warm steps run (without the connections, which the snapshot does not keep)."""
    code = (
        "import importlib.util, json, sys\n"
        "spec = importlib.util.spec_from_file_location('app', sys.argv[1])\n"
        "app = importlib.util.module_from_spec(spec); spec.loader.exec_module(app)\n"
        "app._warm_api()\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    loaded = _loaded(code, str(ROOT / "functions" / "webhook" / "app.py"))
    needed = _reachable("kairos.api.app")
    assert {"kairos.api.routes.runs", "kairos.webhooks", "kairos.api.openapi", "kairos.runs"} <= needed
    assert needed - loaded == set(), "a module a request can import that the snapshot does not hold"
    assert not {m for m in loaded if m.startswith(NEVER_DEPLOYED)}


def test_reading_a_run_loads_neither_the_worker_nor_the_executors() -> None:
    loaded = _loaded("import json, sys; import kairos.runs; print(json.dumps(sorted(sys.modules)))")
    worker = {"kairos.execution.execute", "kairos.execution.claim", "kairos.execution.heartbeat",
              "kairos.execution.sqs", "kairos.executors", "kairos.executors.base", "kairos.effects",
              "kairos.conversations"}
    assert "kairos.runs.moves" in loaded
    assert not worker & loaded, worker & loaded
