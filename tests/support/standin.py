"""The SQS stand-in of the benchmarks (``bench/sqs_standin.py``), loaded from its file for the tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[2] / "bench" / "sqs_standin.py"
_spec = importlib.util.spec_from_file_location("kairos_bench_sqs_standin", _PATH)
assert _spec is not None and _spec.loader is not None
_module = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _module  # dataclasses look their module up while building
_spec.loader.exec_module(_module)

SqsStandin = _module.SqsStandin
