"""Who is calling: the principal of one HTTP API request.

``KAIROS_AUTH=jwt`` (deployed): API Gateway's JWT authorizer has already verified the token (issuer,
audience, signature, expiry); the principal is its ``sub`` claim, read from
``requestContext.authorizer.jwt.claims.sub``. ``KAIROS_AUTH=dev`` (local stack, tests): the
``Authorization: Bearer <token>`` header is looked up in ``KAIROS_DEV_TOKENS`` with a constant-time
compare against every configured token.

Guarantees: no principal means ``Unauthorized`` (401), whatever the route; the bearer token is never
logged or echoed. This module must not decide what a principal may see: every query is scoped by the
principal it returns.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any

from kairos.errors import Unauthorized
from kairos.settings import Settings

MAX_PRINCIPAL_LENGTH = 256


def principal(event: Mapping[str, Any], settings: Settings) -> str:
    """The caller's principal, or ``Unauthorized``."""
    found = _from_jwt(event) if settings.auth == "jwt" else _from_dev_token(event, settings.dev_tokens)
    if not found or len(found) > MAX_PRINCIPAL_LENGTH:
        raise Unauthorized("authentication required: send a valid bearer token")
    return found


def _from_jwt(event: Mapping[str, Any]) -> str | None:
    context = event.get("requestContext") or {}
    authorizer = context.get("authorizer") or {} if isinstance(context, Mapping) else {}
    jwt = authorizer.get("jwt") or {} if isinstance(authorizer, Mapping) else {}
    claims = jwt.get("claims") or {} if isinstance(jwt, Mapping) else {}
    sub = claims.get("sub") if isinstance(claims, Mapping) else None
    return sub if isinstance(sub, str) and sub.strip() else None


def _from_dev_token(event: Mapping[str, Any], tokens: Mapping[str, str]) -> str | None:
    headers = event.get("headers") or {}
    if not isinstance(headers, Mapping):
        return None
    value = next((v for k, v in headers.items() if isinstance(k, str) and k.lower() == "authorization"), None)
    if not isinstance(value, str):
        return None
    scheme, _, presented = value.strip().partition(" ")
    presented = presented.strip()
    if scheme.lower() != "bearer" or not presented:
        return None
    found: str | None = None
    wanted = presented.encode("utf-8", errors="replace")
    for token, who in tokens.items():  # every token is compared: timing does not tell which one matched
        if hmac.compare_digest(token.encode("utf-8"), wanted):
            found = who
    return found
