"""The cyclic garbage collector while the tick holds its batches in memory.

Role: a fire batch keeps about twenty container objects a fire alive until it commits (the locked
rows, the decisions, their fires, the JSON rows), two batches of 500 at once. With CPython's default
young-generation threshold (a collection every 700 net allocations) those objects outlive several
young collections, are promoted, and grow the old generation past its trigger, so full collections
run during the tick: each walks every object of the container (imports, caches, clients) to find
that the batch's objects, freed by reference counting moments later, were never garbage. Measured on
the distinct-rules bench: 0.1-0.3 s of a tick's 1.0-1.7 s of client CPU, all of it under the
interpreter lock both fire workers share (issue 14's eighth pass, commit 7e15669).

``batch_threshold()`` raises the young threshold to ``BATCH_YOUNG`` for as long as one holder is
inside it (the tick holds it for its whole run), and puts back what was set when the last holder
leaves; holders may nest and overlap across threads. A threshold already higher is kept.

Guarantees: nothing is kept alive longer than before except cyclic garbage, which waits at most
``BATCH_YOUNG`` net allocations of container objects for the next young collection; objects without
cycles are freed by reference counting as always. Must not: disable the collector, or leave the raised
threshold set once no holder is left.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# Above what the fire workers hold at once (two batches of 500 fires, ~20 objects a fire: ~20,000), so
# a batch is freed before a young collection ever looks at it.
BATCH_YOUNG = 50_000

_lock = threading.Lock()
_holders = 0
_saved: tuple[int, int, int] | None = None


@contextmanager
def batch_threshold() -> Iterator[None]:
    """Young collections every ``BATCH_YOUNG`` net allocations while inside (see the module docstring)."""
    global _holders, _saved
    with _lock:
        if _holders == 0:
            _saved = gc.get_threshold()
            if BATCH_YOUNG > _saved[0]:
                gc.set_threshold(BATCH_YOUNG, *_saved[1:])
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _saved is not None:
                gc.set_threshold(*_saved)
                _saved = None
