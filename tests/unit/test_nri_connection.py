"""The asyncio shell around the NRI wire codecs, over socketpairs and unix sockets."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from pycrid.nri import api
from pycrid.nri.proto import ttrpc_pb2
from pycrid.nri.wire import mux
from pycrid.nri.wire.connection import (
    PLUGIN_SIDE,
    RUNTIME_SIDE,
    Connection,
    ConnectionClosed,
    Server,
    Services,
    connect,
)
from pycrid.nri.wire.ttrpc import (
    HEADER,
    HEADER_SIZE,
    MAX_MESSAGE_SIZE,
    ClientProtocol,
    Code,
    MessageType,
    RequestReceived,
    ResponseReceived,
    ServerProtocol,
    TtrpcError,
    encode_message,
)

pytestmark = pytest.mark.timeout(10)

LIMIT = 2.0  # seconds any single test body may take
PLUGIN = api.PLUGIN_SERVICE
RUNTIME = api.RUNTIME_SERVICE


# ---------------------------------------------------------------- fixtures and helpers


@pytest.fixture(autouse=True)
async def loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """Every error that reaches the loop's exception handler fails the test."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    old = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    yield errors
    await asyncio.sleep(0.01)
    gc.collect()  # "exception was never retrieved" is reported at collection
    await asyncio.sleep(0)
    loop.set_exception_handler(old)
    assert errors == []


async def echo(ev: RequestReceived) -> bytes:
    return ev.payload


@dataclass
class Pair:
    runtime: Connection
    plugin: Connection
    runtime_services: Services  # what the runtime serves (the Runtime service, conn 2)
    plugin_services: Services  # what the plugin serves (the Plugin service, conn 1)


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    a, b = socket.socketpair()
    rs, ps = Services(), Services()
    rs.add(RUNTIME, "Echo", echo)
    ps.add(PLUGIN, "Echo", echo)
    runtime = await connect(sock=a, services=rs, roles=RUNTIME_SIDE, name="rt-side")
    plugin = await connect(sock=b, services=ps, roles=PLUGIN_SIDE, name="plug-side")
    yield Pair(runtime, plugin, rs, ps)
    await runtime.aclose()
    await plugin.aclose()


@dataclass
class Raw:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def frame(self) -> tuple[int, bytes]:
        header = await self.reader.readexactly(mux.FRAME_HEADER.size)
        conn_id, length = mux.FRAME_HEADER.unpack(header)
        return conn_id, await self.reader.readexactly(length)

    async def message(self) -> tuple[int, list[int], bytes]:
        """One whole ttrpc message: its conn, the sizes of the frames it came in, its bytes."""
        conn_id, data = await self.frame()
        sizes = [len(data)]
        while len(data) < HEADER_SIZE or len(data) < HEADER_SIZE + int.from_bytes(data[:4]):
            cid, more = await self.frame()
            assert cid == conn_id
            sizes.append(len(more))
            data += more
        assert len(data) == HEADER_SIZE + int.from_bytes(data[:4])
        return conn_id, sizes, data

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    def close(self) -> None:
        self.writer.close()


@pytest.fixture
async def raw_plugin() -> AsyncIterator[tuple[Connection, Raw, Services]]:
    """A Connection on the plugin side, with the test playing the runtime by hand."""
    a, b = socket.socketpair()
    ps = Services()
    ps.add(PLUGIN, "Echo", echo)
    conn = await connect(sock=a, services=ps, roles=PLUGIN_SIDE, name="raw-plugin")
    reader, writer = await asyncio.open_unix_connection(sock=b)
    raw = Raw(reader, writer)
    yield conn, raw, ps
    await conn.aclose()
    raw.close()


def own_tasks(name: str) -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith(name)]


# ---------------------------------------------------------------- calls


async def test_call_in_each_direction(pair: Pair) -> None:
    async with asyncio.timeout(LIMIT):
        req = api.ConfigureRequest(config="c", runtime_name="pycrid")
        got = await pair.runtime.call(PLUGIN, "Echo", req.SerializeToString(), timeout=1)
        assert api.ConfigureRequest.FromString(got) == req
        assert await pair.plugin.call(RUNTIME, "Echo", b"from plugin", timeout=1) == b"from plugin"
        # Without a timeout too.
        assert await pair.plugin.call(RUNTIME, "Echo", b"") == b""


async def test_handler_sees_request_fields(pair: Pair) -> None:
    seen: list[RequestReceived] = []

    async def record(ev: RequestReceived) -> bytes:
        seen.append(ev)
        return b"ok"

    pair.plugin_services.add(PLUGIN, "Record", record)
    async with asyncio.timeout(LIMIT):
        assert await pair.runtime.call(PLUGIN, "Record", b"p", timeout=1.5) == b"ok"
        assert await pair.runtime.call(PLUGIN, "Record", b"q") == b"ok"
    assert [(e.stream_id, e.service, e.method, e.payload) for e in seen] == [
        (1, PLUGIN, "Record", b"p"),
        (3, PLUGIN, "Record", b"q"),
    ]
    assert seen[0].timeout_nano == 1_500_000_000
    assert seen[1].timeout_nano == 0


async def test_concurrent_calls_answered_out_of_order(pair: Pair) -> None:
    finished: list[int] = []

    async def slow_echo(ev: RequestReceived) -> bytes:
        i = int(ev.payload)
        await asyncio.sleep((19 - i) * 0.004)  # the last call sent is answered first
        finished.append(i)
        return b"answer %d" % i

    pair.plugin_services.add(PLUGIN, "Slow", slow_echo)
    pair.runtime_services.add(RUNTIME, "Slow", slow_echo)
    async with asyncio.timeout(LIMIT):
        calls = [pair.runtime.call(PLUGIN, "Slow", b"%d" % i, timeout=1) for i in range(20)]
        calls += [pair.plugin.call(RUNTIME, "Slow", b"%d" % i, timeout=1) for i in range(20)]
        answers = await asyncio.gather(*calls)
    assert answers == [b"answer %d" % i for i in range(20)] * 2
    assert finished[:2] == [19, 19]
    assert sorted(finished) == sorted(list(range(20)) * 2)
    assert pair.runtime._pending == {} and pair.plugin._pending == {}


async def test_client_deadline_and_late_answer_dropped(
    pair: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    cancelled = asyncio.Event()

    async def slow(ev: RequestReceived) -> bytes:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return b"too late"

    pair.plugin_services.add(PLUGIN, "Slow", slow)
    caplog.set_level(logging.DEBUG, logger="pycrid.nri.wire.connection")
    async with asyncio.timeout(LIMIT):
        start = time.monotonic()
        with pytest.raises(TtrpcError) as exc:
            await pair.runtime.call(PLUGIN, "Slow", b"", timeout=0.05)
        assert exc.value.code == Code.DEADLINE_EXCEEDED
        assert 0.04 < time.monotonic() - start < 0.5
        # The server gives up too (the timeout travelled as timeout_nano) and its
        # answer arrives after the caller stopped waiting: it must be dropped.
        await cancelled.wait()
        await asyncio.sleep(0.05)
        assert await pair.runtime.call(PLUGIN, "Echo", b"next", timeout=1) == b"next"
        assert await pair.runtime.call(PLUGIN, "Echo", b"again", timeout=1) == b"again"
    assert not pair.runtime.is_closed
    assert pair.runtime._pending == {}
    assert "answer for unknown stream 1 dropped" in caplog.text


async def test_server_enforces_timeout_nano(raw_plugin: tuple[Connection, Raw, Services]) -> None:
    conn, raw, services = raw_plugin
    cancelled = asyncio.Event()

    async def slow(ev: RequestReceived) -> bytes:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return b"never"

    services.add(PLUGIN, "Slow", slow)
    client = ClientProtocol()
    sid, data = client.request(PLUGIN, "Slow", b"", timeout_nano=50_000_000)
    async with asyncio.timeout(LIMIT):
        start = time.monotonic()
        await raw.send(mux.encode(mux.PLUGIN_SERVICE_CONN, data))
        conn_id, _, message = await raw.message()
        elapsed = time.monotonic() - start
    assert conn_id == mux.PLUGIN_SERVICE_CONN
    assert client.receive_data(message) == [
        ResponseReceived(sid, Code.DEADLINE_EXCEEDED, "context deadline exceeded", b"")
    ]
    assert 0.04 < elapsed < 1
    assert cancelled.is_set()
    assert not conn.is_closed


async def test_unknown_service_and_method(pair: Pair) -> None:
    async with asyncio.timeout(LIMIT):
        with pytest.raises(TtrpcError) as exc:
            await pair.runtime.call("no.such.Service", "Echo", b"", timeout=1)
        assert exc.value.code == Code.UNIMPLEMENTED
        assert exc.value.message == "service no.such.Service"
        with pytest.raises(TtrpcError) as exc:
            await pair.plugin.call(RUNTIME, "NoSuchMethod", b"", timeout=1)
        assert exc.value.code == Code.UNIMPLEMENTED
        assert exc.value.message == "method NoSuchMethod"
        # The Runtime service lives on the runtime, not on the plugin.
        with pytest.raises(TtrpcError) as exc:
            await pair.runtime.call(RUNTIME, "Echo", b"", timeout=1)
        assert exc.value.code == Code.UNIMPLEMENTED


async def test_handler_exception_answers_unknown(pair: Pair) -> None:
    async def boom(ev: RequestReceived) -> bytes:
        raise RuntimeError("boom: disk on fire")

    async def bare(ev: RequestReceived) -> bytes:
        raise ValueError

    async def typed(ev: RequestReceived) -> bytes:
        raise TtrpcError(Code.NOT_FOUND, "container xyz not found")

    async def timeout_inside(ev: RequestReceived) -> bytes:
        raise TimeoutError("inner timeout")

    for name, handler in [("Boom", boom), ("Bare", bare), ("Typed", typed), ("T", timeout_inside)]:
        pair.plugin_services.add(PLUGIN, name, handler)
    async with asyncio.timeout(LIMIT):
        results = []
        for method in ["Boom", "Bare", "Typed", "T"]:
            with pytest.raises(TtrpcError) as exc:
                await pair.runtime.call(PLUGIN, method, b"", timeout=1)
            results.append((exc.value.code, exc.value.message))
        assert await pair.runtime.call(PLUGIN, "Echo", b"still fine", timeout=1) == b"still fine"
    assert results == [
        (Code.UNKNOWN, "boom: disk on fire"),
        (Code.UNKNOWN, "ValueError"),
        (Code.NOT_FOUND, "container xyz not found"),
        (Code.UNKNOWN, "inner timeout"),
    ]


async def test_oversized_call_fails_locally(pair: Pair) -> None:
    called = False

    async def record(ev: RequestReceived) -> bytes:
        nonlocal called
        called = True
        return b""

    pair.plugin_services.add(PLUGIN, "Big", record)
    async with asyncio.timeout(LIMIT):
        with pytest.raises(TtrpcError) as exc:
            await pair.runtime.call(PLUGIN, "Big", b"\0" * MAX_MESSAGE_SIZE, timeout=1)
        assert exc.value.code == Code.RESOURCE_EXHAUSTED
        assert not isinstance(exc.value, ConnectionClosed)
        assert pair.runtime._pending == {}
        assert await pair.runtime.call(PLUGIN, "Echo", b"after", timeout=1) == b"after"
    assert not called


async def test_oversized_answer_is_resource_exhausted(pair: Pair) -> None:
    async def huge(ev: RequestReceived) -> bytes:
        return b"\0" * (MAX_MESSAGE_SIZE + 1)

    pair.plugin_services.add(PLUGIN, "Huge", huge)
    async with asyncio.timeout(LIMIT):
        with pytest.raises(TtrpcError) as exc:
            await pair.runtime.call(PLUGIN, "Huge", b"", timeout=1)
        assert exc.value.code == Code.RESOURCE_EXHAUSTED
        assert "exceeds maximum message size" in exc.value.message
        assert await pair.runtime.call(PLUGIN, "Echo", b"after", timeout=1) == b"after"


async def test_large_payload_round_trip(pair: Pair) -> None:
    payload = os.urandom(3 << 20)
    async with asyncio.timeout(LIMIT):
        assert await pair.runtime.call(PLUGIN, "Echo", payload, timeout=1) == payload
        assert await pair.plugin.call(RUNTIME, "Echo", payload, timeout=1) == payload


# ---------------------------------------------------------------- closing


async def test_peer_close_fails_pending_calls(pair: Pair) -> None:
    started = asyncio.Event()

    async def hang(ev: RequestReceived) -> bytes:
        started.set()
        await asyncio.sleep(5)
        return b""

    pair.plugin_services.add(PLUGIN, "Hang", hang)
    async with asyncio.timeout(LIMIT):
        calls = [
            asyncio.create_task(pair.runtime.call(PLUGIN, "Hang", b"", timeout=5)) for _ in range(3)
        ]
        await started.wait()
        await pair.plugin.aclose()
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(r, ConnectionClosed) for r in results), results
        reason = await pair.runtime.wait_closed()
        assert reason == "peer closed the connection"
        assert await pair.plugin.wait_closed() == "closed locally"
        assert pair.runtime.close_reason == reason
        with pytest.raises(ConnectionClosed) as exc:
            await pair.runtime.call(PLUGIN, "Echo", b"", timeout=1)
        assert exc.value.code == Code.UNAVAILABLE
        assert exc.value.reason == reason
    assert own_tasks("plug-side") == []


async def test_local_close_fails_pending_calls(pair: Pair) -> None:
    async def hang(ev: RequestReceived) -> bytes:
        await asyncio.sleep(5)
        return b""

    pair.plugin_services.add(PLUGIN, "Hang", hang)
    async with asyncio.timeout(LIMIT):
        call = asyncio.create_task(pair.runtime.call(PLUGIN, "Hang", b"", timeout=5))
        await asyncio.sleep(0.02)
        await pair.runtime.aclose("shutting down")
        with pytest.raises(ConnectionClosed) as exc:
            await call
        assert exc.value.reason == "shutting down"
        assert await pair.runtime.wait_closed() == "shutting down"
        assert await pair.plugin.wait_closed() == "peer closed the connection"


async def test_aclose_leaves_no_tasks(pair: Pair) -> None:
    async def hang(ev: RequestReceived) -> bytes:
        await asyncio.sleep(5)
        return b""

    pair.plugin_services.add(PLUGIN, "Hang", hang)
    async with asyncio.timeout(LIMIT):
        calls = [
            asyncio.create_task(pair.runtime.call(PLUGIN, "Hang", b"", timeout=5)) for _ in range(5)
        ]
        await asyncio.sleep(0.02)
        assert len(own_tasks("plug-side")) == 6  # the reader and five calls
        assert len(own_tasks("rt-side")) == 1
        await pair.plugin.aclose()
        await pair.runtime.aclose()
        await asyncio.gather(*calls, return_exceptions=True)
        assert own_tasks("plug-side") == []
        assert own_tasks("rt-side") == []
        assert pair.plugin._owner.tree() == [] and pair.runtime._owner.tree() == []
        # Closing twice is harmless and keeps the first reason.
        await pair.plugin.aclose("again")
        assert pair.plugin.close_reason == "closed locally"


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param(b"\xff" * 64, id="ff-bytes"),
        pytest.param(mux.FRAME_HEADER.pack(1, mux.MAX_FRAME_PAYLOAD + 1), id="oversized-frame"),
        pytest.param(
            mux.encode(mux.PLUGIN_SERVICE_CONN, encode_message(1, 9, b"")), id="bad-ttrpc-type"
        ),
        pytest.param(
            mux.encode(mux.PLUGIN_SERVICE_CONN, encode_message(1, MessageType.RESPONSE, b"")),
            id="response-to-server",
        ),
        pytest.param(
            mux.encode(mux.RUNTIME_SERVICE_CONN, encode_message(1, MessageType.REQUEST, b"")),
            id="request-to-client",
        ),
        # No queue-overflow case: the shell consumes each frame as it is parsed, so its
        # queue never fills (see test_burst_of_257_concurrent_calls); the limit itself is
        # tested on the Demultiplexer in test_nri_codecs.py.
    ],
)
async def test_protocol_error_closes(
    raw_plugin: tuple[Connection, Raw, Services], garbage: bytes
) -> None:
    conn, raw, _ = raw_plugin
    async with asyncio.timeout(1):
        await raw.send(garbage)
        reason = await conn.wait_closed()
        # The socket is closed too: the raw side sees EOF.
        assert await raw.reader.read() == b""
    assert reason.startswith("protocol error:"), reason
    assert own_tasks("raw-plugin") == []


async def test_protocol_error_fails_pending_calls() -> None:
    a, b = socket.socketpair()
    conn = await connect(sock=a, services=Services(), roles=RUNTIME_SIDE, name="victim")
    reader, writer = await asyncio.open_unix_connection(sock=b)
    try:
        async with asyncio.timeout(1):
            call = asyncio.create_task(conn.call(PLUGIN, "Echo", b"", timeout=5))
            await Raw(reader, writer).message()  # the request went out
            writer.write(b"\xff" * 64)
            with pytest.raises(ConnectionClosed) as exc:
                await call
            assert exc.value.reason.startswith("protocol error:")
    finally:
        await conn.aclose()
        writer.close()


async def test_frames_for_unopened_conns_are_dropped(
    raw_plugin: tuple[Connection, Raw, Services],
) -> None:
    conn, raw, _ = raw_plugin
    client = ClientProtocol()
    _, data = client.request(PLUGIN, "Echo", b"hi")
    async with asyncio.timeout(LIMIT):
        await raw.send(mux.encode(7, b"whatever") + mux.encode(mux.PLUGIN_SERVICE_CONN, data))
        _, _, message = await raw.message()
    assert [ev.payload for ev in client.receive_data(message)] == [b"hi"]
    assert conn._demux is not None and conn._demux.dropped_frames == 1


@pytest.mark.parametrize("cut", [3, 8, 12, -5])
async def test_truncated_frame_then_eof(
    raw_plugin: tuple[Connection, Raw, Services], cut: int
) -> None:
    conn, raw, _ = raw_plugin
    _, data = ClientProtocol().request(PLUGIN, "Echo", b"payload")
    async with asyncio.timeout(1):
        await raw.send(mux.encode(mux.PLUGIN_SERVICE_CONN, data)[:cut])
        raw.writer.write_eof()
        reason = await conn.wait_closed()
    assert "middle of a message" in reason


async def test_truncated_ttrpc_message_in_whole_frame_then_eof(
    raw_plugin: tuple[Connection, Raw, Services],
) -> None:
    conn, raw, _ = raw_plugin
    _, data = ClientProtocol().request(PLUGIN, "Echo", b"payload")
    async with asyncio.timeout(1):
        await raw.send(mux.encode(mux.PLUGIN_SERVICE_CONN, data[:-4]))
        raw.writer.write_eof()
        reason = await conn.wait_closed()
    assert "middle of a message" in reason
    assert "(4 bytes)" not in reason  # it counts what was held back, not what was missing
    assert f"({len(data) - 4} bytes)" in reason


async def test_clean_eof_reason(raw_plugin: tuple[Connection, Raw, Services]) -> None:
    conn, raw, _ = raw_plugin
    async with asyncio.timeout(1):
        raw.writer.write_eof()
        assert await conn.wait_closed() == "peer closed the connection"


# ---------------------------------------------------------------- framing on the wire


async def test_large_answer_goes_out_as_two_frames(
    raw_plugin: tuple[Connection, Raw, Services],
) -> None:
    _, raw, _ = raw_plugin
    payload = os.urandom(70_000)
    client = ClientProtocol()
    sid, data = client.request(PLUGIN, "Echo", payload)
    expected = ServerProtocol().respond(sid, payload)
    async with asyncio.timeout(LIMIT):
        # Send the request split in an unusual way: 1000-byte frames.
        await raw.send(
            b"".join(
                mux.FRAME_HEADER.pack(1, len(data[i : i + 1000])) + data[i : i + 1000]
                for i in range(0, len(data), 1000)
            )
        )
        conn_id, sizes, message = await raw.message()
    assert conn_id == mux.PLUGIN_SERVICE_CONN
    assert sizes == mux.frame_sizes(1, expected) == [4096, len(expected) - 4096]
    assert message == expected
    assert client.receive_data(message) == [ResponseReceived(sid, Code.OK, "", payload)]


async def test_large_call_goes_out_as_two_frames() -> None:
    a, b = socket.socketpair()
    conn = await connect(sock=a, services=Services(), roles=RUNTIME_SIDE, name="big-caller")
    reader, writer = await asyncio.open_unix_connection(sock=b)
    raw = Raw(reader, writer)
    payload = os.urandom(70_000)
    answer = os.urandom(70_000)
    try:
        async with asyncio.timeout(LIMIT):
            call = asyncio.create_task(conn.call(PLUGIN, "Big", payload))
            conn_id, sizes, message = await raw.message()
            sid, expected = ClientProtocol().request(PLUGIN, "Big", payload)
            assert conn_id == mux.PLUGIN_SERVICE_CONN
            assert sizes == mux.frame_sizes(1, expected) == [4096, len(expected) - 4096]
            assert message == expected
            [ev] = ServerProtocol().receive_data(message)
            assert isinstance(ev, RequestReceived) and ev.payload == payload
            # Answer in 1-byte-header-split pieces: any split must be accepted.
            reply = mux.encode(1, ServerProtocol().respond(sid, answer))
            for i in range(0, 64, 1):
                await raw.send(reply[i : i + 1])
            await raw.send(reply[64:])
            assert await call == answer
    finally:
        await conn.aclose()
        writer.close()


# ---------------------------------------------------------------- plain ttrpc


@pytest.fixture
def sock_path() -> Iterator[str]:
    # A short directory of its own: pytest's tmp_path can exceed sun_path's 108 bytes.
    with tempfile.TemporaryDirectory(prefix="ttrpc-") as d:
        yield os.path.join(d, "t.sock")


async def test_plain_server_and_client(sock_path: str) -> None:
    services = Services()
    services.add("example.Service", "Echo", echo)
    server = Server(services)
    await server.listen(sock_path)
    client = await connect(sock_path, name="plain-client")
    try:
        async with asyncio.timeout(LIMIT):
            assert await client.call("example.Service", "Echo", b"plain", timeout=1) == b"plain"
            with pytest.raises(TtrpcError) as exc:
                await client.call("example.Service", "Missing", b"", timeout=1)
            assert (exc.value.code, exc.value.message) == (Code.UNIMPLEMENTED, "method Missing")
            with pytest.raises(TtrpcError) as exc:
                await client.call("other.Service", "Echo", b"", timeout=1)
            assert (exc.value.code, exc.value.message) == (
                Code.UNIMPLEMENTED,
                "service other.Service",
            )
            big = os.urandom(100_000)
            assert await client.call("example.Service", "Echo", big, timeout=1) == big
            await server.aclose()
            assert await client.wait_closed() == "peer closed the connection"
    finally:
        await client.aclose()
        await server.aclose()
    assert own_tasks("ttrpc-server") == []


async def test_plain_wire_is_unframed(sock_path: str) -> None:
    services = Services()
    services.add("example.Service", "Echo", echo)
    server = Server(services)
    await server.listen(sock_path)
    reader, writer = await asyncio.open_unix_connection(sock_path)
    try:
        client = ClientProtocol()
        sid, data = client.request("example.Service", "Echo", b"bare")
        async with asyncio.timeout(LIMIT):
            writer.write(data)
            header = await reader.readexactly(HEADER_SIZE)
            body = await reader.readexactly(int.from_bytes(header[:4]))
        assert client.receive_data(header + body) == [ResponseReceived(sid, Code.OK, "", b"bare")]
    finally:
        writer.close()
        await server.aclose()


async def test_plain_server_closes_many_clients(sock_path: str) -> None:
    services = Services()
    services.add("example.Service", "Echo", echo)
    server = Server(services)
    await server.listen(sock_path)
    clients = [await connect(sock_path) for _ in range(3)]
    try:
        async with asyncio.timeout(LIMIT):
            for c in clients:
                assert await c.call("example.Service", "Echo", b"x", timeout=1) == b"x"
            await server.aclose()
            reasons = [await c.wait_closed() for c in clients]
        assert reasons == ["peer closed the connection"] * 3
    finally:
        for c in clients:
            await c.aclose()


# ---------------------------------------------------------------- rejections on the wire


async def test_rejected_requests_are_answered_and_connection_survives(
    raw_plugin: tuple[Connection, Raw, Services],
) -> None:
    conn, raw, _ = raw_plugin

    def req(stream_id: int, payload: bytes = b"") -> bytes:
        body = ttrpc_pb2.Request(service=PLUGIN, method="Echo", payload=payload)
        return encode_message(stream_id, MessageType.REQUEST, body.SerializeToString())

    big = MAX_MESSAGE_SIZE + 1
    stream = [
        req(2),  # even
        req(1, b"one"),  # fine
        req(1),  # reused
        encode_message(3, MessageType.DATA, b"chunk"),  # data message
        encode_message(5, MessageType.REQUEST, b"\x0a\x05ab"),  # undecodable
        HEADER.pack(big, 7, MessageType.REQUEST, 0) + bytes(big),  # oversized
        req(9, b"nine"),  # fine again
    ]
    async with asyncio.timeout(LIMIT):
        await raw.send(b"".join(mux.encode(mux.PLUGIN_SERVICE_CONN, m) for m in stream))
        client = ClientProtocol()
        answers: dict[int, list[ResponseReceived]] = {}
        for _ in range(len(stream)):
            _, _, message = await raw.message()
            [ev] = client.receive_data(message)
            answers.setdefault(ev.stream_id, []).append(ev)
    assert sorted(answers) == [1, 2, 3, 5, 7, 9]
    assert sorted((e.code, e.payload) for e in answers[1]) == [
        (Code.OK, b"one"),
        (Code.INVALID_ARGUMENT, b""),
    ]
    assert answers[2][0].code == Code.INVALID_ARGUMENT
    assert answers[3][0].message == "StreamID is no longer active"
    assert answers[5][0].message.startswith("unmarshal request error")
    assert answers[7][0].code == Code.RESOURCE_EXHAUSTED
    assert (answers[9][0].code, answers[9][0].payload) == (Code.OK, b"nine")
    assert not conn.is_closed


async def test_oversized_response_fails_only_its_call() -> None:
    a, b = socket.socketpair()
    conn = await connect(sock=a, services=Services(), roles=RUNTIME_SIDE, name="big-answer")
    reader, writer = await asyncio.open_unix_connection(sock=b)
    raw = Raw(reader, writer)
    try:
        async with asyncio.timeout(LIMIT):
            call = asyncio.create_task(conn.call(PLUGIN, "Big", b"", timeout=1))
            _, _, first = await raw.message()
            big = MAX_MESSAGE_SIZE + 1
            await raw.send(mux.encode(1, HEADER.pack(big, 1, MessageType.RESPONSE, 0) + bytes(big)))
            with pytest.raises(TtrpcError) as exc:
                await call
            assert exc.value.code == Code.RESOURCE_EXHAUSTED
            call = asyncio.create_task(conn.call(PLUGIN, "Small", b"", timeout=1))
            _, _, second = await raw.message()
            [ev] = ServerProtocol().receive_data(second)
            assert ev.stream_id == 3
            await raw.send(mux.encode(1, ServerProtocol().respond(3, b"small")))
            assert await call == b"small"
        assert first[4:8] == (1).to_bytes(4, "big")
    finally:
        await conn.aclose()
        writer.close()


async def test_huge_timeout_nano_is_no_problem(
    raw_plugin: tuple[Connection, Raw, Services],
) -> None:
    _, raw, _ = raw_plugin
    client = ClientProtocol()
    sid, data = client.request(PLUGIN, "Echo", b"forever", timeout_nano=2**63 - 1)
    async with asyncio.timeout(LIMIT):
        await raw.send(mux.encode(1, data))
        _, _, message = await raw.message()
    assert client.receive_data(message) == [ResponseReceived(sid, Code.OK, "", b"forever")]


# ---------------------------------------------------------------- found by these tests, fixed


async def test_burst_of_257_concurrent_calls(pair: Pair) -> None:
    async with asyncio.timeout(LIMIT):
        answers = await asyncio.gather(
            *[pair.runtime.call(PLUGIN, "Echo", b"%d" % i, timeout=1) for i in range(257)],
            return_exceptions=True,
        )
    assert not pair.plugin.is_closed, pair.plugin.close_reason
    assert answers == [b"%d" % i for i in range(257)]


async def test_handler_returning_non_bytes_answers_unknown(
    pair: Pair, loop_errors: list[dict[str, Any]]
) -> None:
    async def wrong(ev: RequestReceived) -> bytes:
        return "not bytes"  # type: ignore[return-value]

    pair.plugin_services.add(PLUGIN, "Wrong", wrong)
    try:
        async with asyncio.timeout(LIMIT):
            with pytest.raises(TtrpcError) as exc:
                await pair.runtime.call(PLUGIN, "Wrong", b"", timeout=0.3)
        code = exc.value.code
    finally:
        await asyncio.sleep(0)
        gc.collect()
        await asyncio.sleep(0)
        errors = list(loop_errors)
        loop_errors.clear()  # keep the teardown check for the other tests
    assert errors == []
    assert code == Code.UNKNOWN
