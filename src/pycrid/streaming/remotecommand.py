"""Exec and attach, once for both transports (kubelet's remotecommand server).

The transport hands over the streams the client opened (SPDY: one stream per
``streamType`` header; WebSocket: fixed channels); this module runs the
process with them and reports how it ended on the error stream: from
protocol v4 on a Kubernetes ``Status`` with the exit code, before it the bare
message of a failure.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pycrid.stdio import (
    AttachRequest,
    ByteSink,
    ByteSource,
    ExecRequest,
    ProcessIO,
    StreamError,
    StreamRuntime,
    TerminalSize,
)
from pycrid.streaming.side_streams import (
    ResizeDecoder,
    encode_status_for_version,
    exit_code_status,
    internal_error_status,
    success_status,
)

log = logging.getLogger(__name__)

#: How long the client has to open its streams (kubelet's stream creation timeout).
STREAM_CREATION_TIMEOUT = 30.0

#: SPDY ``X-Stream-Protocol-Version`` values, best first, and their version numbers.
SPDY_PROTOCOLS = {"v4.channel.k8s.io": 4, "v3.channel.k8s.io": 3, "v2.channel.k8s.io": 2,
                  "channel.k8s.io": 1}


@dataclass
class CommandStreams:
    version: int
    error: ByteSink
    stdin: ByteSource | None = None
    stdout: ByteSink | None = None
    stderr: ByteSink | None = None
    #: The raw JSON resize messages (TTY sessions from protocol v3 on).
    resize: ByteSource | None = None


def expected_streams(request: ExecRequest | AttachRequest, version: int) -> set[str]:
    """The ``streamType`` of every stream the client must open before the command runs."""
    kinds = {"error"}
    kinds |= {k for k, on in (("stdin", request.stdin), ("stdout", request.stdout),
                              ("stderr", request.stderr)) if on}
    if request.tty and version >= 3:
        kinds.add("resize")
    return kinds


async def sizes(source: ByteSource) -> AsyncIterator[TerminalSize]:
    decoder = ResizeDecoder()
    while data := await source.read():
        try:
            for size in decoder.feed(data):
                yield size
        except ValueError as e:
            log.info("ignoring the rest of a bad resize stream: %s", e)
            return


async def run_command(runtime: StreamRuntime, request: ExecRequest | AttachRequest,
                      streams: CommandStreams) -> None:
    """Run the exec or attach to its end, then close the output streams and write the
    status; the caller closes the connection."""
    io = ProcessIO(tty=request.tty, stdin=streams.stdin, stdout=streams.stdout,
                   stderr=streams.stderr,
                   resize=sizes(streams.resize) if streams.resize is not None else None)
    code: int | None = 0
    failure = ""
    try:
        if isinstance(request, ExecRequest):
            code = await runtime.exec(request, io)
        else:
            await runtime.attach(request, io)
    except StreamError as e:
        code, failure = None, str(e)
    for sink in (streams.stdout, streams.stderr):
        if sink is not None:
            with contextlib.suppress(ConnectionError, OSError):
                await sink.close()
    if code is None:
        status = internal_error_status(failure)
    elif code == 0:
        status = success_status()
    else:
        status = exit_code_status(code, request.cmd if isinstance(request, ExecRequest)
                                  else None)
    status = encode_status_for_version(streams.version, status)
    with contextlib.suppress(ConnectionError, OSError):
        if status:
            await streams.error.write(status)
        await streams.error.close()

