"""The OpenAPI document as ``GET /v1/openapi.json`` serves it, for the golden-file test and the tests that
read the API's declared parameters from it.

Regenerate the golden file after a deliberate change with::

    PYTHONPATH=layers/common .venv/bin/python -c "from tests.support.openapi import served; \
        open('tests/unit/golden/openapi.json', 'w').write(served())"
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def served() -> str:
    """The body ``GET /v1/openapi.json`` answers, as sent (the sample event ``events/api_openapi.json``)."""
    from kairos.api.app import handle

    event = json.loads((ROOT / "events" / "api_openapi.json").read_text())
    response = handle(event, None)
    assert response["statusCode"] == 200, response
    assert response["headers"]["Content-Type"] == "application/json"
    body: str = response["body"]
    return body
