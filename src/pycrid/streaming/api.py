"""What the streaming server serves and what it needs from the runtime.

The servers speak SPDY or WebSocket to the client; the runtime behind them
sees only byte sources and sinks (kubelet's ``Executor``/``PortForwarder``
shape), so exec, attach and port-forward are written once for both
transports, and a second runtime implements three methods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pycrid.runtime.stdio import ByteSink, ByteSource, ByteStream, ProcessIO, TerminalSize

__all__ = ["AttachRequest", "ByteSink", "ByteSource", "ByteStream", "ExecRequest",
           "PortForwardRequest", "ProcessIO", "StreamError", "StreamRequest", "StreamRuntime",
           "TerminalSize"]


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
