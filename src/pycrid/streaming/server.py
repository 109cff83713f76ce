"""The streaming server: the HTTP endpoint behind the URLs Exec, Attach and
PortForward return (containerd's and the kubelet's ``cri-streaming`` server).

``/{exec,attach,portforward}/<token>`` accepts GET and POST. The token is the
only credential: single use, valid for a minute (:mod:`tokens`); a bad,
reused or expired one answers 404 and nothing else. A request then upgrades
to SPDY/3.1 (``X-Stream-Protocol-Version`` negotiation) or to WebSocket
(``Sec-WebSocket-Protocol``), chosen by its ``Upgrade`` header. HTTP parsing
is h11's and WebSocket framing wsproto's, both sans-IO like our SPDY and
channel codecs; this module is the thin asyncio shell that routes between
them. Every connection is a task the server owns: closing the server ends
every session and so every exec process and forwarded connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import ssl
from collections.abc import Coroutine, Sequence
from typing import Any
from urllib.parse import parse_qs

import h11
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, RejectConnection, RejectData
from wsproto.events import Request as WSRequest

from pycrid.errors import ResourceExhausted
from pycrid.stdio import (
    AttachRequest,
    ExecRequest,
    PortForwardRequest,
    StreamRequest,
    StreamRuntime,
)
from pycrid.streaming import channels, portforward, remotecommand
from pycrid.streaming.remotecommand import SPDY_PROTOCOLS, CommandStreams
from pycrid.streaming.spdy_session import SpdySession, SpdyStream
from pycrid.streaming.tokens import TokenCache, TooManyRequests
from pycrid.streaming.transport import Transport
from pycrid.streaming.websocket import GOING_AWAY, WebSocketEnd
from pycrid.streaming.ws_session import WebSocketChannel, WebSocketSession, WebSocketTunnel
from pycrid.tasks import Owner, race

log = logging.getLogger(__name__)

#: How long a client may take to send its HTTP request line and headers.
REQUEST_TIMEOUT = 30.0
#: How long closing the server waits for its sessions to end (the rest end in the
#: background).
SESSIONS_CLOSE_WITHIN = 10.0
_KINDS: dict[str, type[StreamRequest]] = {
    "exec": ExecRequest, "attach": AttachRequest, "portforward": PortForwardRequest}
_PATHS = {kind: path for path, kind in _KINDS.items()}


class HTTPError(Exception):
    def __init__(self, status: int, message: str,
                 headers: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.headers = list(headers)


class StreamServer:
    def __init__(self, *, runtime: StreamRuntime, address: str = "127.0.0.1", port: int = 0,
                 idle_timeout: float = 4 * 3600, tls: ssl.SSLContext | None = None,
                 tokens: TokenCache[StreamRequest] | None = None,
                 parent: Owner | None = None) -> None:
        self.runtime = runtime
        self.address = address
        self.port = port
        self.idle_timeout = idle_timeout
        self.tls = tls
        self.tokens: TokenCache[StreamRequest] = tokens if tokens is not None else TokenCache()
        self._server: asyncio.Server | None = None
        #: One task per client connection. A close waits at most SESSIONS_CLOSE_WITHIN
        #: for them: a session stuck in its cleanup must not hold up the daemon's stop.
        self._connections = (
            parent.child("streaming server", SESSIONS_CLOSE_WITHIN) if parent is not None
            else Owner("streaming server", SESSIONS_CLOSE_WITHIN))
        self.base_url = ""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connection, self.address, self.port,
                                                  ssl=self.tls)
        port = self._server.sockets[0].getsockname()[1]
        host = self.address
        with contextlib.suppress(ValueError):
            if ipaddress.ip_address(host).version == 6:
                host = f"[{host}]"
        self.base_url = f"{'https' if self.tls else 'http'}://{host}:{port}"
        log.info("streaming server listening on %s", self.base_url)

    def url(self, request: StreamRequest) -> str:
        """A fresh single-use URL for ``request`` (what Exec/Attach/PortForward return)."""
        try:
            token = self.tokens.insert(request)
        except TooManyRequests as e:
            raise ResourceExhausted(str(e)) from None
        return f"{self.base_url}/{_PATHS[type(request)]}/{token}"

    async def aclose(self) -> None:
        """Stop listening and end every session (their processes and connections)."""
        if self._server is not None:
            self._server.close()
        await self._connections.aclose()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    @property
    def sessions(self) -> int:
        return len(self._connections)

    # ---- one connection ----------------------------------------------------------------

    def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._connections.closed:  # accepted while the server was closing
            writer.close()
            return
        peer = writer.get_extra_info("peername")
        self._connections.spawn(self._session(Transport(reader, writer, self.idle_timeout)),
                                f"connection from {peer}")

    async def _session(self, transport: Transport) -> None:
        try:
            await self._serve(transport)
        except asyncio.CancelledError:
            pass  # the server is closing; ending the session frees what it held
        except Exception:
            log.exception("streaming session failed")
        finally:
            await transport.aclose()

    async def _serve(self, transport: Transport) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            request = await asyncio.wait_for(_read_request(conn, transport), REQUEST_TIMEOUT)
        except (TimeoutError, h11.RemoteProtocolError):
            return
        if request is None:
            return
        try:
            await self._route(conn, transport, request)
        except HTTPError as e:
            await _respond(conn, transport, e.status, str(e), e.headers)

    async def _route(self, conn: h11.Connection, transport: Transport,
                     request: h11.Request) -> None:
        target = request.target.decode("latin-1")
        path, _, query = target.partition("?")
        parts = path.strip("/").split("/")
        kind = _KINDS.get(parts[0]) if len(parts) == 2 else None
        if kind is None:
            raise HTTPError(404, "not found")
        if request.method not in (b"GET", b"POST"):
            raise HTTPError(405, "method not allowed", [("allow", "GET, POST")])
        stream_request = self.tokens.consume(parts[1])
        if not isinstance(stream_request, kind):
            raise HTTPError(404, "not found")
        headers = _headers(request)
        trailing = conn.trailing_data[0]
        upgrade = ",".join(headers.get("upgrade", [])).lower()
        if "websocket" in upgrade:
            await self._websocket(conn, transport, request, stream_request,
                                  parse_qs(query), trailing)
        elif "spdy/3.1" in upgrade and any("upgrade" in v.lower()
                                           for v in headers.get("connection", [])):
            await self._spdy(conn, transport, headers, stream_request, trailing)
        else:
            raise HTTPError(400, "unable to upgrade: missing upgrade headers in request "
                                 "(want Upgrade: SPDY/3.1 or websocket)")

    # ---- SPDY --------------------------------------------------------------------------

    async def _spdy(self, conn: h11.Connection, transport: Transport,
                    headers: dict[str, list[str]], request: StreamRequest,
                    trailing: bytes) -> None:
        supported = ([channels.PORT_FORWARD_SPDY_PROTOCOL]
                     if isinstance(request, PortForwardRequest) else list(SPDY_PROTOCOLS))
        offered = [p.strip() for v in headers.get("x-stream-protocol-version", [])
                   for p in v.split(",") if p.strip()]
        if not offered:
            raise HTTPError(400, "unable to upgrade: header X-Stream-Protocol-Version "
                                 "is missing or empty")
        chosen = next((p for p in offered if p in supported), None)
        if chosen is None:
            raise HTTPError(403, f"unable to upgrade: unable to negotiate protocol: client "
                                 f"supports {offered}, server accepts {supported}",
                            [("x-accepted-stream-protocol-versions", p) for p in supported])
        await transport.send(conn.send(h11.InformationalResponse(status_code=101, headers=[
            ("connection", "Upgrade"), ("upgrade", "SPDY/3.1"),
            ("x-stream-protocol-version", chosen)])) or b"")
        session = SpdySession(transport)

        async def serve() -> None:
            if isinstance(request, PortForwardRequest):
                await portforward.serve_spdy(self.runtime, request.sandbox_id, session)
            else:
                version = SPDY_PROTOCOLS[chosen]
                streams = await _spdy_streams(session, request, version)
                if streams is not None:
                    await remotecommand.run_command(self.runtime, request, streams)

        try:
            await _while_connected(serve(), session.run(trailing), transport)
        finally:
            await session.close()

    # ---- WebSocket ---------------------------------------------------------------------

    async def _websocket(self, conn: h11.Connection, transport: Transport,
                         request: h11.Request, stream_request: StreamRequest,
                         query: dict[str, list[str]], trailing: bytes) -> None:
        if isinstance(stream_request, PortForwardRequest):
            supported: Sequence[str] = (*channels.PORT_FORWARD_WS_PROTOCOLS,
                                        channels.PORT_FORWARD_TUNNEL_PROTOCOL)
        else:
            supported = channels.REMOTE_COMMAND_WS_PROTOCOLS
        ws = WSConnection(ConnectionType.SERVER)
        ws.initiate_upgrade_connection(list(request.headers), request.target)
        handshake = next((e for e in ws.events() if isinstance(e, WSRequest)), None)
        if handshake is None:
            raise HTTPError(400, "bad WebSocket handshake")
        chosen = channels.choose_subprotocol(handshake.subprotocols, supported)
        if chosen is None:
            message = (f"requested protocol(s) are not supported: {handshake.subprotocols}; "
                       f"supports {list(supported)}").encode()
            await transport.send(ws.send(RejectConnection(
                status_code=400, headers=[(b"content-type", b"text/plain"),
                                          (b"content-length", str(len(message)).encode())],
                has_body=True)) + ws.send(RejectData(data=message)))
            return
        if chosen == channels.PORT_FORWARD_TUNNEL_PROTOCOL:
            assert isinstance(stream_request, PortForwardRequest)
            await transport.send(ws.send(AcceptConnection(subprotocol=chosen)))
            await self._tunnel(transport, WebSocketEnd(ws), stream_request, trailing)
            return
        ports: list[int] = []
        if isinstance(stream_request, PortForwardRequest):
            try:
                ports = channels.parse_ports(query.get("port", []))
            except ValueError as e:
                raise HTTPError(400, str(e)) from None
        await transport.send(ws.send(AcceptConnection(subprotocol=chosen or None)))
        session = WebSocketSession(transport, WebSocketEnd(ws), channels.ChannelCodec(chosen))

        async def serve() -> None:
            if isinstance(stream_request, PortForwardRequest):
                await portforward.serve_websocket(self.runtime, stream_request.sandbox_id,
                                                  ports, session)
            else:
                streams = _websocket_streams(session, stream_request, session.codec.version)
                first = streams.stdout or streams.stderr or streams.error
                await first.write(b"")  # tells the client the session is ready
                await remotecommand.run_command(self.runtime, stream_request, streams)
            # Everything is sent: a Close frame ends every channel for the client, which
            # counts only that as a normal end (see streaming/websocket.py).
            await session.close()

        try:
            await _while_connected(serve(), session.run(trailing), transport)
        finally:
            # Still open here only when the session was cut short (the daemon stops, the
            # session failed): no status went out, and the code says so.
            await session.close(GOING_AWAY, "session ended early")

    async def _tunnel(self, transport: Transport, end: WebSocketEnd,
                      request: PortForwardRequest, trailing: bytes) -> None:
        """Port-forward as SPDY inside the WebSocket (client-go's WebSocket port-forward):
        the same session as a SPDY upgrade, reading and writing binary messages."""
        session = SpdySession(WebSocketTunnel(transport, end, trailing))
        try:
            await _while_connected(
                portforward.serve_spdy(self.runtime, request.sandbox_id, session),
                session.run(), transport)
        finally:
            await session.close()


async def _spdy_streams(session: SpdySession, request: ExecRequest | AttachRequest,
                        version: int) -> CommandStreams | None:
    """Wait for the client to open the streams the request needs (by ``streamType``)."""
    wanted = remotecommand.expected_streams(request, version)
    got: dict[str, SpdyStream] = {}

    async def collect() -> None:
        while wanted - set(got):
            stream = await session.accept()
            if stream is None:
                raise ConnectionResetError("connection closed before all streams were open")
            kind = stream.headers.get("streamtype", "")
            if kind not in wanted or kind in got:
                raise ConnectionResetError(f"unexpected stream type {kind!r}")
            got[kind] = stream

    try:
        await asyncio.wait_for(collect(), remotecommand.STREAM_CREATION_TIMEOUT)
    except (TimeoutError, ConnectionResetError) as e:
        log.info("exec/attach session closed: %s", e or "timed out waiting for streams")
        return None
    return CommandStreams(version=version, error=got["error"], stdin=got.get("stdin"),
                          stdout=got.get("stdout"), stderr=got.get("stderr"),
                          resize=got.get("resize"))


def _websocket_streams(session: WebSocketSession, request: ExecRequest | AttachRequest,
                       version: int) -> CommandStreams:
    def ch(number: int, wanted: bool) -> WebSocketChannel | None:
        return session.channel(number) if wanted else None

    return CommandStreams(
        version=version, error=session.channel(channels.ERROR),
        stdin=ch(channels.STDIN, request.stdin), stdout=ch(channels.STDOUT, request.stdout),
        stderr=ch(channels.STDERR, request.stderr), resize=ch(channels.RESIZE, request.tty))


async def _while_connected(serve: Coroutine[Any, Any, None],
                           read: Coroutine[Any, Any, None], transport: Transport) -> None:
    """Run the session (``serve``) while the connection lives: ``read`` reads it and
    ends when the client goes away or the idle timeout closes it; the session is then
    cancelled, which kills its exec or closes its forwarded connections. The idle watch
    runs alongside and is cancelled with the other two; the failures of all three are
    logged once they are all done, unless this itself is cancelled."""
    failures: list[Exception] = []

    async def recorded(coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except Exception as e:
            failures.append(e)

    async def alongside(coro: Coroutine[Any, Any, None]) -> None:
        await recorded(coro)
        await asyncio.Future()  # its end does not end the session: only serve or read do

    await race(recorded(serve), recorded(read), alongside(transport.watch_idle()))
    for failure in failures:
        log.error("streaming session failed: %r", failure, exc_info=failure)


async def _read_request(conn: h11.Connection, transport: Transport) -> h11.Request | None:
    request = None
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await transport.read()
            conn.receive_data(data)
            if not data and request is None:
                return None
            continue
        if isinstance(event, h11.Request):
            request = event
        elif event is h11.PAUSED or isinstance(event, h11.EndOfMessage):
            return request
        elif isinstance(event, h11.ConnectionClosed):
            return None


def _headers(request: h11.Request) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, value in request.headers:
        out.setdefault(name.decode("latin-1").lower(), []).append(value.decode("latin-1"))
    return out


async def _respond(conn: h11.Connection, transport: Transport, status: int, message: str,
                   headers: Sequence[tuple[str, str]] = ()) -> None:
    body = (message + "\n").encode()
    with contextlib.suppress(h11.LocalProtocolError, ConnectionError, OSError):
        out = conn.send(h11.Response(status_code=status, headers=[
            *headers, ("content-type", "text/plain; charset=utf-8"),
            ("content-length", str(len(body))), ("connection", "close")]))
        out = (out or b"") + (conn.send(h11.Data(data=body)) or b"")
        out += conn.send(h11.EndOfMessage()) or b""
        await transport.send(out)
