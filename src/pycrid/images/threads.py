"""Work handed to threads without losing track of it.

``run_settled`` runs a function in a thread and, if its caller is cancelled, still waits
for the thread to end: a thread cannot be interrupted, and cleanup that ran while it was
still writing files would leave some behind.

``ChunkPipe`` carries bytes from the event loop to one worker thread, with a bound on
what waits in between. A blob arrives on the event loop (aiohttp) but is hashed,
written, decompressed and untarred in a thread, so the loop only moves chunks. The loop
side awaits while more than ``limit`` bytes are buffered (back-pressure reaches the
socket); the thread side blocks until a chunk, the end, or a failure arrives. Either
side can stop the other: ``fail`` makes the thread's next read raise, ``stop`` makes the
loop's next put return False, so neither is left waiting for a partner that is gone.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

T = TypeVar("T")


async def settle(*futures: asyncio.Future[Any]) -> None:
    """Wait until every future is done, through cancellations of the waiter (for cleanup
    paths, which re-raise what brought them there), and mark their errors as seen."""
    pending = set(futures)
    while pending:
        with contextlib.suppress(asyncio.CancelledError):
            _, pending = await asyncio.wait(pending)
    for f in futures:
        if not f.cancelled():
            f.exception()


async def run_settled(executor: Executor | None, fn: Callable[[], T],
                      on_cancel: Callable[[], None] | None = None) -> T:
    """``fn()`` in a thread of ``executor``; a cancelled caller calls ``on_cancel`` (which
    should make ``fn`` stop early) and waits for the thread to end."""
    fut = asyncio.get_running_loop().run_in_executor(executor, fn)
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        if on_cancel is not None:
            on_cancel()
        await settle(fut)
        raise


class PipeBroken(Exception):
    """The loop side failed (network error, timeout, cancellation) before the end."""


class ChunkPipe:
    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int = 4 << 20) -> None:
        self._loop = loop
        self._limit = limit
        self._cond = threading.Condition()
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._eof = False
        self._failed: BaseException | None = None
        self._stopped = False
        self._writer_waits = False
        self._space = asyncio.Event()

    # ---- the event loop's side ---------------------------------------------------------

    async def put(self, chunk: bytes) -> bool:
        """Hand ``chunk`` over, waiting for room; False when the reader has stopped."""
        while True:
            with self._cond:
                if self._stopped:
                    return False
                if self._buffered < self._limit:
                    self._chunks.append(chunk)
                    self._buffered += len(chunk)
                    self._cond.notify()
                    return True
                self._space.clear()
                self._writer_waits = True
            await self._space.wait()

    def close(self) -> None:
        """The end of the stream: the reader gets b"" once the buffer is empty."""
        with self._cond:
            self._eof = True
            self._cond.notify()

    def fail(self, why: BaseException) -> None:
        """Stop the reader at its next read, buffered chunks or not (after ``close`` too)."""
        with self._cond:
            if self._failed is None:
                self._failed = why
            self._eof = True
            self._cond.notify()

    # ---- the worker thread's side -------------------------------------------------------

    def read(self, turn: threading.Lock | None = None) -> bytes:
        """Everything buffered, as one piece (a reader that fell behind catches up in few
        large steps, each one hash update and one write); b"" at the end. Raises
        PipeBroken after ``fail``. ``turn``: a lock the reader holds and gives up while it
        waits for the writer (another reader may use the time)."""
        if turn is not None:
            with self._cond:
                if self._chunks or self._eof:
                    return self._take()
            turn.release()
            try:
                with self._cond:
                    return self._take()
            finally:
                turn.acquire()
        with self._cond:
            return self._take()

    def _take(self) -> bytes:
        """``read`` with the condition's lock held."""
        while not self._chunks and not self._eof:
            self._cond.wait()
        if self._failed is not None:
            raise PipeBroken(str(self._failed) or type(self._failed).__name__)
        chunks, self._chunks = self._chunks, collections.deque()
        self._buffered = 0
        if self._writer_waits:
            self._writer_waits = False
            self._loop.call_soon_threadsafe(self._space.set)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def stop(self) -> None:
        """The reader is done (finished or failed): wake and refuse the writer."""
        with self._cond:
            self._stopped = True
            self._chunks.clear()
            self._buffered = 0
            if self._writer_waits:
                self._writer_waits = False
                self._loop.call_soon_threadsafe(self._space.set)
