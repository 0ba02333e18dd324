"""``kairos dev``: the local stack (grown by the local-stack issue)."""

from __future__ import annotations

import argparse


def main(args: argparse.Namespace) -> int:
    raise SystemExit("kairos dev: not implemented yet")
