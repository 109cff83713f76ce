"""Which of a layer's files come from this node and which byte ranges are fetched.

Every file with contents is looked up by digest in the file index; a candidate counts
only if its snapshot is still committed and its row says the right size. The file is
opened once, when the layer is rebuilt (``reassemble``): under the snapshot's directory
through no symlink, as a regular file of that size and those contents, or the layer is
pulled whole and the row dropped (rows are of committed snapshots, whose files never
change: that costs nothing but a failed attempt). The rest are fetched: their
compressed ranges, coalesced. Runs in a thread (SQLite, the snapshotter).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pycrid.images.partial.file_index import FileIndex, Found
from pycrid.images.partial.layout import FileData, Layout
from pycrid.images.partial.ranges import Range, coalesce

#: The directory of committed snapshot ``key``, or None when it is not one (any more).
CommittedDir = Callable[[str], str | None]


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
    for i, f in files:
        if f.digest not in chosen:
            chosen[f.digest] = _usable(f, found.get(f.digest, []), index, committed_dir, dirs)
        src = chosen[f.digest]
        if src is None:
            missing.append((f.start, f.end))
        else:
            plan.local[i] = src
            plan.reused += f.size
    plan.ranges = coalesce(missing)
    return plan


def _usable(f: FileData, candidates: list[Found], index: FileIndex,
            committed_dir: CommittedDir, dirs: dict[str, str | None]) -> Local | None:
    for c in candidates:
        if c.layer not in dirs:
            dirs[c.layer] = committed_dir(c.layer)
        root = dirs[c.layer]
        if root is None:
            continue  # a snapshot being removed: the next collection drops its rows
        if c.size == f.size:
            return Local(c.layer, root, c.path)
        index.forget(c.layer, c.path)
    return None
