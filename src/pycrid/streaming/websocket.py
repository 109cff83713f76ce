"""The server end of one WebSocket after the handshake, sans-IO: wsproto's frames as whole
messages, pings answered, and the close handshake the Kubernetes clients expect.

client-go (gorilla/websocket) takes only a Close frame with code 1000 as the normal end of a
session: a connection that just drops is "close 1006 (abnormal closure)", which fails every
stream, the one carrying the exit status too. So the server ends a session with a Close frame
after its last message and then waits for the client's Close before it drops the
connection (RFC 6455 7.1.1: the server closes TCP first, once both Close frames are through);
a socket closed with the client's bytes still unread answers with a reset, and the client
may lose what it had not read yet.

Bytes in, bytes out: the caller feeds what it read (``b""`` at EOF) to :meth:`receive` and
writes whatever the methods return.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from wsproto import WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import BytesMessage, CloseConnection, Message, Ping, TextMessage
from wsproto.frame_protocol import CloseReason

#: The close codes the server sends (RFC 6455 7.4.1).
NORMAL_CLOSURE: Final = int(CloseReason.NORMAL_CLOSURE)
#: The session ended before its end (daemon stopping, session failed): client-go reports
#: it as an error instead of taking the missing status for success.
GOING_AWAY: Final = int(CloseReason.GOING_AWAY)
PROTOCOL_ERROR: Final = int(CloseReason.PROTOCOL_ERROR)
UNSUPPORTED_DATA: Final = int(CloseReason.UNSUPPORTED_DATA)


@dataclass
class Received:
    """What one :meth:`WebSocketEnd.receive` produced."""

    #: Whole data messages, in order: bytes from binary frames, str from text frames.
    messages: list[bytes | str] = field(default_factory=list)
    #: Bytes to write back now (pongs, the answer to the client's Close).
    reply: bytes = b""


class WebSocketEnd:
    """One upgraded connection, server side. ``open`` while both sides may send data;
    ``finished`` once nothing more will be read (both Close frames are through, the client
    broke the framing, or the connection ended)."""

    def __init__(self, ws: WSConnection) -> None:
        self.ws = ws
        self._parts: list[bytes | str] = []
        self._broken = False
        #: The code of the client's Close frame (1006 if the connection just ended).
        self.peer_code: int | None = None

    @property
    def open(self) -> bool:
        return self.ws.state is ConnectionState.OPEN and not self._broken

    @property
    def finished(self) -> bool:
        return self._broken or self.ws.state is ConnectionState.CLOSED

    def receive(self, data: bytes) -> Received:
        """Feed bytes read from the connection; ``b""`` means the connection ended."""
        out = Received()
        if self.finished:
            return out
        self.ws.receive_data(data or None)
        for event in self.ws.events():
            if isinstance(event, Message):
                self._parts.append(event.data)
                if event.message_finished:
                    out.messages.append(_join(self._parts, isinstance(event, TextMessage)))
                    self._parts = []
            elif isinstance(event, Ping):
                if self.ws.state is ConnectionState.OPEN:
                    out.reply += self.ws.send(event.response())
            elif isinstance(event, CloseConnection):
                self.peer_code = event.code
                if self.ws.state is ConnectionState.REMOTE_CLOSING:
                    out.reply += self.ws.send(event.response())
                elif self.ws.state is not ConnectionState.CLOSED:
                    # wsproto reports bad framing as a Close event without changing state:
                    # nothing after it can be read, so answer with that code and stop.
                    if self.ws.state is ConnectionState.OPEN:
                        out.reply += self.ws.send(event)
                    self._broken = True
                break
        return out

    def send(self, message: bytes | str) -> bytes:
        """The frame of one data message; ConnectionResetError once the session is closing."""
        if not self.open:
            raise ConnectionResetError("WebSocket is closing")
        event = TextMessage(data=message) if isinstance(message, str) else BytesMessage(
            data=message)
        return self.ws.send(event)

    def close(self, code: int = NORMAL_CLOSURE, reason: str = "") -> bytes:
        """Our Close frame, or ``b""`` when one was already sent or the connection is gone.
        Reading goes on until the client's Close arrives (``finished``)."""
        if not self.open:
            return b""
        return self.ws.send(CloseConnection(code=code, reason=reason))


def _join(parts: list[bytes | str], text: bool) -> bytes | str:
    if text:
        return "".join(p for p in parts if isinstance(p, str))
    return b"".join(p for p in parts if isinstance(p, bytes))
