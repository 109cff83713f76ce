"""Apply a layer rebuilt by ``reassemble`` with the ordinary unpacker, sharing what it can.

The rebuilt tar goes through ``unpack.extract`` like a downloaded one: the same path
rules, whiteouts and hashing; the diff id must be the config's (when it is not and files
of this node went in, they are hashed one by one to name the index row that lied). Its
placer sees every regular file before it is written: it notes where the file lands (for
the file index) and, when
``use_hard_links`` is on and the file comes from this node with exactly the entry's
owner, mode, mtime and xattrs, gives it a hard link to that file instead of a copy
(containers/storage's ``use_hard_links``). Nothing ever writes to a layer's files after
they are committed: containers change them through overlayfs, which copies a file up
before the first write, so a change in one container never reaches another.
"""

from __future__ import annotations

import errno
import os
import stat
import tarfile
from dataclasses import dataclass, field
from typing import Any

from pycrid.errors import DataLoss
from pycrid.faults import failpoint
from pycrid.host.mounts import link_fd
from pycrid.images.layer_paths import OVERLAY_XATTRS
from pycrid.images.partial.layout import Layout
from pycrid.images.partial.plan import Plan
from pycrid.images.partial.reassemble import (
    CHUNK,
    LocalMismatch,
    Ranges,
    Reassembled,
    stale_local,
)
from pycrid.images.tar_stream import TarStream
from pycrid.images.unpack import Extracted, extract

_XATTR = "SCHILY.xattr."


@dataclass
class Materialized:
    extracted: Extracted
    #: (digest, path inside the layer, size) of every file with contents.
    landed: list[tuple[str, str, int]] = field(default_factory=list)
    reused: int = 0
    linked: int = 0


@dataclass(frozen=True)
class Job:
    """What a layer is applied from and to."""

    lay: Layout
    plan: Plan
    root: str
    name: str
    has_lower: bool
    allow_device_nodes: bool
    hard_links: bool
    #: The config's diff id for the layer: what the rebuilt tar must hash to.
    diff_id: str


class _Stream:
    """Reassembled, as the unpacker's blob reader; ``position``: bytes handed on."""

    def __init__(self, inner: Reassembled) -> None:
        self.inner = inner
        self.position = 0

    def read(self, n: int = -1, /) -> bytes:
        out = self.inner.read(n)
        self.position += len(out)
        return out

    def readinto(self, buffer: Any, /) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[:len(data)] = data
        return len(data)

    def peek(self, n: int = 0, /) -> bytes:
        return b""  # not compressed: the unpacker takes it as a plain tar


def materialize(job: Job, ranges: Ranges) -> Materialized:
    """Unpack the rebuilt layer into ``job.root``; runs in a worker thread."""
    stream = Reassembled(job.lay, job.plan, ranges)
    wrapped = _Stream(stream)
    placer = _Placer(stream, wrapped, os.path.realpath(job.root), job.hard_links)
    placer.halfway = max(1, len(job.lay.files()) // 2)
    try:
        got = extract(wrapped, job.root, name=job.name, has_lower=job.has_lower,
                      allow_device_nodes=job.allow_device_nodes, place=placer)
    except DataLoss as e:
        if stream.mismatch is not None:  # the unpacker rewords errors: keep which row
            raise LocalMismatch(stream.mismatch, str(e)) from None
        raise
    finally:
        stream.close()
    if got.diff_id != job.diff_id:
        # Fetched files were checked one by one; files of this node only by this hash.
        stale = stale_local(job.lay, job.plan) if job.plan.local else None
        if stale is not None:
            raise stale
        raise DataLoss(f"rebuilt, it hashes to {got.diff_id}, not the config's diff id "
                       f"{job.diff_id}")
    return Materialized(got, placer.landed, stream.reused, placer.linked)


class _Placer:
    def __init__(self, stream: Reassembled, wrapped: _Stream, root: str, hard_links: bool) -> None:
        self._stream, self._wrapped = stream, wrapped
        self._root, self._hard_links = root.rstrip("/"), hard_links
        self.landed: list[tuple[str, str, int]] = []
        self.linked = 0
        #: Files placed when the fail point ``pull.partial`` is met (half the layer's).
        self.halfway = 1

    def __call__(self, info: tarfile.TarInfo, path: str, src: TarStream) -> bool:
        cur = self._stream.current()
        if cur is None or cur[0].size != info.size or src.tell() != self._wrapped.position:
            return False  # not where the tar-split said a file's data starts: write it
        f, local = cur
        self.landed.append((f.digest, path[len(self._root) + 1:], f.size))
        if len(self.landed) == self.halfway:
            failpoint("pull.partial")  # half the files in the scratch snapshot, some shared
        if local is None or not self._hard_links:
            return False
        fd = self._stream.local_fd()
        if not _same_meta(fd, info):
            return False
        try:
            link_fd(fd, path)
        except OSError as e:
            if e.errno in (errno.EMLINK, errno.EXDEV, errno.EPERM, errno.EEXIST):
                # too many links, another file system, a name an earlier entry of the
                # layer took: a copy then
                return False
            raise
        left = info.size
        while left:  # the bytes still count for the diff id, which checks them
            chunk = src.read(min(left, CHUNK))
            if not chunk:
                raise DataLoss(f"{f.name}: the layer ends inside its data")
            left -= len(chunk)
        self.linked += 1
        return True


def _same_meta(fd: int, info: tarfile.TarInfo) -> bool:
    """Whether the file open as ``fd`` already has everything the unpacker would give the
    entry: owner, permission bits, mtime and xattrs."""
    st = os.fstat(fd)
    if (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) != \
            (info.uid, info.gid, stat.S_IMODE(info.mode)):
        return False
    if not isinstance(info.mtime, int) or st.st_mtime_ns != info.mtime * 10**9:
        return False
    want = {k[len(_XATTR):]: v.encode("utf-8", "surrogateescape")
            for k, v in info.pax_headers.items()
            if k.startswith(_XATTR) and not k[len(_XATTR):].startswith(OVERLAY_XATTRS)}
    have = {}
    for name in os.listxattr(fd):
        if not name.startswith(OVERLAY_XATTRS):
            have[name] = os.getxattr(fd, name)
    return want == have
