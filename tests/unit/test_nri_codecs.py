"""Sans-IO tests of the NRI wire codecs: ttrpc framing and state machines, and the mux."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pycrid.nri import api
from pycrid.nri.proto import ttrpc_pb2
from pycrid.nri.wire import mux
from pycrid.nri.wire.ttrpc import (
    HEADER,
    HEADER_SIZE,
    MAX_MESSAGE_SIZE,
    ClientProtocol,
    Code,
    Message,
    MessageReader,
    MessageType,
    Oversized,
    ProtocolError,
    Rejected,
    RequestReceived,
    ResponseReceived,
    ServerProtocol,
    TtrpcError,
    encode_message,
)

PROPS = settings(max_examples=150, deadline=None)

# ---------------------------------------------------------------- helpers


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at the given offsets (clamped, sorted, deduplicated)."""
    points = sorted({min(max(c, 0), len(data)) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def chunks_of(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


cut_lists = st.lists(st.integers(min_value=0, max_value=20_000), max_size=30)


def feed_all(reader: MessageReader, pieces: list[bytes]) -> list[Message | Oversized]:
    out: list[Message | Oversized] = []
    for piece in pieces:
        out.extend(reader.feed(piece))
    return out


def oversized_header(stream_id: int = 5, length: int = MAX_MESSAGE_SIZE + 1) -> bytes:
    return HEADER.pack(length, stream_id, MessageType.REQUEST, 0)


def request_bytes(stream_id: int, service: str = "s", method: str = "m") -> bytes:
    body = ttrpc_pb2.Request(service=service, method=method).SerializeToString()
    return encode_message(stream_id, MessageType.REQUEST, body)


# ---------------------------------------------------------------- framing


def test_header_layout_is_big_endian_ten_bytes() -> None:
    data = encode_message(0x01020304, MessageType.RESPONSE, b"xyz", flags=7)
    assert HEADER_SIZE == 10
    assert data == b"\x00\x00\x00\x03\x01\x02\x03\x04\x02\x07xyz"


def test_encode_message_refuses_oversized_payload() -> None:
    encode_message(1, MessageType.REQUEST, b"\0" * MAX_MESSAGE_SIZE)  # the limit itself is fine
    with pytest.raises(TtrpcError) as exc:
        encode_message(1, MessageType.REQUEST, b"\0" * (MAX_MESSAGE_SIZE + 1))
    assert exc.value.code == Code.RESOURCE_EXHAUSTED


@PROPS
@given(
    payload=st.binary(max_size=5000),
    stream_id=st.integers(min_value=0, max_value=2**32 - 1),
    type_=st.integers(min_value=0, max_value=255),
    flags=st.integers(min_value=0, max_value=255),
    cuts=cut_lists,
)
def test_message_round_trip_any_split(
    payload: bytes, stream_id: int, type_: int, flags: int, cuts: list[int]
) -> None:
    data = encode_message(stream_id, type_, payload, flags)
    reader = MessageReader()
    assert feed_all(reader, split(data, cuts)) == [Message(stream_id, type_, flags, payload)]
    assert reader.buffered == 0


@PROPS
@given(payload=st.binary(max_size=300))
def test_message_round_trip_one_byte_chunks(payload: bytes) -> None:
    data = encode_message(3, MessageType.REQUEST, payload)
    reader = MessageReader()
    out: list[Message | Oversized] = []
    for i, piece in enumerate(chunks_of(data, 1)):
        out.extend(reader.feed(piece))
        if i < len(data) - 1:
            assert out == []
            assert reader.buffered == i + 1
    assert out == [Message(3, MessageType.REQUEST, 0, payload)]
    assert reader.buffered == 0


@PROPS
@given(
    payloads=st.lists(st.binary(max_size=600), min_size=1, max_size=12),
    cuts=cut_lists,
)
def test_back_to_back_messages_any_split(payloads: list[bytes], cuts: list[int]) -> None:
    data = b"".join(
        encode_message(2 * i + 1, MessageType.REQUEST, p) for i, p in enumerate(payloads)
    )
    expected = [Message(2 * i + 1, MessageType.REQUEST, 0, p) for i, p in enumerate(payloads)]
    assert feed_all(MessageReader(), split(data, cuts)) == expected
    assert feed_all(MessageReader(), [data]) == expected


def test_empty_feed_yields_nothing() -> None:
    reader = MessageReader()
    assert reader.feed(b"") == []
    assert reader.buffered == 0


def test_oversized_then_valid_in_one_feed() -> None:
    length = MAX_MESSAGE_SIZE + 1
    data = oversized_header(5, length) + b"\xaa" * length + encode_message(7, 1, b"ok")
    reader = MessageReader()
    assert reader.feed(data) == [
        Oversized(5, MessageType.REQUEST, length),
        Message(7, 1, 0, b"ok"),
    ]
    assert reader.buffered == 0


@pytest.mark.parametrize("chunk", [1000, 4096, 65536, 1 << 20, 3 << 20])
def test_oversized_then_valid_chunked(chunk: int) -> None:
    length = MAX_MESSAGE_SIZE + 1
    valid = encode_message(7, 1, b"still here")
    data = oversized_header(5, length) + b"\xaa" * length + valid
    reader = MessageReader()
    out: list[Message | Oversized] = []
    max_buffered = 0
    for piece in chunks_of(data, chunk):
        out.extend(reader.feed(piece))
        # The skipped body is counted but never held in memory.
        max_buffered = max(max_buffered, len(reader._buf))
    assert out == [Oversized(5, MessageType.REQUEST, length), Message(7, 1, 0, b"still here")]
    assert reader.buffered == 0
    assert max_buffered <= chunk + len(valid)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_oversized_then_valid_random_split(data: st.DataObject) -> None:
    length = MAX_MESSAGE_SIZE + 1 + data.draw(st.integers(min_value=0, max_value=100))
    payload = data.draw(st.binary(max_size=100))
    valid = encode_message(9, 1, payload)
    stream = oversized_header(5, length) + bytes(length) + valid
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=len(stream)), max_size=8))
    # Always cut somewhere in the header and right before the valid message's end too.
    cuts += [data.draw(st.integers(0, HEADER_SIZE)), len(stream) - len(valid) - 1]
    out = feed_all(MessageReader(), split(stream, cuts))
    assert out == [Oversized(5, MessageType.REQUEST, length), Message(9, 1, 0, payload)]


def test_oversized_body_pending_is_counted_as_buffered() -> None:
    reader = MessageReader()
    assert reader.feed(oversized_header(5) + b"x" * 100) == [
        Oversized(5, MessageType.REQUEST, MAX_MESSAGE_SIZE + 1)
    ]
    assert reader.buffered == MAX_MESSAGE_SIZE + 1 - 100


def test_reader_max_size_is_configurable() -> None:
    reader = MessageReader(max_size=4)
    out = reader.feed(encode_message(1, 1, b"12345") + encode_message(3, 1, b"1234"))
    assert out == [Oversized(1, 1, 5), Message(3, 1, 0, b"1234")]


# ---------------------------------------------------------------- client <-> server

services = st.text(max_size=60)
metadata_st = st.lists(st.tuples(st.text(max_size=10), st.text(max_size=10)), max_size=4)


@PROPS
@given(
    service=services,
    method=services,
    payload=st.binary(max_size=3000),
    timeout=st.integers(min_value=-(2**40), max_value=2**63 - 1),
    metadata=metadata_st,
    answer=st.binary(max_size=3000),
    code=st.sampled_from(list(Code)),
    message=st.text(max_size=40),
    cuts=cut_lists,
)
def test_request_response_round_trip(
    service: str,
    method: str,
    payload: bytes,
    timeout: int,
    metadata: list[tuple[str, str]],
    answer: bytes,
    code: Code,
    message: str,
    cuts: list[int],
) -> None:
    client, server = ClientProtocol(), ServerProtocol()
    stream_id, data = client.request(
        service, method, payload, timeout_nano=timeout, metadata=metadata
    )
    assert stream_id == 1
    events: list[RequestReceived | Rejected] = []
    for piece in split(data, cuts):
        events.extend(server.receive_data(piece))
    assert events == [
        RequestReceived(1, service, method, payload, max(0, timeout), tuple(metadata))
    ]
    reply = server.respond(stream_id, answer, code, message)
    got: list[ResponseReceived] = []
    for piece in split(reply, cuts):
        got.extend(client.receive_data(piece))
    if code == Code.OK:
        assert got == [ResponseReceived(1, Code.OK, "", answer)]
    else:
        assert got == [ResponseReceived(1, code, message, answer)]
    assert client.buffered == 0 and server.buffered == 0


def test_client_stream_ids_are_odd_and_increasing() -> None:
    client = ClientProtocol()
    ids = [client.request("s", "m", b"")[0] for _ in range(5)]
    assert ids == [1, 3, 5, 7, 9]


def test_oversized_request_does_not_consume_a_stream_id() -> None:
    client = ClientProtocol()
    with pytest.raises(TtrpcError) as exc:
        client.request("s", "m", b"\0" * MAX_MESSAGE_SIZE)
    assert exc.value.code == Code.RESOURCE_EXHAUSTED
    assert client.request("s", "m", b"")[0] == 1


def test_ok_response_carries_no_status_field() -> None:
    data = ServerProtocol().respond(3, b"payload")
    resp = ttrpc_pb2.Response.FromString(data[HEADER_SIZE:])
    assert not resp.HasField("status")
    assert resp.payload == b"payload"
    # Byte for byte: only field 2 (payload).
    assert data[HEADER_SIZE:] == b"\x12\x07payload"


def test_error_response_carries_status() -> None:
    data = ServerProtocol().respond(3, b"", Code.NOT_FOUND, "nope")
    resp = ttrpc_pb2.Response.FromString(data[HEADER_SIZE:])
    assert resp.status.code == Code.NOT_FOUND
    assert resp.status.message == "nope"


def test_oversized_response_turns_into_resource_exhausted() -> None:
    data = ServerProtocol().respond(3, b"\0" * MAX_MESSAGE_SIZE)
    assert len(data) < 1000
    [ev] = ClientProtocol().receive_data(data)
    assert ev.stream_id == 3
    assert ev.code == Code.RESOURCE_EXHAUSTED
    assert "exceeds maximum message size" in ev.message


def test_nri_message_round_trip() -> None:
    client, server = ClientProtocol(), ServerProtocol()
    req = api.ConfigureRequest(config="cfg", runtime_name="pycrid", request_timeout=2000)
    sid, data = client.request(api.PLUGIN_SERVICE, "Configure", req.SerializeToString())
    [ev] = server.receive_data(data)
    assert isinstance(ev, RequestReceived)
    assert api.ConfigureRequest.FromString(ev.payload) == req
    [resp] = client.receive_data(server.respond(sid, api.Empty().SerializeToString()))
    assert resp == ResponseReceived(sid, Code.OK, "", b"")


# ---------------------------------------------------------------- server rejections


def test_server_rejects_even_stream_id() -> None:
    server = ServerProtocol()
    [ev] = server.receive_data(request_bytes(2))
    assert ev == Rejected(
        2, Code.INVALID_ARGUMENT, "StreamID must be odd for client initiated streams"
    )


def test_server_rejects_reused_stream_id() -> None:
    server = ServerProtocol()
    first, second = server.receive_data(request_bytes(5) + request_bytes(5))
    assert isinstance(first, RequestReceived) and first.stream_id == 5
    assert second == Rejected(
        5, Code.INVALID_ARGUMENT, "StreamID cannot be re-used and must increment"
    )


def test_server_rejects_decreasing_stream_id() -> None:
    server = ServerProtocol()
    events = server.receive_data(request_bytes(7) + request_bytes(3) + request_bytes(9))
    assert [type(e) for e in events] == [RequestReceived, Rejected, RequestReceived]
    assert events[1] == Rejected(
        3, Code.INVALID_ARGUMENT, "StreamID cannot be re-used and must increment"
    )
    assert events[2].stream_id == 9


def test_server_rejects_data_message() -> None:
    server = ServerProtocol()
    [ev] = server.receive_data(encode_message(1, MessageType.DATA, b"chunk"))
    assert ev == Rejected(1, Code.INVALID_ARGUMENT, "StreamID is no longer active")
    # The id was not consumed by the data message.
    [ok] = server.receive_data(request_bytes(1))
    assert isinstance(ok, RequestReceived)


def test_server_rejects_undecodable_request() -> None:
    server = ServerProtocol()
    # Field 1 (service) claims 5 bytes but only 2 follow.
    events = server.receive_data(
        encode_message(1, MessageType.REQUEST, b"\x0a\x05ab") + request_bytes(3)
    )
    assert isinstance(events[0], Rejected)
    assert events[0].stream_id == 1
    assert events[0].code == Code.INVALID_ARGUMENT
    assert events[0].message.startswith("unmarshal request error")
    assert isinstance(events[1], RequestReceived) and events[1].stream_id == 3


def test_server_rejects_oversized_and_continues() -> None:
    server = ServerProtocol()
    length = MAX_MESSAGE_SIZE + 10
    data = oversized_header(1, length) + bytes(length) + request_bytes(3)
    events: list[RequestReceived | Rejected] = []
    for piece in chunks_of(data, 1 << 20):
        events.extend(server.receive_data(piece))
    assert len(events) == 2
    assert isinstance(events[0], Rejected)
    assert events[0].stream_id == 1 and events[0].code == Code.RESOURCE_EXHAUSTED
    assert str(length) in events[0].message
    assert isinstance(events[1], RequestReceived) and events[1].stream_id == 3


@pytest.mark.parametrize("type_", [0, MessageType.RESPONSE, 4, 255])
def test_server_protocol_error_on_non_request(type_: int) -> None:
    with pytest.raises(ProtocolError):
        ServerProtocol().receive_data(encode_message(1, type_, b""))


@pytest.mark.parametrize("type_", [0, MessageType.REQUEST, MessageType.DATA, 9])
def test_client_protocol_error_on_non_response(type_: int) -> None:
    with pytest.raises(ProtocolError):
        ClientProtocol().receive_data(encode_message(1, type_, b""))


def test_client_protocol_error_on_undecodable_response() -> None:
    with pytest.raises(ProtocolError):
        ClientProtocol().receive_data(encode_message(1, MessageType.RESPONSE, b"\x0a\x09xx"))


def test_client_reports_response_to_unknown_stream() -> None:
    client = ClientProtocol()
    [ev] = client.receive_data(ServerProtocol().respond(99, b"late"))
    assert ev == ResponseReceived(99, Code.OK, "", b"late")


def test_client_reports_oversized_response() -> None:
    client = ClientProtocol()
    length = MAX_MESSAGE_SIZE + 1
    header = HEADER.pack(length, 1, MessageType.RESPONSE, 0)
    [ev] = client.receive_data(header + bytes(length))
    assert ev.stream_id == 1 and ev.code == Code.RESOURCE_EXHAUSTED and ev.payload == b""


# ---------------------------------------------------------------- mux


@pytest.mark.parametrize(
    ("n", "sizes"),
    [
        (0, [0]),
        (1, [1]),
        (4095, [4095]),
        (4096, [4096]),
        (4097, [4096, 1]),
        (70000, [4096, 70000 - 4096]),
    ],
)
def test_mux_frame_sizes(n: int, sizes: list[int]) -> None:
    message = bytes(range(256)) * (n // 256) + bytes(n % 256)
    assert mux.frame_sizes(1, message) == sizes
    data = mux.encode(1, message)
    assert len(data) == len(message) + 8 * len(sizes)
    # Headers are big-endian [conn][length].
    assert data[:8] == (1).to_bytes(4, "big") + sizes[0].to_bytes(4, "big")


def test_mux_largest_message_is_two_frames() -> None:
    message = bytes(MAX_MESSAGE_SIZE + HEADER_SIZE)
    assert mux.frame_sizes(2, message) == [4096, len(message) - 4096]


def test_mux_reserved_conn() -> None:
    with pytest.raises(ValueError):
        mux.encode(0, b"x")
    with pytest.raises(ValueError):
        mux.Demultiplexer([0, 1])


mux_messages = st.lists(
    st.tuples(
        st.sampled_from([1, 2]),
        st.one_of(st.binary(max_size=200), st.binary(min_size=4000, max_size=9000)),
    ),
    max_size=20,
)


@settings(max_examples=100, deadline=None)
@given(messages=mux_messages, data=st.data())
def test_demux_reassembles_per_conn(messages: list[tuple[int, bytes]], data: st.DataObject) -> None:
    stream = b"".join(mux.encode(c, m) for c, m in messages)
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=len(stream)), max_size=40))
    read_between = data.draw(st.booleans())
    demux = mux.Demultiplexer([1, 2])
    got = {1: b"", 2: b""}
    for piece in split(stream, cuts):
        demux.receive_data(piece)
        if read_between:
            for c in got:
                got[c] += demux.read(c)
    for c in got:
        got[c] += demux.read(c)
    for c in (1, 2):
        assert got[c] == b"".join(m for cc, m in messages if cc == c)
    assert demux.buffered == 0
    assert demux.dropped_frames == 0


def test_demux_one_byte_chunks() -> None:
    stream = mux.encode(1, b"a" * 5000) + mux.encode(2, b"b" * 10) + mux.encode(1, b"")
    demux = mux.Demultiplexer([1, 2])
    for piece in chunks_of(stream, 1):
        demux.receive_data(piece)
    assert demux.read(1) == b"a" * 5000
    assert demux.read(2) == b"b" * 10
    assert demux.read(1) == b""


def test_demux_drops_frames_for_unopened_conn() -> None:
    demux = mux.Demultiplexer([1, 2])
    demux.receive_data(
        mux.encode(7, b"x" * 5000)
        + mux.encode(1, b"one")
        + mux.encode(7, b"y")
        + mux.encode(2, b"two")
    )
    assert demux.dropped_frames == 3
    assert demux.read(1) == b"one"
    assert demux.read(2) == b"two"
    assert demux.conns() == [1, 2]
    with pytest.raises(KeyError):
        demux.read(7)


def test_demux_oversize_header_fails_before_payload() -> None:
    demux = mux.Demultiplexer([1, 2])
    with pytest.raises(mux.MuxError):
        demux.receive_data(mux.FRAME_HEADER.pack(1, mux.MAX_FRAME_PAYLOAD + 1))


def test_demux_largest_frame_is_accepted() -> None:
    demux = mux.Demultiplexer([1])
    payload = bytes(mux.MAX_FRAME_PAYLOAD)
    demux.receive_data(mux.FRAME_HEADER.pack(1, len(payload)) + payload)
    assert len(demux.read(1)) == mux.MAX_FRAME_PAYLOAD


def test_demux_oversize_header_split_across_feeds() -> None:
    demux = mux.Demultiplexer([1, 2])
    header = mux.FRAME_HEADER.pack(2, 0xFFFFFFFF)
    demux.receive_data(header[:5])
    with pytest.raises(mux.MuxError):
        demux.receive_data(header[5:])


def test_demux_queue_of_256_frames_is_fine() -> None:
    demux = mux.Demultiplexer([1])
    demux.receive_data(b"".join(mux.encode(1, bytes([i])) for i in range(256)))
    assert demux.read(1) == bytes(range(256))


def test_demux_257th_queued_frame_overflows() -> None:
    demux = mux.Demultiplexer([1, 2])
    demux.receive_data(b"".join(mux.encode(1, b"x") for _ in range(256)))
    with pytest.raises(mux.MuxError):
        demux.receive_data(mux.encode(1, b"x"))


def test_demux_read_resets_queue_limit() -> None:
    demux = mux.Demultiplexer([1])
    for _ in range(3):
        demux.receive_data(b"".join(mux.encode(1, b"x") for _ in range(256)))
        assert demux.read(1) == b"x" * 256


def test_demux_buffered_after_truncated_frame() -> None:
    demux = mux.Demultiplexer([1])
    frame = mux.encode(1, b"hello world")
    demux.receive_data(frame[:-3])
    assert demux.buffered == len(frame) - 3
    assert demux.read(1) == b""
    demux.receive_data(frame[-3:])
    assert demux.buffered == 0
    assert demux.read(1) == b"hello world"


def test_demux_buffered_after_partial_header() -> None:
    demux = mux.Demultiplexer([1])
    demux.receive_data(b"\x00\x00\x00")
    assert demux.buffered == 3


def test_demux_frames_yields_each_frame_without_queueing() -> None:
    demux = mux.Demultiplexer([1, 2])
    data = b"".join(mux.encode(1 if i % 2 else 2, b"m%d" % i) for i in range(300))
    data += mux.encode(7, b"dropped") + mux.encode(1, b"tail")[:-2]
    got = list(demux.frames(data))
    assert len(got) == 300
    assert got[:3] == [(2, b"m0"), (1, b"m1"), (2, b"m2")]
    assert demux.dropped_frames == 1
    assert demux.buffered == len(mux.encode(1, b"tail")) - 2
    assert list(demux.frames(b"il")) == [(1, b"tail")]
    assert demux.read(1) == b"" and demux.read(2) == b""  # nothing was queued
    with pytest.raises(mux.MuxError):
        list(demux.frames(mux.FRAME_HEADER.pack(2, mux.MAX_FRAME_PAYLOAD + 1)))
