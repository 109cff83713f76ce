"""What one pull cost: bytes fetched from registries, reused from this node, skipped.

The image service opens a report per pull (``reporting``); whatever downloads or reuses
bytes for that pull, in any of its tasks, adds to it through ``current()`` (a context
variable: tasks a pull starts inherit it). It feeds the pull's log line, the metrics and
``pycrid_image_pull_last_bytes``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass
class PullReport:
    #: Bytes received from registries: manifests, configs, whole layers and ranges.
    fetched: int = 0
    #: Uncompressed file bytes taken from layers already on this node (partial pulls).
    reused: int = 0
    #: Compressed bytes of partially pulled layers that were not downloaded.
    skipped: int = 0
    #: Layers pulled partially, and of them, files shared by hard link.
    partial_layers: int = 0
    linked_files: int = 0
    #: Whether the node had no indexed files when the pull began (None: not asked yet):
    #: then none of its layers tries a partial pull, not even after the first commits.
    nothing_indexed: bool | None = None


_CURRENT: ContextVar[PullReport | None] = ContextVar("pycrid_pull_report", default=None)


def current() -> PullReport:
    """The report of the pull this code runs for (a throwaway outside any pull)."""
    return _CURRENT.get() or PullReport()


@contextlib.contextmanager
def reporting() -> Iterator[PullReport]:
    report = PullReport()
    token = _CURRENT.set(report)
    try:
        yield report
    finally:
        _CURRENT.reset(token)
