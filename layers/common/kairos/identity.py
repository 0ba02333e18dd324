"""Deterministic identities: the same opportunity always gets the same occurrence and run id.

occurrence id = uuid5(namespace, schedule id, source, fire instant or idempotency key and its
generation); run id = uuid5(namespace, occurrence id). A key's generation counts its uses after an
expired receipt (0 first, the form every earlier id was made with), so a key used again after 24 h
makes a new, still deterministic, occurrence. A duplicate tick, a retried webhook or a replayed
request computes the same ids and converges on the same rows through the unique constraints.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from kairos.states import Source

# Fixed forever: changing it would change every id.
NAMESPACE = uuid.UUID("5f0c6c1e-8a7e-4f43-9d0b-6b6169726f73")


def occurrence_id(schedule_id: uuid.UUID, source: Source | str, *, fire_at: datetime | None = None,
                  key: str | None = None, generation: int = 0) -> uuid.UUID:
    """Timed sources are keyed by their UTC instant (microseconds), keyed sources by their key and
    its generation (``key:<key>`` for 0, ``key<n>:<key>`` after: the two forms cannot collide)."""
    if (fire_at is None) == (key is None):
        raise ValueError("give exactly one of fire_at and key")
    if fire_at is not None:
        if fire_at.tzinfo is None:
            raise ValueError("fire_at must be timezone-aware")
        discriminator = fire_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    else:
        if generation < 0:
            raise ValueError("generation must be 0 or more")
        discriminator = f"key:{key}" if generation == 0 else f"key{generation}:{key}"
    return uuid.uuid5(NAMESPACE, f"occurrence:{schedule_id}:{Source(source).value}:{discriminator}")


def run_id(occurrence: uuid.UUID) -> uuid.UUID:
    return uuid.uuid5(NAMESPACE, f"run:{occurrence}")
