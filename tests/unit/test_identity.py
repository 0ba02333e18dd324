"""Deterministic ids (``kairos.identity``): fixed forever, and the hand-made uuid5 is ``uuid.uuid5``.

The ids below were computed with ``uuid.uuid5`` and ``strftime`` before the tick's fast path replaced
them: a change to either form would give every existing occurrence and run a new id, and a tick
replaying a fire recorded before the upgrade would then record it twice.
"""

from __future__ import annotations

import copy
import pickle
import random
import string
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from kairos import identity
from kairos.states import Source

SCHEDULE = uuid.UUID("0b8f6a4e-3c1d-4f6e-9a53-2f1d8c7b6a01")


@pytest.mark.parametrize(("made", "expected"), [
    (lambda: identity.occurrence_id(SCHEDULE, Source.SCHEDULED, fire_at=datetime(2026, 3, 8, 7, 0, tzinfo=UTC)),
     "4524c4c7-a4f2-54e8-a993-9412bd6ab6b5"),
    # An offset instant is keyed by its UTC form, to the microsecond; the source may be given as text.
    (lambda: identity.occurrence_id(SCHEDULE, "backfill", fire_at=datetime(
        2026, 3, 8, 8, 0, 0, 250, tzinfo=timezone(timedelta(hours=1)))), "1ce1da88-f967-5bfe-bae2-8069a7f84f2c"),
    # strftime's unpadded year below 1000, kept as it was.
    (lambda: identity.occurrence_id(SCHEDULE, Source.SCHEDULED, fire_at=datetime(999, 1, 2, 3, 4, 5, tzinfo=UTC)),
     "a9cd0f1a-96db-54d4-8072-f42954a03358"),
    (lambda: identity.occurrence_id(SCHEDULE, Source.WEBHOOK, key="order-42"), "b2a2d83e-433e-5d60-a1aa-cce39a3f99a2"),
    (lambda: identity.occurrence_id(SCHEDULE, Source.WEBHOOK, key="ordre-42-é", generation=3),
     "d5ee0e7a-dbb5-52bb-b873-3a6af8cb6e71"),
    (lambda: identity.run_id(uuid.UUID("5f0c6c1e-8a7e-4f43-9d0b-6b6169726f73")),
     "15ffef36-c564-508b-abff-ad605bd9b860"),
])
def test_ids_are_the_ones_made_before(made, expected: str) -> None:  # type: ignore[no-untyped-def]
    assert made() == uuid.UUID(expected)


def test_the_hand_made_uuid5_is_the_standard_one() -> None:
    rng = random.Random(14)
    alphabet = string.printable + "éü日本\u2028\U0001f600"
    names = ["", "run:", "occurrence:" + str(SCHEDULE) + ":scheduled:2026-03-08T07:00:00.000000Z"]
    names += ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 120))) for _ in range(3000)]
    for name in names:
        made = identity._uuid5(name)
        standard = uuid.uuid5(identity.NAMESPACE, name)
        assert made == standard, name
        assert (made.version, made.variant) == (5, uuid.RFC_4122)
        # Made without UUID.__init__: the same object in every other way.
        assert (str(made), hash(made), made.is_safe) == (str(standard), hash(standard), standard.is_safe)
        assert pickle.loads(pickle.dumps(made)) == standard and copy.deepcopy(made) == standard
    with pytest.raises(TypeError):
        made.int = 0  # type: ignore[misc]  # as immutable as any UUID


@pytest.mark.parametrize("at", [
    datetime(2026, 3, 8, 7, 0, tzinfo=UTC),
    datetime(2026, 10, 25, 2, 30, 0, 1, tzinfo=timezone(timedelta(hours=2))),
    datetime(1000, 1, 1, tzinfo=UTC),
    datetime(999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
])
def test_an_instant_is_keyed_by_the_strftime_form(at: datetime) -> None:
    assert identity._instant(at) == at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_a_naive_instant_and_two_discriminators_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        identity.occurrence_id(SCHEDULE, Source.SCHEDULED, fire_at=datetime(2026, 3, 8, 7, 0))
    with pytest.raises(ValueError, match="exactly one"):
        identity.occurrence_id(SCHEDULE, Source.WEBHOOK, fire_at=datetime(2026, 3, 8, tzinfo=UTC), key="k")
    with pytest.raises(ValueError):
        identity.occurrence_id(SCHEDULE, "nonsense", key="k")
