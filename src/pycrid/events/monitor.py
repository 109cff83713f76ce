"""The exit monitor: every exit handled once, in order, and never dropped.

Exits come from the one exit-file watcher and from start-up recovery (exits
that happened while the daemon was down are handed in as if they had just
happened). One task owned by the monitor handles them one at a time, each
within a deadline, as containerd's event monitor does; an exit whose handler
fails or times out goes to its object's backoff queue (``backoff.py``) and is
retried, 1 s doubling up to 5 minutes, until it succeeds or the object is
removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from pycrid.events.backoff import Backoff
from pycrid.runtime.exits import Exit
from pycrid.tasks import Owner

log = logging.getLogger(__name__)

#: containerd's handleEventTimeout: one handler may not hold up the others longer.
HANDLER_TIMEOUT = 10.0

Handler = Callable[[Exit], Awaitable[None]]


class ExitMonitor:
    def __init__(self, handler: Handler, *, timeout: float = HANDLER_TIMEOUT,
                 backoff: Backoff[str, Exit] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 owner: Owner | None = None) -> None:
        self._handler = handler
        self._timeout = timeout
        self.backoff: Backoff[str, Exit] = Backoff() if backoff is None else backoff
        self._clock = clock
        self._queue: asyncio.Queue[Exit] = asyncio.Queue()
        #: Owns the one handling task (made here unless the caller gives one).
        self._owner = owner if owner is not None else Owner("exit monitor")
        self._task: asyncio.Task[None] | None = None
        #: Exits handled successfully (for tests and the status page).
        self.handled = 0
        #: Handler failures so far (each one is retried).
        self.failures = 0

    def submit(self, exit_: Exit) -> None:
        """Queue an exit; handled once ``start`` has been called."""
        self._queue.put_nowait(exit_)

    def start(self) -> None:
        if self._task is None:
            self._task = self._owner.spawn(self._run(), "handle exits")

    async def aclose(self) -> None:
        await self._owner.aclose()

    async def idle(self) -> None:
        """Until every submitted exit has been handled once (retries may still be pending)."""
        await self._queue.join()

    async def _run(self) -> None:
        while True:
            due_at = self.backoff.next_due()
            wait = None if due_at is None else max(0.0, due_at - self._clock())
            exit_: Exit | None = None
            # asyncio.timeout, not wait_for: Python 3.11's wait_for drops a cancellation
            # that lands as the item arrives, and this loop would then outlive its owner's
            # close (the daemon hung at its stop when an exit came in just then).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    exit_ = await self._queue.get()
            if exit_ is not None:
                try:
                    if exit_.id in self.backoff:
                        self.backoff.add(exit_.id, exit_, self._clock())  # keep its order
                    elif not await self._handle(exit_):
                        self.backoff.add(exit_.id, exit_, self._clock())
                finally:
                    self._queue.task_done()
            for key in self.backoff.due(self._clock()):
                events, delay = self.backoff.take(key)
                for i, event in enumerate(events):
                    if not await self._handle(event):
                        self.backoff.retry(key, events[i:], delay, self._clock())
                        break

    async def _handle(self, exit_: Exit) -> bool:
        try:
            async with asyncio.timeout(self._timeout):  # (not wait_for: see _run)
                await self._handler(exit_)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.failures += 1
            log.error("handling the exit of %s (code %d) failed, will retry: %s",
                      exit_.id, exit_.code, e or type(e).__name__)
            return False
        self.handled += 1
        return True
