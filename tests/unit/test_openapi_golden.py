"""The served OpenAPI document, byte for byte: ``GET /v1/openapi.json`` through ``kairos.api.app.handle``
(the sample event ``events/api_openapi.json``, no database: the route is public and reads nothing) answers
exactly the bytes of ``golden/openapi.json``.

The document is the API's contract with its clients (and schemathesis); a refactoring of the API's
modules must not move a byte of it. A deliberate change (a new route, a field, a version bump) updates
the golden file in the same commit, regenerated as ``tests/support/openapi.py`` says.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.openapi import served

GOLDEN = Path(__file__).resolve().parent / "golden" / "openapi.json"


def test_the_served_document_is_byte_identical_to_the_golden_file() -> None:
    body = served()
    golden = GOLDEN.read_text(encoding="utf-8")
    # Compared as text first so a failure shows where the documents part; then as bytes.
    assert json.loads(body) == json.loads(golden)
    assert body.encode("utf-8") == golden.encode("utf-8")
