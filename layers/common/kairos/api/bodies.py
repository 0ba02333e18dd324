"""What a request body must be before the resolver validates it, and the raw bytes of one.

``screen(event)`` runs for every route that takes a JSON body, before Powertools parses it: another
media type is 415; not UTF-8 or not JSON is 400 ``malformed_json``; arrays and objects nested deeper
than ``MAX_JSON_DEPTH`` are 422 ``max_depth`` (``check_depth``: one pass over the structural
characters, no recursion, so it runs on hook bodies too); NUL characters or lone surrogates, which
PostgreSQL cannot store, are 422 ``invalid_character`` naming the first such field. ``refuse(event)``
runs for the other private routes that change something: a body there is 422 ``no_body``. ``raw_body(event)``
is the body as bytes (base64 decoded when the event says so), as the webhook receiver and the
idempotency ledger see it.

Must not: log or echo a body (it carries prompts), or recurse over a body it has not bounded.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from typing import Any

from kairos.api.resolver import JSON
from kairos.errors import (
    INVALID_CHARACTER,
    MAX_DEPTH,
    NO_BODY,
    FieldError,
    MalformedJson,
    UnsupportedMediaType,
    ValidationFailed,
)

# Deeper JSON is refused before it is parsed: every reader after the parser (this screen, pydantic,
# psycopg's JSON dump) recurses, and ~1,000 levels exhaust Python's stack (a RecursionError was a 500).
MAX_JSON_DEPTH = 64
_JSON_STRUCTURE = re.compile(r'[\[\]{}"\\]')


def screen(event: Mapping[str, Any]) -> None:
    """JSON only (else 415), parseable (else 400), storable by PostgreSQL (else 422), before validation."""
    headers = {str(k).lower(): str(v) for k, v in (event.get("headers") or {}).items()}
    media_type = headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type and media_type != JSON and not media_type.endswith("+json"):
        raise UnsupportedMediaType("send the body as application/json")
    raw = event.get("body")
    if not raw:
        return
    try:
        text = base64.b64decode(raw).decode("utf-8") if event.get("isBase64Encoded") else str(raw)
    except ValueError:
        raise MalformedJson("the body is not valid JSON") from None
    check_depth(text)
    try:
        value = json.loads(text)
    except ValueError:
        raise MalformedJson("the body is not valid JSON") from None
    bad = _unstorable(value, "")
    if bad is not None:
        raise ValidationFailed([FieldError(bad or "body", INVALID_CHARACTER,
                                           "text must not contain NUL characters or unpaired surrogates")])


def refuse(event: Mapping[str, Any]) -> None:
    """For a route that takes no body: ``ValidationFailed`` (``body`` / ``no_body``) when one is sent,
    rather than ignoring what the caller meant (``approve`` with ``{"arguments": …}``)."""
    if raw_body(event).strip():
        raise ValidationFailed([FieldError("body", NO_BODY, "this route takes no body; send none")])


def check_depth(text: str) -> None:
    """``ValidationFailed`` (``body`` / ``max_depth``) when arrays and objects nest deeper than
    ``MAX_JSON_DEPTH``. One pass over the structural characters, no recursion, strings skipped."""
    depth = 0
    in_string = False
    skip_to = -1
    for token in _JSON_STRUCTURE.finditer(text):
        at = token.start()
        if at < skip_to:
            continue
        char = token.group()
        if in_string:
            if char == "\\":
                skip_to = at + 2  # the escaped character
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise ValidationFailed([FieldError("body", MAX_DEPTH, f"arrays and objects may nest at most "
                                                                       f"{MAX_JSON_DEPTH} levels deep")])
        elif char in "]}":
            depth -= 1


def raw_body(event: Mapping[str, Any]) -> bytes:
    """The body as sent: base64-decoded when ``isBase64Encoded`` (else 400), else the text's UTF-8."""
    body = event.get("body")
    if not body:
        return b""
    if event.get("isBase64Encoded"):
        try:
            return base64.b64decode(body)
        except ValueError:
            raise MalformedJson("the body is not valid base64") from None
    return str(body).encode("utf-8", errors="surrogatepass")


def _unstorable(value: Any, path: str) -> str | None:
    """The dotted path of the first string PostgreSQL cannot store (NUL, lone surrogate), or None."""
    if isinstance(value, str):
        return path if ("\x00" in value or _has_surrogate(value)) else None
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if "\x00" in key or _has_surrogate(key):
                return where
            found = _unstorable(item, where)
            if found is not None:
                return found
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = _unstorable(item, f"{path}.{i}" if path else str(i))
            if found is not None:
                return found
    return None


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
