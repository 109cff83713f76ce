"""The SPDY/3.1 wire format, sans-IO: frames to bytes and back, and the zlib-compressed
header blocks.

Kept apart from the connection state (:mod:`pycrid.streaming.spdy`) so the bit layout
of each frame is in one place and the state machine reads as protocol rules. Header
blocks share one zlib context per direction for the whole connection, so a block that
fails to decompress desynchronises every later one: that is a ``ProtocolError``.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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
#: Stream ids, windows and deltas are 31-bit.
MAX_31BIT = 0x7FFFFFFF

SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS = 1, 2, 3, 4
PING, GOAWAY, HEADERS, WINDOW_UPDATE = 6, 7, 8, 9
FLAG_FIN = 0x01
FLAG_UNIDIRECTIONAL = 0x02

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


#: The ``kind`` of a DATA frame: no control type (a control frame of type 0, unused by
#: the spec, is skipped like any unknown type, so DATA cannot share that number).
DATA = -1


@dataclass(frozen=True)
class Frame:
    """One frame off the wire: a control frame (``kind`` is its type) or a DATA frame
    (``kind`` is :data:`DATA`, ``stream_id`` its stream)."""

    kind: int
    flags: int
    payload: bytes
    stream_id: int = 0

    @property
    def fin(self) -> bool:
        return bool(self.flags & FLAG_FIN)


def parse_frame(buf: bytearray, pos: int) -> tuple[Frame, int] | None:
    """The frame at ``pos`` of ``buf`` and the offset after it; None while it is still
    incomplete. A control frame of another version, or too large, is a ProtocolError."""
    if len(buf) - pos < 8:
        return None
    length = int.from_bytes(buf[pos + 5 : pos + 8], "big")
    control = bool(buf[pos] & 0x80)
    if control and length > MAX_CONTROL_PAYLOAD:
        raise ProtocolError(f"control frame of {length} bytes is too large")
    end = pos + 8 + length
    if len(buf) < end:
        return None
    head = bytes(buf[pos : pos + 8])
    payload = bytes(buf[pos + 8 : end])
    if not control:
        return Frame(DATA, head[4], payload, int.from_bytes(head[0:4], "big")), end
    version = int.from_bytes(head[0:2], "big") & 0x7FFF
    if version != VERSION:
        raise ProtocolError(f"unsupported SPDY version {version}")
    return Frame(int.from_bytes(head[2:4], "big"), head[4], payload), end


def need(payload: bytes, size: int, what: str, *, exact: bool = False) -> None:
    """A control payload of at least (or exactly) ``size`` bytes, or a ProtocolError."""
    if len(payload) < size or (exact and len(payload) != size):
        raise ProtocolError(f"{what} frame has a bad length {len(payload)}")


def parse_settings(payload: bytes) -> dict[int, int]:
    need(payload, 4, "SETTINGS")
    (count,) = struct.unpack_from(">I", payload)
    if len(payload) != 4 + 8 * count:
        raise ProtocolError("SETTINGS length does not match its entry count")
    settings: dict[int, int] = {}
    for i in range(count):
        flag_id, value = struct.unpack_from(">II", payload, 4 + 8 * i)
        settings[flag_id & 0xFFFFFF] = value
    return settings


# ---- outgoing frames ---------------------------------------------------------------------


def control_frame(kind: int, flags: int, payload: bytes) -> bytes:
    if len(payload) > 0xFFFFFF:
        raise ValueError("control frame payload too large")
    return struct.pack(">HHI", 0x8000 | VERSION, kind, flags << 24 | len(payload)) + payload


def data_frames(stream_id: int, data: bytes, *, fin: bool) -> bytes:
    """``data`` as DATA frames of at most MAX_DATA_FRAME bytes, FIN on the last one (an
    empty frame when ``data`` is empty and ``fin`` is set; nothing when neither)."""
    out = bytearray()
    view = memoryview(data)
    offset = 0
    while True:
        chunk = view[offset : offset + MAX_DATA_FRAME]
        offset += len(chunk)
        last = offset >= len(data)
        flags = FLAG_FIN if fin and last else 0
        if chunk or flags:
            out += struct.pack(">II", stream_id, flags << 24 | len(chunk)) + chunk
        if last:
            return bytes(out)


def pair_frame(kind: int, first: int, second: int) -> bytes:
    """RST_STREAM, GOAWAY and WINDOW_UPDATE: two 32-bit words and no flags."""
    return control_frame(kind, 0, struct.pack(">II", first, second))


# ---- header blocks -----------------------------------------------------------------------


class HeaderBlocks:
    """The two zlib contexts of a connection (ours and the peer's), each shared by every
    header block in its direction."""

    def __init__(self) -> None:
        self._compress = zlib.compressobj(
            9, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY, DICTIONARY
        )
        self._decompress = zlib.decompressobj(zdict=DICTIONARY)

    def encode(self, headers: Mapping[str, HeaderValue]) -> bytes:
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

    def decode(self, compressed: bytes) -> dict[str, str]:
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


def header_values(headers: Mapping[str, str], name: str) -> list[str]:
    """The values of a header; several values travel NUL-joined in one entry."""
    value = headers.get(name.lower())
    return [] if value is None else value.split("\x00")
