"""The contract between the streaming server (an edge) and what serves its sessions.

A process's stdio reaches the runtime as byte sources and sinks (the kubelet's
``Executor``/``PortForwarder`` shape), so the runtime knows nothing of SPDY or
WebSocket, exec, attach and port-forward are written once for both transports, and
a second runtime implements the three methods of :class:`StreamRuntime`. Both sides
import this module; it imports nothing of pycrid.
"""

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



@dataclass(frozen=True)
class ExecRequest:
    container_id: str
    cmd: tuple[str, ...]
    tty: bool
    stdin: bool
    stdout: bool
    stderr: bool


@dataclass(frozen=True)
class AttachRequest:
    container_id: str
    tty: bool
    stdin: bool
    stdout: bool
    stderr: bool


@dataclass(frozen=True)
class PortForwardRequest:
    sandbox_id: str
    #: The ports the CRI request named; a WebSocket client names its own in the URL.
    ports: tuple[int, ...]


StreamRequest = ExecRequest | AttachRequest | PortForwardRequest


class StreamError(Exception):
    """A failure the client learns on its error stream (the session ends, the daemon
    goes on)."""


class StreamRuntime(Protocol):
    async def exec(self, request: ExecRequest, io: ProcessIO) -> int:
        """Run the command in the container until it exits; its exit code."""

    async def attach(self, request: AttachRequest, io: ProcessIO) -> None:
        """Join the container's main process stdio until the client or the process ends."""

    async def port_forward(self, sandbox_id: str, port: int, stream: ByteStream) -> None:
        """Copy ``stream`` to and from ``port`` inside the pod's network namespace."""
