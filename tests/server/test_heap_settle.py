"""settle_for_serving: what exists at the call leaves the collector's generations (frozen), the
garbage already there is freed rather than frozen, and young collections come far less often."""
from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from minisgl.server.heap import YOUNG_THRESHOLD, settle_for_serving


@pytest.fixture
def restored_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    gc.disable()  # no automatic collection may free the test's garbage first
    yield
    gc.enable()
    gc.unfreeze()
    gc.set_threshold(*thresholds)


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


def test_settle_freezes_the_live_heap_frees_garbage_and_raises_the_young_threshold(restored_gc: None) -> None:
    _, older, oldest = gc.get_threshold()
    kept = _Node()
    garbage = weakref.ref(_Node())  # a cycle nothing refers to
    assert garbage() is not None
    settle_for_serving()
    assert garbage() is None  # freed, not frozen
    assert gc.get_freeze_count() > 0
    assert not any(o is kept for o in gc.get_objects())  # frozen: in no generation any more
    assert gc.get_threshold() == (YOUNG_THRESHOLD, older, oldest)
    assert YOUNG_THRESHOLD > 700
