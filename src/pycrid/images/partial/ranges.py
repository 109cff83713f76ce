"""Byte ranges of a blob: which to ask for, and the answers taken apart (sans-IO).

``coalesce`` merges ranges with small gaps (a part header costs more than a few KiB
of someone else's file), ``request_batches`` splits them into requests of a bounded
number of ranges. A registry answers a ``Range`` of several ranges with ``206`` and a
``multipart/byteranges`` body (RFC 9110 14.6), one of them with ``206`` and a
``Content-Range``, or ignores it with ``200`` and the whole blob. ``Multipart`` parses
the first form as it arrives, ``Router`` maps what any answer holds onto the ranges
asked for, in order, and says what is still missing (a server may answer fewer ranges
than asked, or merge them).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pycrid.errors import DataLoss

#: Ranges closer than this are fetched as one (the bytes between are dropped).
GAP = 16 << 10
#: Ranges per request: the Range header stays a few KiB.
PER_REQUEST = 100
_MAX_HEAD = 16 << 10  # a part's headers, or what precedes the first part
_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d{1,19})-(\d{1,19})/(\d{1,19}|\*)\s*$", re.I)
_BOUNDARY = re.compile(r"""boundary=(?:"([^"]{1,70})"|([^;\s"]{1,70}))""", re.I)

Range = tuple[int, int]  # [start, end) of the blob


def coalesce(spans: Iterable[Range], gap: int = GAP) -> list[Range]:
    """Sorted, merged ranges: overlapping or nearer than ``gap`` bytes become one."""
    out: list[Range] = []
    for start, end in sorted(spans):
        if out and start - out[-1][1] <= gap:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def request_batches(ranges: Sequence[Range], per_request: int = PER_REQUEST) -> list[list[Range]]:
    return [list(ranges[i:i + per_request]) for i in range(0, len(ranges), per_request)]


def range_header(ranges: Sequence[Range]) -> str:
    return "bytes=" + ",".join(f"{s}-{e - 1}" for s, e in ranges)


def content_range(value: str, blob_size: int) -> Range:
    """``bytes 10-19/100`` -> (10, 20), checked against the blob's size."""
    m = _CONTENT_RANGE.match(value)
    if m is None:
        raise DataLoss(f"malformed Content-Range {value[:100]!r}")
    start, last = int(m[1]), int(m[2])
    if last < start or last >= blob_size or (m[3] != "*" and int(m[3]) != blob_size):
        raise DataLoss(f"Content-Range {value[:100]!r} does not fit a {blob_size}-byte blob")
    return start, last + 1


def boundary_of(content_type: str) -> bytes | None:
    """The boundary of a ``multipart/byteranges`` answer, None for any other type."""
    if not content_type.lower().lstrip().startswith("multipart/byteranges"):
        return None
    m = _BOUNDARY.search(content_type)
    if m is None:
        raise DataLoss("a multipart/byteranges answer without a boundary")
    return (m[1] or m[2]).encode()


@dataclass(frozen=True)
class Part:
    """A part of the answer begins: the blob's bytes ``start:end`` follow."""

    start: int
    end: int


class Multipart:
    """A ``multipart/byteranges`` body, parsed as it arrives: ``feed`` returns ``Part``
    and ``bytes`` events (a part's body, in pieces). Each part's length comes from its
    Content-Range, so bodies are never searched for the boundary."""

    def __init__(self, boundary: bytes, blob_size: int) -> None:
        self._delim = b"--" + boundary
        self._size = blob_size
        self._buf = b""
        self._left = 0  # body bytes still due in the current part
        self._state = "first"  # first, after, head, body, closing, done
        self.done = False

    def feed(self, data: bytes) -> list[Part | bytes]:
        self._buf += data
        out: list[Part | bytes] = []
        while self._step(out):
            pass
        return out

    def _step(self, out: list[Part | bytes]) -> bool:
        buf = self._buf
        if self._state == "body":
            if not buf:
                return False
            take = buf[:self._left]
            self._buf, self._left = buf[len(take):], self._left - len(take)
            out.append(take)
            if self._left == 0:
                self._state = "closing"
            return True
        if self._state == "first":
            at = buf.find(self._delim)
            if at < 0:
                self._too_long(buf, "before the first part")
                return False
            self._buf, self._state = buf[at + len(self._delim):], "after"
            return True
        if self._state == "closing":
            want = b"\r\n" + self._delim
            if not want.startswith(buf[:len(want)]):
                raise DataLoss("a multipart/byteranges part is longer than its Content-Range")
            if len(buf) < len(want):
                return False
            self._buf, self._state = buf[len(want):], "after"
            return True
        if self._state == "after":
            if len(buf) < 2:
                return False
            if buf[:2] == b"--":
                self._buf, self._state, self.done = b"", "done", True
                return False
            if buf[:2] != b"\r\n":
                raise DataLoss("a multipart/byteranges boundary is malformed")
            self._buf, self._state = buf[2:], "head"
            return True
        if self._state == "head":
            end = buf.find(b"\r\n\r\n")
            if buf.startswith(b"\r\n"):
                end, skip = 0, 2  # no headers at all
            else:
                skip = 4
            if end < 0:
                self._too_long(buf, "in a part's headers")
                return False
            out.append(self._part(buf[:end]))
            self._buf, self._state = buf[end + skip:], "body"
            return True
        self._buf = b""  # done: an epilogue, ignored
        return False

    def _part(self, head: bytes) -> Part:
        for line in head.decode("latin-1").split("\r\n"):
            key, _, value = line.partition(":")
            if key.strip().lower() == "content-range":
                start, end = content_range(value, self._size)
                self._left = end - start
                return Part(start, end)
        raise DataLoss("a multipart/byteranges part without a Content-Range")

    def _too_long(self, buf: bytes, where: str) -> None:
        if len(buf) > _MAX_HEAD:
            raise DataLoss(f"a multipart/byteranges answer has over {_MAX_HEAD} bytes {where}")


class Router:
    """Takes the answer's parts and bytes and hands on exactly the bytes of the ranges
    asked for, in order (bytes between them, or sent twice, are dropped)."""

    def __init__(self, wanted: Sequence[Range]) -> None:
        self._wanted = list(wanted)
        self._i = 0
        self._pos = wanted[0][0] if wanted else 0
        self._at = -1  # the blob offset of the next byte of the current part
        self._part_end = -1

    @property
    def complete(self) -> bool:
        return self._i >= len(self._wanted)

    def remaining(self) -> list[Range]:
        """What was asked for and has not come yet."""
        if self.complete:
            return []
        return [(self._pos, self._wanted[self._i][1]), *self._wanted[self._i + 1:]]

    def part(self, p: Part) -> None:
        if not self.complete and p.start > self._pos and p.start < self._wanted[self._i][1]:
            raise DataLoss(f"the registry answered bytes {p.start}-{p.end - 1} of the blob, "
                           f"skipping {self._pos}-{p.start - 1} that were asked for")
        self._at, self._part_end = p.start, p.end

    def data(self, chunk: bytes) -> list[bytes]:
        if self._at < 0 or self._at + len(chunk) > self._part_end:
            raise DataLoss("the registry sent bytes outside the ranges it announced")
        out: list[bytes] = []
        base = self._at
        self._at += len(chunk)
        while not self.complete:
            end = self._wanted[self._i][1]
            if self._pos >= self._at or self._pos < base:
                break
            piece = chunk[self._pos - base:min(end, self._at) - base]
            out.append(piece)
            self._pos += len(piece)
            if self._pos < end:
                break
            self._i += 1
            if not self.complete:
                self._pos = self._wanted[self._i][0]
        return out
