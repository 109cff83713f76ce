"""The NRI multiplexer as a sans-IO codec.

NRI runs two ttrpc streams over one unix socket: frames of
``[u32 conn id][u32 length][payload]`` (big-endian). Conn 1 carries the Plugin
service (the runtime calls the plugin), conn 2 the Runtime service (the plugin
calls the runtime). There is no open or close message; frames for a conn
nobody listens on are dropped.

Two rules come from the Go reader (containerd/nri pkg/net/multiplex), whose
ttrpc side reads through a 4096-byte bufio.Reader and fails with ENOMEM when a
frame is larger than the buffer it is read into:

* a message is never mixed with another in one frame;
* a message over 4096 bytes goes out as a first frame of exactly 4096 bytes and
  a second frame with the rest, as the Go writer's flush pattern produces.

Incoming frames are reassembled per conn as a plain byte stream, so any split
a peer chooses is accepted. Limits are upstream's: a frame payload above
10 bytes + 4 MiB, or more than 256 frames queued for one conn before they are
read, is a fatal error for the whole connection. (The asyncio shell consumes
each frame as it is parsed, through ``frames``, so only the first can happen
there.)
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterable, Iterator

FRAME_HEADER = struct.Struct(">II")
PLUGIN_SERVICE_CONN = 1
RUNTIME_SERVICE_CONN = 2
RESERVED_CONN = 0
MAX_FRAME_PAYLOAD = 10 + (4 << 20)
READ_QUEUE_LENGTH = 256
GO_READ_BUFFER = 4096


class MuxError(Exception):
    """A fatal multiplexer error: the whole connection must be closed."""


def encode(conn_id: int, message: bytes) -> bytes:
    """Frame one whole ttrpc message for ``conn_id`` the way the Go writer does."""
    if conn_id == RESERVED_CONN:
        raise ValueError("conn id 0 is reserved")
    parts = [message[:GO_READ_BUFFER]]
    rest = message[GO_READ_BUFFER:]
    while rest:
        parts.append(rest[:MAX_FRAME_PAYLOAD])
        rest = rest[MAX_FRAME_PAYLOAD:]
    return b"".join(FRAME_HEADER.pack(conn_id, len(p)) + p for p in parts)


def frame_sizes(conn_id: int, message: bytes) -> list[int]:
    """Payload sizes of the frames ``encode`` produces (for tests and logs)."""
    data = encode(conn_id, message)
    sizes = []
    pos = 0
    while pos < len(data):
        _, n = FRAME_HEADER.unpack_from(data, pos)
        sizes.append(n)
        pos += FRAME_HEADER.size + n
    return sizes


class Demultiplexer:
    """Splits an incoming byte stream into per-conn byte streams.

    ``receive_data`` queues whole frames per conn; ``read`` drains one conn's
    queue. Only the conns named at construction are open.
    """

    def __init__(
        self,
        conns: Iterable[int],
        *,
        queue_length: int = READ_QUEUE_LENGTH,
        max_payload: int = MAX_FRAME_PAYLOAD,
    ) -> None:
        self._queues: dict[int, deque[bytes]] = {c: deque() for c in conns}
        if RESERVED_CONN in self._queues:
            raise ValueError("conn id 0 is reserved")
        self._queue_length = queue_length
        self._max_payload = max_payload
        self._buf = bytearray()
        self.dropped_frames = 0

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete frame held back (non-zero at EOF = truncated)."""
        return len(self._buf)

    def receive_data(self, data: bytes) -> None:
        """Queue the frames completed by ``data``; raises MuxError on a fatal error."""
        for conn_id, payload in self.frames(data):
            queue = self._queues[conn_id]
            if len(queue) >= self._queue_length:
                raise MuxError(
                    f"read queue of conn {conn_id} overflowed ({self._queue_length} frames)"
                )
            queue.append(payload)

    def frames(self, data: bytes) -> Iterator[tuple[int, bytes]]:
        """The frames completed by ``data`` for open conns, one at a time, unqueued.

        For a consumer that handles each frame as it is parsed (the asyncio
        shell): nothing waits in a queue, so the queue limit cannot trip, just
        as upstream's only trips for a reader that has stopped reading.
        """
        self._buf += data
        buf = self._buf
        pos = 0
        try:
            while len(buf) - pos >= FRAME_HEADER.size:
                conn_id, length = FRAME_HEADER.unpack_from(buf, pos)
                if length > self._max_payload:
                    raise MuxError(
                        f"frame of {length} bytes for conn {conn_id} exceeds the "
                        f"{self._max_payload}-byte limit"
                    )
                end = pos + FRAME_HEADER.size + length
                if end > len(buf):
                    break
                payload = bytes(buf[pos + FRAME_HEADER.size : end])
                pos = end
                if conn_id in self._queues:
                    yield conn_id, payload
                else:
                    self.dropped_frames += 1
        finally:
            del buf[:pos]

    def read(self, conn_id: int) -> bytes:
        """Everything queued for ``conn_id``, in order, as one byte string."""
        queue = self._queues[conn_id]
        data = b"".join(queue)
        queue.clear()
        return data

    def conns(self) -> list[int]:
        return list(self._queues)
