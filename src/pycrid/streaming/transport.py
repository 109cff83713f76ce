"""One client connection: reads, writes with back-pressure, and the idle timeout."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from typing import Protocol


class Connection(Protocol):
    """What a session reads and writes: the client's TCP connection (:class:`Transport`),
    or a tunnel inside a WebSocket on it (``ws_session.WebSocketTunnel``)."""

    @property
    def closing(self) -> bool: ...

    async def read(self) -> bytes: ...

    def write(self, data: bytes) -> None: ...

    async def send(self, data: bytes) -> None: ...

    async def aclose(self) -> None: ...


class Transport:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 idle_timeout: float) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_timeout = idle_timeout
        self._last = time.monotonic()

    @property
    def closing(self) -> bool:
        return self.writer.is_closing()

    async def read(self) -> bytes:
        """The next bytes; ``b""`` at EOF or once the connection is closed."""
        try:
            data = await self.reader.read(65536)
        except (ConnectionError, OSError):
            return b""
        self._last = time.monotonic()
        return data

    def write(self, data: bytes) -> None:
        if data and not self.writer.is_closing():
            self.writer.write(data)
            self._last = time.monotonic()

    async def send(self, data: bytes) -> None:
        """Write and wait until the kernel takes it (a slow client slows the writer)."""
        if self.writer.is_closing():
            raise ConnectionResetError("connection closed")
        self.write(data)
        await self.writer.drain()

    async def watch_idle(self) -> None:
        """Close the connection once nothing moved for ``idle_timeout`` (0: never)."""
        if self.idle_timeout <= 0:
            return
        while not self.writer.is_closing():
            left = self._last + self.idle_timeout - time.monotonic()
            if left <= 0:
                self.writer.close()
                return
            await asyncio.sleep(left)

    async def aclose(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.writer.wait_closed(), 5)


#: A stream or channel holding this many unread bytes stops the connection's reader:
#: neither WebSocket nor the SPDY clients in use (spdystream ignores windows) would
#: otherwise slow a client that sends faster than the process reads.
BUFFER_LIMIT = 1 << 20


class Inbox:
    """The bytes received for one stream or channel, read in order; ``b""`` once ended."""

    def __init__(self) -> None:
        self._data: collections.deque[bytes] = collections.deque()
        self._arrived = asyncio.Event()
        self.ended = False
        self.buffered = 0

    @property
    def full(self) -> bool:
        return self.buffered > BUFFER_LIMIT

    def put(self, data: bytes) -> None:
        if data and not self.ended:
            self._data.append(data)
            self.buffered += len(data)
            self._arrived.set()

    def end(self) -> None:
        self.ended = True
        self._arrived.set()

    async def get(self) -> bytes:
        while not self._data:
            if self.ended:
                return b""
            self._arrived.clear()
            await self._arrived.wait()
        data = self._data.popleft()
        self.buffered -= len(data)
        return data
