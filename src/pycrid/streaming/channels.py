"""The Kubernetes WebSocket channel protocol, on whole messages (sans-IO).

kubectl, client-go and the API server multiplex exec, attach and port-forward
streams over one WebSocket by prefixing every message with a channel number.
This module turns (channel, bytes) into messages and back; the WebSocket
framing itself, the handshake and the sockets live elsewhere (``wsproto``).

Two encodings exist. The binary subprotocols put the channel in the first
byte and send binary frames. The base64 subprotocols (for browsers that could
not send binary frames) put the channel as an ASCII digit ``'0' + n`` and then
the base64 of the payload, and send text frames.

v5 adds one control message: channel 255 followed by exactly one byte, the
channel the peer has finished writing (a half-close, so stdin EOF can reach a
process over WebSocket).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

# ---------------------------------------------------------------- subprotocols

#: No ``Sec-WebSocket-Protocol`` header at all: binary, version 1.
PROTOCOL_PLAIN: Final = ""
#: Binary channels, pre-v4 (the error channel carries plain text).
PROTOCOL_CHANNEL: Final = "channel.k8s.io"
#: Base64 channels, pre-v4.
PROTOCOL_BASE64_CHANNEL: Final = "base64.channel.k8s.io"
#: Binary channels; the error channel carries a JSON metav1.Status (exit codes).
PROTOCOL_V4_CHANNEL: Final = "v4.channel.k8s.io"
#: Base64 channels with the v4 status.
PROTOCOL_V4_BASE64_CHANNEL: Final = "v4.base64.channel.k8s.io"
#: v4 plus the CLOSE (half-close) signal on channel 255. Binary only.
PROTOCOL_V5_CHANNEL: Final = "v5.channel.k8s.io"

#: The SPDY subprotocol for port-forward (``X-Stream-Protocol-Version``).
PORT_FORWARD_SPDY_PROTOCOL: Final = "portforward.k8s.io"

#: Every WebSocket subprotocol this codec understands for exec and attach.
#: containerd accepts all but v5; client-go's WebSocket executor (crictl
#: ``--transport websocket``) offers only v5, so a server that wants those
#: clients must list it.
REMOTE_COMMAND_WS_PROTOCOLS: Final[tuple[str, ...]] = (
    PROTOCOL_V5_CHANNEL,
    PROTOCOL_V4_CHANNEL,
    PROTOCOL_V4_BASE64_CHANNEL,
    PROTOCOL_CHANNEL,
    PROTOCOL_BASE64_CHANNEL,
    PROTOCOL_PLAIN,
)

#: The WebSocket subprotocols the kubelet (and containerd) accept for port-forward.
PORT_FORWARD_WS_PROTOCOLS: Final[tuple[str, ...]] = (
    PROTOCOL_PLAIN,
    PROTOCOL_V4_CHANNEL,
    PROTOCOL_V4_BASE64_CHANNEL,
)

#: client-go's port-forward over WebSocket (kubectl's default since 1.31, crictl's
#: ``port-forward -r websocket``): SPDY tunnelled in binary messages. The API server
#: accepts it and speaks SPDY on to the kubelet; the kubelet and containerd do not.
PORT_FORWARD_TUNNEL_PROTOCOL: Final = "SPDY/3.1+" + PORT_FORWARD_SPDY_PROTOCOL

# ---------------------------------------------------------------- channel numbers

# The first three match the POSIX file descriptors, by convention.
STDIN: Final = 0
STDOUT: Final = 1
STDERR: Final = 2
#: Server to client: the final status of the command (see ``side_streams.py``).
ERROR: Final = 3
#: Client to server: JSON terminal sizes (see ``side_streams.ResizeDecoder``).
RESIZE: Final = 4
#: v5 only: "I will write no more on channel N".
CLOSE: Final = 255

# In base64 mode the channel is the single character '0' + n. Go writes
# string(rune('0' + n)), which is one byte only while it stays ASCII.
_MAX_BASE64_CHANNEL: Final = 0x7F - ord("0")
_BASE64_BODY = re.compile(rb"[A-Za-z0-9+/]*={0,2}")


class ChannelError(ValueError):
    """A message that does not follow the channel protocol."""


@dataclass(frozen=True, slots=True)
class ChannelData:
    """Payload ``data`` on ``channel``."""

    channel: int
    data: bytes


@dataclass(frozen=True, slots=True)
class ChannelClose:
    """v5: the peer has finished writing on ``channel``."""

    channel: int


ChannelMessage = ChannelData | ChannelClose


def choose_subprotocol(offered: Sequence[str], supported: Sequence[str]) -> str | None:
    """The subprotocol to answer with, or None to refuse the upgrade.

    Mirrors wsstream's handshake: the client's order wins (the first offered
    one we support), and a client that sends no ``Sec-WebSocket-Protocol``
    header is treated as offering only "" (the plain binary protocol), so it is
    accepted only when "" is supported. A client that offers protocols none of
    which match is refused; Kubernetes does not fall back to "" in that case.
    Blank entries (from a header such as ``"a, ,b"``) are ignored.
    """
    names = [name.strip() for name in offered]
    names = [name for name in names if name]
    if not names:
        return PROTOCOL_PLAIN if PROTOCOL_PLAIN in supported else None
    for name in names:
        if name in supported:
            return name
    return None


_VERSIONS: Final[dict[str, tuple[bool, int]]] = {
    PROTOCOL_PLAIN: (True, 1),
    PROTOCOL_CHANNEL: (True, 1),
    PROTOCOL_BASE64_CHANNEL: (False, 1),
    PROTOCOL_V4_CHANNEL: (True, 4),
    PROTOCOL_V4_BASE64_CHANNEL: (False, 4),
    PROTOCOL_V5_CHANNEL: (True, 5),
}


class ChannelCodec:
    """Encodes and decodes whole WebSocket messages for one negotiated subprotocol.

    ``encode`` returns bytes (send as a binary frame) in binary mode and str
    (send as a text frame) in base64 mode. ``decode`` accepts either type in
    both modes, as the Go server does. Channel numbers are not checked against
    the channels a session uses: the server ignores data for unknown channels,
    and only it knows which exist.
    """

    __slots__ = ("binary", "subprotocol", "version")

    def __init__(self, subprotocol: str) -> None:
        try:
            binary, version = _VERSIONS[subprotocol]
        except KeyError:
            raise ValueError(f"unknown channel subprotocol {subprotocol!r}") from None
        self.subprotocol: Final = subprotocol
        self.binary: Final = binary
        self.version: Final = version

    def __repr__(self) -> str:
        return f"ChannelCodec({self.subprotocol!r})"

    @property
    def supports_close(self) -> bool:
        """Whether the CLOSE signal exists (v5 only)."""
        return self.version >= 5

    def encode(self, channel: int, data: bytes) -> bytes | str:
        """One message carrying ``data`` (which may be empty) on ``channel``."""
        if self.binary:
            # 255 is the close signal in v5 and reserved before it.
            if not 0 <= channel < CLOSE:
                raise ChannelError(f"channel {channel} is out of range 0..{CLOSE - 1}")
            return bytes((channel,)) + data
        if not 0 <= channel <= _MAX_BASE64_CHANNEL:
            raise ChannelError(
                f"channel {channel} is out of range 0..{_MAX_BASE64_CHANNEL} for base64"
            )
        return chr(ord("0") + channel) + base64.b64encode(data).decode("ascii")

    def encode_close(self, channel: int) -> bytes:
        """The v5 message saying we will write no more on ``channel``."""
        if not self.supports_close:
            raise ChannelError(f"subprotocol {self.subprotocol!r} has no close signal")
        if not 0 <= channel < CLOSE:
            raise ChannelError(f"channel {channel} is out of range 0..{CLOSE - 1}")
        return bytes((CLOSE, channel))

    def decode(self, message: bytes | str) -> ChannelMessage:
        """The channel and payload of one received message.

        Raises ChannelError for an empty message (the Go server silently skips
        those; callers that want to be as lenient can catch and drop), for a
        malformed close signal and for bad base64.
        """
        raw = message.encode("utf-8") if isinstance(message, str) else bytes(message)
        if not raw:
            raise ChannelError("empty message: no channel number")
        first = raw[0]
        if self.supports_close and first == CLOSE:
            if len(raw) != 2:
                raise ChannelError(
                    f"close signal must carry exactly one channel byte, got {len(raw) - 1}"
                )
            return ChannelClose(raw[1])
        if self.binary:
            return ChannelData(first, raw[1:])
        channel = first - ord("0")
        if not 0 <= channel <= _MAX_BASE64_CHANNEL:
            raise ChannelError(f"bad channel character {chr(first)!r} in base64 message")
        return ChannelData(channel, _b64decode(raw[1:], channel))


def _b64decode(body: bytes, channel: int) -> bytes:
    # Go's StdEncoding skips CR and LF but is otherwise strict about the
    # alphabet and the padding; Python's validate=True rejects newlines.
    body = body.replace(b"\r", b"").replace(b"\n", b"")
    if _BASE64_BODY.fullmatch(body) is None:
        raise ChannelError(f"invalid base64 payload on channel {channel}: bad character")
    try:
        return base64.b64decode(body, validate=True)
    except binascii.Error as exc:
        raise ChannelError(f"invalid base64 payload on channel {channel}: {exc}") from None


# ---------------------------------------------------------------- port-forward

#: The query parameter naming the ports of a WebSocket port-forward.
PORT_QUERY_PARAMETER: Final = "port"
#: Channels come in pairs per port; 2 * 127 - 1 = 253 keeps the error
#: channel of the last port below the reserved 255.
MAX_PORT_FORWARD_PORTS: Final = 127
_DIGITS = re.compile(r"[0-9]+")


def port_forward_channels(index: int) -> tuple[int, int]:
    """The (data, error) channels of the ``index``-th requested port."""
    if not 0 <= index < MAX_PORT_FORWARD_PORTS:
        raise ValueError(f"port index {index} is out of range 0..{MAX_PORT_FORWARD_PORTS - 1}")
    return 2 * index, 2 * index + 1


def port_prefix(port: int) -> bytes:
    """The first payload the server sends on both channels of a port.

    It is the port as an unsigned 16-bit little-endian number, so the client
    can tell which channel pair belongs to which of its ports.
    """
    if not 1 <= port <= 0xFFFF:
        raise ValueError(f"port {port} is out of range 1..65535")
    return struct.pack("<H", port)


def split_port_prefix(data: bytes) -> tuple[int, bytes]:
    """Client side: the port announced at the start of a channel, and the rest."""
    if len(data) < 2:
        raise ChannelError(f"port prefix needs 2 bytes, got {len(data)}")
    (port,) = struct.unpack_from("<H", data)
    return port, bytes(data[2:])


def parse_ports(query_values: list[str]) -> list[int]:
    """The ports of a WebSocket port-forward, from every ``port`` query value.

    Like the kubelet: the parameter may repeat and each value may hold a
    comma-separated list; each port is a plain decimal number 1..65535.
    Duplicates are kept. Errors are ValueErrors worded like the kubelet's.
    """
    if not query_values:
        raise ValueError(f'query parameter "{PORT_QUERY_PARAMETER}" is required')
    ports: list[int] = []
    for value in query_values:
        if not value:
            raise ValueError(f'query parameter "{PORT_QUERY_PARAMETER}" cannot be empty')
        for item in value.split(","):
            # Go's ParseUint: ASCII digits only (no sign, spaces or underscores).
            if _DIGITS.fullmatch(item) is None:
                raise ValueError(f"unable to parse {_quote(item)} as a port: not a decimal number")
            port = int(item)
            if port > 0xFFFF:
                raise ValueError(f"unable to parse {_quote(item)} as a port: out of range")
            if port < 1:
                raise ValueError(f"port {_quote(item)} must be > 0")
            ports.append(port)
    if len(ports) > MAX_PORT_FORWARD_PORTS:
        raise ValueError(
            f"too many ports: {len(ports)} requested, at most {MAX_PORT_FORWARD_PORTS}"
        )
    return ports


def _quote(text: str) -> str:
    # Double quotes with escapes, like Go's %q, so odd input stays readable.
    return json.dumps(text)
