"""graph/heap.py: a loaded process collects its startup garbage once, then freezes the rest."""

import gc
import weakref

import pytest

from graph import heap


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> weakref.ref:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture
def fresh_heap(monkeypatch):
    monkeypatch.setattr(heap, "_settled", False)
    yield
    gc.unfreeze()  # the rest of the test session collects as before


def test_settle_collects_the_garbage_there_is_then_freezes_what_is_left(fresh_heap):
    garbage = _cycle()
    kept = _Node()
    kept.other = kept  # alive, in a cycle: the collector would walk it at every full collection
    assert garbage() is not None  # a cycle: only the collector frees it

    frozen = heap.settle()

    assert garbage() is None
    assert frozen == gc.get_freeze_count() > 0
    assert not any(obj is kept for obj in gc.get_objects())  # in no generation: no collection walks it


def test_what_is_allocated_after_settling_is_still_collected(fresh_heap):
    heap.settle()
    later = _cycle()
    gc.collect()
    assert later() is None


def test_settle_freezes_once_per_process(fresh_heap):
    first = heap.settle()
    _ = [_Node() for _ in range(10)]
    assert heap.settle() == first == gc.get_freeze_count()
