"""Webhook tokens: the one minter and the one hashing rule.

Role: mint a token (32 random bytes, URL-safe) and give the only form that is stored, its SHA-256 hex.
Schedule creation (``kairos.schedules``) and rotation and lookup (``kairos.webhooks``) both use these,
so a token minted by either opens the same hook. Foundation: imports nothing of Kairos.

Must not: store, log or compare tokens (lookups compare hashes in constant time where they happen).
"""

from __future__ import annotations

import hashlib
import secrets


def new_token() -> str:
    """32 random bytes, URL-safe: shown once, stored only as ``hash_token(token)``."""
    return secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """SHA-256 hex of a webhook token: the only form that is stored."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()
