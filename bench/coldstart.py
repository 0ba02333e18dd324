"""Cold start: each handler's import and first invocation in a fresh interpreter, beside `import boto3`.

Every sample is a new Python process (as a new Lambda container is), which times only its own work:
importing ``functions/<name>/app.py`` and calling ``handler`` once with an event that reaches the
database (a real embedded PostgreSQL, migrated) and, where the path sends run ids, moto's SQS server.
The event and the Lambda context are made before the clock starts, from the standard library only,
as the Lambda runtime makes them before it imports the handler. The baseline is a fresh process
doing only ``import boto3``, which every Python Lambda that talks to AWS pays. Target: each
handler's import + first call at most 2x that baseline.

What each row's first call does (the database state is prepared before each sample, untimed):

* ``tick, nothing due``: a tick over a database with no due schedule (settle, repair, one empty fire
  batch). Most ticks of a small deployment look like this; it never needs the SQS client.
* ``tick, 1 due cron``: one cron schedule ("0 7 * * 1-5", Europe/Berlin) is due: the tick records its
  occurrence and run, moves the cursor with the calendar, commits and sends the run id to SQS —
  so this first call builds the SQS client.
* ``run, unknown run``: an SQS record whose run id names no run (the claim finds nothing).
* ``run, echo run``: an SQS record for a queued run (made by a tick in this process): claim, the echo
  executor, trace events, transcript entries, output, terminal state.
* ``api, GET /v1/schedules``: a listing for a principal (dev bearer token).
* ``api, POST /v1/hooks/{token}``: a webhook delivery: token lookup, receipt, occurrence, run, commit,
  then the SQS handoff — this first call builds the SQS client.

Samples are taken in rounds (every row once per round, in the same order), so drifting load on a
shared machine affects all rows alike.

Bytecode (``--bytecode``) decides how much of each cold start is compiling Python source:

* ``env`` (default): children inherit the caller's environment. Installed packages load from the
  bytecode pip wrote; with ``PYTHONDONTWRITEBYTECODE`` set (as on the development machines) the
  ``kairos`` sources have none and are compiled in every sample — as they are on Lambda today.
* ``cached``: every process, baseline included, loads everything from a warm private cache (one
  discarded warm-up sample per row): a layer that ships compiled bytecode.
* ``none``: nothing is loaded from bytecode, baseline included: the layer ``sam build`` makes today
  (no ``.pyc`` at all, and ``/opt`` is read-only), whose boto3 shadows the runtime's.

SnapStart (``--snapstart``): each row again in a fresh process that imports the handler, runs the
before-snapshot hooks ``kairos.snapstart`` registered (the end of a SnapStart init: untimed for the
call), then times the after-restore hooks and the first invocation — the "first call after init" of a
restored copy, beside the same ``import boto3`` baseline (goal ≤ 1.5x). What it leaves out: Lambda's
own restore of the snapshot (the runtime's, not Kairos').

Run: ``.venv/bin/python bench/coldstart.py [--samples 9] [--bytecode {env,cached,none}] [--snapstart]``.
Prints a markdown table (medians).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OWNER = "bench"
TOKEN = "bench-token"  # a local dev token (KAIROS_DEV_TOKENS below)

CHILD = r"""
import json, sys, time, importlib.util
name = sys.argv[1]


class Context:
    # What the Lambda runtime hands the handler; the runtime builds it before any handler code runs,
    # so it is built here, untimed, from nothing but the standard library.
    function_version = "$LATEST"
    memory_limit_in_mb = 512

    def __init__(self, function_name):
        self.function_name = function_name
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:000000000000:function:{function_name}"
        self.aws_request_id = "00000000-0000-4000-8000-000000000001"
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = "coldstart"
        self._deadline = time.monotonic() + 60

    def get_remaining_time_in_millis(self):
        return max(0, int((self._deadline - time.monotonic()) * 1000))


if name != "baseline":
    event, context = json.loads(sys.argv[3]), Context(f"kairos-{name}")
t0 = time.perf_counter()
snapshot_ms = 0.0
if name == "baseline":
    import boto3  # noqa: F401
    t1 = t2 = time.perf_counter()
else:
    spec = importlib.util.spec_from_file_location("app", f"{sys.argv[2]}/functions/{name}/app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    t1 = time.perf_counter()
    if sys.argv[5] == "snapstart":
        # What the Lambda runtime does for a SnapStart version: the before-snapshot hooks end the init
        # (then the snapshot); a restored copy runs the after-restore hooks, then the invocation.
        import snapshot_restore_py as hooks
        for func, args, kwargs in hooks._before_snapshot_registry:
            func(*args, **kwargs)
        t_snap = time.perf_counter()
        snapshot_ms = (t_snap - t1) * 1000
        t1 = t_snap
        for func, args, kwargs in hooks._after_restore_registry:
            func(*args, **kwargs)
    result = module.handler(event, context)
    t2 = time.perf_counter()
    check = sys.argv[4]
    if check and check not in json.dumps(result):
        raise SystemExit(f"unexpected result of {name}: {result!r}")
print(json.dumps({"import_ms": (t1 - t0) * 1000 - snapshot_ms, "snapshot_ms": snapshot_ms,
                  "first_call_ms": (t2 - t1) * 1000}))
"""


@dataclass(frozen=True)
class Case:
    """One row: the function it loads, and (untimed, in this process) the event of the next sample.

    A row that silently took another path (nothing fired, a 404, a send that failed) fails instead of
    being timed: ``expect`` is a string the handler's JSON result must contain, and ``verify`` checks
    the database after the sample."""

    label: str
    function: str
    prepare: Callable[[], dict[str, Any]]
    expect: str = ""
    verify: Callable[[], None] | None = None


class Seeder:
    """Rows the samples need, written with the library (and two plain statements) in this process."""

    def __init__(self, url: str, queue_arn: str) -> None:
        from kairos.db import Database

        self.db = Database(url, max_size=2)
        self.queue_arn = queue_arn
        self.schedule_id: uuid.UUID | None = None  # of the last due or webhook schedule made
        self.run_id: uuid.UUID | None = None  # of the last queued run made

    def _conversation(self) -> uuid.UUID:
        from kairos import conversations

        with self.db.transaction() as conn:
            return conversations.create(conn, owner=OWNER, agent={"executor": "echo"}, title="coldstart").id

    def due_cron(self) -> uuid.UUID:
        """A weekday 07:00 Europe/Berlin schedule whose cursor is five seconds in the past (due now)."""
        from kairos import schedules

        self.quiet()
        with self.db.transaction() as conn:
            created = schedules.create(conn, owner=OWNER, raw={
                "conversation_id": str(self._conversation()), "prompt": "Brief me.", "cron": "0 7 * * 1-5",
                "timezone": "Europe/Berlin"})
            conn.execute("UPDATE schedules SET next_fire_at = now() - interval '5 seconds' WHERE id = %(id)s",
                         {"id": created.schedule.id})
        self.schedule_id = created.schedule.id
        return created.schedule.id

    def queued_run(self) -> uuid.UUID:
        """A queued run of a due schedule, made by a tick here (its SQS send is stubbed)."""
        from kairos.tick import Tick

        schedule_id = self.due_cron()
        Tick(self.db, _AcceptingSqs(), "stub", metrics=None).run()
        with self.db.transaction() as conn:
            row = conn.execute("SELECT id FROM runs WHERE schedule_id = %(id)s AND state = 'queued'",
                               {"id": schedule_id}).fetchone()
        assert row is not None, "the tick made no run"
        # Nothing else is due (the tick moved this cursor on), and the schedule stays active: a run of a
        # cancelled schedule is refused at its claim, which is not the path this sample measures.
        self.run_id = uuid.UUID(str(row["id"]))
        return self.run_id

    def hook_token(self) -> str:
        """A webhook schedule's token (a new schedule per sample: deliveries are rate limited)."""
        from kairos import schedules

        with self.db.transaction() as conn:
            created = schedules.create(conn, owner=OWNER, raw={
                "conversation_id": str(self._conversation()), "prompt": "Read this.", "kind": "webhook"})
        assert created.token is not None
        self.schedule_id = created.schedule.id
        return created.token

    def check_sent(self) -> None:
        """The last schedule has exactly one run, and SQS accepted it (its handoff is stamped)."""
        with self.db.transaction() as conn:
            rows = conn.execute("SELECT handoff_at FROM runs WHERE schedule_id = %(id)s",
                                {"id": self.schedule_id}).fetchall()
        if len(rows) != 1 or rows[0]["handoff_at"] is None:
            raise RuntimeError(f"expected one run handed to SQS, found {rows}")

    def check_succeeded(self) -> None:
        """The last queued run was executed to the end."""
        with self.db.transaction() as conn:
            row = conn.execute("SELECT state FROM runs WHERE id = %(id)s", {"id": self.run_id}).fetchone()
        if row is None or row["state"] != "succeeded":
            raise RuntimeError(f"expected the echo run to succeed, found {row}")

    def quiet(self) -> None:
        """Nothing left due: every timed schedule of the bench is cancelled."""
        with self.db.transaction() as conn:
            conn.execute("UPDATE schedules SET status = 'cancelled' WHERE owner = %(owner)s AND kind <> 'webhook'",
                         {"owner": OWNER})

    def close(self) -> None:
        self.db.close()


class _AcceptingSqs:
    """Accepts every entry (the parent's tick only prepares a queued run; SQS is not measured there)."""

    def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, str]]) -> dict[str, Any]:
        return {"Successful": [{"Id": e["Id"]} for e in Entries], "Failed": []}


def cases(seed: Seeder) -> list[Case]:
    from kairos.local import apigw, stack

    def sqs_record(run_id: uuid.UUID) -> dict[str, Any]:
        return stack.sqs_event([{"MessageId": "m-1", "ReceiptHandle": "r-1",
                                 "Body": json.dumps({"run_id": str(run_id)})}], seed.queue_arn)

    def idle_tick() -> dict[str, Any]:
        seed.quiet()
        return stack.scheduled_event()

    def due_tick() -> dict[str, Any]:
        seed.due_cron()
        return stack.scheduled_event()

    def hook() -> dict[str, Any]:
        return apigw.build_event("POST", f"/v1/hooks/{seed.hook_token()}",
                                 {"content-type": "application/json", "idempotency-key": str(uuid.uuid4())},
                                 b'{"action": "opened", "number": 7}')

    return [
        Case("tick, nothing due", "tick", idle_tick, '"schedules": 0'),
        Case("tick, 1 due cron", "tick", due_tick, '"dispatched": 1', seed.check_sent),
        Case("run, unknown run", "run", lambda: sqs_record(uuid.uuid4()), '"batchItemFailures": []'),
        Case("run, echo run", "run", lambda: sqs_record(seed.queued_run()), '"batchItemFailures": []',
             seed.check_succeeded),
        Case("api, GET /v1/schedules", "webhook",
             lambda: apigw.build_event("GET", "/v1/schedules", {"authorization": f"Bearer {TOKEN}"}, None),
             '"statusCode": 200'),
        Case("api, POST /v1/hooks/{token}", "webhook", hook, '"statusCode": 202', seed.check_sent),
    ]


def sample(name: str, event: object, env: dict[str, str], expect: str = "", mode: str = "classic") -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, name, str(ROOT), json.dumps(event), expect, mode],
        env=env, capture_output=True, text=True, check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{name} sample failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def measure(case: Case, env: dict[str, str], mode: str = "classic") -> dict[str, float]:
    """One sample of ``case``: prepare the database, time a fresh process, verify what it did."""
    result = sample(case.function, case.prepare(), env, case.expect, mode)
    if case.verify is not None:
        case.verify()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=7)
    parser.add_argument("--bytecode", choices=("env", "cached", "none"), default="env",
                        help="env: as the environment says; cached: everything from a warm private bytecode "
                             "cache; none: everything compiled from source in every process (see the module doc)")
    parser.add_argument("--snapstart", action="store_true",
                        help="also time each handler's first call after a SnapStart restore (goal ≤ 1.5x baseline)")
    args = parser.parse_args()

    from kairos import migrations
    from kairos.local import stack
    from kairos.local.postgres import LocalPostgres

    pg = LocalPostgres()
    rows: list[tuple[str, float, float, float]] = []
    snap_rows: list[tuple[str, float, float]] = []
    try:
        url = pg.url()
        migrations.apply(url)
        with stack.sqs_server() as (endpoint, queue_url, queue_arn), tempfile.TemporaryDirectory() as pycache:
            env = {
                **os.environ,
                "DATABASE_URL": url,
                "RUN_QUEUE_URL": queue_url,
                "AWS_ENDPOINT_URL": endpoint,
                "KAIROS_AUTH": "dev",
                "KAIROS_DEV_TOKENS": f"{TOKEN}={OWNER}",
                "POWERTOOLS_METRICS_DISABLED": "true",
                "POWERTOOLS_LOG_LEVEL": "WARNING",
            }
            if args.bytecode == "cached":
                env.pop("PYTHONDONTWRITEBYTECODE", None)
                env["PYTHONPYCACHEPREFIX"] = pycache
            elif args.bytecode == "none":  # an empty cache that is never written: every import compiles
                env["PYTHONDONTWRITEBYTECODE"] = "1"
                env["PYTHONPYCACHEPREFIX"] = pycache
            seed = Seeder(url, queue_arn)
            try:
                all_cases = cases(seed)
                if args.bytecode == "cached":  # warm-up: fills the cache, not counted
                    sample("baseline", None, env)
                    for case in all_cases:
                        measure(case, env)
                base: list[float] = []
                runs: dict[str, list[dict[str, float]]] = {case.label: [] for case in all_cases}
                snaps: dict[str, list[dict[str, float]]] = {case.label: [] for case in all_cases}
                for _ in range(args.samples):
                    base.append(sample("baseline", None, env)["import_ms"])
                    for case in all_cases:
                        runs[case.label].append(measure(case, env))
                        if args.snapstart:
                            snaps[case.label].append(measure(case, env, "snapstart"))
            finally:
                seed.close()
            baseline = statistics.median(base)
            for case in all_cases:
                imp = statistics.median(r["import_ms"] for r in runs[case.label])
                first = statistics.median(r["first_call_ms"] for r in runs[case.label])
                rows.append((case.label, imp, first, imp + first))
                if args.snapstart:
                    snap_rows.append((case.label, statistics.median(r["snapshot_ms"] for r in snaps[case.label]),
                                      statistics.median(r["first_call_ms"] for r in snaps[case.label])))
    finally:
        pg.stop()

    print(f"\nCold start, median of {args.samples} fresh interpreters (ms), bytecode: {args.bytecode}\n")
    print("| handler, first call | import | first call | total | baseline `import boto3` | total / baseline |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, imp, first, total in rows:
        print(f"| {label} | {imp:.0f} | {first:.0f} | {total:.0f} | {baseline:.0f} | {total / baseline:.2f}x |")
    if snap_rows:
        print(f"\nSnapStart (kairos.snapstart hooks run as the runtime runs them), median of {args.samples} fresh "
              f"interpreters (ms): the first call after init = after-restore hooks + the handler's first call; "
              f"the restore of the snapshot itself is Lambda's and not measured here\n")
        print("| handler, first call | before-snapshot hooks (init) | first call after restore "
              "| baseline `import boto3` | first call / baseline |")
        print("|---|---:|---:|---:|---:|")
        for label, snap, first in snap_rows:
            print(f"| {label} | {snap:.0f} | {first:.0f} | {baseline:.0f} | {first / baseline:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
