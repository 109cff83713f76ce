"""Which of a layer's files come from this node and which byte ranges are fetched.

Every file with contents is looked up by digest in the file index; a candidate counts
only if its snapshot is still committed and the file opens under the snapshot's
directory through no symlink, as a regular file of the right size (a row that fails
this is dropped from the index). The rest are fetched: their compressed ranges,
coalesced. Runs in a thread (SQLite, stat calls).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field

from pycrid.host.mounts import open_no_symlinks
from pycrid.images.partial.file_index import FileIndex, Found
from pycrid.images.partial.layout import FileData, Layout, clean
from pycrid.images.partial.ranges import Range, coalesce

#: The directory of committed snapshot ``key``, or None when it is not one (any more).
CommittedDir = Callable[[str], str | None]


class Dirs:
    """Open layer directories (O_PATH), so files are opened under them with one syscall."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}

    def open(self, root: str, path: str) -> int:
        """``path`` under ``root``, read-only, through no symlink (open_no_symlinks)."""
        fd = self._fds.get(root)
        if fd is None:
            fd = self._fds[root] = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        return open_no_symlinks(fd, clean(path))

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


@dataclass(frozen=True)
class Local:
    """A file with the wanted contents: ``path`` under the directory ``root`` of
    committed snapshot ``layer``."""

    layer: str
    root: str
    path: str


@dataclass
class Plan:
    #: Files taken from this node, by their place in ``Layout.pieces``.
    local: dict[int, Local] = field(default_factory=dict)
    #: The blob's byte ranges to fetch, in order.
    ranges: list[Range] = field(default_factory=list)
    #: Uncompressed bytes of the files taken from this node.
    reused: int = 0

    @property
    def fetch_bytes(self) -> int:
        return sum(e - s for s, e in self.ranges)


def make_plan(lay: Layout, index: FileIndex, committed_dir: CommittedDir) -> Plan:
    files = [(i, p) for i, p in enumerate(lay.pieces) if isinstance(p, FileData)]
    found = index.lookup({f.digest for _, f in files})
    dirs: dict[str, str | None] = {}
    chosen: dict[str, Local | None] = {}
    plan = Plan()
    missing: list[Range] = []
    opened = Dirs()
    try:
        for i, f in files:
            if f.digest not in chosen:
                chosen[f.digest] = _usable(f, found.get(f.digest, []), index, committed_dir,
                                           (dirs, opened))
            src = chosen[f.digest]
            if src is None:
                missing.append((f.start, f.end))
            else:
                plan.local[i] = src
                plan.reused += f.size
    finally:
        opened.close()
    plan.ranges = coalesce(missing)
    return plan


def _usable(f: FileData, candidates: list[Found], index: FileIndex,
            committed_dir: CommittedDir,
            cache: tuple[dict[str, str | None], Dirs]) -> Local | None:
    dirs, opened = cache
    for c in candidates:
        if c.layer not in dirs:
            dirs[c.layer] = committed_dir(c.layer)
        root = dirs[c.layer]
        if root is None:
            continue  # a snapshot being removed: the next collection drops its rows
        if c.size == f.size and _opens(opened, root, c.path, f.size):
            return Local(c.layer, root, c.path)
        index.forget(c.layer, c.path)
    return None


def _opens(opened: Dirs, root: str, path: str, size: int) -> bool:
    try:
        fd = opened.open(root, path)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return stat.S_ISREG(st.st_mode) and st.st_size == size
