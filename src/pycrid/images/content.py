"""The content store: blobs by digest on disk, written only after their digest checks out.

Layout (containerd's): ``<root>/blobs/sha256/<hex>`` for committed blobs and
``<root>/ingest/`` for downloads in progress. A blob becomes visible by an
atomic rename after its size and sha256 are verified and the file is fsynced,
so a reader never sees partial or wrong content, even after a power cut.
Concurrent requests for one digest share a single download (the second waits
for the first), which is how two pulls of images sharing a layer fetch that
layer once.

A download is read by a consumer as it arrives (the unpacker untars a layer
while it downloads): the event loop only moves chunks; hashing, writing and
the consumer run in a worker thread. The consumer reads the same bytes from
the committed file when the blob is already present.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import IO, Any, Generic, Protocol, TypeVar, overload

from pycrid.errors import DataLoss, DeadlineExceeded, NotFound
from pycrid.images.mediatypes import validate_digest
from pycrid.images.threads import ChunkPipe, run_settled, settle
from pycrid.tasks import race

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Opens a stream of a blob's bytes (the registry client's ``fetch_blob``).
BlobOpener = Callable[[], contextlib.AbstractAsyncContextManager[AsyncIterator[bytes]]]


class BlobReader(Protocol):
    """What a consumer reads a blob from: a file opened for reading has all of it."""

    def read(self, n: int = -1, /) -> bytes: ...

    def readinto(self, buffer: Any, /) -> int: ...

    def peek(self, n: int = 0, /) -> bytes: ...


#: Reads a blob in a worker thread; what it returns, ``ingest`` returns.
Consumer = Callable[[BlobReader], T]


@dataclass(frozen=True)
class Ingested(Generic[T]):
    digest: str
    size: int
    #: False when the blob was already present or another task fetched it for us.
    downloaded: bool
    #: What the consumer returned.
    result: T


#: Bytes of a download between two nudges to the kernel to write it out.
_WRITEBACK = 4 << 20


class _Stopped(Exception):
    """Internal: the consumer was asked to stop (its caller was cancelled)."""


class ContentStore:
    def __init__(self, root: str) -> None:
        self.root = root
        self._blobs = os.path.join(root, "blobs", "sha256")
        self._ingest = os.path.join(root, "ingest")
        os.makedirs(self._blobs, mode=0o700, exist_ok=True)
        os.makedirs(self._ingest, mode=0o700, exist_ok=True)
        self._inflight: dict[str, asyncio.Event] = {}

    def path(self, digest: str) -> str:
        return os.path.join(self._blobs, validate_digest(digest).split(":", 1)[1])

    def exists(self, digest: str) -> bool:
        return os.path.exists(self.path(digest))

    def size(self, digest: str) -> int:
        try:
            return os.stat(self.path(digest)).st_size
        except FileNotFoundError:
            raise NotFound(f"content {digest} not found") from None

    def read(self, digest: str) -> bytes:
        try:
            with open(self.path(digest), "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise NotFound(f"content {digest} not found") from None

    def write(self, digest: str, data: bytes) -> None:
        """Store small, already-in-memory content (manifests, configs) after verifying it."""
        got = "sha256:" + hashlib.sha256(data).hexdigest()
        if got != digest:
            raise DataLoss(f"content {digest}: digest mismatch (got {got})")
        if self.exists(digest):
            return
        tmp = self._tmp_path(digest)
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, self.path(digest))
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def delete(self, digest: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(digest))

    def digests(self) -> set[str]:
        return {"sha256:" + name for name in os.listdir(self._blobs) if len(name) == 64}

    def usage(self) -> tuple[int, int]:
        """(bytes, inodes) used by committed blobs."""
        total = count = 0
        with os.scandir(self._blobs) as it:
            for entry in it:
                total += entry.stat(follow_symlinks=False).st_blocks * 512
                count += 1
        return total, count

    def cleanup(self) -> list[str]:
        """Drop leftovers of downloads a crash interrupted (start-up only)."""
        removed = []
        for name in os.listdir(self._ingest):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self._ingest, name))
            removed.append(name)
        return removed

    def _tmp_path(self, digest: str) -> str:
        return os.path.join(self._ingest, f"{digest.split(':', 1)[1]}.{secrets.token_hex(4)}")

    @overload
    async def ingest(
        self, digest: str, size: int, open_blob: BlobOpener, consume: None = None, *,
        progress_timeout: float = 0, executor: Executor | None = None,
    ) -> Ingested[None]: ...

    @overload
    async def ingest(
        self, digest: str, size: int, open_blob: BlobOpener, consume: Consumer[T], *,
        progress_timeout: float = 0, executor: Executor | None = None,
    ) -> Ingested[T]: ...

    async def ingest(
        self, digest: str, size: int, open_blob: BlobOpener,
        consume: Consumer[Any] | None = None, *, progress_timeout: float = 0,
        executor: Executor | None = None,
    ) -> Ingested[Any]:
        """Make sure blob ``digest`` of ``size`` bytes is present, downloading it if needed,
        and pass its bytes through ``consume`` (run in a thread of ``executor``).

        ``progress_timeout`` (seconds, 0 = none) cancels a download that receives no
        bytes for that long. A failed download, or one whose consumer raises, leaves
        nothing in the store.
        """
        validate_digest(digest)
        consume = consume or _drain
        while True:
            if self.exists(digest):
                result = await self._consume_present(digest, consume, executor)
                return Ingested(digest, size, downloaded=False, result=result)
            busy = self._inflight.get(digest)
            if busy is None:
                break
            # Someone else is fetching it: wait, then look again. If their download
            # failed we try with our own stream.
            await busy.wait()
        done = asyncio.Event()
        self._inflight[digest] = done
        try:
            result = await self._download(digest, size, open_blob, consume, progress_timeout,
                                          executor)
            return Ingested(digest, size, downloaded=True, result=result)
        finally:
            del self._inflight[digest]
            done.set()

    async def _consume_present(self, digest: str, consume: Consumer[T],
                               executor: Executor | None) -> T:
        stop = threading.Event()

        def run() -> T:
            with open(self.path(digest), "rb") as f:
                return consume(_Stoppable(f, stop))

        return await run_settled(executor, run, on_cancel=stop.set)

    async def _download(
        self, digest: str, size: int, open_blob: BlobOpener, consume: Consumer[T],
        progress_timeout: float, executor: Executor | None,
    ) -> T:
        loop = asyncio.get_running_loop()
        pipe = ChunkPipe(loop)
        worker = loop.run_in_executor(executor, self._receive, pipe, digest, size, consume)
        feed = asyncio.ensure_future(self._feed(pipe, digest, open_blob, progress_timeout))
        try:
            # The first to end: the feed (the whole stream is in, or the download failed,
            # which is raised here; the worker stops at its next read), or the worker (the
            # consumer refused the blob: the feed is cancelled and waited for).
            await race(feed, asyncio.shield(worker))
            return await asyncio.shield(worker)
        except BaseException as e:
            # Cancelled, or failed: the worker must stop touching files before this
            # returns, since the caller's cleanup removes what it wrote to.
            pipe.fail(e)
            feed.cancel()
            await settle(feed, worker)
            raise

    async def _feed(self, pipe: ChunkPipe, digest: str, open_blob: BlobOpener,
                    progress_timeout: float) -> None:
        """Move the blob's chunks into ``pipe``; the only part of a download on the loop."""
        loop = asyncio.get_running_loop()

        def due() -> float | None:
            return loop.time() + progress_timeout if progress_timeout > 0 else None

        try:
            try:
                # One deadline, moved along: wait_for per chunk would cost a task each.
                async with asyncio.timeout(due()) as deadline, open_blob() as chunks:
                    async for chunk in chunks:
                        deadline.reschedule(None)  # a busy worker is not a stalled registry
                        if not await pipe.put(chunk):
                            return  # the worker stopped: its error is the one to report
                        deadline.reschedule(due())
            except TimeoutError:
                raise DeadlineExceeded(
                    f"blob {digest}: no data received for {progress_timeout:g}s") from None
            pipe.close()
        except BaseException as e:
            pipe.fail(e)
            raise

    def _receive(self, pipe: ChunkPipe, digest: str, size: int, consume: Consumer[T]) -> T:
        """The worker thread of a download: hash and write what arrives, feed ``consume``,
        and commit the blob once it is whole and verified."""
        tmp = self._tmp_path(digest)
        try:
            with open(tmp, "xb") as f:
                src = _Receiving(pipe, f, digest, size)
                result = consume(src)
                src.finish()
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, self.path(digest))
            return result
        finally:
            pipe.stop()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def _drain(src: BlobReader) -> None:
    while src.read(1 << 20):
        pass


class _Receiving:
    """A blob as it arrives through a pipe: every chunk is counted, hashed and written to
    the ingest file as it is received; reads hand the same bytes to the consumer."""

    def __init__(self, pipe: ChunkPipe, out: IO[bytes], digest: str, size: int) -> None:
        self._pipe, self._out = pipe, out
        self._digest, self._size = digest, size
        self._hash = hashlib.sha256()
        self._got = 0
        self._flushed = 0
        self._chunk = b""
        self._pos = 0
        self._eof = False

    def _fill(self) -> bool:
        """Receive the next chunk; False at the end of the blob."""
        if self._eof:
            return False
        chunk = self._pipe.read()
        if not chunk:
            self._eof = True
            return False
        self._got += len(chunk)
        if self._got > self._size:
            raise DataLoss(f"blob {self._digest}: registry sent more than the {self._size} "
                           "bytes the manifest declares")
        self._hash.update(chunk)
        self._out.write(chunk)
        if self._got - self._flushed >= _WRITEBACK:
            # Start writing the blob out now (and drop what is written from the page
            # cache), so the fsync before the commit waits for little.
            self._out.flush()
            os.posix_fadvise(self._out.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            self._flushed = self._got
        self._chunk, self._pos = chunk, 0
        return True

    def read(self, n: int = -1, /) -> bytes:
        if n < 0:
            parts = [self._chunk[self._pos:]]
            while self._fill():
                parts.append(self._chunk)
            self._chunk, self._pos = b"", 0
            return b"".join(parts)
        if self._pos >= len(self._chunk) and not self._fill():
            return b""
        if self._pos == 0 and n >= len(self._chunk):
            out, self._chunk = self._chunk, b""  # the whole chunk: no copy
            return out
        out = self._chunk[self._pos:self._pos + n]
        self._pos += len(out)
        return out

    def readinto(self, buffer: Any, /) -> int:
        if self._pos >= len(self._chunk) and not self._fill():
            return 0
        view = memoryview(buffer).cast("B")
        n = min(len(view), len(self._chunk) - self._pos)
        view[:n] = memoryview(self._chunk)[self._pos:self._pos + n]
        self._pos += n
        return n

    def peek(self, n: int = 0, /) -> bytes:
        """At least ``n`` bytes ahead (fewer only at the end), not consumed."""
        while len(self._chunk) - self._pos < max(n, 1):
            rest = self._chunk[self._pos:]
            if not self._fill():
                self._chunk, self._pos = rest, 0
                break
            self._chunk, self._pos = rest + self._chunk, 0
        return self._chunk[self._pos:]

    def finish(self) -> None:
        """Receive the rest (what the consumer did not need), then verify size and digest."""
        self._chunk, self._pos = b"", 0
        while self._fill():
            pass
        if self._got != self._size:
            raise DataLoss(f"blob {self._digest}: got {self._got} of {self._size} bytes")
        got = "sha256:" + self._hash.hexdigest()
        if got != self._digest:
            raise DataLoss(f"blob {self._digest}: digest mismatch (content hashes to {got})")


class _Stoppable:
    """A committed blob file whose reads fail once ``stop`` is set."""

    def __init__(self, f: IO[bytes], stop: threading.Event) -> None:
        self._f, self._stop = f, stop

    def _check(self) -> None:
        if self._stop.is_set():
            raise _Stopped("stopped")

    def read(self, n: int = -1, /) -> bytes:
        self._check()
        return self._f.read(n)

    def readinto(self, buffer: Any, /) -> int:
        self._check()
        return self._f.readinto(buffer)  # type: ignore[attr-defined, no-any-return]

    def peek(self, n: int = 0, /) -> bytes:
        self._check()
        return self._f.peek(n)  # type: ignore[attr-defined, no-any-return]
