"""The sans-IO SPDY/3.1 codec: round trips, flow control, errors, Go interop vectors."""

from __future__ import annotations

import struct
import zlib

import pytest

from pycrid.streaming import spdy_frames
from pycrid.streaming.spdy import FlowControlError, SpdyConnection, StreamClosedError
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
from pycrid.streaming.spdy_frames import ProtocolError

# Bytes written by moby/spdystream's spdy.Framer (the vendored copy kubectl and
# crictl use). The client-direction frames come from one framer, so
# SYN_STREAM_STDOUT continues SYN_STREAM_ERROR's compression context; SYN_REPLY
# and HEADERS_MULTI come from a second framer, the server direction.
GO_SYN_STREAM_ERROR = bytes.fromhex(  # stream 1, streamtype: error
    "80030001000000290000000100000000000078f9e3c6a7c26260606004a7b392a2d4c45c6851c29a0a0a"
    "6800000000ffff"
)
GO_SYN_STREAM_STDOUT = bytes.fromhex(  # stream 3, FIN, priority 2, streamtype: stdout
    "800300010100001900000003000000004000c22ac5565c92925f5a02000000ffff"
)
GO_SYN_REPLY = bytes.fromhex(  # stream 1, no headers
    "80030002000000140000000178f9e3c6a7c26260606000000000ffff"
)
GO_DATA_FIN = bytes.fromhex("000000010100000568656c6c6f")  # stream 1, "hello", FIN
GO_PING = bytes.fromhex("800300060000000400000007")  # id 7
GO_GOAWAY = bytes.fromhex("80030007000000080000000500000000")  # last good 5, status 0
GO_WINDOW_UPDATE = bytes.fromhex("80030009000000080000000100001000")  # stream 1, +4096
GO_RST_STREAM = bytes.fromhex("80030003000000080000000300000005")  # stream 3, CANCEL
GO_HEADERS_MULTI = bytes.fromhex(  # stream 1, x-multi: a, b
    "800300080000001c000000016260606004a5c90adddcd29c924c70c9c89004000000ffff"
)


def pump(src: SpdyConnection, dst: SpdyConnection) -> list[Event]:
    return dst.receive_data(src.data_to_send())


@pytest.fixture
def pair() -> tuple[SpdyConnection, SpdyConnection]:
    return SpdyConnection(client=True), SpdyConnection(client=False)


def test_open_reply_data_fin(pair: tuple[SpdyConnection, SpdyConnection]) -> None:
    client, server = pair
    sid = client.open_stream({"StreamType": "stdin", "port": "80"}, priority=3)
    assert sid == 1
    assert pump(client, server) == [
        StreamOpened(1, {"streamtype": "stdin", "port": "80"}, fin=False, associated_id=0)
    ]
    server.reply(sid, {"status": "ok"})
    assert pump(server, client) == [StreamReplied(1, {"status": "ok"}, fin=False)]
    client.send_data(sid, b"ping", fin=True)
    assert pump(client, server) == [DataReceived(1, b"ping", fin=True)]
    assert server.remote_closed(sid) and not server.local_closed(sid)
    with pytest.raises(StreamClosedError):
        client.send_data(sid, b"more")
    server.send_data(sid, b"pong")
    server.end_stream(sid)
    assert pump(server, client) == [DataReceived(1, b"pong", False), DataReceived(1, b"", True)]
    assert not client.is_open(sid) and not server.is_open(sid)
    assert client.open_stream({}) == 3


def test_server_streams_are_even_and_headers_frames(
    pair: tuple[SpdyConnection, SpdyConnection],
) -> None:
    client, server = pair
    sid = server.open_stream({"a": "1"}, associated_id=0)
    assert sid == 2 and server.open_stream({}, fin=True) == 4
    assert [type(e) for e in pump(server, client)] == [StreamOpened, StreamOpened]
    client.reply(sid)
    client.send_headers(sid, {"trailer-ish": "x"}, fin=True)
    assert pump(client, server) == [
        StreamReplied(2, {}, False),
        HeadersReceived(2, {"trailer-ish": "x"}, True),
    ]


def test_reset_forgets_stream_and_late_frames_are_dropped(
    pair: tuple[SpdyConnection, SpdyConnection],
) -> None:
    client, server = pair
    sid = client.open_stream({})
    pump(client, server)
    server.send_data(sid, b"in flight")
    client.reset_stream(sid)
    assert not client.is_open(sid)
    assert pump(server, client) == []  # data for the stream we just reset
    assert pump(client, server) == [StreamReset(sid, spdy_frames.CANCEL)]
    assert not server.is_open(sid)
    client.reset_stream(sid)  # already gone: nothing queued
    assert client.data_to_send() == b""


def test_data_after_remote_fin_is_reset(pair: tuple[SpdyConnection, SpdyConnection]) -> None:
    client, server = pair
    sid = client.open_stream({}, fin=True)
    pump(client, server)
    frame = struct.pack(">II", sid, 3) + b"bad"
    assert server.receive_data(frame) == [StreamReset(sid, spdy_frames.STREAM_ALREADY_CLOSED)]
    assert client.receive_data(server.data_to_send()) == [
        StreamReset(sid, spdy_frames.STREAM_ALREADY_CLOSED)
    ]


def test_ping_goaway_settings(pair: tuple[SpdyConnection, SpdyConnection]) -> None:
    client, server = pair
    pid = client.ping()
    assert pid % 2 == 1 and client.ping() == pid + 2
    assert pump(client, server) == [PingReceived(pid), PingReceived(pid + 2)]
    assert pump(server, client) == [PingAcknowledged(pid), PingAcknowledged(pid + 2)]
    assert server.ping() % 2 == 0
    server.data_to_send()
    sid = client.open_stream({})
    pump(client, server)
    server.go_away(spdy_frames.INTERNAL_ERROR)
    assert pump(server, client) == [GoAwayReceived(sid, spdy_frames.INTERNAL_ERROR)]
    assert client.go_away_received and server.go_away_sent
    body = struct.pack(">III", 1, (1 << 24) | 4, 100)  # flag 1 (persist), id 4
    frame = struct.pack(">HHI", 0x8003, 4, len(body)) + body
    assert client.receive_data(frame) == [SettingsReceived({4: 100})]
    assert not client.peer_flow_control


def test_refuses_streams_after_goaway(pair: tuple[SpdyConnection, SpdyConnection]) -> None:
    client, server = pair
    server.go_away()
    client.open_stream({"x": "y"})
    assert pump(client, server) == []
    assert pump(server, client) == [GoAwayReceived(0, 0),
                                    StreamReset(1, spdy_frames.REFUSED_STREAM)]


def test_byte_by_byte_feeding(pair: tuple[SpdyConnection, SpdyConnection]) -> None:
    client, server = pair
    sid = client.open_stream({"streamtype": "data"})
    client.send_data(sid, b"x" * 100, fin=True)
    client.ping()
    events: list[Event] = []
    for byte in client.data_to_send():
        events += server.receive_data(bytes([byte]))
    assert events == [
        StreamOpened(1, {"streamtype": "data"}, False, 0),
        DataReceived(1, b"x" * 100, True),
        PingReceived(1),
    ]


def test_compression_context_is_shared(pair: tuple[SpdyConnection, SpdyConnection]) -> None:
    client, server = pair
    headers = {"streamtype": "stdout", "requestid": "0", "x-kubernetes": "exec"}
    sizes = []
    for i in range(20):
        client.open_stream(headers)
        out = client.data_to_send()
        sizes.append(len(out))
        assert server.receive_data(out) == [StreamOpened(2 * i + 1, headers, False, 0)]
    assert sizes[1] < sizes[0]


def test_multi_valued_headers(pair: tuple[SpdyConnection, SpdyConnection]) -> None:
    client, server = pair
    client.open_stream({"Accept": ["a", "b"], "accept": "c", "one": "1"})
    (event,) = pump(client, server)
    assert isinstance(event, StreamOpened)
    assert event.headers == {"accept": "a\x00b\x00c", "one": "1"}
    assert spdy_frames.header_values(event.headers, "Accept") == ["a", "b", "c"]
    assert spdy_frames.header_values(event.headers, "missing") == []


def test_large_data_is_split(pair: tuple[SpdyConnection, SpdyConnection]) -> None:
    client, server = pair
    sid = client.open_stream({})
    pump(client, server)
    payload = bytes(range(256)) * 400  # 102400 bytes, past the 64 KiB window
    client.send_data(sid, payload, fin=True)
    events = pump(client, server)
    assert [len(e.data) for e in events if isinstance(e, DataReceived)] == [
        32768,
        32768,
        32768,
        4096,
    ]
    assert b"".join(e.data for e in events if isinstance(e, DataReceived)) == payload


def window_updates(raw: bytes) -> list[tuple[int, int]]:
    """(stream, delta) of every WINDOW_UPDATE frame in raw."""
    found = []
    while raw:
        (length,) = struct.unpack_from(">I", raw, 4)
        length &= 0xFFFFFF
        if raw[:4] == b"\x80\x03\x00\x09":
            found.append(struct.unpack_from(">II", raw, 8))
        raw = raw[8 + length :]
    return found


def test_acknowledge_batches_window_updates(
    pair: tuple[SpdyConnection, SpdyConnection],
) -> None:
    client, server = pair
    a = client.open_stream({})
    b = client.open_stream({})
    pump(client, server)
    client.send_data(a, b"x" * 20000)
    client.send_data(b, b"y" * 20000)
    pump(client, server)
    server.acknowledge(a, 20000)
    assert window_updates(server.data_to_send()) == []  # below half a window
    server.acknowledge(b, 20000)  # session total 40000 crosses the threshold
    first = server.data_to_send()
    assert window_updates(first) == [(0, 40000)]
    server.acknowledge(a, 15000)
    second = server.data_to_send()
    assert window_updates(second) == [(a, 35000)]
    events = client.receive_data(first + second)
    assert events == [WindowUpdated(0, 40000), WindowUpdated(a, 35000)]


def test_send_window_unenforced_until_peer_updates(
    pair: tuple[SpdyConnection, SpdyConnection],
) -> None:
    client, server = pair
    sid = client.open_stream({})
    pump(client, server)
    assert client.send_window(sid) is None
    client.send_data(sid, b"x" * 70000)  # like spdystream's peers: no limit yet
    pump(client, server)
    server.acknowledge(sid, 70000)
    events = pump(server, client)
    assert events == [WindowUpdated(sid, 70000), WindowUpdated(0, 70000)]
    assert client.peer_flow_control
    assert client.send_window(sid) == 65536
    client.send_data(sid, b"x" * 60000)
    assert client.send_window(sid) == 5536
    with pytest.raises(FlowControlError):
        client.send_data(sid, b"x" * 6000)
    pump(client, server)
    server.acknowledge(sid, 60000)
    pump(server, client)
    assert client.send_window(sid) == 65536


def test_settings_initial_window_enables_enforcement(
    pair: tuple[SpdyConnection, SpdyConnection],
) -> None:
    client, _ = pair
    sid = client.open_stream({})
    client.send_data(sid, b"x" * 1000)
    body = struct.pack(">III", 1, spdy_frames.SETTINGS_INITIAL_WINDOW_SIZE, 4096)
    frame = struct.pack(">HHI", 0x8003, 4, len(body)) + body
    assert client.receive_data(frame) == [SettingsReceived({7: 4096})]
    assert client.send_window(sid) == 3096
    assert client.send_window(client.open_stream({})) == 4096
    with pytest.raises(StreamClosedError):
        client.send_window(99)


def test_bad_version() -> None:
    with pytest.raises(ProtocolError, match="version"):
        SpdyConnection(client=False).receive_data(bytes.fromhex("800200060000000400000001"))


def test_wrong_parity_and_non_increasing_syn_stream(
    pair: tuple[SpdyConnection, SpdyConnection],
) -> None:
    client, server = pair
    server.open_stream({})  # id 2 arriving at the server from "the client" is wrong
    with pytest.raises(ProtocolError, match="parity"):
        SpdyConnection(client=False).receive_data(server.data_to_send())
    client.open_stream({})
    first = client.data_to_send()
    client.open_stream({})
    second = bytearray(client.data_to_send())
    second[8:12] = struct.pack(">I", 1)  # stream 3 renamed 1; header block still valid
    assert [type(e) for e in server.receive_data(first)] == [StreamOpened]
    with pytest.raises(ProtocolError, match="increase"):
        server.receive_data(bytes(second))


def test_data_on_unknown_stream() -> None:
    with pytest.raises(ProtocolError, match="unknown stream"):
        SpdyConnection(client=False).receive_data(struct.pack(">II", 5, 1) + b"x")
    with pytest.raises(ProtocolError, match="unknown stream"):
        SpdyConnection(client=False).receive_data(struct.pack(">II", 0, 0))


def test_garbage_header_block() -> None:
    payload = struct.pack(">IIH", 1, 0, 0) + b"not zlib at all"
    frame = struct.pack(">HHI", 0x8003, 1, len(payload)) + payload
    with pytest.raises(ProtocolError, match="decompress"):
        SpdyConnection(client=False).receive_data(frame)


def test_header_block_with_bad_lengths() -> None:
    c = zlib.compressobj(zdict=spdy_frames.DICTIONARY)
    block = c.compress(struct.pack(">II", 1, 50) + b"short") + c.flush(zlib.Z_SYNC_FLUSH)
    payload = struct.pack(">IIH", 1, 0, 0) + block
    frame = struct.pack(">HHI", 0x8003, 1, len(payload)) + payload
    with pytest.raises(ProtocolError, match="malformed"):
        SpdyConnection(client=False).receive_data(frame)


def test_truncated_and_oversized_control_frames() -> None:
    with pytest.raises(ProtocolError, match="PING"):
        SpdyConnection(client=True).receive_data(bytes.fromhex("8003000600000002abcd"))
    with pytest.raises(ProtocolError, match="too large"):
        SpdyConnection(client=True).receive_data(bytes.fromhex("80030001") + b"\x00\xff\xff\xff")


def test_unknown_control_frames_are_skipped() -> None:
    frame = bytes.fromhex("8003000a00000003abcdef") + GO_PING
    assert SpdyConnection(client=False).receive_data(frame) == [PingReceived(7)]


def test_a_control_frame_of_type_zero_is_skipped_not_taken_for_data() -> None:
    frame = bytes.fromhex("8003000000000000") + GO_PING
    assert SpdyConnection(client=False).receive_data(frame) == [PingReceived(7)]


def test_dictionary_identity() -> None:
    # Go's framer puts this checksum (DICTID) into every zlib stream header.
    assert len(spdy_frames.DICTIONARY) == 1423
    assert zlib.adler32(spdy_frames.DICTIONARY) == int.from_bytes(GO_SYN_STREAM_ERROR[20:24], "big")


def test_decodes_go_framer_vectors() -> None:
    server = SpdyConnection(client=False)
    stream = GO_SYN_STREAM_ERROR + GO_SYN_STREAM_STDOUT + GO_DATA_FIN + GO_PING
    assert server.receive_data(stream) == [
        StreamOpened(1, {"streamtype": "error"}, False, 0),
        StreamOpened(3, {"streamtype": "stdout"}, True, 0),
        DataReceived(1, b"hello", True),
        PingReceived(7),
    ]
    assert server.data_to_send() == GO_PING  # answered with the same id
    server.reply(1)
    assert server.receive_data(GO_WINDOW_UPDATE + GO_RST_STREAM) == [
        WindowUpdated(1, 4096),
        StreamReset(3, spdy_frames.CANCEL),
    ]
    assert server.receive_data(GO_GOAWAY) == [GoAwayReceived(5, 0)]


def test_decodes_go_framer_reply_and_headers() -> None:
    client = SpdyConnection(client=True)
    client.open_stream({})
    assert client.receive_data(GO_SYN_REPLY + GO_HEADERS_MULTI) == [
        StreamReplied(1, {}, False),
        HeadersReceived(1, {"x-multi": "a\x00b"}, False),
    ]


def test_go_vectors_fed_byte_by_byte() -> None:
    server = SpdyConnection(client=False)
    events: list[Event] = []
    for byte in GO_SYN_STREAM_ERROR + GO_SYN_STREAM_STDOUT:
        events += server.receive_data(bytes([byte]))
    assert [e.headers for e in events if isinstance(e, StreamOpened)] == [
        {"streamtype": "error"},
        {"streamtype": "stdout"},
    ]


def test_headers_after_remote_fin_reset_the_stream(
    pair: tuple[SpdyConnection, SpdyConnection],
) -> None:
    client, server = pair
    # A twin compresses identically, so it can speak on a stream the client finished.
    twin = SpdyConnection(client=True)
    client.open_stream({"a": "b"}, fin=True)
    twin.open_stream({"a": "b"})
    twin.data_to_send()
    pump(client, server)
    assert server.is_open(1) and server.remote_closed(1)
    twin.send_headers(1, {"x": "y"})
    assert pump(twin, server) == [StreamReset(1, spdy_frames.STREAM_ALREADY_CLOSED)]
    assert not server.is_open(1)
