"""Lambda handler of the ``Custom::KairosMigrations`` resource: applies the schema at deploy time.

The logic, its guarantees (exactly one cfn-response answer, secret-free reasons, FAILED before the
timeout) and what it must not do are in ``kairos.migrations.custom_resource``.
"""

from __future__ import annotations

from typing import Any

from kairos.migrations import custom_resource


def handler(event: dict[str, Any], context: Any) -> dict[str, Any] | None:
    """Answers one CloudFormation custom-resource request; returns the answer it sent."""
    return custom_resource.handle(event, context)
