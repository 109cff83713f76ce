"""images/heap.py: the heap thresholds are raised on glibc, and the freed buffers go back
once the last of the pulls under way ends, not before."""

from __future__ import annotations

import platform
from collections.abc import Callable
from typing import Any

import pytest

from pycrid.images import heap


class Recorder:
    """An executor that only records what it was given."""

    def __init__(self) -> None:
        self.calls: list[Callable[..., Any]] = []

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        self.calls.append(fn)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_thresholds_are_raised_and_memory_released_on_glibc() -> None:
    assert heap.keep_freed_buffers()
    heap.release()  # returns, whatever the heap holds


def test_buffers_go_back_after_the_last_pull() -> None:
    ex = Recorder()
    buffers = heap.PullBuffers(ex)  # type: ignore[arg-type]
    with buffers.pulling():
        with buffers.pulling():
            pass
        assert ex.calls == []  # one pull still under way
    assert ex.calls == [heap.release]
    with pytest.raises(ValueError), buffers.pulling():
        raise ValueError("a failed pull")
    assert ex.calls == [heap.release, heap.release]
