"""The operator commands are one table: every (command, verb) the ``kairos`` parser accepts has its
operation in ``cli.OPERATIONS``, and the table holds nothing the parser does not offer."""

from __future__ import annotations

import argparse

from kairos import cli


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:  # type: ignore[type-arg]
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def test_every_operator_command_has_its_operation_and_no_more() -> None:
    offered: set[tuple[str, str | None]] = set()
    for command, parser in _subparsers(cli.build_parser()).choices.items():
        if parser.get_default("func") is not cli._cmd_ops:
            continue  # migrate, dev, invoke: commands of their own
        verbs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if verbs:
            offered.update((command, verb) for verb in verbs[0].choices)
        else:
            offered.add((command, None))
    assert ("status", None) in offered and ("runs", "trace") in offered  # the control: the scan sees both shapes
    assert offered == set(cli.OPERATIONS)
