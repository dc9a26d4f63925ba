"""``freeze_startup_heap`` (``gc_heap.py``): the start-up heap leaves the collector's sight."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from areal_tasks.gc_heap import freeze_startup_heap


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """This test process keeps collecting: whatever the test froze is unfrozen after it (and no
    automatic collection runs during the test, so only the freeze's own collection frees garbage)."""
    gc.unfreeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


def test_freezing_moves_live_objects_out_of_collections_and_collects_garbage_first(unfrozen) -> None:
    class Node:
        def __init__(self) -> None:
            self.me = self  # a reference cycle: only the cyclic collector frees it

    live = [Node() for _ in range(1000)]
    garbage = weakref.ref(Node())  # unreachable before the freeze: collected, not frozen
    assert garbage() is not None
    before = len(gc.get_objects())
    frozen = freeze_startup_heap()
    assert frozen.objects == gc.get_freeze_count() > 0
    assert frozen.objects >= len(live)
    assert frozen.collect_s >= 0.0
    # a collection now tracks only what was made since: far fewer objects than before
    assert len(gc.get_objects()) < before // 10
    assert garbage() is None
