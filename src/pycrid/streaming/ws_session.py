"""asyncio shells around a WebSocket (:mod:`pycrid.streaming.websocket`): the Kubernetes
channel session of exec, attach and port-forward, and the SPDY tunnel of client-go's
WebSocket port-forward.

Channel session: one task reads the WebSocket, each channel is an object with
``read``/``write``/``close``. A client that sends faster than the process reads is held
back: the reader stops reading the socket while a channel holds more than
``BUFFER_LIMIT`` unread bytes (WebSocket has no flow control of its own).

The server never says that one of its channels ended: the kubelet's wsstream has no
such message (v5's CLOSE on channel 255 goes from client to server only, and client-go
logs one it receives as an error). The client learns that all of them ended from the
Close frame that ends the session, after the status on the error channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

from pycrid.streaming.channels import ChannelClose, ChannelCodec, ChannelError
from pycrid.streaming.transport import Inbox, Transport
from pycrid.streaming.websocket import (
    NORMAL_CLOSURE,
    PROTOCOL_ERROR,
    UNSUPPORTED_DATA,
    Received,
    WebSocketEnd,
)

log = logging.getLogger(__name__)

#: How long the server waits for the client's answer to its Close frame.
CLOSE_TIMEOUT: Final = 5.0


class WebSocketChannel:
    def __init__(self, session: WebSocketSession, number: int) -> None:
        self.session = session
        self.number = number
        self.inbox = Inbox()

    async def read(self) -> bytes:
        """The next message's payload; ``b""`` when the client closed the channel (v5) or
        the connection."""
        data = await self.inbox.get()
        self.session.drained()
        return data

    async def write(self, data: bytes) -> None:
        await self.session.send(self.number, data)

    async def close(self) -> None:
        """Nothing goes on the wire (see the module doc): the session's Close frame ends
        every channel at once."""


class WebSocketSession:
    def __init__(self, transport: Transport, end: WebSocketEnd, codec: ChannelCodec) -> None:
        self.transport = transport
        self.end = end
        self.codec = codec
        self.channels: dict[int, WebSocketChannel] = {}
        self._room = asyncio.Event()
        self._closing = False
        #: Set when the reader stops: the close handshake is through or the client is gone.
        self.ended = asyncio.Event()

    def channel(self, number: int) -> WebSocketChannel:
        if number not in self.channels:
            self.channels[number] = WebSocketChannel(self, number)
        return self.channels[number]

    async def run(self, initial: bytes = b"") -> None:
        try:
            data = initial
            while True:
                if data:
                    await self._handle(self.end.receive(data))
                if self.end.finished:
                    break
                while not self._closing and any(c.inbox.full for c in self.channels.values()):
                    self._room.clear()
                    await self._room.wait()
                data = await self.transport.read()
                if not data:
                    self.end.receive(b"")
                    break
        except ChannelError as e:
            log.info("WebSocket client broke the channel protocol: %s", e)
            with contextlib.suppress(ConnectionError, OSError):
                await self.transport.send(self.end.close(PROTOCOL_ERROR, str(e)[:120]))
        except (ConnectionError, OSError):
            pass
        finally:
            self.ended.set()
            for channel in self.channels.values():
                channel.inbox.end()

    async def _handle(self, received: Received) -> None:
        if received.reply:
            await self.transport.send(received.reply)
        for message in received.messages:
            if not message:
                continue  # wsstream skips empty messages too
            decoded = self.codec.decode(message)
            if isinstance(decoded, ChannelClose):
                self.channel(decoded.channel).inbox.end()
            else:
                self.channel(decoded.channel).inbox.put(decoded.data)

    def drained(self) -> None:
        self._room.set()

    async def send(self, channel: int, data: bytes) -> None:
        await self.transport.send(self.end.send(self.codec.encode(channel, data)))

    async def close(self, code: int = NORMAL_CLOSURE, reason: str = "") -> None:
        """End the session: our Close frame, the client's answer (for at most
        ``CLOSE_TIMEOUT``, while the reader still runs), then the connection. Safe to call
        again; without a reader, or with the connection gone, it just closes."""
        self._closing = True
        for channel in self.channels.values():
            channel.inbox.end()  # nobody reads any more: drop what still arrives
        self._room.set()  # a reader held back by a full channel must get to the answer
        farewell = self.end.close(code, reason)
        if farewell and not self.transport.closing:
            with contextlib.suppress(ConnectionError, OSError, TimeoutError):
                await self.transport.send(farewell)
                await asyncio.wait_for(self.ended.wait(), CLOSE_TIMEOUT)
        await self.transport.aclose()


class WebSocketTunnel:
    """client-go's port-forward over WebSocket (``SPDY/3.1+portforward.k8s.io``, what the
    API server's tunneling handler accepts, and crictl's ``port-forward -r websocket``):
    a SPDY connection whose bytes travel in binary messages. The SPDY session reads and
    writes this as if it were the TCP connection."""

    def __init__(self, transport: Transport, end: WebSocketEnd, initial: bytes = b"") -> None:
        self.transport = transport
        self.end = end
        self._initial = initial

    @property
    def closing(self) -> bool:
        return not self.end.open or self.transport.closing

    async def read(self) -> bytes:
        """The payload of the next binary messages; ``b""`` once the tunnel is closed."""
        while not self.end.finished:
            data, self._initial = self._initial or await self.transport.read(), b""
            received = self.end.receive(data)
            self.transport.write(received.reply)
            if any(isinstance(m, str) for m in received.messages):
                log.info("WebSocket port-forward client sent a text message")
                self.transport.write(self.end.close(UNSUPPORTED_DATA, "binary messages only"))
                return b""
            payload = b"".join(m for m in received.messages if isinstance(m, bytes))
            if payload:
                return payload
        return b""

    def write(self, data: bytes) -> None:
        if data and self.end.open:
            self.transport.write(self.end.send(data))

    async def send(self, data: bytes) -> None:
        if not self.end.open:
            raise ConnectionResetError("WebSocket is closing")
        if data:
            await self.transport.send(self.end.send(data))

    async def aclose(self) -> None:
        """Our Close frame, then read (for at most ``CLOSE_TIMEOUT``) until the client's
        answer; the SPDY session's reader has stopped by now."""
        farewell = self.end.close()
        if farewell and not self.transport.closing:
            with contextlib.suppress(ConnectionError, OSError, TimeoutError):
                await self.transport.send(farewell)
                await asyncio.wait_for(self._until_finished(), CLOSE_TIMEOUT)
        await self.transport.aclose()

    async def _until_finished(self) -> None:
        while not self.end.finished:
            received = self.end.receive(await self.transport.read())
            self.transport.write(received.reply)
