"""The uncompressed layer as ``tarfile`` reads it: in order, hashed as it passes (the diff
id).

tarfile parses the headers in its random-access mode, which over a stream read in order
only ever seeks forward, or back a little into the bytes just read (to check that a
member's data is all there). It asks for many small pieces per member (a header block,
a byte, the padding): those are served from a look-ahead block read from the stream in
one piece, and hashed once, as it is read. File data is copied straight from the stream
to the file (:meth:`TarStream.copy_to`), without joining or buffering it.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
from typing import Any

CHUNK = 1 << 20
#: Read from the stream at once for small reads (headers, small files' data, padding).
LOOKAHEAD = 64 << 10
#: What can be stepped back over: the bytes just before the position.
_BACK = tarfile.BLOCKSIZE


class TarStream:
    def __init__(self, inner: Any, *, hashed: bool = True) -> None:
        self._inner = inner
        #: sha256 of what was read, unless not ``hashed`` (the caller knows the digest).
        self.hash = hashlib.sha256() if hashed else None
        # _buf[_i:] is read from the stream (and hashed) but not handed out yet;
        # _buf[:_i] ends with what was handed out last (up to _BACK of it, to step back).
        self._buf = b""
        self._i = 0
        self._pos = 0

    def tell(self) -> int:
        return self._pos

    def _pull(self, need: int, want: int) -> bytes:
        """At least ``need`` bytes from the stream (fewer only at its end), and up to
        ``want`` of them if they come in the same reads; hashed."""
        parts = []
        got = 0
        while got < need:
            data: bytes = self._inner.read(want - got)
            if not data:
                break
            if self.hash is not None:
                self.hash.update(data)
            parts.append(data)
            got += len(data)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _handed_out(self, data: bytes) -> None:
        """``data`` went out past the buffer: keep its end (with what went before it, if it
        is short) for a step back."""
        if len(data) < _BACK:
            data = self._buf[max(0, self._i - _BACK):self._i] + data
        self._buf = data[-_BACK:]
        self._i = len(self._buf)

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            return b"".join(iter(lambda: self.read(CHUNK), b""))
        have = len(self._buf) - self._i
        if n > have:
            if n > LOOKAHEAD:
                # Large: what is buffered, then the rest straight from the stream.
                rest = self._pull(n - have, n - have)
                out = self._buf[self._i:] + rest if have else rest
                self._handed_out(out)
                self._pos += len(out)
                return out
            keep = max(0, self._i - _BACK)
            self._buf = self._buf[keep:] + self._pull(n - have, LOOKAHEAD)
            self._i -= keep
        out = self._buf[self._i:self._i + n]
        self._i += len(out)
        self._pos += len(out)
        return out

    def copy_to(self, fd: int, n: int) -> int:
        """Write the next ``n`` bytes to ``fd``: the buffered ones, then the rest straight
        from the stream, a piece at a time; bytes written (fewer only at the end)."""
        done = 0
        if self._i < len(self._buf):
            head = self._buf[self._i:self._i + n]
            write_all(fd, head)
            self._i += len(head)
            done = len(head)
        while done < n:
            data: bytes = self._inner.read(min(n - done, CHUNK))
            if not data:
                break
            if self.hash is not None:
                self.hash.update(data)
            write_all(fd, data)
            done += len(data)
            self._handed_out(data)
        self._pos += done
        return done

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        if whence != os.SEEK_SET:
            raise OSError("a layer stream seeks to absolute positions only")
        if pos < self._pos:
            back = self._pos - pos
            if back > min(self._i, _BACK):
                raise OSError(f"a layer stream cannot go back {back} bytes")
            self._i -= back
            self._pos = pos
        while self._pos < pos and self.read(min(pos - self._pos, CHUNK)):
            pass
        return self._pos

    def drain(self) -> None:
        while self.read(CHUNK):
            pass


def write_all(fd: int, data: bytes) -> None:
    """All of ``data`` to ``fd`` (a short write is continued, a full disk raises)."""
    done = os.write(fd, data)
    if done < len(data):  # a regular file takes all but on a full disk, which raises next
        view = memoryview(data)
        while done < len(data):
            done += os.write(fd, view[done:])
