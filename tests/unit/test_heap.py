"""services/common/heap.py: what a server does to its collector once started."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from services.common import heap


@pytest.fixture
def collector() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_settle_freezes_what_is_alive_and_raises_only_the_young_threshold(
    collector: None,
) -> None:
    alive = [[] for _ in range(10)]  # containers the collector tracks
    _, gen1, gen2 = gc.get_threshold()
    before = gc.get_freeze_count()
    heap.settle()
    assert gc.get_freeze_count() > before  # start-up's objects: no collection walks them again
    assert gc.get_threshold() == (heap.GEN0_THRESHOLD, gen1, gen2)  # cycles still collected
    assert alive  # still referenced


def test_cycles_made_after_settling_are_still_collected(collector: None) -> None:
    heap.settle()

    class Node:
        other: object = None

    a, b = Node(), Node()
    a.other, b.other = b, a
    del a, b
    assert gc.collect() >= 2
