"""Streaming sessions by the container or pod they run in: removing the object ends
its sessions with an error instead of leaving the client hanging."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

from pycrid.stdio import StreamError

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
    task = asyncio.ensure_future(work)
    try:
        first: list[asyncio.Future[Any]] = [task, ended]
        await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if not task.cancelled():
        return task.result()
    raise StreamError(ended.result())
