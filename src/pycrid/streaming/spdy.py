"""A sans-IO SPDY/3.1 codec: bytes in, events out; the caller owns the socket.

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
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# RST_STREAM / GOAWAY status codes.
PROTOCOL_ERROR = 1
INVALID_STREAM = 2
REFUSED_STREAM = 3
UNSUPPORTED_VERSION = 4
CANCEL = 5
INTERNAL_ERROR = 6
FLOW_CONTROL_ERROR = 7
STREAM_IN_USE = 8
STREAM_ALREADY_CLOSED = 9

SETTINGS_INITIAL_WINDOW_SIZE = 7
DEFAULT_WINDOW = 65536
VERSION = 3
MAX_DATA_FRAME = 32 * 1024
# Header blocks from kubectl are tiny; the limits only stop a hostile peer.
MAX_CONTROL_PAYLOAD = 1 << 20
MAX_HEADER_BLOCK = 1 << 20
_MAX_WINDOW = 0x7FFFFFFF
_UPDATE_THRESHOLD = DEFAULT_WINDOW // 2

_SYN_STREAM, _SYN_REPLY, _RST_STREAM, _SETTINGS = 1, 2, 3, 4
_PING, _GOAWAY, _HEADERS, _WINDOW_UPDATE = 6, 7, 8, 9
_FLAG_FIN = 0x01
_FLAG_UNIDIRECTIONAL = 0x02

# The SPDY/3 header compression dictionary (draft 3, section 2.6.10.1): a
# protocol constant both ends must share byte for byte.
DICTIONARY = (
    b"\x00\x00\x00\x07options\x00\x00\x00\x04head\x00\x00\x00\x04post\x00\x00\x00\x03put"
    b"\x00\x00\x00\x06delete\x00\x00\x00\x05trace\x00\x00\x00\x06accept"
    b"\x00\x00\x00\x0eaccept-charset\x00\x00\x00\x0faccept-encoding"
    b"\x00\x00\x00\x0faccept-language\x00\x00\x00\x0daccept-ranges\x00\x00\x00\x03age"
    b"\x00\x00\x00\x05allow\x00\x00\x00\x0dauthorization\x00\x00\x00\x0dcache-control"
    b"\x00\x00\x00\x0aconnection\x00\x00\x00\x0ccontent-base"
    b"\x00\x00\x00\x10content-encoding\x00\x00\x00\x10content-language"
    b"\x00\x00\x00\x0econtent-length\x00\x00\x00\x10content-location"
    b"\x00\x00\x00\x0bcontent-md5\x00\x00\x00\x0dcontent-range\x00\x00\x00\x0ccontent-type"
    b"\x00\x00\x00\x04date\x00\x00\x00\x04etag\x00\x00\x00\x06expect"
    b"\x00\x00\x00\x07expires\x00\x00\x00\x04from\x00\x00\x00\x04host"
    b"\x00\x00\x00\x08if-match\x00\x00\x00\x11if-modified-since"
    b"\x00\x00\x00\x0dif-none-match\x00\x00\x00\x08if-range"
    b"\x00\x00\x00\x13if-unmodified-since\x00\x00\x00\x0dlast-modified"
    b"\x00\x00\x00\x08location\x00\x00\x00\x0cmax-forwards\x00\x00\x00\x06pragma"
    b"\x00\x00\x00\x12proxy-authenticate\x00\x00\x00\x13proxy-authorization"
    b"\x00\x00\x00\x05range\x00\x00\x00\x07referer\x00\x00\x00\x0bretry-after"
    b"\x00\x00\x00\x06server\x00\x00\x00\x02te\x00\x00\x00\x07trailer"
    b"\x00\x00\x00\x11transfer-encoding\x00\x00\x00\x07upgrade\x00\x00\x00\x0auser-agent"
    b"\x00\x00\x00\x04vary\x00\x00\x00\x03via\x00\x00\x00\x07warning"
    b"\x00\x00\x00\x10www-authenticate\x00\x00\x00\x06method\x00\x00\x00\x03get"
    b"\x00\x00\x00\x06status\x00\x00\x00\x06200 OK\x00\x00\x00\x07version"
    b"\x00\x00\x00\x08HTTP/1.1\x00\x00\x00\x03url\x00\x00\x00\x06public"
    b"\x00\x00\x00\x0aset-cookie\x00\x00\x00\x0akeep-alive\x00\x00\x00\x06origin"
    b"100101201202205206300302303304305306307402405406407408409410411412413414415416417"
    b"502504505"
    b"203 Non-Authoritative Information204 No Content301 Moved Permanently"
    b"400 Bad Request401 Unauthorized403 Forbidden404 Not Found"
    b"500 Internal Server Error501 Not Implemented503 Service Unavailable"
    b"Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 "
    b"Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT"
    b"chunked,text/html,image/png,image/jpg,image/gif,application/xml,"
    b"application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age="
    b"gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0."
)

HeaderValue = str | Sequence[str]


class ProtocolError(Exception):
    """The peer broke the protocol; the connection cannot continue."""


class FlowControlError(ValueError):
    """More data was offered than the peer's (enforced) window allows."""


class StreamClosedError(ValueError):
    """The stream is unknown, reset, or already finished on our side."""


@dataclass(frozen=True)
class StreamOpened:
    stream_id: int
    headers: dict[str, str]
    fin: bool
    associated_id: int


@dataclass(frozen=True)
class StreamReplied:
    stream_id: int
    headers: dict[str, str]
    fin: bool


@dataclass(frozen=True)
class HeadersReceived:
    stream_id: int
    headers: dict[str, str]
    fin: bool


@dataclass(frozen=True)
class DataReceived:
    stream_id: int
    data: bytes
    fin: bool


@dataclass(frozen=True)
class StreamReset:
    stream_id: int
    status: int


@dataclass(frozen=True)
class PingReceived:
    ping_id: int


@dataclass(frozen=True)
class PingAcknowledged:
    ping_id: int


@dataclass(frozen=True)
class SettingsReceived:
    settings: dict[int, int]


@dataclass(frozen=True)
class WindowUpdated:
    stream_id: int
    delta: int


@dataclass(frozen=True)
class GoAwayReceived:
    last_stream_id: int
    status: int


Event = (
    StreamOpened
    | StreamReplied
    | HeadersReceived
    | DataReceived
    | StreamReset
    | PingReceived
    | PingAcknowledged
    | SettingsReceived
    | WindowUpdated
    | GoAwayReceived
)


def header_values(headers: Mapping[str, str], name: str) -> list[str]:
    """The values of a header; several values travel NUL-joined in one entry."""
    value = headers.get(name.lower())
    return [] if value is None else value.split("\x00")


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
        self._compress = zlib.compressobj(
            9, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY, DICTIONARY
        )
        self._decompress = zlib.decompressobj(zdict=DICTIONARY)
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
        if stream_id > _MAX_WINDOW:
            raise StreamClosedError("stream ids exhausted")
        self._next_id += 2
        block = self._encode_headers(headers)
        payload = struct.pack(">IIBB", stream_id, associated_id, priority << 5, 0) + block
        self._control(_SYN_STREAM, _FLAG_FIN if fin else 0, payload)
        self._streams[stream_id] = _Stream(self._initial_send_window, local_closed=fin)
        return stream_id

    def reply(
        self, stream_id: int, headers: Mapping[str, HeaderValue] = {}, *, fin: bool = False
    ) -> None:
        stream = self._local_open(stream_id)
        if stream_id % 2 == self._next_id % 2 or stream.replied:
            raise StreamClosedError(f"stream {stream_id} cannot be replied to")
        stream.replied = True
        payload = struct.pack(">I", stream_id) + self._encode_headers(headers)
        self._control(_SYN_REPLY, _FLAG_FIN if fin else 0, payload)
        if fin:
            self._close_local(stream_id, stream)

    def send_headers(
        self, stream_id: int, headers: Mapping[str, HeaderValue], *, fin: bool = False
    ) -> None:
        stream = self._local_open(stream_id)
        payload = struct.pack(">I", stream_id) + self._encode_headers(headers)
        self._control(_HEADERS, _FLAG_FIN if fin else 0, payload)
        if fin:
            self._close_local(stream_id, stream)

    def send_data(self, stream_id: int, data: bytes, *, fin: bool = False) -> None:
        stream = self._local_open(stream_id)
        window = self.send_window(stream_id)
        if window is not None and len(data) > window:
            raise FlowControlError(f"{len(data)} bytes exceed send window {window}")
        view = memoryview(data)
        offset = 0
        while True:
            chunk = view[offset : offset + MAX_DATA_FRAME]
            offset += len(chunk)
            last = offset >= len(data)
            flags = _FLAG_FIN if fin and last else 0
            if chunk or flags:
                self._out += struct.pack(">II", stream_id, flags << 24 | len(chunk)) + chunk
            if last:
                break
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
            self._control(_RST_STREAM, 0, struct.pack(">II", stream_id, status))

    def ping(self) -> int:
        ping_id = self._next_ping
        self._next_ping = ping_id + 2 if ping_id + 2 <= 0xFFFFFFFF else ping_id % 2 or 2
        self._control(_PING, 0, struct.pack(">I", ping_id))
        return ping_id

    def go_away(self, status: int = 0) -> None:
        self.go_away_sent = True
        self._control(_GOAWAY, 0, struct.pack(">II", self._last_remote_id, status))

    def acknowledge(self, stream_id: int, n: int) -> None:
        """Record that the caller consumed ``n`` bytes; updates go out in batches."""
        if n < 0:
            raise ValueError("cannot acknowledge a negative amount")
        stream = self._streams.get(stream_id)
        if stream is not None and not stream.remote_closed:
            stream.unacked += n
            if stream.unacked >= _UPDATE_THRESHOLD:
                self._window_update(stream_id, stream.unacked)
                stream.unacked = 0
        self._session_unacked += n
        if self._session_unacked >= _UPDATE_THRESHOLD:
            self._window_update(0, self._session_unacked)
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
            while len(buf) - pos >= 8:
                length = int.from_bytes(buf[pos + 5 : pos + 8], "big")
                if buf[pos] & 0x80 and length > MAX_CONTROL_PAYLOAD:
                    raise ProtocolError(f"control frame of {length} bytes is too large")
                if len(buf) - pos < 8 + length:
                    break
                head = bytes(buf[pos : pos + 8])
                payload = bytes(buf[pos + 8 : pos + 8 + length])
                pos += 8 + length
                self._on_frame(head, payload, events)
        finally:
            # One compaction per call keeps many small frames from costing O(n^2).
            del buf[:pos]
        return events

    def _on_frame(self, head: bytes, payload: bytes, events: list[Event]) -> None:
        if head[0] & 0x80:
            version = int.from_bytes(head[0:2], "big") & 0x7FFF
            if version != VERSION:
                raise ProtocolError(f"unsupported SPDY version {version}")
            kind = int.from_bytes(head[2:4], "big")
            self._on_control(kind, head[4], payload, events)
        else:
            self._on_data(int.from_bytes(head[0:4], "big"), head[4], payload, events)

    def _on_data(self, stream_id: int, flags: int, data: bytes, events: list[Event]) -> None:
        stream = self._known(stream_id, "DATA")
        if stream is None:
            self.acknowledge(0, len(data))
            return
        if stream.remote_closed:
            self._already_closed(stream_id, events)
            return
        fin = bool(flags & _FLAG_FIN)
        events.append(DataReceived(stream_id, data, fin))
        if fin:
            self._close_remote(stream_id, stream)

    def _on_control(self, kind: int, flags: int, payload: bytes, events: list[Event]) -> None:
        fin = bool(flags & _FLAG_FIN)
        if kind == _SYN_STREAM:
            self._need(payload, 10, "SYN_STREAM")
            stream_id, associated = struct.unpack_from(">II", payload)
            stream_id &= _MAX_WINDOW
            headers = self._decode_headers(payload[10:])
            if stream_id == 0 or stream_id % 2 == self._next_id % 2:
                raise ProtocolError(f"SYN_STREAM with wrong parity id {stream_id}")
            if stream_id <= self._last_remote_id:
                raise ProtocolError(f"SYN_STREAM id {stream_id} does not increase")
            self._last_remote_id = stream_id
            if self.go_away_sent:
                self._control(_RST_STREAM, 0, struct.pack(">II", stream_id, REFUSED_STREAM))
                return
            local = bool(flags & _FLAG_UNIDIRECTIONAL)
            stream = _Stream(self._initial_send_window, local_closed=local, remote_closed=fin)
            self._streams[stream_id] = stream
            events.append(StreamOpened(stream_id, headers, fin, associated & _MAX_WINDOW))
            if local and fin:
                self._streams.pop(stream_id)
        elif kind in (_SYN_REPLY, _HEADERS):
            self._need(payload, 4, "SYN_REPLY/HEADERS")
            stream_id = int.from_bytes(payload[:4], "big") & _MAX_WINDOW
            headers = self._decode_headers(payload[4:])
            known = self._known(stream_id, "SYN_REPLY" if kind == _SYN_REPLY else "HEADERS")
            if known is None:
                return
            if known.remote_closed:
                self._already_closed(stream_id, events)
                return
            if kind == _SYN_REPLY:
                if stream_id % 2 != self._next_id % 2 or known.replied:
                    raise ProtocolError(f"unexpected SYN_REPLY for stream {stream_id}")
                known.replied = True
                events.append(StreamReplied(stream_id, headers, fin))
            else:
                events.append(HeadersReceived(stream_id, headers, fin))
            if fin:
                self._close_remote(stream_id, known)
        elif kind == _RST_STREAM:
            self._need(payload, 8, "RST_STREAM", exact=True)
            stream_id, status = struct.unpack(">II", payload)
            stream_id &= _MAX_WINDOW
            if self._streams.pop(stream_id, None) is not None:
                events.append(StreamReset(stream_id, status))
        elif kind == _SETTINGS:
            self._on_settings(payload, events)
        elif kind == _PING:
            self._need(payload, 4, "PING", exact=True)
            (ping_id,) = struct.unpack(">I", payload)
            if ping_id % 2 == self._next_ping % 2:
                events.append(PingAcknowledged(ping_id))
            else:
                self._control(_PING, 0, payload)
                events.append(PingReceived(ping_id))
        elif kind == _GOAWAY:
            self._need(payload, 8, "GOAWAY", exact=True)
            last, status = struct.unpack(">II", payload)
            self.go_away_received = True
            events.append(GoAwayReceived(last & _MAX_WINDOW, status))
        elif kind == _WINDOW_UPDATE:
            self._need(payload, 8, "WINDOW_UPDATE", exact=True)
            stream_id, delta = struct.unpack(">II", payload)
            stream_id &= _MAX_WINDOW
            delta &= _MAX_WINDOW
            self.peer_flow_control = True
            if stream_id == 0:
                self._session_send += delta
            elif (target := self._streams.get(stream_id)) is not None:
                target.send_window += delta
            else:
                return
            events.append(WindowUpdated(stream_id, delta))
        # Other control frame types (NOOP, CREDENTIAL, future ones) are skipped.

    def _on_settings(self, payload: bytes, events: list[Event]) -> None:
        self._need(payload, 4, "SETTINGS")
        (count,) = struct.unpack_from(">I", payload)
        if len(payload) != 4 + 8 * count:
            raise ProtocolError("SETTINGS length does not match its entry count")
        settings: dict[int, int] = {}
        for i in range(count):
            flag_id, value = struct.unpack_from(">II", payload, 4 + 8 * i)
            settings[flag_id & 0xFFFFFF] = value
        if SETTINGS_INITIAL_WINDOW_SIZE in settings:
            new = settings[SETTINGS_INITIAL_WINDOW_SIZE]
            if new > _MAX_WINDOW:
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
        self._control(_RST_STREAM, 0, struct.pack(">II", stream_id, STREAM_ALREADY_CLOSED))
        events.append(StreamReset(stream_id, STREAM_ALREADY_CLOSED))

    @staticmethod
    def _need(payload: bytes, size: int, what: str, *, exact: bool = False) -> None:
        if len(payload) < size or (exact and len(payload) != size):
            raise ProtocolError(f"{what} frame has a bad length {len(payload)}")

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

    def _control(self, kind: int, flags: int, payload: bytes) -> None:
        if len(payload) > 0xFFFFFF:
            raise ValueError("control frame payload too large")
        head = struct.pack(">HHI", 0x8000 | VERSION, kind, flags << 24 | len(payload))
        self._out += head + payload

    def _window_update(self, stream_id: int, delta: int) -> None:
        self._control(_WINDOW_UPDATE, 0, struct.pack(">II", stream_id, delta))

    def _encode_headers(self, headers: Mapping[str, HeaderValue]) -> bytes:
        merged: dict[bytes, list[str]] = {}
        for name, value in headers.items():
            values = [value] if isinstance(value, str) else list(value)
            merged.setdefault(name.lower().encode(), []).extend(values)
        parts = [struct.pack(">I", len(merged))]
        for name_bytes, values in merged.items():
            raw = "\x00".join(values).encode("utf-8", "surrogateescape")
            parts += [
                struct.pack(">I", len(name_bytes)),
                name_bytes,
                struct.pack(">I", len(raw)),
                raw,
            ]
        block = b"".join(parts)
        return self._compress.compress(block) + self._compress.flush(zlib.Z_SYNC_FLUSH)

    def _decode_headers(self, compressed: bytes) -> dict[str, str]:
        try:
            block = self._decompress.decompress(compressed, MAX_HEADER_BLOCK)
        except zlib.error as exc:
            raise ProtocolError(f"header block does not decompress: {exc}") from None
        if self._decompress.unconsumed_tail:
            raise ProtocolError("header block is too large")
        try:
            (count,) = struct.unpack_from(">I", block)
            offset = 4
            headers: dict[str, str] = {}
            for _ in range(count):
                (n,) = struct.unpack_from(">I", block, offset)
                name = block[offset + 4 : offset + 4 + n]
                offset += 4 + n
                (n,) = struct.unpack_from(">I", block, offset)
                value = block[offset + 4 : offset + 4 + n]
                offset += 4 + n
                if offset > len(block):
                    raise struct.error("header block is truncated")
                key = name.decode("utf-8", "surrogateescape").lower()
                text = value.decode("utf-8", "surrogateescape")
                headers[key] = f"{headers[key]}\x00{text}" if key in headers else text
        except struct.error as exc:
            raise ProtocolError(f"malformed header block: {exc}") from None
        if offset != len(block):
            raise ProtocolError("header block has trailing bytes")
        return headers
