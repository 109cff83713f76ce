"""ttrpc as a sans-IO state machine: bytes in, events out, bytes to send back.

ttrpc (containerd/ttrpc) is gRPC without HTTP/2: every message is a 10-byte
big-endian header (payload length, stream id, type, flags) followed by a
protobuf ``ttrpc.Request`` or ``ttrpc.Response``. NRI only makes unary calls:
one Request, one Response, flags 0. Nothing here touches a socket; the asyncio
shell in ``pycrid.nri.wire.connection`` feeds bytes in and writes bytes out, and
the tests drive these classes directly (h11 is the model).

Behaviour follows the Go implementation (channel.go, server.go): odd, strictly
increasing client stream ids; a message over 4 MiB is refused by the sender and
skipped and answered with ResourceExhausted by the receiver; an unknown service
or method answers Unimplemented; a missing status or code 0 means OK.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from google.protobuf.message import DecodeError
from google.rpc import status_pb2

from pycrid.nri.proto import ttrpc_pb2

HEADER = struct.Struct(">IIBB")
HEADER_SIZE = HEADER.size
MAX_MESSAGE_SIZE = 4 << 20
"""Largest payload (excluding the header) either side accepts."""


class MessageType(enum.IntEnum):
    REQUEST = 1
    RESPONSE = 2
    DATA = 3


class Code(enum.IntEnum):
    """gRPC status codes, which ttrpc reuses in google.rpc.Status."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


def code_name(code: int) -> str:
    try:
        return Code(code).name
    except ValueError:
        return f"code {code}"


class TtrpcError(Exception):
    """A call that ended with a non-OK status (from the peer or from us)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code_name(code)}: {message}")
        self.code = code
        self.message = message


class ProtocolError(Exception):
    """The peer broke the framing; the connection cannot continue."""


# ---------------------------------------------------------------- framing


@dataclass(frozen=True, slots=True)
class Message:
    """One whole ttrpc message as read off the stream."""

    stream_id: int
    type: int
    flags: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Oversized:
    """A message whose declared length exceeded the limit; its body was skipped."""

    stream_id: int
    type: int
    length: int


def encode_message(stream_id: int, type_: int, payload: bytes, flags: int = 0) -> bytes:
    """Header plus payload; refuses what the peer would refuse (ResourceExhausted)."""
    if len(payload) > MAX_MESSAGE_SIZE:
        raise TtrpcError(
            Code.RESOURCE_EXHAUSTED,
            f"message length {len(payload)} exceeds maximum message size of {MAX_MESSAGE_SIZE}",
        )
    return HEADER.pack(len(payload), stream_id, type_, flags) + payload


class MessageReader:
    """Cuts a byte stream into ttrpc messages, skipping oversized ones without
    buffering them (the Go reader discards them the same way)."""

    def __init__(self, max_size: int = MAX_MESSAGE_SIZE) -> None:
        self._buf = bytearray()
        self._max = max_size
        self._skip = 0

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete message held back (non-zero at EOF = truncated)."""
        return len(self._buf) + self._skip

    def feed(self, data: bytes) -> list[Message | Oversized]:
        out: list[Message | Oversized] = []
        view = memoryview(data)
        if self._skip:
            n = min(self._skip, len(view))
            self._skip -= n
            view = view[n:]
        self._buf += view
        buf = self._buf
        pos = 0
        while len(buf) - pos >= HEADER_SIZE:
            length, stream_id, type_, flags = HEADER.unpack_from(buf, pos)
            if length > self._max:
                out.append(Oversized(stream_id, type_, length))
                avail = len(buf) - pos - HEADER_SIZE
                if avail >= length:
                    pos += HEADER_SIZE + length
                    continue
                self._skip = length - avail
                pos = len(buf)
                break
            end = pos + HEADER_SIZE + length
            if end > len(buf):
                break
            out.append(Message(stream_id, type_, flags, bytes(buf[pos + HEADER_SIZE : end])))
            pos = end
        del buf[:pos]
        return out


def _status(code: int, message: str) -> status_pb2.Status | None:
    return None if code == Code.OK else status_pb2.Status(code=code, message=message)


# ---------------------------------------------------------------- client side


@dataclass(frozen=True, slots=True)
class ResponseReceived:
    """The answer to the call on ``stream_id``; ``code`` 0 means success."""

    stream_id: int
    code: int
    message: str
    payload: bytes


class ClientProtocol:
    """The calling side of one ttrpc stream: numbers calls and parses answers."""

    def __init__(self) -> None:
        self._reader = MessageReader()
        self._next_id = 1

    @property
    def buffered(self) -> int:
        return self._reader.buffered

    def request(
        self,
        service: str,
        method: str,
        payload: bytes,
        *,
        timeout_nano: int = 0,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> tuple[int, bytes]:
        """A new call: its stream id and the bytes to send.

        Raises TtrpcError(ResourceExhausted) without consuming a stream id when
        the request is too large, as the Go client does.
        """
        req = ttrpc_pb2.Request(
            service=service,
            method=method,
            payload=payload,
            timeout_nano=max(0, timeout_nano),
            metadata=[ttrpc_pb2.KeyValue(key=k, value=v) for k, v in metadata],
        )
        data = encode_message(self._next_id, MessageType.REQUEST, req.SerializeToString())
        stream_id = self._next_id
        self._next_id += 2
        return stream_id, data

    def receive_data(self, data: bytes) -> list[ResponseReceived]:
        """Answers found in ``data``. Raises ProtocolError on bytes that are not ttrpc."""
        events: list[ResponseReceived] = []
        for item in self._reader.feed(data):
            if isinstance(item, Oversized):
                events.append(
                    ResponseReceived(
                        item.stream_id,
                        Code.RESOURCE_EXHAUSTED,
                        f"message length {item.length} exceeds maximum message size "
                        f"of {MAX_MESSAGE_SIZE}",
                        b"",
                    )
                )
                continue
            if item.type != MessageType.RESPONSE:
                raise ProtocolError(f"expected a response, got message type {item.type}")
            resp = ttrpc_pb2.Response()
            try:
                resp.ParseFromString(item.payload)
            except DecodeError as exc:
                raise ProtocolError(f"undecodable response on stream {item.stream_id}") from exc
            status = resp.status
            events.append(
                ResponseReceived(item.stream_id, status.code, status.message, resp.payload)
            )
        return events


# ---------------------------------------------------------------- server side


@dataclass(frozen=True, slots=True)
class RequestReceived:
    """A call to dispatch; answer it with ``ServerProtocol.respond``."""

    stream_id: int
    service: str
    method: str
    payload: bytes
    timeout_nano: int
    metadata: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Rejected:
    """A request refused by the protocol itself; answer it with this status."""

    stream_id: int
    code: int
    message: str


class ServerProtocol:
    """The serving side of one ttrpc stream: validates and decodes requests."""

    def __init__(self) -> None:
        self._reader = MessageReader()
        self._last_id = 0

    @property
    def buffered(self) -> int:
        return self._reader.buffered

    def receive_data(self, data: bytes) -> list[RequestReceived | Rejected]:
        """Calls found in ``data``. Raises ProtocolError on bytes that are not ttrpc."""
        events: list[RequestReceived | Rejected] = []
        for item in self._reader.feed(data):
            events.extend(self._one(item))
        return events

    def _one(self, item: Message | Oversized) -> Iterable[RequestReceived | Rejected]:
        if isinstance(item, Oversized):
            yield Rejected(
                item.stream_id,
                Code.RESOURCE_EXHAUSTED,
                f"message length {item.length} exceeds maximum message size of {MAX_MESSAGE_SIZE}",
            )
            return
        if item.type not in (MessageType.REQUEST, MessageType.DATA):
            raise ProtocolError(f"expected a request, got message type {item.type}")
        if item.stream_id % 2 != 1:
            yield Rejected(
                item.stream_id,
                Code.INVALID_ARGUMENT,
                "StreamID must be odd for client initiated streams",
            )
            return
        if item.type == MessageType.DATA:
            # Only streaming calls send data messages; NRI has none, so no stream is open.
            yield Rejected(item.stream_id, Code.INVALID_ARGUMENT, "StreamID is no longer active")
            return
        if item.stream_id <= self._last_id:
            yield Rejected(
                item.stream_id,
                Code.INVALID_ARGUMENT,
                "StreamID cannot be re-used and must increment",
            )
            return
        self._last_id = item.stream_id
        req = ttrpc_pb2.Request()
        try:
            req.ParseFromString(item.payload)
        except DecodeError as exc:
            yield Rejected(item.stream_id, Code.INVALID_ARGUMENT, f"unmarshal request error: {exc}")
            return
        yield RequestReceived(
            item.stream_id,
            req.service,
            req.method,
            req.payload,
            req.timeout_nano,
            tuple((kv.key, kv.value) for kv in req.metadata),
        )

    def respond(
        self, stream_id: int, payload: bytes = b"", code: int = Code.OK, message: str = ""
    ) -> bytes:
        """The bytes of the answer to ``stream_id``.

        An OK answer carries no status at all, byte for byte what the Go server
        sends. A payload too large to send turns into a ResourceExhausted answer.
        """
        resp = ttrpc_pb2.Response(status=_status(code, message), payload=payload)
        body = resp.SerializeToString()
        if len(body) > MAX_MESSAGE_SIZE:
            resp = ttrpc_pb2.Response(
                status=_status(
                    Code.RESOURCE_EXHAUSTED,
                    f"message length {len(body)} exceeds maximum message size "
                    f"of {MAX_MESSAGE_SIZE}",
                )
            )
            body = resp.SerializeToString()
        return encode_message(stream_id, MessageType.RESPONSE, body)
