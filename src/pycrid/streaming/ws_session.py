"""An asyncio shell around wsproto and the Kubernetes channel codec: one task reads
the WebSocket, each channel is an object with ``read``/``write``/``close``.

A client that sends faster than the process reads is held back: the reader
stops reading the socket while a channel holds more than ``BUFFER_LIMIT``
unread bytes (WebSocket has no flow control of its own).
"""

from __future__ import annotations

import asyncio
import logging

from wsproto import WSConnection
from wsproto.events import (
    BytesMessage,
    CloseConnection,
    Message,
    Ping,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from pycrid.streaming.channels import ChannelClose, ChannelCodec, ChannelError
from pycrid.streaming.transport import Inbox, Transport

log = logging.getLogger(__name__)


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
        """Only v5 can say a channel ended; older clients learn it when the connection
        closes."""
        await self.session.close_channel(self.number)


class WebSocketSession:
    def __init__(self, transport: Transport, ws: WSConnection, codec: ChannelCodec) -> None:
        self.transport = transport
        self.ws = ws
        self.codec = codec
        self.channels: dict[int, WebSocketChannel] = {}
        self._room = asyncio.Event()
        self._parts: list[bytes | str] = []
        self.closed = False

    def channel(self, number: int) -> WebSocketChannel:
        if number not in self.channels:
            self.channels[number] = WebSocketChannel(self, number)
        return self.channels[number]

    async def run(self, initial: bytes = b"") -> None:
        try:
            data = initial
            while True:
                if data:
                    self.ws.receive_data(data)
                    await self._handle_events()
                while any(c.inbox.full for c in self.channels.values()):
                    self._room.clear()
                    await self._room.wait()
                if self.closed:
                    break
                data = await self.transport.read()
                if not data:
                    break
        except (RemoteProtocolError, ChannelError) as e:
            log.info("WebSocket client broke the protocol: %s", e)
        except (ConnectionError, OSError, LocalProtocolError):
            pass
        finally:
            self.closed = True
            for channel in self.channels.values():
                channel.inbox.end()

    async def _handle_events(self) -> None:
        for event in self.ws.events():
            if isinstance(event, Message):
                self._parts.append(event.data)
                if not event.message_finished:
                    continue
                if isinstance(event, TextMessage):
                    message: bytes | str = "".join(p for p in self._parts if isinstance(p, str))
                else:
                    message = b"".join(p for p in self._parts if isinstance(p, bytes))
                self._parts = []
                decoded = self.codec.decode(message)
                if isinstance(decoded, ChannelClose):
                    self.channel(decoded.channel).inbox.end()
                else:
                    self.channel(decoded.channel).inbox.put(decoded.data)
            elif isinstance(event, Ping):
                await self.transport.send(self.ws.send(event.response()))
            elif isinstance(event, CloseConnection):
                if not self.closed:
                    self.closed = True
                    await self.transport.send(self.ws.send(event.response()))
                return

    def drained(self) -> None:
        self._room.set()

    async def send(self, channel: int, data: bytes) -> None:
        if self.closed:
            raise ConnectionResetError("WebSocket closed")
        payload = self.codec.encode(channel, data)
        message = (TextMessage(data=payload) if isinstance(payload, str)
                   else BytesMessage(data=payload))
        await self.transport.send(self.ws.send(message))

    async def close_channel(self, channel: int) -> None:
        if self.codec.version >= 5 and not self.closed:
            await self.transport.send(self.ws.send(BytesMessage(
                data=self.codec.encode_close(channel))))

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if not self.closed and not self.transport.closing:
            self.closed = True
            try:
                await self.transport.send(self.ws.send(CloseConnection(code=code,
                                                                       reason=reason)))
            except (ConnectionError, OSError, LocalProtocolError):
                pass
        await self.transport.aclose()
