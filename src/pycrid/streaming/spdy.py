"""A sans-IO SPDY/3.1 connection: bytes in, events out; the caller owns the socket.

This module keeps the state of streams and windows; the frame layout and header
compression are in :mod:`pycrid.streaming.spdy_frames`, the events it reports in
:mod:`pycrid.streaming.spdy_events`.

kubectl, crictl and the kubelet speak SPDY/3.1 through moby/spdystream for exec,
attach and port-forward, so this module follows that implementation where the
draft spec leaves room.

Flow control. Both the stream and the session windows start at 64 KiB.

* Receiving: nothing is acknowledged automatically. The caller reports bytes it
  has consumed with ``acknowledge()``; WINDOW_UPDATE frames (for the stream and
  for the session, stream 0) go out once half a window has been consumed, so a
  busy stream costs one extra frame per 32 KiB rather than one per packet. The
  receive window is not enforced: spdystream ignores our updates and would
  overrun it, and dropping its data would break every large transfer.
* Sending: spdystream never sends WINDOW_UPDATE, so enforcing the 64 KiB send
  window against it would stall any transfer after 64 KiB. Send windows are
  therefore tracked from the start but enforced only once the peer has shown
  that it does flow control, by sending a WINDOW_UPDATE or a SETTINGS frame with
  INITIAL_WINDOW_SIZE. Until then ``send_window()`` returns ``None``.

Errors. Anything that breaks the connection (bad version, malformed or
oversized frame, a header block that fails to decompress, which desynchronises
the shared zlib context, a SYN_STREAM with the wrong parity or a non-increasing
id, frames for a stream id that was never opened) raises ``ProtocolError``; the
connection is then unusable. Data for a stream whose remote side has already
finished gets RST_STREAM STREAM_ALREADY_CLOSED and a ``StreamReset`` event.
Frames for a stream that existed but has been forgotten (reset or fully closed)
are dropped silently, since they are normal in a reset race; dropped data is
still acknowledged on the session window so it does not leak.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

from pycrid.streaming import spdy_frames as wire
from pycrid.streaming.spdy_events import (
    DataReceived,
    Event,
    GoAwayReceived,
    HeadersReceived,
    PingAcknowledged,
    PingReceived,
    SettingsReceived,
    StreamOpened,
    StreamReplied,
    StreamReset,
    WindowUpdated,
)
from pycrid.streaming.spdy_frames import (
    CANCEL,
    DEFAULT_WINDOW,
    MAX_31BIT,
    REFUSED_STREAM,
    SETTINGS_INITIAL_WINDOW_SIZE,
    STREAM_ALREADY_CLOSED,
    Frame,
    HeaderValue,
    ProtocolError,
)

_UPDATE_THRESHOLD = DEFAULT_WINDOW // 2


class FlowControlError(ValueError):
    """More data was offered than the peer's (enforced) window allows."""


class StreamClosedError(ValueError):
    """The stream is unknown, reset, or already finished on our side."""


@dataclass
class _Stream:
    send_window: int
    local_closed: bool = False
    remote_closed: bool = False
    replied: bool = False
    unacked: int = field(default=0)  # consumed by the caller, not yet announced


class SpdyConnection:
    """One end of a SPDY/3.1 session; ``client`` decides stream and ping parity."""

    def __init__(self, *, client: bool) -> None:
        self.client = client
        self._in = bytearray()
        self._out = bytearray()
        self._headers = wire.HeaderBlocks()
        self._streams: dict[int, _Stream] = {}
        self._next_id = 1 if client else 2
        self._last_remote_id = 0
        self._next_ping = 1 if client else 2
        self._initial_send_window = DEFAULT_WINDOW
        self._session_send = DEFAULT_WINDOW
        self._session_unacked = 0
        self.peer_flow_control = False
        self.go_away_sent = False
        self.go_away_received = False

    # -- outgoing ---------------------------------------------------------

    def data_to_send(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out

    def open_stream(
        self,
        headers: Mapping[str, HeaderValue],
        *,
        fin: bool = False,
        associated_id: int = 0,
        priority: int = 0,
    ) -> int:
        if not 0 <= priority <= 7:
            raise ValueError("SPDY/3 priority is 0..7")
        stream_id = self._next_id
        if stream_id > MAX_31BIT:
            raise StreamClosedError("stream ids exhausted")
        self._next_id += 2
        block = self._headers.encode(headers)
        payload = struct.pack(">IIBB", stream_id, associated_id, priority << 5, 0) + block
        self._control(wire.SYN_STREAM, fin, payload)
        self._streams[stream_id] = _Stream(self._initial_send_window, local_closed=fin)
        return stream_id

    def reply(
        self, stream_id: int, headers: Mapping[str, HeaderValue] = {}, *, fin: bool = False
    ) -> None:
        stream = self._local_open(stream_id)
        if stream_id % 2 == self._next_id % 2 or stream.replied:
            raise StreamClosedError(f"stream {stream_id} cannot be replied to")
        stream.replied = True
        payload = struct.pack(">I", stream_id) + self._headers.encode(headers)
        self._control(wire.SYN_REPLY, fin, payload)
        if fin:
            self._close_local(stream_id, stream)

    def send_headers(
        self, stream_id: int, headers: Mapping[str, HeaderValue], *, fin: bool = False
    ) -> None:
        stream = self._local_open(stream_id)
        payload = struct.pack(">I", stream_id) + self._headers.encode(headers)
        self._control(wire.HEADERS, fin, payload)
        if fin:
            self._close_local(stream_id, stream)

    def send_data(self, stream_id: int, data: bytes, *, fin: bool = False) -> None:
        stream = self._local_open(stream_id)
        window = self.send_window(stream_id)
        if window is not None and len(data) > window:
            raise FlowControlError(f"{len(data)} bytes exceed send window {window}")
        self._out += wire.data_frames(stream_id, data, fin=fin)
        stream.send_window -= len(data)
        self._session_send -= len(data)
        if fin:
            self._close_local(stream_id, stream)

    def end_stream(self, stream_id: int) -> None:
        self.send_data(stream_id, b"", fin=True)

    def reset_stream(self, stream_id: int, status: int = CANCEL) -> None:
        """Abort a stream; resetting one already gone is a no-op."""
        if status == 0:
            raise ValueError("RST_STREAM status 0 is invalid")
        if self._streams.pop(stream_id, None) is not None:
            self._out += wire.pair_frame(wire.RST_STREAM, stream_id, status)

    def ping(self) -> int:
        ping_id = self._next_ping
        self._next_ping = ping_id + 2 if ping_id + 2 <= 0xFFFFFFFF else ping_id % 2 or 2
        self._control(wire.PING, False, struct.pack(">I", ping_id))
        return ping_id

    def go_away(self, status: int = 0) -> None:
        self.go_away_sent = True
        self._out += wire.pair_frame(wire.GOAWAY, self._last_remote_id, status)

    def acknowledge(self, stream_id: int, n: int) -> None:
        """Record that the caller consumed ``n`` bytes; updates go out in batches."""
        if n < 0:
            raise ValueError("cannot acknowledge a negative amount")
        stream = self._streams.get(stream_id)
        if stream is not None and not stream.remote_closed:
            stream.unacked += n
            if stream.unacked >= _UPDATE_THRESHOLD:
                self._out += wire.pair_frame(wire.WINDOW_UPDATE, stream_id, stream.unacked)
                stream.unacked = 0
        self._session_unacked += n
        if self._session_unacked >= _UPDATE_THRESHOLD:
            self._out += wire.pair_frame(wire.WINDOW_UPDATE, 0, self._session_unacked)
            self._session_unacked = 0

    def send_window(self, stream_id: int) -> int | None:
        stream = self._streams.get(stream_id)
        if stream is None:
            raise StreamClosedError(f"stream {stream_id} is not open")
        if not self.peer_flow_control:
            return None
        return max(0, min(stream.send_window, self._session_send))

    # -- state ------------------------------------------------------------

    def is_open(self, stream_id: int) -> bool:
        return stream_id in self._streams

    def local_closed(self, stream_id: int) -> bool:
        stream = self._streams.get(stream_id)
        return stream is None or stream.local_closed

    def remote_closed(self, stream_id: int) -> bool:
        stream = self._streams.get(stream_id)
        return stream is None or stream.remote_closed

    # -- incoming ---------------------------------------------------------

    def receive_data(self, data: bytes) -> list[Event]:
        """Parse every complete frame; a partial one waits for the next call."""
        self._in += data
        events: list[Event] = []
        buf, pos = self._in, 0
        try:
            while (parsed := wire.parse_frame(buf, pos)) is not None:
                frame, pos = parsed
                self._on_frame(frame, events)
        finally:
            # One compaction per call keeps many small frames from costing O(n^2).
            del buf[:pos]
        return events

    def _on_frame(self, frame: Frame, events: list[Event]) -> None:
        kind, payload = frame.kind, frame.payload
        if kind == wire.DATA:
            self._on_data(frame.stream_id, frame.fin, payload, events)
        elif kind == wire.SYN_STREAM:
            self._on_syn_stream(frame, events)
        elif kind in (wire.SYN_REPLY, wire.HEADERS):
            self._on_reply_or_headers(frame, events)
        elif kind == wire.RST_STREAM:
            wire.need(payload, 8, "RST_STREAM", exact=True)
            stream_id, status = struct.unpack(">II", payload)
            stream_id &= MAX_31BIT
            if self._streams.pop(stream_id, None) is not None:
                events.append(StreamReset(stream_id, status))
        elif kind == wire.SETTINGS:
            self._on_settings(payload, events)
        elif kind == wire.PING:
            wire.need(payload, 4, "PING", exact=True)
            (ping_id,) = struct.unpack(">I", payload)
            if ping_id % 2 == self._next_ping % 2:
                events.append(PingAcknowledged(ping_id))
            else:
                self._control(wire.PING, False, payload)
                events.append(PingReceived(ping_id))
        elif kind == wire.GOAWAY:
            wire.need(payload, 8, "GOAWAY", exact=True)
            last, status = struct.unpack(">II", payload)
            self.go_away_received = True
            events.append(GoAwayReceived(last & MAX_31BIT, status))
        elif kind == wire.WINDOW_UPDATE:
            self._on_window_update(payload, events)
        # Other control frame types (NOOP, CREDENTIAL, future ones) are skipped.

    def _on_data(self, stream_id: int, fin: bool, data: bytes, events: list[Event]) -> None:
        stream = self._known(stream_id, "DATA")
        if stream is None:
            self.acknowledge(0, len(data))
            return
        if stream.remote_closed:
            self._already_closed(stream_id, events)
            return
        events.append(DataReceived(stream_id, data, fin))
        if fin:
            self._close_remote(stream_id, stream)

    def _on_syn_stream(self, frame: Frame, events: list[Event]) -> None:
        payload, fin = frame.payload, frame.fin
        wire.need(payload, 10, "SYN_STREAM")
        stream_id, associated = struct.unpack_from(">II", payload)
        stream_id &= MAX_31BIT
        headers = self._headers.decode(payload[10:])
        if stream_id == 0 or stream_id % 2 == self._next_id % 2:
            raise ProtocolError(f"SYN_STREAM with wrong parity id {stream_id}")
        if stream_id <= self._last_remote_id:
            raise ProtocolError(f"SYN_STREAM id {stream_id} does not increase")
        self._last_remote_id = stream_id
        if self.go_away_sent:
            self._out += wire.pair_frame(wire.RST_STREAM, stream_id, REFUSED_STREAM)
            return
        local = bool(frame.flags & wire.FLAG_UNIDIRECTIONAL)
        stream = _Stream(self._initial_send_window, local_closed=local, remote_closed=fin)
        self._streams[stream_id] = stream
        events.append(StreamOpened(stream_id, headers, fin, associated & MAX_31BIT))
        if local and fin:
            self._streams.pop(stream_id)

    def _on_reply_or_headers(self, frame: Frame, events: list[Event]) -> None:
        payload, fin, is_reply = frame.payload, frame.fin, frame.kind == wire.SYN_REPLY
        wire.need(payload, 4, "SYN_REPLY/HEADERS")
        stream_id = int.from_bytes(payload[:4], "big") & MAX_31BIT
        headers = self._headers.decode(payload[4:])
        known = self._known(stream_id, "SYN_REPLY" if is_reply else "HEADERS")
        if known is None:
            return
        if known.remote_closed:
            self._already_closed(stream_id, events)
            return
        if is_reply:
            if stream_id % 2 != self._next_id % 2 or known.replied:
                raise ProtocolError(f"unexpected SYN_REPLY for stream {stream_id}")
            known.replied = True
            events.append(StreamReplied(stream_id, headers, fin))
        else:
            events.append(HeadersReceived(stream_id, headers, fin))
        if fin:
            self._close_remote(stream_id, known)

    def _on_window_update(self, payload: bytes, events: list[Event]) -> None:
        wire.need(payload, 8, "WINDOW_UPDATE", exact=True)
        stream_id, delta = struct.unpack(">II", payload)
        stream_id &= MAX_31BIT
        delta &= MAX_31BIT
        self.peer_flow_control = True
        if stream_id == 0:
            self._session_send += delta
        elif (target := self._streams.get(stream_id)) is not None:
            target.send_window += delta
        else:
            return
        events.append(WindowUpdated(stream_id, delta))

    def _on_settings(self, payload: bytes, events: list[Event]) -> None:
        settings = wire.parse_settings(payload)
        if SETTINGS_INITIAL_WINDOW_SIZE in settings:
            new = settings[SETTINGS_INITIAL_WINDOW_SIZE]
            if new > MAX_31BIT:
                raise ProtocolError(f"initial window {new} is too large")
            # The change applies retroactively to every open stream.
            for stream in self._streams.values():
                stream.send_window += new - self._initial_send_window
            self._initial_send_window = new
            self.peer_flow_control = True
        events.append(SettingsReceived(settings))

    # -- helpers ----------------------------------------------------------

    def _known(self, stream_id: int, what: str) -> _Stream | None:
        """The open stream, None for a forgotten one, or ProtocolError if never opened."""
        stream = self._streams.get(stream_id)
        if stream is not None:
            return stream
        ours = stream_id % 2 == self._next_id % 2
        if stream_id == 0 or (
            stream_id >= self._next_id if ours else stream_id > self._last_remote_id
        ):
            raise ProtocolError(f"{what} for unknown stream {stream_id}")
        return None

    def _already_closed(self, stream_id: int, events: list[Event]) -> None:
        """The peer sent on a stream it had finished: reset just that stream."""
        del self._streams[stream_id]
        self._out += wire.pair_frame(wire.RST_STREAM, stream_id, STREAM_ALREADY_CLOSED)
        events.append(StreamReset(stream_id, STREAM_ALREADY_CLOSED))

    def _local_open(self, stream_id: int) -> _Stream:
        stream = self._streams.get(stream_id)
        if stream is None or stream.local_closed:
            raise StreamClosedError(f"stream {stream_id} is closed for sending")
        return stream

    def _close_local(self, stream_id: int, stream: _Stream) -> None:
        stream.local_closed = True
        if stream.remote_closed:
            del self._streams[stream_id]

    def _close_remote(self, stream_id: int, stream: _Stream) -> None:
        stream.remote_closed = True
        if stream.local_closed:
            del self._streams[stream_id]

    def _control(self, kind: int, fin: bool, payload: bytes) -> None:
        self._out += wire.control_frame(kind, wire.FLAG_FIN if fin else 0, payload)
