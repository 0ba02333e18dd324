"""Deterministic identities: the same opportunity always gets the same occurrence and run id.

occurrence id = uuid5(namespace, schedule id, source, fire instant or idempotency key and its
generation); run id = uuid5(namespace, occurrence id). A key's generation counts its uses after an
expired receipt (0 first, the form every earlier id was made with), so a key used again after 24 h
makes a new, still deterministic, occurrence. A duplicate tick, a retried webhook or a replayed
request computes the same ids and converges on the same rows through the unique constraints.

A jittered fire's dispatch offset (``dispatch_offset``) is derived the same way, from what the fire's
occurrence id is made of (its schedule id and nominal instant): uniform in ``[0, jitter]`` and the same
for every tick that computes it. The database computes the same number (``kairos_dispatch_at``, the
generated ``schedules.next_dispatch_at``).
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime, timedelta

from kairos.states import Source, parse

# Fixed forever: changing it would change every id.
NAMESPACE = uuid.UUID("5f0c6c1e-8a7e-4f43-9d0b-6b6169726f73")

# uuid5 by hand: the tick makes two ids a fire, and uuid.uuid5 (the reference the unit tests hold this
# to) spends half its time on UUID(bytes=..., version=...)'s checks. RFC 4122 version 5: the first 16
# bytes of SHA-1(namespace + name), version nibble 5, variant bits 10.
_NAMESPACE_BYTES = NAMESPACE.bytes
_KEEP = ~((0xF000 << 64) | (0xC000 << 48)) & ((1 << 128) - 1)
_VERSION_5 = (0x5000 << 64) | (0x8000 << 48)


# A UUID made from its 128-bit value without ``UUID.__init__``'s argument checks (a third of its cost):
# what ``__init__`` itself stores, through the slots' descriptors (``UUID.__setattr__`` refuses writes).
_new = object.__new__
_set_int = vars(uuid.UUID)["int"].__set__
_set_safe = vars(uuid.UUID)["is_safe"].__set__
_UNKNOWN = uuid.SafeUUID.unknown


def _uuid5(name: str) -> uuid.UUID:
    """``uuid.uuid5(NAMESPACE, name)``."""
    digest = hashlib.sha1(_NAMESPACE_BYTES + name.encode(), usedforsecurity=False).digest()
    made = _new(uuid.UUID)
    _set_int(made, int.from_bytes(digest[:16]) & _KEEP | _VERSION_5)
    _set_safe(made, _UNKNOWN)
    return made


def _instant(fire_at: datetime) -> str:
    """``fire_at`` in UTC as ``%Y-%m-%dT%H:%M:%S.%fZ`` (microseconds always), the form ids are keyed by."""
    utc = fire_at.astimezone(UTC)
    if utc.year < 1000:  # strftime's %Y does not pad: keep its form exactly
        return utc.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return utc.isoformat(timespec="microseconds")[:-6] + "Z"  # without its "+00:00" (cheaper than a replace)


def occurrence_id(schedule_id: uuid.UUID, source: Source | str, *, fire_at: datetime | None = None,
                  key: str | None = None, generation: int = 0) -> uuid.UUID:
    """Timed sources are keyed by their UTC instant (microseconds), keyed sources by their key and
    its generation (``key:<key>`` for 0, ``key<n>:<key>`` after: the two forms cannot collide)."""
    if (fire_at is None) == (key is None):
        raise ValueError("give exactly one of fire_at and key")
    if fire_at is not None:
        if fire_at.tzinfo is None:
            raise ValueError("fire_at must be timezone-aware")
        discriminator = _instant(fire_at)
    else:
        if generation < 0:
            raise ValueError("generation must be 0 or more")
        discriminator = f"key:{key}" if generation == 0 else f"key{generation}:{key}"
    return _uuid5(f"occurrence:{schedule_id}:{parse(Source, source).value}:{discriminator}")


def run_id(occurrence: uuid.UUID) -> uuid.UUID:
    return _uuid5(f"run:{occurrence}")


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def dispatch_offset(schedule_id: uuid.UUID, fire_at: datetime, jitter_seconds: int) -> int:
    """Whole seconds in ``[0, jitter_seconds]`` that the timed fire of ``schedule_id`` at ``fire_at`` waits
    before dispatch: the first 48 bits of SHA-256(schedule id bytes || the instant as big-endian signed
    microseconds since the Unix epoch), mod ``jitter_seconds + 1`` (``kairos_dispatch_at`` in SQL)."""
    if jitter_seconds <= 0:
        return 0
    if fire_at.tzinfo is None:
        raise ValueError("fire_at must be timezone-aware")
    micros = (fire_at - _EPOCH) // _MICROSECOND
    digest = hashlib.sha256(schedule_id.bytes + micros.to_bytes(8, "big", signed=True)).digest()
    return int.from_bytes(digest[:6]) % (jitter_seconds + 1)


def dispatch_at(schedule_id: uuid.UUID, fire_at: datetime, jitter_seconds: int) -> datetime:
    """The instant a timed fire is due for dispatch: ``fire_at`` plus its ``dispatch_offset`` (``fire_at``
    itself without jitter: the tick asks twice a fire)."""
    if jitter_seconds <= 0:
        return fire_at
    return fire_at + timedelta(seconds=dispatch_offset(schedule_id, fire_at, jitter_seconds))
