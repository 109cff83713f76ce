"""The C heap during pulls: large buffers reused instead of faulted in afresh.

A pull allocates and frees buffers of 64 KiB to a few MiB all the time (each received
piece of a blob, twice: the socket read and the HTTP parser's copy; joined pieces;
decompressed data). glibc gives such sizes fresh pages, by mmap or by growing the heap
again after trimming it, so every one of them is page-faulted in: about one fault per
4 KiB of every blob, a sixth of a pull's CPU, much of it on the event loop. Raising the
mmap and trim thresholds (``mallopt``) keeps freed buffers in the heap for the next
ones; :func:`release` (``malloc_trim``) gives them back to the system when no pull is
under way, so the daemon's memory between pulls is what it was. Anything but glibc:
nothing is changed.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
from collections.abc import Iterator
from concurrent.futures import Executor

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Allocations below this come from the heap (a pull's largest buffers are 4 MiB).
MMAP_THRESHOLD = 8 << 20
#: Free memory kept at the top of a heap while pulls run.
TRIM_THRESHOLD = 64 << 20


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt, libc.malloc_trim  # noqa: B018 (glibc only)
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


def keep_freed_buffers() -> bool:
    """Raise the thresholds (once per process is enough); False where that is not glibc."""
    if _LIBC is None:
        return False
    ok = bool(_LIBC.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
        bool(_LIBC.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    if not ok:
        log.debug("mallopt refused the pull's heap thresholds")
    return ok


def release() -> None:
    """Give the heap's free memory back to the system (blocks for a few milliseconds)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


class PullBuffers:
    """Counts the pulls under way; when the last one ends, the freed buffers go back to
    the system in a thread of ``executor`` (not waited for: nothing depends on it)."""

    def __init__(self, executor: Executor) -> None:
        self._executor = executor
        self._pulls = 0
        keep_freed_buffers()

    @contextlib.contextmanager
    def pulling(self) -> Iterator[None]:
        self._pulls += 1
        try:
            yield
        finally:
            self._pulls -= 1
            if not self._pulls:
                with contextlib.suppress(RuntimeError):  # the executor was shut down
                    self._executor.submit(release)
