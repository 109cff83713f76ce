"""Fan-out of CRI container events to every ``GetContainerEvents`` stream.

Publishing never waits: each subscriber has a bounded queue, and when a slow
subscriber's queue is full its oldest event is dropped (with a warning and a
count) so the runtime is never held up by a reader. containerd's event queue
instead blocks the publisher on a slow subscriber; the kubelet relists when
it misses events, so dropping is the safer failure. Like containerd, events
published while nobody listens are held for five minutes and handed to the
next subscriber (the kubelet reconnects after a runtime restart).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Events a subscriber may fall behind by before the oldest is dropped.
QUEUE_SIZE = 1000
#: How long events wait for a first subscriber (containerd: 5 minutes).
HOLD_FOR = 300.0


class Subscription(Generic[T]):
    """One stream's queue; ``get`` waits for the next event, None once closed."""

    def __init__(self, owner: Broadcast[T], size: int) -> None:
        self._owner = owner
        self._queue: collections.deque[T] = collections.deque()
        self._size = size
        self._wakeup = asyncio.Event()
        self.closed = False
        #: Events dropped because this subscriber fell behind.
        self.dropped = 0

    def _push(self, event: T) -> None:
        if len(self._queue) >= self._size:
            self._queue.popleft()
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 100 == 0:
                log.warning("container event subscriber too slow: %d events dropped so far",
                            self.dropped)
        self._queue.append(event)
        self._wakeup.set()

    async def get(self) -> T | None:
        while not self._queue:
            if self.closed:
                return None
            self._wakeup.clear()
            await self._wakeup.wait()
        return self._queue.popleft()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._wakeup.set()
            self._owner._unsubscribe(self)


class Broadcast(Generic[T]):
    def __init__(self, queue_size: int = QUEUE_SIZE, hold_for: float = HOLD_FOR,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.queue_size = queue_size
        self.hold_for = hold_for
        self._clock = clock
        self._subscribers: list[Subscription[T]] = []
        #: (published at, event) while nobody listens.
        self._held: collections.deque[tuple[float, T]] = collections.deque()
        #: Events discarded unseen (held too long, or more than a queue's worth).
        self.discarded = 0

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def publish(self, event: T) -> None:
        if self._subscribers:
            for sub in self._subscribers:
                sub._push(event)
            return
        now = self._clock()
        self._expire(now)
        if len(self._held) >= self.queue_size:
            self._held.popleft()
            self.discarded += 1
        self._held.append((now, event))

    def subscribe(self) -> Subscription[T]:
        sub = Subscription(self, self.queue_size)
        self._expire(self._clock())
        for _, event in self._held:
            sub._push(event)
        self._held.clear()
        self._subscribers.append(sub)
        return sub

    def close(self) -> None:
        """Shutdown: every stream ends."""
        for sub in list(self._subscribers):
            sub.close()

    def _expire(self, now: float) -> None:
        while self._held and now - self._held[0][0] > self.hold_for:
            self._held.popleft()
            self.discarded += 1

    def _unsubscribe(self, sub: Subscription[T]) -> None:
        if sub in self._subscribers:
            self._subscribers.remove(sub)
