"""Cold start: each handler's import and first invocation in a fresh interpreter, beside `import boto3`.

Every sample is a new Python process (as a new Lambda container is), which times only its own work:
importing ``functions/<name>/app.py`` and calling ``handler`` once with a representative event that
reaches the database (a real embedded PostgreSQL, migrated) and, for the tick, moto's SQS server.
The baseline is a fresh process doing only ``import boto3``, which every Python Lambda that talks to
AWS pays. Target: each handler's import + first call at most 2x that baseline.

Run: ``.venv/bin/python bench/coldstart.py [--samples 7]``. Prints a markdown table (medians).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time, importlib.util
name = sys.argv[1]
t0 = time.perf_counter()
if name == "baseline":
    import boto3  # noqa: F401
    t1 = t2 = time.perf_counter()
else:
    spec = importlib.util.spec_from_file_location("app", f"{sys.argv[2]}/functions/{name}/app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    t1 = time.perf_counter()
    from kairos.apigw import LocalContext
    event = json.loads(sys.argv[3])
    result = module.handler(event, LocalContext(timeout_ms=60_000, function_name=f"kairos-{name}"))
    t2 = time.perf_counter()
print(json.dumps({"import_ms": (t1 - t0) * 1000, "first_call_ms": (t2 - t1) * 1000}))
"""


def events() -> dict[str, dict[str, object]]:
    from kairos import apigw, dev

    return {
        "tick": dev.scheduled_event(),
        "run": dev.sqs_event(
            [{"MessageId": "m-1", "ReceiptHandle": "r-1", "Body": json.dumps({"run_id": str(uuid.uuid4())})}],
            "arn:aws:sqs:us-east-1:000000000000:kairos-runs",
        ),
        "webhook": apigw.build_event("GET", "/v1/schedules", {"authorization": "Bearer bench-token"}, None),
    }


def sample(name: str, event: object, env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, name, str(ROOT), json.dumps(event)],
        env=env, capture_output=True, text=True, check=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=7)
    args = parser.parse_args()

    from kairos import dev, migrations
    from kairos.localdb import LocalPostgres

    pg = LocalPostgres()
    try:
        url = pg.url()
        migrations.apply(url)
        with dev.sqs_server() as (endpoint, queue_url, _arn):
            env = {
                **os.environ,
                "DATABASE_URL": url,
                "RUN_QUEUE_URL": queue_url,
                "AWS_ENDPOINT_URL": endpoint,
                "KAIROS_AUTH": "dev",
                "KAIROS_DEV_TOKENS": "bench-token=bench",
                "POWERTOOLS_METRICS_DISABLED": "true",
                "POWERTOOLS_LOG_LEVEL": "WARNING",
            }
            rows = []
            base = [sample("baseline", None, env)["import_ms"] for _ in range(args.samples)]
            baseline = statistics.median(base)
            for name, event in events().items():
                runs = [sample(name, event, env) for _ in range(args.samples)]
                imp = statistics.median(r["import_ms"] for r in runs)
                first = statistics.median(r["first_call_ms"] for r in runs)
                rows.append((name, imp, first, imp + first))
    finally:
        pg.stop()

    print(f"\nCold start, median of {args.samples} fresh interpreters (ms)\n")
    print("| handler | import | first call | total | baseline `import boto3` | total / baseline |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, imp, first, total in rows:
        print(f"| {name} | {imp:.0f} | {first:.0f} | {total:.0f} | {baseline:.0f} | {total / baseline:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
