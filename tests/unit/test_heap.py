"""kairos.heap: the young threshold is raised while a holder is inside, and put back when the last one leaves."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from kairos import heap


@pytest.fixture(autouse=True)
def default_threshold() -> Iterator[tuple[int, int, int]]:
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        yield gc.get_threshold()
    finally:
        gc.set_threshold(*saved)


def test_the_young_threshold_is_raised_inside_and_restored_after() -> None:
    with heap.batch_threshold():
        assert gc.get_threshold() == (heap.BATCH_YOUNG, 10, 10)
    assert gc.get_threshold() == (700, 10, 10)


def test_an_exception_inside_still_restores_it() -> None:
    with pytest.raises(RuntimeError, match="boom"), heap.batch_threshold():
        raise RuntimeError("boom")
    assert gc.get_threshold() == (700, 10, 10)


def test_nested_holders_restore_only_when_the_outer_one_leaves() -> None:
    with heap.batch_threshold():
        with heap.batch_threshold():
            assert gc.get_threshold()[0] == heap.BATCH_YOUNG
        assert gc.get_threshold()[0] == heap.BATCH_YOUNG
    assert gc.get_threshold() == (700, 10, 10)


def test_holders_in_two_threads_overlapping_leave_it_raised_until_both_have_left() -> None:
    first_inside, second_inside, first_left, second_may_leave = (threading.Event() for _ in range(4))
    seen: dict[str, int] = {}

    def first() -> None:
        with heap.batch_threshold():
            first_inside.set()
            second_inside.wait(5)
        first_left.set()

    def second() -> None:
        first_inside.wait(5)
        with heap.batch_threshold():
            second_inside.set()
            first_left.wait(5)
            seen["after_first_left"] = gc.get_threshold()[0]
            second_may_leave.wait(5)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    first_left.wait(5)
    second_may_leave.set()
    for t in threads:
        t.join(5)
    assert seen == {"after_first_left": heap.BATCH_YOUNG}
    assert gc.get_threshold() == (700, 10, 10)


def test_a_higher_threshold_already_set_is_kept() -> None:
    gc.set_threshold(heap.BATCH_YOUNG * 2, 5, 5)
    with heap.batch_threshold():
        assert gc.get_threshold() == (heap.BATCH_YOUNG * 2, 5, 5)
    assert gc.get_threshold() == (heap.BATCH_YOUNG * 2, 5, 5)


def test_a_batch_of_live_objects_no_longer_triggers_collections_inside() -> None:
    """What it is for: 20,000 objects alive at once (a fire batch's worth) run young collections by
    the dozen at the default threshold, and none inside."""
    collections: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    def batch() -> int:
        gc.collect()
        collections.clear()
        gc.callbacks.append(count)
        try:
            live = [{"row": i} for i in range(20_000)]
            del live
        finally:
            gc.callbacks.remove(count)
        return len(collections)

    assert batch() >= 20
    with heap.batch_threshold():
        assert batch() == 0
