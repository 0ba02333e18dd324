"""Redaction: what a step preview may keep of a value before anything is stored.

Role: a run's step previews (``kairos.runs.steps``) show a model turn's input and answer and a tool
call's arguments and result to the run's owner. Before such a value is written anywhere it passes
``redact``, which replaces with ``REDACTED``:

* the value under a key named like a credential — ``authorization``, ``cookie``, ``token``,
  ``secret``, ``password``, ``api_key`` / ``api-key`` / ``apikey`` — compared case-insensitively as a
  substring of the key (``X-Auth-Token``, ``client_secret``, ``Set-Cookie`` …), whatever the value;
* every occurrence, inside any string, of a secret value the run resolved (``secrets_of`` reads them
  from the headers of the calls it prepared: the credential of an ``Authorization: Bearer …``
  header and the header's whole value), so a peer or a model echoing a key back does not store it;
* a string holding a JSON object or array is redacted as that document (a tool's answer is JSON
  text whose body is often JSON text again), and written back as JSON text.

``headers`` keeps a header's name and replaces every value: headers are never stored.

Guarantees: pure functions, no I/O; the input is never modified; a value that needs no redaction
comes back equal. Must not: log anything it sees (its inputs are the very values it hides).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "[redacted]"
SENSITIVE_KEY = re.compile(r"authorization|cookie|token|secret|password|passwd|api[-_]?key", re.IGNORECASE)
# A secret shorter than this is not searched for inside other strings (it would redact ordinary words);
# it is still redacted where a whole string equals it.
MIN_SECRET_CHARS = 8
_JSON_DEPTH = 3  # JSON text inside JSON text inside …: parsed this deep, kept as text below


def sensitive_key(key: object) -> bool:
    """Whether a value under ``key`` is a credential by its name."""
    return isinstance(key, str) and SENSITIVE_KEY.search(key) is not None


def secrets_of(headers: Mapping[str, str]) -> frozenset[str]:
    """The secret values in a prepared call's headers: each credential header's value and, for a
    ``<scheme> <credential>`` value (``Bearer sk-…``), the credential alone."""
    found: set[str] = set()
    for name, value in headers.items():
        if not sensitive_key(name) and name.lower() not in {"x-api-key", "proxy-authorization"}:
            continue
        value = str(value).strip()
        if value:
            found.add(value)
        parts = value.split(None, 1)
        if len(parts) == 2 and parts[1].strip():
            found.add(parts[1].strip())
    return frozenset(found)


def headers(values: Mapping[str, Any]) -> dict[str, str]:
    """Header names kept, every value replaced."""
    return {str(name): REDACTED for name in values}


def redact(value: Any, secrets: Iterable[str] = ()) -> Any:
    """``value`` with credentials replaced by ``REDACTED`` (see the module doc)."""
    known = sorted({s for s in secrets if s}, key=len, reverse=True)  # the longest first: "Bearer x" before "x"
    return _redact(value, known, _JSON_DEPTH)


def _redact(value: Any, secrets: list[str], depth: int) -> Any:
    if isinstance(value, Mapping):
        return {str(k): REDACTED if sensitive_key(k) else _redact(v, secrets, depth) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redact(v, secrets, depth) for v in value]
    if isinstance(value, str):
        return _text(value, secrets, depth)
    return value


def _text(text: str, secrets: list[str], depth: int) -> str:
    stripped = text.strip()
    if depth > 0 and stripped[:1] in ("{", "[") and stripped[-1:] in ("}", "]"):
        try:
            document = json.loads(stripped)
        except ValueError:
            document = None
        if isinstance(document, (dict, list)):
            cleaned = _redact(document, secrets, depth - 1)
            if cleaned == document:
                return _secrets_out(text, secrets)
            return json.dumps(cleaned, ensure_ascii=False)
    return _secrets_out(text, secrets)


def _secrets_out(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if text == secret:
            return REDACTED
        if len(secret) >= MIN_SECRET_CHARS and secret in text:
            text = text.replace(secret, REDACTED)
    return text
