"""A process's stdio as the streaming server hands it to the runtime: byte sources
and sinks (kubelet's ``Executor`` takes the same shape), so the runtime knows
nothing of SPDY or WebSocket."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class TerminalSize:
    """A terminal size in character cells."""

    width: int
    height: int


class ByteSource(Protocol):
    async def read(self) -> bytes:
        """The next bytes from the client; ``b""`` once it has sent all it will."""


class ByteSink(Protocol):
    async def write(self, data: bytes) -> None: ...

    async def close(self) -> None:
        """No more bytes in this direction (the client sees the end of the stream)."""


class ByteStream(ByteSource, ByteSink, Protocol):
    """Both directions of one forwarded connection."""


@dataclass
class ProcessIO:
    """The client's side of a process's stdio; a stream it did not ask for is None."""

    tty: bool
    stdin: ByteSource | None
    stdout: ByteSink | None
    stderr: ByteSink | None
    resize: AsyncIterator[TerminalSize] | None
