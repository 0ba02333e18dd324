"""Lambda handler: not implemented yet (see the issue that builds the webhook function)."""

from __future__ import annotations

from typing import Any


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return {"statusCode": 501, "body": "not implemented yet"}
