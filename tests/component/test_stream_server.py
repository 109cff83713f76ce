"""The streaming server in-process on loopback, with a small runtime behind it: the HTTP
answers it gives, its token cap, TLS, the idle and stream-creation timeouts, shutdown
with sessions open, failures on the error stream, large transfers, how a WebSocket
session ends and port-forward tunnelled in a WebSocket. (The same paths
with real containers are in tests/e2e/test_streaming.py.)"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
import stat
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, ParamSpec, TypeVar
from urllib.parse import urlsplit

import pytest
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, BytesMessage, CloseConnection
from wsproto.events import Request as WSRequest

from pycrid.errors import ResourceExhausted
from pycrid.stdio import (
    AttachRequest,
    ByteStream,
    ExecRequest,
    PortForwardRequest,
    ProcessIO,
    StreamError,
)
from pycrid.streaming import remotecommand
from pycrid.streaming.server import StreamServer
from pycrid.streaming.tls import server_context
from pycrid.streaming.tokens import TokenCache
from tests.support.streams import (
    HTTPStatusError,
    SpdyClient,
    SpdyCommand,
    SpdyPortForward,
    WebSocketCommand,
    WebSocketPipe,
)

pytestmark = pytest.mark.timeout(60)

P = ParamSpec("P")
R = TypeVar("R")


def guard(seconds: float = 20) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Fail a test that hangs instead of waiting for the global timeout."""
    def wrap(test: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(test)
        async def run(*args: P.args, **kwargs: P.kwargs) -> R:
            return await asyncio.wait_for(test(*args, **kwargs), seconds)
        return run
    return wrap


class Runtime:
    """exec by ``cmd[0]``: "echo" copies stdin to stdout and exits ``cmd[1]``, "block"
    waits until cancelled, "fail" raises StreamError(``cmd[1]``). port_forward echoes."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.cancelled: list[str] = []
        self.returned: list[str] = []

    async def exec(self, request: ExecRequest, io: ProcessIO) -> int:
        self.calls.append(request.cmd[0])
        try:
            if request.cmd[0] == "fail":
                raise StreamError(request.cmd[1])
            if request.cmd[0] == "block":
                await asyncio.Event().wait()
            assert io.stdin is not None and io.stdout is not None
            while data := await io.stdin.read():
                await io.stdout.write(data)
            self.returned.append("exec")
            return int(request.cmd[1])
        except asyncio.CancelledError:
            self.cancelled.append("exec")
            raise

    async def attach(self, request: AttachRequest, io: ProcessIO) -> None:
        raise StreamError("attach is not used here")

    async def port_forward(self, sandbox_id: str, port: int, stream: ByteStream) -> None:
        self.calls.append("port_forward")
        try:
            while data := await stream.read():
                await stream.write(data)
        except asyncio.CancelledError:
            self.cancelled.append("port_forward")
            raise


Start = Callable[..., Awaitable[StreamServer]]


@pytest.fixture
def runtime() -> Runtime:
    return Runtime()


@pytest.fixture
async def start(runtime: Runtime) -> AsyncIterator[Start]:
    servers: list[StreamServer] = []

    async def start(**kw: Any) -> StreamServer:
        server = StreamServer(runtime=runtime, address="127.0.0.1", port=0, **kw)
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.aclose()


def _exec(*cmd: str, stdin: bool = True) -> ExecRequest:
    return ExecRequest(container_id="c1", cmd=cmd, tty=False, stdin=stdin, stdout=True,
                       stderr=False)


async def _eventually(pred: Callable[[], bool], limit: float = 5) -> None:
    deadline = time.monotonic() + limit
    while not pred():
        assert time.monotonic() < deadline, "condition never became true"
        await asyncio.sleep(0.01)


async def _raw(url: str, method: str = "GET",
               headers: Sequence[str] = ()) -> tuple[int, list[tuple[str, str]], str]:
    """One plain HTTP request: (status, headers, body); stops after the head on 101."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        lines = [f"{method} {parts.path} HTTP/1.1", f"Host: {parts.netloc}", *headers, "", ""]
        writer.write("\r\n".join(lines).encode())
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        status_line, *rest = head.split("\r\n")
        fields = [(k.strip().lower(), v.strip()) for k, _, v in
                  (h.partition(":") for h in rest if h)]
        length = int(dict(fields).get("content-length", "0"))
        body = await reader.readexactly(length) if length else b""
        return int(status_line.split()[1]), fields, body.decode()
    finally:
        writer.close()


SPDY_HEADERS = ("Connection: Upgrade", "Upgrade: SPDY/3.1",
                "X-Stream-Protocol-Version: v4.channel.k8s.io")
WS_HEADERS = ("Connection: Upgrade", "Upgrade: websocket", "Sec-WebSocket-Version: 13",
              "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
              "Sec-WebSocket-Protocol: v5.channel.k8s.io")


@pytest.mark.parametrize("headers", [SPDY_HEADERS, WS_HEADERS], ids=["spdy", "websocket"])
@guard()
async def test_expired_token_is_404_and_says_nothing(start: Start,
                                                     headers: tuple[str, ...]) -> None:
    now = [1000.0]
    server = await start(tokens=TokenCache(clock=lambda: now[0]))
    fresh, stale = server.url(_exec("echo", "0")), server.url(_exec("echo", "0"))
    now[0] += 60  # exactly the ttl: still valid
    assert (await _raw(fresh, headers=headers))[0] == 101
    now[0] += 1.5
    status, _, body = await _raw(stale, headers=headers)
    token = stale.rsplit("/", 1)[1]
    assert status == 404
    assert body.strip() == "not found"
    assert token not in body and "exec" not in body and "c1" not in body


@guard()
async def test_bad_requests_get_the_answer_the_server_gives(start: Start) -> None:
    server = await start()
    base = server.base_url
    for path in ("/nothing/here", "/exec", "/exec/a/b", "/"):
        assert (await _raw(base + path, headers=SPDY_HEADERS))[0] == 404, path
    status, fields, _ = await _raw(server.url(_exec("echo", "0")), "PUT", SPDY_HEADERS)
    assert (status, dict(fields)["allow"]) == (405, "GET, POST")

    status, _, body = await _raw(server.url(_exec("echo", "0")))
    assert status == 400 and "missing upgrade headers" in body

    status, _, body = await _raw(server.url(_exec("echo", "0")),
                                 headers=SPDY_HEADERS[:2])
    assert status == 400 and "X-Stream-Protocol-Version" in body

    status, fields, body = await _raw(server.url(_exec("echo", "0")), headers=(
        *SPDY_HEADERS[:2], "X-Stream-Protocol-Version: v9.channel.k8s.io"))
    assert status == 403 and "v9.channel.k8s.io" in body
    assert [v for k, v in fields if k == "x-accepted-stream-protocol-versions"] == \
        list(remotecommand.SPDY_PROTOCOLS)

    with pytest.raises(HTTPStatusError) as refused:
        await WebSocketCommand.start(server.url(_exec("echo", "0")),
                                     protocols=("v9.channel.k8s.io",))
    assert refused.value.status == 400


@guard()
async def test_outstanding_tokens_are_capped(start: Start) -> None:
    now = [0.0]
    server = await start(tokens=TokenCache(max_outstanding=2, clock=lambda: now[0]))
    server.url(_exec("echo", "0"))
    server.url(PortForwardRequest(sandbox_id="s", ports=(80,)))
    with pytest.raises(ResourceExhausted):
        server.url(_exec("echo", "0"))
    now[0] += 61  # once they expire there is room again
    assert server.url(_exec("echo", "0")).startswith(server.base_url + "/exec/")


@guard()
async def test_tls_with_a_self_signed_certificate(start: Start, tmp_path: Any) -> None:
    tls = server_context("", "", state_dir=str(tmp_path), address="127.0.0.1", section="x")
    server = await start(tls=tls)
    assert server.base_url.startswith("https://127.0.0.1:")
    key = tmp_path / "streaming" / "tls.key"
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    session = await SpdyCommand.start(server.url(_exec("echo", "5")), stdin=True, stderr=False)
    await session.write_stdin(b"over tls")
    await session.close_stdin()
    result = await session.wait(10)
    assert (result.stdout, result.exit_code) == (b"over tls", 5)


@guard()
async def test_idle_session_is_closed_and_the_exec_cancelled(start: Start,
                                                             runtime: Runtime) -> None:
    server = await start(idle_timeout=0.5)
    began = time.monotonic()
    session = await SpdyCommand.start(server.url(_exec("block", stdin=False)), stdin=False,
                                      stderr=False)
    await _eventually(lambda: runtime.cancelled == ["exec"])
    assert 0.45 <= time.monotonic() - began < 5
    result = await session.wait(5)  # the client sees the connection end, with no status
    assert result.error == b""
    await _eventually(lambda: server.sessions == 0)


@guard()
async def test_aclose_ends_every_session(start: Start, runtime: Runtime) -> None:
    server = await start()
    spdy = await SpdyCommand.start(server.url(_exec("block", stdin=False)), stdin=False,
                                   stderr=False)
    ws = await WebSocketCommand.start(server.url(_exec("block", stdin=False)))
    forward = await SpdyClient.connect(
        server.url(PortForwardRequest(sandbox_id="s", ports=(80,))), ["portforward.k8s.io"])
    headers = {"port": "80", "requestID": "0"}
    await forward.open({**headers, "streamType": "error"}, fin=True)
    data = await forward.open({**headers, "streamType": "data"})
    await forward.send(data, b"ping")
    assert await forward.read(data) == b"ping"
    await _eventually(lambda: sorted(runtime.calls) == ["block", "block", "port_forward"])
    assert server.sessions == 3

    await server.aclose()
    assert server.sessions == 0
    assert sorted(runtime.cancelled) == ["exec", "exec", "port_forward"]
    assert runtime.returned == []
    await spdy.wait(5)
    result = await ws.wait(5)
    # Cut short, without a status: "going away", which client-go reports as an error
    # (after a normal Close it would take the missing status for success).
    assert (ws.close_code, result.error) == (1001, b"")
    assert await asyncio.wait_for(forward.read_all(data), 5) == b""
    await asyncio.wait_for(forward.goaway.wait(), 5)
    await forward.close()


@guard()
async def test_streams_not_opened_in_time_close_the_connection(
        start: Start, runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remotecommand, "STREAM_CREATION_TIMEOUT", 0.3)
    server = await start()
    began = time.monotonic()
    client = await SpdyClient.connect(server.url(_exec("echo", "0")), ["v4.channel.k8s.io"])
    await client.open({"streamType": "error"}, fin=True)  # stdin and stdout never come
    await asyncio.wait_for(client.goaway.wait(), 5)
    assert time.monotonic() - began < 5
    await _eventually(lambda: server.sessions == 0)
    assert runtime.calls == []
    await client.close()


@guard()
async def test_stream_error_reaches_the_client_as_internal_error(start: Start) -> None:
    server = await start()
    message = "container c1 is gone <&>"
    spdy = await SpdyCommand.start(server.url(_exec("fail", message)), stdin=True,
                                   stderr=False, protocols=("v4.channel.k8s.io",))
    ws = await WebSocketCommand.start(server.url(_exec("fail", message)),
                                      protocols=("v5.channel.k8s.io",))
    for result in (await spdy.wait(10), await ws.wait(10)):
        status = json.loads(result.error)
        assert status["status"] == "Failure" and status["reason"] == "InternalError"
        assert status["message"] == f"Internal error occurred: {message}"
        assert status["details"]["causes"] == [{"message": message}]


PAYLOAD = random.Random(7).randbytes(5 << 20)


@pytest.mark.parametrize("transport", ["spdy", "websocket"])
@guard(60)
async def test_large_transfer_arrives_intact(start: Start, transport: str) -> None:
    server = await start()
    url = server.url(_exec("echo", "0"))
    session: SpdyCommand | WebSocketCommand
    if transport == "spdy":
        session = await SpdyCommand.start(url, stdin=True, stderr=False)
    else:
        session = await WebSocketCommand.start(url, protocols=("v5.channel.k8s.io",))
    for offset in range(0, len(PAYLOAD), 64 << 10):
        await session.write_stdin(PAYLOAD[offset:offset + (64 << 10)])
    await session.close_stdin()
    result = await session.wait(50)
    assert len(result.stdout) == len(PAYLOAD)
    assert result.stdout == PAYLOAD
    assert result.exit_code == 0


@guard()
async def test_v5_close_ends_stdin(start: Start, runtime: Runtime) -> None:
    server = await start()
    session = await WebSocketCommand.start(server.url(_exec("echo", "0")),
                                           protocols=("v5.channel.k8s.io",))
    assert session.ws.protocol == "v5.channel.k8s.io"
    await session.write_stdin(b"before close")
    await session.wait_output(lambda b: b == b"before close", limit=5)
    assert runtime.returned == []  # the exec still waits for stdin
    await session.close_stdin()
    result = await session.wait(10)
    assert runtime.returned == ["exec"] and runtime.cancelled == []
    assert (result.stdout, result.exit_code) == (b"before close", 0)
    assert json.loads(result.error)["status"] == "Success"
    assert (session.close_code, session.closed_channels) == (1000, set())


async def _websocket_frames(url: str, protocol: str, messages: Sequence[bytes] = ()
                            ) -> tuple[list[bytes], CloseConnection, bool, bytes]:
    """A WebSocket client on wsproto over a plain connection: sends ``messages``, then
    returns every data message up to the server's Close, that Close, whether the server
    still held the connection open then (waiting for our answer), and what came after
    our answer (nothing: the server closes)."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    client = WSConnection(ConnectionType.CLIENT)
    writer.write(client.send(WSRequest(host=parts.netloc, target=parts.path,
                                       subprotocols=[protocol])))
    received: list[bytes] = []
    part = b""
    close: CloseConnection | None = None
    try:
        while close is None:
            data = await reader.read(65536)
            assert data, "the server dropped the connection without a Close frame"
            client.receive_data(data)
            for event in client.events():
                if isinstance(event, AcceptConnection):
                    for message in messages:
                        writer.write(client.send(BytesMessage(data=message)))
                elif isinstance(event, BytesMessage):
                    part += event.data
                    if event.message_finished:
                        received.append(part)
                        part = b""
                elif isinstance(event, CloseConnection):
                    close = event
        # Give a server that would not wait for our answer the time to close.
        await asyncio.sleep(0.2)
        held_open = not reader.at_eof()
        writer.write(client.send(close.response()))
        rest = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
    return received, close, held_open, rest


@guard()
async def test_websocket_exec_ends_with_its_status_and_a_close_frame(start: Start) -> None:
    """What client-go's WebSocket executor needs to end without an error: the output,
    the status on channel 3, a Close frame with code 1000 (a dropped connection is 1006
    and fails every stream), and no CLOSE signal (channel 255) from the server, which it
    does not expect."""
    server = await start()
    for exit_code in ("0", "7"):
        received, close, held_open, rest = await _websocket_frames(
            server.url(_exec("echo", exit_code)), "v5.channel.k8s.io",
            [b"\x00hello", b"\xff\x00"])  # stdin, then v5's half-close of stdin
        assert received[:2] == [b"\x01", b"\x01hello"]  # "ready", then the output
        assert len(received) == 3 and received[2][0] == 3
        status = json.loads(received[2][1:])
        if exit_code == "0":
            assert status["status"] == "Success"
        else:
            assert status["reason"] == "NonZeroExitCode"
            assert status["details"]["causes"] == [{"reason": "ExitCode", "message": "7"}]
        assert (close.code, close.reason) == (1000, "")
        assert held_open and rest == b""


@guard()
async def test_port_forward_tunnelled_in_websocket(start: Start, runtime: Runtime) -> None:
    """client-go's WebSocket port-forward: SPDY in binary messages
    (``SPDY/3.1+portforward.k8s.io``), ended by either side with a Close frame."""
    server = await start()
    url = server.url(PortForwardRequest(sandbox_id="s", ports=(80,)))
    forward = await SpdyPortForward.connect(url, websocket=True)
    assert forward.client.protocol == "portforward.k8s.io"
    results = await asyncio.gather(*(forward.request(80, f"ping {i}".encode())
                                     for i in range(3)))
    assert sorted(results) == [(f"ping {i}".encode(), b"") for i in range(3)]
    assert runtime.calls == ["port_forward"] * 3
    await server.aclose()  # the server ends it: GOAWAY, then a Close frame
    await asyncio.wait_for(forward.client.goaway.wait(), 5)
    pipe = forward.client.reader
    assert isinstance(pipe, WebSocketPipe) and pipe.close_code == 1000
    await forward.close()
    assert server.sessions == 0

    server = await start()
    forward = await SpdyPortForward.connect(
        server.url(PortForwardRequest(sandbox_id="s", ports=(80,))), websocket=True)
    assert await forward.request(80, b"once") == (b"once", b"")
    await forward.close()  # the client ends it
    await _eventually(lambda: server.sessions == 0)


@guard()
async def test_websocket_port_forward_refuses_other_tunnels(start: Start) -> None:
    server = await start()
    headers = (*WS_HEADERS[:-1], "Sec-WebSocket-Protocol: SPDY/3.1+v4.channel.k8s.io")
    status, _, body = await _raw(server.url(PortForwardRequest(sandbox_id="s", ports=(80,))),
                                 headers=headers)
    assert status == 400
    assert "['SPDY/3.1+v4.channel.k8s.io']" in body and "SPDY/3.1+portforward.k8s.io" in body
