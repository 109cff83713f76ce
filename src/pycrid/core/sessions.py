"""Streaming sessions by the container or pod they run in: removing the object ends
its sessions with an error instead of leaving the client hanging."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Iterator
from typing import NoReturn, TypeVar

from pycrid.stdio import StreamError
from pycrid.tasks import race

T = TypeVar("T")


class SessionEnds:
    def __init__(self) -> None:
        self._open: dict[str, set[asyncio.Future[str]]] = {}

    @contextlib.contextmanager
    def track(self, object_id: str) -> Iterator[asyncio.Future[str]]:
        """A future that gets the reason once ``end(object_id)`` is called."""
        ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._open.setdefault(object_id, set()).add(ended)
        try:
            yield ended
        finally:
            waiting = self._open.get(object_id)
            if waiting is not None:
                waiting.discard(ended)
                if not waiting:
                    del self._open[object_id]

    def end(self, object_id: str, why: str) -> None:
        for ended in self._open.pop(object_id, ()):
            if not ended.done():
                ended.set_result(why)


async def until_ended(work: Awaitable[T], ended: asyncio.Future[str]) -> T:
    """``work``'s result, unless ``ended`` comes first: then ``work`` is cancelled (which
    kills an exec) and the reason raised as a StreamError."""
    return await race(work, _raise_when(ended))


async def _raise_when(ended: asyncio.Future[str]) -> NoReturn:
    # Shielded: losing the race cancels this waiter, never the session's own future.
    raise StreamError(await asyncio.shield(ended))
