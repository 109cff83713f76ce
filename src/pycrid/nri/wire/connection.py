"""The asyncio shell around the ttrpc and multiplexer codecs.

A ``Connection`` owns one stream socket. It reads bytes, hands them to the
sans-IO codecs, runs one task per incoming call and writes whatever the codecs
produce. It carries either plain ttrpc (one role per socket, as containerd's
ttrpc clients and servers use it) or NRI's multiplexed pair: a ttrpc server on
one mux conn and a ttrpc client on the other.

Lifetime: the connection's ``Owner`` holds its reader task and, in a child, every
call task; ``aclose`` (or the peer going away, or a protocol error) stops all of them, fails every
pending call with ``ConnectionClosed`` and records a reason for the logs.
Nothing raised by a peer's bytes escapes into the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from pycrid.nri.wire import mux
from pycrid.nri.wire.ttrpc import (
    ClientProtocol,
    Code,
    ProtocolError,
    Rejected,
    RequestReceived,
    ResponseReceived,
    ServerProtocol,
    TtrpcError,
)
from pycrid.tasks import Owner

log = logging.getLogger(__name__)

Handler = Callable[[RequestReceived], Awaitable[bytes]]
"""Serves one call: gets the request, returns the encoded answer or raises
TtrpcError (any other exception answers Unknown with its text)."""

READ_SIZE = 256 * 1024


class ConnectionClosed(TtrpcError):
    """The connection ended before (or while) the call could complete."""

    def __init__(self, reason: str) -> None:
        super().__init__(Code.UNAVAILABLE, f"ttrpc: closed: {reason}")
        self.reason = reason


class Services:
    """The methods a server answers, by full service name and bare method name."""

    def __init__(self) -> None:
        self._methods: dict[str, dict[str, Handler]] = {}

    def add(self, service: str, method: str, handler: Handler) -> None:
        methods = self._methods.setdefault(service, {})
        if method in methods:
            raise ValueError(f"{service}/{method} registered twice")
        methods[method] = handler

    def lookup(self, service: str, method: str) -> Handler:
        """The handler, or TtrpcError(Unimplemented) worded as the Go server words it."""
        methods = self._methods.get(service)
        if methods is None:
            raise TtrpcError(Code.UNIMPLEMENTED, f"service {service}")
        handler = methods.get(method)
        if handler is None:
            raise TtrpcError(Code.UNIMPLEMENTED, f"method {method}")
        return handler


@dataclass(frozen=True)
class MuxRoles:
    """Which mux conn this side serves on and which it calls on."""

    serve: int
    call: int


PLUGIN_SIDE = MuxRoles(serve=mux.PLUGIN_SERVICE_CONN, call=mux.RUNTIME_SERVICE_CONN)
RUNTIME_SIDE = MuxRoles(serve=mux.RUNTIME_SERVICE_CONN, call=mux.PLUGIN_SERVICE_CONN)


class Connection:
    """ttrpc over one stream socket; see the module docstring.

    ``roles`` selects NRI's multiplexed mode. Without it the socket is plain
    ttrpc and serves if ``services`` is given, otherwise it only calls.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        services: Services | None = None,
        roles: MuxRoles | None = None,
        name: str = "ttrpc",
        strict: bool = False,
    ) -> None:
        self.name = name
        self._strict = strict
        self._reader = reader
        self._writer = writer
        self._services = services
        self._roles = roles
        self._client = ClientProtocol()
        self._server = ServerProtocol()
        self._demux = mux.Demultiplexer([roles.serve, roles.call]) if roles else None
        self._pending: dict[int, asyncio.Future[ResponseReceived]] = {}
        self._owner = Owner(name)
        self._calls = self._owner.child("calls")
        self._reading = False
        self._closed = asyncio.get_running_loop().create_future()

    # ------------------------------------------------------------ lifetime

    def start(self) -> None:
        if not self._reading:
            self._reading = True
            self._owner.spawn(self._read_loop(), "reader")

    @property
    def is_closed(self) -> bool:
        return self._closed.done()

    @property
    def close_reason(self) -> str | None:
        return self._closed.result() if self._closed.done() else None

    async def wait_closed(self) -> str:
        """Wait until the connection ends; returns why."""
        return await asyncio.shield(self._closed)

    async def aclose(self, reason: str = "closed locally") -> None:
        """Stop everything the connection owns and close the socket."""
        self._finish(reason)
        await self._owner.aclose()
        with contextlib.suppress(OSError, asyncio.CancelledError):
            await self._writer.wait_closed()

    def _finish(self, reason: str) -> None:
        if self._closed.done():
            return
        self._closed.set_result(reason)
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ConnectionClosed(reason))
        self._pending.clear()
        if not self._owner.closed:  # the calls in flight end with the connection
            self._owner.spawn(self._calls.aclose(), "call cancellation")
        with contextlib.suppress(OSError, RuntimeError):
            self._writer.close()

    # ------------------------------------------------------------ calling

    async def call(
        self, service: str, method: str, payload: bytes, *, timeout: float | None = None
    ) -> bytes:
        """One unary call; returns the answer's payload or raises TtrpcError.

        ``timeout`` (seconds) becomes the request's ``timeout_nano`` and bounds
        the wait here: expiry raises DeadlineExceeded, as a Go client's context does.
        """
        if self._closed.done():
            raise ConnectionClosed(self._closed.result())
        timeout_nano = int(timeout * 1e9) if timeout else 0
        stream_id, data = self._client.request(service, method, payload, timeout_nano=timeout_nano)
        fut: asyncio.Future[ResponseReceived] = asyncio.get_running_loop().create_future()
        self._pending[stream_id] = fut
        try:
            await self._send(self._roles.call if self._roles else 0, data)
            async with asyncio.timeout(timeout):
                resp = await fut
        except TimeoutError:
            raise TtrpcError(
                Code.DEADLINE_EXCEEDED, f"{method}: no answer within {timeout:g}s"
            ) from None
        finally:
            self._pending.pop(stream_id, None)
        if resp.code != Code.OK:
            raise TtrpcError(resp.code, resp.message)
        return resp.payload

    # ------------------------------------------------------------ serving

    def _own(self, coro: Coroutine[Any, Any, None], what: str) -> None:
        """Run ``coro`` as a call task (cancelled when the connection closes); a request
        read after the close is dropped."""
        if self._closed.done():
            coro.close()
            return
        self._calls.spawn(coro, what)

    async def _serve(self, ev: RequestReceived) -> None:
        assert self._services is not None
        code: int = Code.OK
        message, payload = "", b""
        timeout = ev.timeout_nano / 1e9 if ev.timeout_nano > 0 else None
        try:
            handler = self._services.lookup(ev.service, ev.method)
            deadline = asyncio.timeout(timeout)
            try:
                async with deadline:
                    payload = await handler(ev)
            except TimeoutError:
                if not deadline.expired():
                    raise
                code, message = Code.DEADLINE_EXCEEDED, "context deadline exceeded"
        except TtrpcError as exc:
            code, message = exc.code, exc.message
        except Exception as exc:
            log.warning("%s: %s/%s failed: %s", self.name, ev.service, ev.method, exc)
            code, message = Code.UNKNOWN, str(exc) or type(exc).__name__
        await self._answer(ev.stream_id, payload, code, message)

    async def _answer(self, stream_id: int, payload: bytes, code: int, message: str) -> None:
        try:
            data = self._server.respond(stream_id, payload, code, message)
        except (TypeError, ValueError) as exc:  # a handler that returned something odd
            log.warning("%s: cannot encode the answer on stream %d: %s", self.name, stream_id, exc)
            data = self._server.respond(stream_id, b"", Code.UNKNOWN, f"bad answer: {exc}")
        with contextlib.suppress(ConnectionClosed):
            await self._send(self._roles.serve if self._roles else 0, data)

    # ------------------------------------------------------------ bytes

    async def _send(self, conn_id: int, message: bytes) -> None:
        if self._closed.done():
            raise ConnectionClosed(self._closed.result())
        data = mux.encode(conn_id, message) if self._roles else message
        try:
            self._writer.write(data)
            await self._writer.drain()
        except (OSError, RuntimeError) as exc:
            self._finish(f"write failed: {exc}")
            raise ConnectionClosed(f"write failed: {exc}") from exc

    async def _read_loop(self) -> None:
        reason = "peer closed the connection"
        try:
            while True:
                data = await self._reader.read(READ_SIZE)
                if not data:
                    left = self._buffered()
                    if left:
                        reason = (
                            f"peer closed the connection in the middle of a message ({left} bytes)"
                        )
                    break
                self._receive(data)
        except (mux.MuxError, ProtocolError) as exc:
            reason = f"protocol error: {exc}"
        except OSError as exc:
            reason = f"read failed: {exc}"
        if reason != "peer closed the connection":
            log.warning("%s: closing: %s", self.name, reason)
        self._finish(reason)

    def _buffered(self) -> int:
        n = self._client.buffered + self._server.buffered
        return n + (self._demux.buffered if self._demux else 0)

    def _receive(self, data: bytes) -> None:
        if self._demux is None or self._roles is None:
            if self._services is not None:
                self._on_requests(data)
            else:
                self._on_responses(data)
            return
        for conn_id, payload in self._demux.frames(data):
            if conn_id == self._roles.serve:
                self._on_requests(payload)
            else:
                self._on_responses(payload)

    def _on_requests(self, data: bytes) -> None:
        for ev in self._server.receive_data(data):
            if isinstance(ev, Rejected):
                if self._strict:
                    raise ProtocolError(f"bad request: {ev.message}")
                log.warning("%s: rejected a request: %s", self.name, ev.message)
                self._own(self._answer(ev.stream_id, b"", ev.code, ev.message), "rejection")
            elif self._services is None:
                missing = f"service {ev.service}"
                self._own(self._answer(ev.stream_id, b"", Code.UNIMPLEMENTED, missing), "answer")
            else:
                self._own(self._serve(ev), ev.method)

    def _on_responses(self, data: bytes) -> None:
        for ev in self._client.receive_data(data):
            fut = self._pending.get(ev.stream_id)
            if fut is None:
                log.debug("%s: answer for unknown stream %d dropped", self.name, ev.stream_id)
            elif not fut.done():
                fut.set_result(ev)


async def connect(
    path: str | None = None,
    *,
    sock: socket.socket | None = None,
    services: Services | None = None,
    roles: MuxRoles | None = None,
    name: str = "ttrpc",
    strict: bool = False,
) -> Connection:
    """Dial a unix socket (or adopt a connected one) and start a Connection on it."""
    reader, writer = await asyncio.open_unix_connection(path, sock=sock, limit=READ_SIZE)
    conn = Connection(reader, writer, services=services, roles=roles, name=name, strict=strict)
    conn.start()
    return conn


class Server:
    """A plain ttrpc server on a unix socket; owns every connection it accepts."""

    def __init__(self, services: Services, *, name: str = "ttrpc-server") -> None:
        self._services = services
        self._name = name
        self._server: asyncio.Server | None = None
        self._conns: set[Connection] = set()

    async def listen(self, path: str) -> None:
        self._server = await asyncio.start_unix_server(self._accept, path, limit=READ_SIZE)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Connection(reader, writer, services=self._services, name=self._name)
        self._conns.add(conn)
        conn.start()
        try:
            await conn.wait_closed()
        finally:
            self._conns.discard(conn)

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns):
            await conn.aclose("server shutting down")
        if self._server is not None:
            await self._server.wait_closed()
