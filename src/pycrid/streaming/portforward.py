"""Port-forward sessions (kubelet's portforward server), for both transports.

SPDY (``portforward.k8s.io``): for every forwarded connection the client opens
an error stream and a data stream with the same ``port`` and ``requestID``
headers; once both are there the data stream is copied to the port inside the
pod, and a failure is written on the error stream. WebSocket: the URL names
the ports (``?port=80&port=443``); port *i* gets data channel 2i and error
channel 2i+1, each first carrying the port number, and one connection each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from pycrid.stdio import StreamError, StreamRuntime
from pycrid.streaming.channels import port_prefix
from pycrid.streaming.spdy_session import SpdySession, SpdyStream
from pycrid.streaming.ws_session import WebSocketSession

log = logging.getLogger(__name__)

#: How long the second stream of a pair may take to arrive.
PAIR_TIMEOUT = 30.0


@dataclass
class _Pair:
    data: SpdyStream | None = None
    error: SpdyStream | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)


def _request_id(stream: SpdyStream) -> str:
    """``requestID``, or for old clients without one the id the kubelet derives: the
    error stream's own id, which is the data stream's id minus 2."""
    if rid := stream.headers.get("requestid"):
        return rid
    kind = stream.headers.get("streamtype")
    return str(stream.id - 2 if kind == "data" else stream.id)


async def _fail(stream: SpdyStream, message: str) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        await stream.write(message.encode())
        await stream.close()


async def serve_spdy(runtime: StreamRuntime, sandbox_id: str, session: SpdySession) -> None:
    """Forward every stream pair the client opens until it closes the connection."""
    pairs: dict[str, _Pair] = {}
    async with asyncio.TaskGroup() as tg:
        while (stream := await session.accept()) is not None:
            kind = stream.headers.get("streamtype", "")
            port_text = stream.headers.get("port", "")
            if kind not in ("data", "error") or not port_text.isdigit():
                await _fail(stream, f"invalid stream: streamType {kind!r}, port "
                                    f"{port_text!r} (want data or error and a port)")
                continue
            rid = _request_id(stream)
            pair = pairs.get(rid)
            if pair is None:
                pair = pairs[rid] = _Pair()
                tg.create_task(_expire(pairs, rid, pair))
            if getattr(pair, kind) is not None:
                await _fail(stream, f"request {rid} already has a {kind} stream")
                continue
            setattr(pair, kind, stream)
            if pair.data is not None and pair.error is not None:
                pair.done.set()
                del pairs[rid]
                tg.create_task(_forward(runtime, sandbox_id, int(port_text), pair))
        for pair in pairs.values():
            pair.done.set()  # the connection is gone: no pair can complete any more


async def _expire(pairs: dict[str, _Pair], rid: str, pair: _Pair) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(pair.done.wait(), PAIR_TIMEOUT)
        return
    pairs.pop(rid, None)
    for stream in (pair.data, pair.error):
        if stream is not None:
            await _fail(stream, f"timed out waiting for the other stream of request {rid}")


async def _forward(runtime: StreamRuntime, sandbox_id: str, port: int, pair: _Pair) -> None:
    assert pair.data is not None and pair.error is not None
    try:
        await runtime.port_forward(sandbox_id, port, pair.data)
    except StreamError as e:
        await _fail(pair.error, f"error forwarding port {port} to pod {sandbox_id}: {e}")
    finally:
        with contextlib.suppress(ConnectionError, OSError):
            await pair.data.close()
            await pair.error.close()


async def serve_websocket(runtime: StreamRuntime, sandbox_id: str, ports: list[int],
                          session: WebSocketSession) -> None:
    """One connection per port named in the URL; the session ends when all have."""
    for i, port in enumerate(ports):
        for channel in (2 * i, 2 * i + 1):
            await session.channel(channel).write(port_prefix(port))

    async def one(i: int, port: int) -> None:
        data, error = session.channel(2 * i), session.channel(2 * i + 1)
        try:
            await runtime.port_forward(sandbox_id, port, data)
        except StreamError as e:
            with contextlib.suppress(ConnectionError, OSError):
                await error.write(f"error forwarding port {port} to pod {sandbox_id}: "
                                  f"{e}".encode())

    async with asyncio.TaskGroup() as tg:
        for i, port in enumerate(ports):
            tg.create_task(one(i, port))
