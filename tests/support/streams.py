"""Test clients for the streaming server: SPDY (our codec in client mode, speaking as
client-go does) and WebSocket (aiohttp's client, an implementation independent of
the server's wsproto), with one interface for exec/attach sessions."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from pycrid.streaming import channels, spdy, spdy_events
from pycrid.streaming.side_streams import parse_exit_status


class HTTPStatusError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


def _insecure() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


@dataclass
class _Stream:
    data: asyncio.Queue[bytes] = field(default_factory=asyncio.Queue)
    replied: asyncio.Event = field(default_factory=asyncio.Event)
    ended: bool = False


class WebSocketPipe:
    """The reader and writer calls SpdyClient makes, carried in a WebSocket's binary
    messages: client-go's SPDY-over-WebSocket port-forward, on aiohttp's client."""

    def __init__(self, http: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.http, self.ws = http, ws
        self._out: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._sender = asyncio.create_task(self._send())
        #: The code of the server's Close frame, once the tunnel ended.
        self.close_code: int | None = None

    async def read(self, n: int = -1) -> bytes:
        msg = await self.ws.receive()
        if msg.type == aiohttp.WSMsgType.BINARY:
            assert isinstance(msg.data, bytes)
            return msg.data
        assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED,
                            aiohttp.WSMsgType.CLOSING), msg
        self.close_code = self.ws.close_code
        return b""

    def write(self, data: bytes) -> None:
        self._out.put_nowait(data)

    async def _send(self) -> None:
        while (data := await self._out.get()) is not None:
            with contextlib.suppress(ConnectionError):
                await self.ws.send_bytes(data)
            self._out.task_done()
        self._out.task_done()

    async def drain(self) -> None:
        await self._out.join()

    def close(self) -> None:
        self._out.put_nowait(None)

    async def wait_closed(self) -> None:
        await self._sender
        await self.ws.close()
        await self.http.close()


class SpdyClient:
    """A client-side SPDY/3.1 connection after the HTTP upgrade (or in a WebSocket)."""

    def __init__(self, reader: asyncio.StreamReader | WebSocketPipe,
                 writer: asyncio.StreamWriter | WebSocketPipe,
                 protocol: str, leftover: bytes) -> None:
        self.reader, self.writer, self.protocol = reader, writer, protocol
        self.codec = spdy.SpdyConnection(client=True)
        self.streams: dict[int, _Stream] = {}
        self.goaway = asyncio.Event()
        self.window = asyncio.Event()
        self._task = asyncio.create_task(self._run(leftover))

    @classmethod
    async def connect(cls, url: str, protocols: list[str], *,
                      method: str = "POST") -> SpdyClient:
        parts = urlsplit(url)
        tls = _insecure() if parts.scheme == "https" else None
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port, ssl=tls)
        lines = [f"{method} {parts.path}{'?' + parts.query if parts.query else ''} HTTP/1.1",
                 f"Host: {parts.netloc}", "Connection: Upgrade", "Upgrade: SPDY/3.1",
                 *(f"X-Stream-Protocol-Version: {p}" for p in protocols),
                 "Content-Length: 0", "", ""]
        writer.write("\r\n".join(lines).encode())
        head = await reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        status = int(status_line.split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in
                   (h.partition(":") for h in header_lines if h)}
        if status != 101:
            body = b""
            with contextlib.suppress(Exception):
                body = await asyncio.wait_for(reader.read(65536), 5)
            writer.close()
            raise HTTPStatusError(status, body.decode(errors="replace").strip())
        return cls(reader, writer, headers.get("x-stream-protocol-version", ""), b"")

    @classmethod
    async def connect_websocket(cls, url: str, protocols: list[str]) -> SpdyClient:
        """SPDY tunnelled in a WebSocket, offering ``SPDY/3.1+<protocol>`` as client-go's
        tunneling dialer does."""
        http = aiohttp.ClientSession()
        try:
            ws = await http.ws_connect(url.replace("http", "ws", 1),
                                       protocols=[f"SPDY/3.1+{p}" for p in protocols],
                                       ssl=_insecure() if url.startswith("https") else True)
        except aiohttp.WSServerHandshakeError as e:
            await http.close()
            raise HTTPStatusError(e.status, e.message) from None
        pipe = WebSocketPipe(http, ws)
        return cls(pipe, pipe, (ws.protocol or "").removeprefix("SPDY/3.1+"), b"")

    async def _run(self, data: bytes) -> None:
        try:
            while True:
                for event in self.codec.receive_data(data) if data else ():
                    s = self.streams.get(getattr(event, "stream_id", -1))
                    if isinstance(event, spdy_events.StreamReplied) and s:
                        s.replied.set()
                    elif isinstance(event, spdy_events.DataReceived) and s:
                        if event.data:
                            s.data.put_nowait(event.data)
                            self.codec.acknowledge(event.stream_id, len(event.data))
                        if event.fin:
                            self._end(s)
                    elif isinstance(event, spdy_events.StreamReset) and s:
                        self._end(s)
                    elif isinstance(event, spdy_events.GoAwayReceived):
                        self.goaway.set()
                    elif isinstance(event, spdy_events.WindowUpdated):
                        self.window.set()
                self._flush()
                data = await self.reader.read(65536)
                if not data:
                    break
        finally:
            for s in self.streams.values():
                self._end(s)
            self.goaway.set()

    @staticmethod
    def _end(s: _Stream) -> None:
        if not s.ended:
            s.ended = True
            s.replied.set()
            s.data.put_nowait(b"")

    def _flush(self) -> None:
        if out := self.codec.data_to_send():
            self.writer.write(out)

    async def open(self, headers: dict[str, str], *, fin: bool = False) -> int:
        sid = self.codec.open_stream(headers, fin=fin)
        self.streams[sid] = _Stream()
        self._flush()
        await asyncio.wait_for(self.streams[sid].replied.wait(), 10)
        return sid

    async def send(self, sid: int, data: bytes, *, fin: bool = False) -> None:
        """Send within the server's window (it does flow control; spdystream would not)."""
        while True:
            room = self.codec.send_window(sid)
            n = len(data) if room is None else min(room, len(data))
            if n or not data:
                last = n == len(data)
                self.codec.send_data(sid, data[:n], fin=fin and last)
                self._flush()
                await self.writer.drain()
                data = data[n:]
                if last:
                    return
            self.window.clear()
            await asyncio.wait_for(self.window.wait(), 10)

    async def read(self, sid: int) -> bytes:
        return await self.streams[sid].data.get()

    async def read_all(self, sid: int) -> bytes:
        out = bytearray()
        while chunk := await self.read(sid):
            out += chunk
        self.streams[sid].data.put_nowait(b"")
        return bytes(out)

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task


# ---- exec / attach sessions -------------------------------------------------------------


@dataclass
class CommandResult:
    stdout: bytes
    stderr: bytes
    #: The raw error stream (a JSON Status from v4 on).
    error: bytes

    @property
    def exit_code(self) -> int | None:
        """0 or the code of a NonZeroExitCode status; raises for other failures."""
        return parse_exit_status(self.error)


class CommandSession:
    """An exec or attach session, whichever the transport: write stdin, resize, read
    output as it comes, then wait for the end."""

    out: bytearray
    err: bytearray
    #: Set whenever output arrives (and at the end); whoever waits clears it first.
    arrived: asyncio.Event

    async def write_stdin(self, data: bytes) -> None:
        raise NotImplementedError

    async def close_stdin(self) -> None:
        raise NotImplementedError

    async def resize(self, width: int, height: int) -> None:
        raise NotImplementedError

    async def wait(self, limit: float = 30) -> CommandResult:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def wait_output(self, pred: Callable[[bytes], bool], limit: float = 15,
                          stream: str = "out") -> bytes:
        deadline = asyncio.get_running_loop().time() + limit
        while True:
            self.arrived.clear()
            buf = bytes(self.out if stream == "out" else self.err)
            if pred(buf):
                return buf
            remaining = deadline - asyncio.get_running_loop().time()
            try:
                await asyncio.wait_for(self.arrived.wait(), max(remaining, 0))
            except TimeoutError:
                raise TimeoutError(f"output never matched; got {buf!r}") from None


class SpdyCommand(CommandSession):
    def __init__(self, client: SpdyClient, ids: dict[str, int]) -> None:
        self.client, self.ids = client, ids
        self.out, self.err = bytearray(), bytearray()
        self.arrived = asyncio.Event()
        self._pumps = [asyncio.create_task(self._pump(k, buf)) for k, buf in
                       (("stdout", self.out), ("stderr", self.err)) if k in ids]
        self._error = asyncio.create_task(client.read_all(ids["error"]))

    @classmethod
    async def start(cls, url: str, *, stdin: bool, stdout: bool = True, stderr: bool = True,
                    tty: bool = False,
                    protocols: tuple[str, ...] = ("v4.channel.k8s.io", "v3.channel.k8s.io",
                                                  "v2.channel.k8s.io", "channel.k8s.io")
                    ) -> SpdyCommand:
        client = await SpdyClient.connect(url, list(protocols))
        ids = {"error": await client.open({"streamType": "error"}, fin=True)}
        for kind, on in (("stdin", stdin), ("stdout", stdout), ("stderr", stderr),
                         ("resize", tty and client.protocol != "v2.channel.k8s.io"
                          and client.protocol != "channel.k8s.io")):
            if on:
                ids[kind] = await client.open({"streamType": kind},
                                              fin=kind in ("stdout", "stderr"))
        return cls(client, ids)

    async def _pump(self, kind: str, buf: bytearray) -> None:
        while chunk := await self.client.read(self.ids[kind]):
            buf += chunk
            self.arrived.set()
        self.arrived.set()

    async def write_stdin(self, data: bytes) -> None:
        await self.client.send(self.ids["stdin"], data)

    async def close_stdin(self) -> None:
        await self.client.send(self.ids["stdin"], b"", fin=True)

    async def resize(self, width: int, height: int) -> None:
        await self.client.send(self.ids["resize"],
                               json.dumps({"Width": width, "Height": height}).encode() + b"\n")

    async def wait(self, limit: float = 30) -> CommandResult:
        await asyncio.wait_for(asyncio.gather(*self._pumps), limit)
        error = await asyncio.wait_for(self._error, limit)
        await self.client.close()
        return CommandResult(bytes(self.out), bytes(self.err), error)

    async def close(self) -> None:
        await self.client.close()
        for t in (*self._pumps, self._error):
            t.cancel()


class WebSocketCommand(CommandSession):
    def __init__(self, http: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse,
                 codec: channels.ChannelCodec) -> None:
        self.http, self.ws, self.codec = http, ws, codec
        self.out, self.err, self.error = bytearray(), bytearray(), bytearray()
        self.arrived = asyncio.Event()
        #: Channels the server sent v5's CLOSE for (the kubelet never does).
        self.closed_channels: set[int] = set()
        #: The code of the server's Close frame, once the session ended.
        self.close_code: int | None = None
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, url: str, *, protocols: tuple[str, ...] = ("v5.channel.k8s.io",),
                    **_: Any) -> WebSocketCommand:
        http = aiohttp.ClientSession()
        try:
            ws = await http.ws_connect(url.replace("http", "ws", 1), protocols=protocols,
                                       ssl=_insecure() if url.startswith("https") else True)
        except aiohttp.WSServerHandshakeError as e:
            await http.close()
            raise HTTPStatusError(e.status, e.message) from None
        return cls(http, ws, channels.ChannelCodec(ws.protocol or ""))

    async def _read(self) -> None:
        async for msg in self.ws:
            if msg.type not in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT):
                break
            decoded = self.codec.decode(msg.data)
            if isinstance(decoded, channels.ChannelClose):
                self.closed_channels.add(decoded.channel)
                continue
            target = {channels.STDOUT: self.out, channels.STDERR: self.err,
                      channels.ERROR: self.error}.get(decoded.channel)
            if target is not None:
                target += decoded.data
                self.arrived.set()
        self.close_code = self.ws.close_code
        self.arrived.set()

    async def _send(self, channel: int, data: bytes) -> None:
        payload = self.codec.encode(channel, data)
        if isinstance(payload, str):
            await self.ws.send_str(payload)
        else:
            await self.ws.send_bytes(payload)

    async def write_stdin(self, data: bytes) -> None:
        await self._send(channels.STDIN, data)

    async def close_stdin(self) -> None:
        await self.ws.send_bytes(self.codec.encode_close(channels.STDIN))

    async def resize(self, width: int, height: int) -> None:
        await self._send(channels.RESIZE,
                         json.dumps({"Width": width, "Height": height}).encode())

    async def wait(self, limit: float = 30) -> CommandResult:
        await asyncio.wait_for(self._reader, limit)
        await self.close()
        return CommandResult(bytes(self.out), bytes(self.err), bytes(self.error))

    async def close(self) -> None:
        await self.ws.close()
        await self.http.close()
        self._reader.cancel()


TRANSPORTS: dict[str, Any] = {"spdy": SpdyCommand, "websocket": WebSocketCommand}


# ---- port-forward -------------------------------------------------------------------------


class SpdyPortForward:
    """client-go's port-forward: per connection an error stream and a data stream."""

    def __init__(self, client: SpdyClient) -> None:
        self.client = client
        self._ids = itertools.count()

    @classmethod
    async def connect(cls, url: str, *, websocket: bool = False) -> SpdyPortForward:
        """Over a SPDY upgrade, or tunnelled in a WebSocket (client-go's WebSocket
        port-forward)."""
        if websocket:
            return cls(await SpdyClient.connect_websocket(url, ["portforward.k8s.io"]))
        return cls(await SpdyClient.connect(url, ["portforward.k8s.io"]))

    async def request(self, port: int, payload: bytes, *, half_close: bool = True,
                      limit: float = 30) -> tuple[bytes, bytes]:
        """One forwarded connection: send ``payload``, return (response, error text)."""
        rid = str(next(self._ids))
        headers = {"port": str(port), "requestID": rid}
        error = await self.client.open({**headers, "streamType": "error"}, fin=True)
        data = await self.client.open({**headers, "streamType": "data"})
        await self.client.send(data, payload, fin=half_close)
        response, err = await asyncio.wait_for(asyncio.gather(
            self.client.read_all(data), self.client.read_all(error)), limit)
        return response, err

    async def close(self) -> None:
        await self.client.close()


async def websocket_port_forward(url: str, port: int, payload: bytes, *,
                                 protocol: str = "v4.channel.k8s.io",
                                 limit: float = 30) -> tuple[bytes, bytes]:
    """One connection to ``port`` over WebSocket; (response, error text). The client
    cannot half-close here, so it reads until the server closes."""
    sep = "&" if "?" in url else "?"
    async with aiohttp.ClientSession() as http, http.ws_connect(
            f"{url.replace('http', 'ws', 1)}{sep}port={port}", protocols=(protocol,)) as ws:
        codec = channels.ChannelCodec(ws.protocol or "")
        seen_prefix: set[int] = set()
        data, error = bytearray(), bytearray()
        sent = False

        async def run() -> None:
            nonlocal sent
            async for msg in ws:
                if msg.type not in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT):
                    break
                decoded = codec.decode(msg.data)
                assert isinstance(decoded, channels.ChannelData)
                body = decoded.data
                if decoded.channel not in seen_prefix:
                    got, body = channels.split_port_prefix(body)
                    assert got == port, (got, port)
                    seen_prefix.add(decoded.channel)
                    if len(seen_prefix) == 2 and not sent:
                        sent = True
                        payload_msg = codec.encode(0, payload)
                        if isinstance(payload_msg, str):
                            await ws.send_str(payload_msg)
                        else:
                            await ws.send_bytes(payload_msg)
                (data if decoded.channel == 0 else error).extend(body)
                if data.endswith(b"</html>\n") or error:
                    break

        await asyncio.wait_for(run(), limit)
        return bytes(data), bytes(error)
