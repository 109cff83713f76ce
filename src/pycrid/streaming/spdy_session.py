"""An asyncio shell around the sans-IO SPDY codec: one task reads the connection,
streams are objects with ``read``/``write``/``close``.

Flow control: data the client sends is acknowledged (WINDOW_UPDATE) only once
the consumer has read it, and the reader stops reading the socket while a
stream holds too much unread (clients built on spdystream ignore windows);
writes wait for the client's window only when the client does flow control at
all (see :mod:`pycrid.streaming.spdy`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping

from pycrid.streaming import spdy, spdy_events, spdy_frames
from pycrid.streaming.transport import Connection, Inbox

log = logging.getLogger(__name__)


class SpdyStream:
    def __init__(self, session: SpdySession, stream_id: int, headers: Mapping[str, str],
                 remote_closed: bool) -> None:
        self.session = session
        self.id = stream_id
        self.headers = dict(headers)
        self.inbox = Inbox()
        if remote_closed:
            self.inbox.end()
        self._local_closed = False

    # -- from the session --

    def _receive(self, data: bytes, fin: bool) -> None:
        self.inbox.put(data)
        if fin:
            self.inbox.end()
            self._forget_if_done()

    def _end(self, reset: bool) -> None:
        if reset:
            self._local_closed = True
        self.inbox.end()

    def _forget_if_done(self) -> None:
        """Both sides closed: the session stops tracking it (a port-forward connection
        opens two streams per forwarded connection, for hours)."""
        if self._local_closed and self.inbox.ended:
            self.session.streams.pop(self.id, None)

    # -- for the user --

    async def read(self) -> bytes:
        """The next chunk from the client; ``b""`` at its FIN, a reset or the end of the
        connection."""
        data = await self.inbox.get()
        if data:
            self.session.consumed(self.id, len(data))
        return data

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view and not self._local_closed:
            room = self.session.codec.send_window(self.id)
            if room is not None and room <= 0:
                await self.session.window_opened()
                continue
            chunk = view if room is None else view[:room]
            self.session.codec.send_data(self.id, bytes(chunk))
            view = view[len(chunk):]
            await self.session.flush()
        if view:
            raise ConnectionResetError(f"stream {self.id} was closed")

    async def close(self) -> None:
        """FIN: the client reads the end of this stream."""
        if not self._local_closed:
            self._local_closed = True
            with contextlib.suppress(spdy_frames.ProtocolError):
                self.session.codec.end_stream(self.id)
            self._forget_if_done()
            await self.session.flush()


class SpdySession:
    """A server-side SPDY connection: ``run`` reads it, ``accept`` yields the streams the
    client opens (each already answered with SYN_REPLY, as the kubelet does)."""

    def __init__(self, transport: Connection) -> None:
        self.transport = transport
        self.codec = spdy.SpdyConnection(client=False)
        self.streams: dict[int, SpdyStream] = {}
        self._opened: asyncio.Queue[SpdyStream | None] = asyncio.Queue()
        self._window = asyncio.Event()
        self._room = asyncio.Event()
        self.closed = False

    async def run(self, initial: bytes = b"") -> None:
        """Read frames until the client goes away; every stream then sees its end."""
        try:
            data = initial
            while True:
                if data:
                    for event in self.codec.receive_data(data):
                        self._dispatch(event)
                    await self.flush()
                while any(s.inbox.full for s in self.streams.values()):
                    self._room.clear()
                    await self._room.wait()
                data = await self.transport.read()
                if not data:
                    break
        except spdy_frames.ProtocolError as e:
            log.info("SPDY client broke the protocol: %s", e)
            with contextlib.suppress(Exception):
                self.codec.go_away(spdy_frames.PROTOCOL_ERROR)
                await self.flush()
        except (ConnectionError, OSError):
            pass
        finally:
            self.closed = True
            for stream in self.streams.values():
                stream._end(reset=False)
            self._opened.put_nowait(None)
            self._window.set()

    def _dispatch(self, event: spdy_events.Event) -> None:
        if isinstance(event, spdy_events.StreamOpened):
            stream = SpdyStream(self, event.stream_id, event.headers, event.fin)
            self.streams[event.stream_id] = stream
            self.codec.reply(event.stream_id)
            self._opened.put_nowait(stream)
        elif isinstance(event, spdy_events.DataReceived):
            if (s := self.streams.get(event.stream_id)) is not None:
                s._receive(event.data, event.fin)
        elif isinstance(event, spdy_events.HeadersReceived):
            if event.fin and (s := self.streams.get(event.stream_id)) is not None:
                s._receive(b"", True)
        elif isinstance(event, spdy_events.StreamReset):
            if (s := self.streams.pop(event.stream_id, None)) is not None:
                s._end(reset=True)
        elif isinstance(event, spdy_events.WindowUpdated):
            self._window.set()
        elif isinstance(event, spdy_events.GoAwayReceived):
            self._opened.put_nowait(None)

    async def accept(self) -> SpdyStream | None:
        """The next stream the client opened, or None once it can open no more."""
        stream = await self._opened.get()
        if stream is None:
            self._opened.put_nowait(None)  # every later call sees the end too
        return stream

    def consumed(self, stream_id: int, n: int) -> None:
        """The reader took ``n`` bytes: open the client's window, let the reader go on."""
        with contextlib.suppress(spdy_frames.ProtocolError, ValueError):
            self.codec.acknowledge(stream_id, n)
        self.transport.write(self.codec.data_to_send())
        self._room.set()

    async def window_opened(self) -> None:
        if self.closed:
            raise ConnectionResetError("connection closed")
        self._window.clear()
        await self._window.wait()

    async def flush(self) -> None:
        await self.transport.send(self.codec.data_to_send())

    async def close(self) -> None:
        """GOAWAY, then close the connection."""
        if not self.transport.closing:
            with contextlib.suppress(Exception):
                self.codec.go_away(0)
                await self.flush()
        await self.transport.aclose()
