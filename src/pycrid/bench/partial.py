"""The partial-pull section: pulling the new version of an image on a node that has the
old one, beside pulling it on a node that has nothing of it (the floor).

Each round pulls OLD (untimed), times the pull of NEW, reads ImageFsInfo (the disk the
two take together), removes both, then times the pull of NEW alone and removes it. A
runtime that pulls partially (pycrid with zstd:chunked images) fetches only what changed
the first time; one that does not downloads NEW whole both times. Neither image may be
on the node before the run: it pulls and removes both, every round. Bytes fetched are
read from a counter when the caller has one (``python -m bench``: the test registry's
access log); a node's registry gives none.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cri_api.v1 import api_pb2 as pb

from pycrid.bench.report import Section
from pycrid.bench.timing import timed

#: A running total of bytes the registry sent (read before and after each timed pull).
Counter = Callable[[], int]


def pull(client: Any, ref: str) -> None:
    client.images.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=ref)), timeout=900)


def remove(client: Any, ref: str) -> None:
    client.images.RemoveImage(pb.RemoveImageRequest(image=pb.ImageSpec(image=ref)),
                              timeout=120)


def present(client: Any, ref: str) -> bool:
    st = client.images.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=ref)),
                                   timeout=30)
    return bool(st.image.id)


def fs_used(client: Any) -> int:
    """Bytes the runtime's image file systems use (ImageFsInfo)."""
    fs = client.images.ImageFsInfo(pb.ImageFsInfoRequest(), timeout=120)
    return int(sum(f.used_bytes.value for f in fs.image_filesystems))


@dataclass
class Pulls:
    """Timings (ms), bytes fetched and disk (bytes) of one kind of pull."""

    ms: list[float] = field(default_factory=list)
    fetched: list[float] = field(default_factory=list)
    disk: list[float] = field(default_factory=list)


def upgrade(client: Any, old: str, new: str, into: Pulls, counter: Counter | None) -> None:
    """OLD untimed, NEW timed; the disk both take; both removed."""
    before = fs_used(client)
    pull(client, old)
    try:
        timed_pull(client, new, into, counter)
        into.disk.append(fs_used(client) - before)
    finally:
        for ref in (new, old):
            if present(client, ref):
                remove(client, ref)


def cold(client: Any, ref: str, into: Pulls, counter: Counter | None) -> None:
    """``ref`` timed on a node without it; removed."""
    try:
        timed_pull(client, ref, into, counter)
    finally:
        if present(client, ref):
            remove(client, ref)


def timed_pull(client: Any, ref: str, into: Pulls, counter: Counter | None) -> None:
    start = counter() if counter is not None else 0
    ms, _ = timed(lambda: pull(client, ref))
    into.ms.append(ms)
    if counter is not None:
        into.fetched.append(counter() - start)


def add_figures(sec: Section, label: str, upgraded: Pulls, whole: Pulls) -> None:
    """The upgrade pull against the whole pull of NEW: time, and bytes when counted."""
    floor = f"PullImage {label}, nothing to reuse"
    sec.floor(floor, whole.ms)
    sec.figure(f"PullImage {label} after the old version", upgraded.ms, floor=floor)
    if upgraded.fetched and whole.fetched:
        sec.floor(f"bytes fetched {label}, nothing to reuse",
                  [b / 1024 for b in whole.fetched], unit="KiB")
        sec.figure(f"bytes fetched {label} after the old version",
                   [b / 1024 for b in upgraded.fetched], unit="KiB",
                   floor=f"bytes fetched {label}, nothing to reuse")
    if upgraded.disk:
        sec.figure(f"disk of the old version and {label}", [b / 1024 for b in upgraded.disk],
                   unit="KiB")


def run(target: Any, old: str, new: str, rounds: int) -> Section:
    """``pycrid bench``'s section: OLD and NEW are the operator's (two versions of one
    image, e.g. before and after a rebuild)."""
    sec = Section("partial")
    client = target.client
    if present(client, old) or present(client, new):
        sec.skipped = "the old or the new image is on the node already (remove both first)"
        return sec
    upgraded, whole = Pulls(), Pulls()
    for i in range(rounds):
        # Alternate which goes first: the page cache and the registry warm up.
        steps: list[Callable[[], None]] = [
            lambda: upgrade(client, old, new, upgraded, None),
            lambda: cold(client, new, whole, None)]
        for step in steps if i % 2 == 0 else steps[::-1]:
            step()
        print(f"\rpartial {i + 1}/{rounds}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    add_figures(sec, "NEW", upgraded, whole)
    sec.notes.append(f"old {old}, new {new}; each round pulls old (untimed) then new, and "
                     "new on a node without old; disk is ImageFsInfo's growth with both")
    sec.extra.update({"old": old, "new": new, "rounds": rounds})
    return sec
