"""Per-object retry queues for event handlers that failed (containerd's event backoff).

An exit whose handling failed (the record could not be written, a plugin call
broke) is never dropped: it waits in its object's queue and is retried after
1 s, then 2 s, 4 s ... up to 5 minutes between tries. While an object is
backing off, its newer events queue behind the failed one, so one object's
events are still handled in order; other objects are not held up. Pure: the
caller passes the clock in.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
E = TypeVar("E")

#: containerd's backOffInitDuration and backOffMaxDuration.
INITIAL = 1.0
MAXIMUM = 300.0


@dataclass
class _Queue(Generic[E]):
    events: list[E]
    delay: float
    due: float = field(default=0.0)


class Backoff(Generic[K, E]):
    def __init__(self, initial: float = INITIAL, maximum: float = MAXIMUM) -> None:
        self.initial = initial
        self.maximum = maximum
        self._queues: dict[K, _Queue[E]] = {}

    def __len__(self) -> int:
        return len(self._queues)

    def __contains__(self, key: object) -> bool:
        return key in self._queues

    def add(self, key: K, event: E, now: float) -> None:
        """Queue ``event`` for ``key``: behind the queue if it backs off already, else as
        the first event of a new queue due after the initial delay."""
        queue = self._queues.get(key)
        if queue is not None:
            queue.events.append(event)
        else:
            self._queues[key] = _Queue([event], self.initial, now + self.initial)

    def due(self, now: float) -> list[K]:
        """Keys whose delay has passed, oldest deadline first."""
        ready = [(q.due, k) for k, q in self._queues.items() if q.due <= now]
        return [k for _, k in sorted(ready, key=lambda item: item[0])]

    def take(self, key: K) -> tuple[list[E], float]:
        """Remove ``key``'s queue to retry it: its events in order and its last delay."""
        queue = self._queues.pop(key)
        return queue.events, queue.delay

    def retry(self, key: K, events: list[E], delay: float, now: float) -> None:
        """``events[0]`` failed again: back off twice as long (up to the maximum). Events
        added for ``key`` since ``take`` go behind them."""
        longer = min(2 * delay, self.maximum)
        newer = self._queues.pop(key, None)
        merged = list(events) + (newer.events if newer is not None else [])
        self._queues[key] = _Queue(merged, longer, now + longer)

    def next_due(self) -> float | None:
        """The earliest deadline, or None when nothing backs off."""
        return min((q.due for q in self._queues.values()), default=None)

    def drop(self, key: K) -> None:
        """The object is gone: its pending events with it."""
        self._queues.pop(key, None)
