"""The ``kairos`` command: ``migrate`` and ``dev`` for everyone, and operator commands.

Commands are thin: they parse arguments, open the database from ``DATABASE_URL`` and call the same
library functions the handlers use.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence


def _cmd_migrate(args: argparse.Namespace) -> int:
    from kairos import migrations

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


def _cmd_dev(args: argparse.Namespace) -> int:
    from kairos import dev

    return dev.main(args)


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
    dev.add_argument("--once", action="store_true", help="set up, print the demo, and exit")
    dev.set_defaults(func=_cmd_dev)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result
