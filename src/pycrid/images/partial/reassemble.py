"""A layer's uncompressed tar, rebuilt as it is read, in a worker thread.

The pieces come in tar order: raw segments from the tar-split; files found on this node,
read from their snapshot (opened through no symlink); fetched files, decompressed from
the ranges as they arrive (``Ranges``: the bytes of the requested ranges, in order, as
the loop hands them over). Every fetched file is hashed as it is read and checked against
its digest before its last bytes are handed on, so fetched bytes that are not what the TOC
says never land whole. Files of this node are not hashed on their own: the stream's hash
(the diff id, the unpacker's) covers every byte of them, and only when it comes out wrong
are they hashed one by one (``stale_local``) to find the index row that lied.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import IO, Any, cast

import zstandard
from isal import igzip

from pycrid.errors import DataLoss
from pycrid.host.mounts import open_no_symlinks, open_no_symlinks_dir
from pycrid.images.layer_paths import clean_name
from pycrid.images.layer_tar import CODEC_ERRORS
from pycrid.images.partial.layout import FileData, Layout
from pycrid.images.partial.plan import Local, Plan
from pycrid.images.partial.ranges import Range

CHUNK = 1 << 20


class Dirs:
    """Directories of layers, open (O_PATH) as they are met, so that most files are
    opened with one plain openat: their directory was reached through no symlink
    (open_no_symlinks_dir), and the name itself is opened O_NOFOLLOW."""

    #: Directories kept open at once (the least recently opened is closed first).
    KEEP = 64

    def __init__(self) -> None:
        self._roots: dict[str, int] = {}
        self._dirs: OrderedDict[tuple[str, str], int] = OrderedDict()

    def open(self, root: str, path: str) -> int:
        """``path`` under ``root``, read-only, through no symlink (ELOOP where a component
        is one, ENOENT where it is missing)."""
        rel = clean_name(path)  # ".." clamped: only the root itself has no last name
        parent, _, base = rel.rpartition("/")
        if not base:
            return open_no_symlinks(self._root(root), rel)
        return os.open(base, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                       dir_fd=self._dir(root, parent))

    def _dir(self, root: str, parent: str) -> int:
        if not parent:
            return self._root(root)
        dfd = self._dirs.get((root, parent))
        if dfd is None:
            dfd = self._dirs[(root, parent)] = open_no_symlinks_dir(self._root(root), parent)
            if len(self._dirs) > self.KEEP:
                os.close(self._dirs.popitem(last=False)[1])
        return dfd

    def _root(self, root: str) -> int:
        fd = self._roots.get(root)
        if fd is None:
            fd = self._roots[root] = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        return fd

    def close(self) -> None:
        for fd in [*self._dirs.values(), *self._roots.values()]:
            os.close(fd)
        self._dirs.clear()
        self._roots.clear()


class LocalMismatch(DataLoss):
    """A file taken from this node is gone or not what the index said (its row is
    stale): the layer is then pulled whole, and the row dropped."""

    def __init__(self, src: Local, why: str) -> None:
        super().__init__(f"{src.path} of layer {src.layer}: {why}")
        self.source = src


def _read_upto(f: Any, n: int) -> bytes:
    """Up to ``n`` bytes (fewer only at the end)."""
    parts, got = [], 0
    while got < n:
        chunk = f.read(n - got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


class Ranges:
    """The fetched ranges' bytes, addressed by blob offset; ``next_chunk`` gives what
    arrived next (b"" at the end of everything)."""

    def __init__(self, next_chunk: Callable[[], bytes], ranges: Sequence[Range]) -> None:
        self._next = next_chunk
        self._ranges = list(ranges)
        self._i = 0
        self._pos = self._ranges[0][0] if self._ranges else 0
        self._buf = memoryview(b"")

    def seek(self, offset: int) -> None:
        """Skip to ``offset``: forward only, to a byte of a requested range (what lies
        between is dropped)."""
        while self._i < len(self._ranges) and self._ranges[self._i][1] <= offset:
            self._drop(self._ranges[self._i][1] - self._pos)
            self._i += 1
            if self._i < len(self._ranges):
                self._pos = self._ranges[self._i][0]
        if self._i >= len(self._ranges) or offset < self._pos:
            raise DataLoss(f"blob offset {offset} was not fetched")
        self._drop(offset - self._pos)

    def _drop(self, n: int) -> None:
        while n:
            n -= len(self.read(n))

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes from the current position, not beyond the current range."""
        if self._i >= len(self._ranges):
            return b""
        n = min(n, self._ranges[self._i][1] - self._pos)
        if not self._buf:
            chunk = self._next()
            if not chunk:
                raise DataLoss("the registry's answer ended before every range was sent")
            self._buf = memoryview(chunk)
        out = bytes(self._buf[:n])
        self._buf = self._buf[len(out):]
        self._pos += len(out)
        return out


class _Span:
    """``start:end`` of the blob, as a file object for the decompressor."""

    def __init__(self, ranges: Ranges, start: int, end: int) -> None:
        ranges.seek(start)
        self._ranges, self._left = ranges, end - start

    def read(self, n: int = -1) -> bytes:
        if self._left <= 0:
            return b""
        out = self._ranges.read(min(self._left, CHUNK if n < 0 else n))
        self._left -= len(out)
        return out

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[:len(data)] = data
        return len(data)


class _FdReader:
    """Reads the open file ``fd`` (closed by its owner, not here)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def read(self, n: int = -1) -> bytes:
        return os.read(self._fd, CHUNK if n < 0 else n)

    def close(self) -> None:
        pass


class Reassembled:
    """The tar stream (``read``), and where the file now being read comes from (for the
    unpacker's placer: ``local_fd``)."""

    def __init__(self, lay: Layout, plan: Plan, ranges: Ranges) -> None:
        self._pieces = lay.pieces
        self._local = plan.local
        self._ranges = ranges
        self._i = 0
        self._off = 0
        self._src: Any = None  # the current file's reader
        self._fd = -1  # the current local file
        self._hash = hashlib.sha256()
        self._dirs = Dirs()
        #: Uncompressed bytes read from files of this node.
        self.reused = 0
        #: The file of this node that was not what the index said, if one was met.
        self.mismatch: Local | None = None

    def close(self) -> None:
        self._close_file()
        self._dirs.close()

    def _close_file(self) -> None:
        if self._src is not None:
            self._src.close()
            self._src = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def current(self) -> tuple[FileData, Local | None] | None:
        """The file whose contents the stream is about to give, from its first byte."""
        while (self._i < len(self._pieces) and isinstance(self._pieces[self._i], bytes)
               and self._off >= len(self._pieces[self._i])):  # type: ignore[arg-type]
            self._i, self._off = self._i + 1, 0
        if self._i < len(self._pieces) and self._off == 0:
            p = self._pieces[self._i]
            if isinstance(p, FileData):
                return p, self._local.get(self._i)
        return None

    def local_fd(self) -> int:
        """The open file of the current piece, which must be a local one."""
        if self._src is None:
            self._open()
        return self._fd

    def read(self, n: int = -1) -> bytes:
        if n < 0:
            n = CHUNK
        while self._i < len(self._pieces):
            p = self._pieces[self._i]
            if isinstance(p, bytes):
                out = p[self._off:self._off + n]
                if out:
                    self._off += len(out)
                    return out
            elif self._off < p.size:
                return self._file_bytes(p, n)
            self._i, self._off = self._i + 1, 0
        return b""

    def _open(self) -> None:
        p = self._pieces[self._i]
        assert isinstance(p, FileData)
        src = self._local.get(self._i)
        if src is None:
            self._hash = hashlib.sha256()
            span = cast(IO[bytes], _Span(self._ranges, p.start, p.end))
            if p.codec == "gzip":
                self._src = igzip.GzipFile(fileobj=span, mode="rb")  # type: ignore[no-untyped-call]
            else:
                self._src = zstandard.ZstdDecompressor().stream_reader(
                    span, read_size=CHUNK, read_across_frames=True)
            return
        try:
            self._fd = self._dirs.open(src.root, src.path)
        except OSError as e:
            raise self._bad(src, f"cannot be opened ({e.strerror})") from None
        st = os.fstat(self._fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != p.size:
            raise self._bad(src, "is not a regular file of the expected size")
        self._src = _FdReader(self._fd)

    def _file_bytes(self, p: FileData, n: int) -> bytes:
        if self._src is None:
            self._open()
        src = self._local.get(self._i)
        try:
            data: bytes = self._src.read(min(n, p.size - self._off, CHUNK))
        except CODEC_ERRORS as e:
            raise DataLoss(f"{p.name}: its fetched data does not decompress: {e}") from None
        if not data:
            why = f"ends after {self._off} of its {p.size} bytes"
            raise self._bad(src, why) if src else DataLoss(f"{p.name}: data {why}")
        self._off += len(data)
        if src is not None:
            self.reused += len(data)
            if self._off == p.size:  # fstat said it holds p.size bytes: all read
                self._close_file()
            return data
        self._hash.update(data)
        if self._off == p.size:
            self._finish(p)
        return data

    def _finish(self, p: FileData) -> None:
        # What follows the contents in their span: nothing for zstd:chunked; for eStargz
        # the tar's headers up to the next file, which must be the ones the layout wrote
        # again from the TOC.
        try:
            rest = _read_upto(self._src, len(p.tail) + 1)
        except CODEC_ERRORS as e:
            raise DataLoss(f"{p.name}: its fetched data does not decompress: {e}") from None
        self._close_file()
        got = "sha256:" + self._hash.hexdigest()
        if got != p.digest:
            raise DataLoss(f"{p.name}: fetched data hashes to {got}, not {p.digest}")
        if rest != p.tail:
            raise DataLoss(f"{p.name}: the tar headers after it are not the ones its TOC "
                           "implies" if p.tail else f"{p.name}: fetched data holds more "
                           "than its size")

    def _bad(self, src: Local, why: str) -> LocalMismatch:
        self.mismatch = src
        return LocalMismatch(src, why)


def stale_local(lay: Layout, plan: Plan) -> LocalMismatch | None:
    """The first file of this node the plan took that does not hash to its digest (or is
    gone): asked only after a rebuilt layer's diff id came out wrong, to name the index
    row to drop. Runs in a worker thread."""
    dirs = Dirs()
    seen: set[tuple[str, str]] = set()
    try:
        for i, src in sorted(plan.local.items()):
            p = lay.pieces[i]
            assert isinstance(p, FileData)
            if (src.root, src.path) in seen:
                continue
            seen.add((src.root, src.path))
            try:
                fd = dirs.open(src.root, src.path)
            except OSError as e:
                return LocalMismatch(src, f"cannot be opened ({e.strerror})")
            try:
                h = hashlib.sha256()
                while chunk := os.read(fd, CHUNK):
                    h.update(chunk)
            finally:
                os.close(fd)
            got = "sha256:" + h.hexdigest()
            if got != p.digest:
                return LocalMismatch(src, f"hashes to {got}, not {p.digest}")
        return None
    finally:
        dirs.close()
