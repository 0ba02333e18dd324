"""``kairos chaos``'s arguments for the CLI; the rehearsal itself is imported only when it runs.

Role: ``add_parser(sub)`` registers the subcommand on ``kairos.cli``'s subparsers. Its function refuses
in one line (exit 2) when the ``local`` extra is missing, as ``kairos dev`` does.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kairos.chaos.plan import FAULT_KINDS
from kairos.extras import LOCAL_MODULES, installed


def _run(args: argparse.Namespace) -> int:
    for module in LOCAL_MODULES:
        if not installed(module):
            print(f"kairos chaos: the rehearsal needs the 'local' extra ({module} is not installed): "
                  "pip install -e '.[local]' in the checkout", file=sys.stderr)
            return 2
    from kairos.chaos import rehearse

    return rehearse.main(args)


def add_parser(sub: Any) -> None:
    chaos = sub.add_parser("chaos", help="a seeded fault rehearsal of the local stack (docs/operations.md)")
    chaos.add_argument("--seed", type=int, required=True, help="the seed: the same seed replays the same faults")
    chaos.add_argument("--minutes", type=float, default=10.0, help="simulated minutes of workload (default 10)")
    chaos.add_argument("--faults", default=None,
                       help=f"comma-separated fault kinds (default all: {','.join(FAULT_KINDS)}; 'none' for none)")
    chaos.add_argument("--verbose", action="store_true", help="print progress every 15 steps")
    chaos.add_argument("--log-level", default="CRITICAL", help="level of the handlers' JSON logs")
    chaos.set_defaults(func=_run)
