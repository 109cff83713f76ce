"""Sans-IO tests of the streaming codecs: WebSocket channels and the close handshake,
error-stream statuses, resize events and stream tokens."""

from __future__ import annotations

import base64
import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    Pong,
    TextMessage,
)
from wsproto.events import Request as WSRequest

from pycrid.streaming import channels as ch
from pycrid.streaming.channels import (
    ChannelClose,
    ChannelCodec,
    ChannelData,
    ChannelError,
    choose_subprotocol,
    parse_ports,
    port_forward_channels,
    port_prefix,
    split_port_prefix,
)
from pycrid.streaming.side_streams import (
    RemoteCommandError,
    ResizeDecoder,
    TerminalSize,
    encode_status_for_version,
    exit_code_status,
    internal_error_status,
    parse_exit_status,
    success_status,
)
from pycrid.streaming.tokens import TOKEN_LENGTH, TokenCache, TooManyRequests
from pycrid.streaming.websocket import Received, WebSocketEnd

PROPS = settings(max_examples=100, deadline=None)

BINARY = [ch.PROTOCOL_PLAIN, ch.PROTOCOL_CHANNEL, ch.PROTOCOL_V4_CHANNEL, ch.PROTOCOL_V5_CHANNEL]
BASE64 = [ch.PROTOCOL_BASE64_CHANNEL, ch.PROTOCOL_V4_BASE64_CHANNEL]

# ---------------------------------------------------------------- subprotocols


def test_protocol_names() -> None:
    assert ch.PROTOCOL_CHANNEL == "channel.k8s.io"
    assert ch.PROTOCOL_BASE64_CHANNEL == "base64.channel.k8s.io"
    assert ch.PROTOCOL_V4_CHANNEL == "v4.channel.k8s.io"
    assert ch.PROTOCOL_V4_BASE64_CHANNEL == "v4.base64.channel.k8s.io"
    assert ch.PROTOCOL_V5_CHANNEL == "v5.channel.k8s.io"
    assert ch.PORT_FORWARD_SPDY_PROTOCOL == "portforward.k8s.io"
    assert ch.PORT_FORWARD_WS_PROTOCOLS == ("", "v4.channel.k8s.io", "v4.base64.channel.k8s.io")
    assert (ch.STDIN, ch.STDOUT, ch.STDERR, ch.ERROR, ch.RESIZE, ch.CLOSE) == (0, 1, 2, 3, 4, 255)


@pytest.mark.parametrize(
    ("protocol", "binary", "version"),
    [
        ("", True, 1),
        ("channel.k8s.io", True, 1),
        ("base64.channel.k8s.io", False, 1),
        ("v4.channel.k8s.io", True, 4),
        ("v4.base64.channel.k8s.io", False, 4),
        ("v5.channel.k8s.io", True, 5),
    ],
)
def test_codec_properties(protocol: str, binary: bool, version: int) -> None:
    codec = ChannelCodec(protocol)
    assert (codec.subprotocol, codec.binary, codec.version) == (protocol, binary, version)
    assert codec.supports_close == (version == 5)


def test_codec_rejects_unknown_subprotocol() -> None:
    with pytest.raises(ValueError, match="unknown channel subprotocol"):
        ChannelCodec("v3.channel.k8s.io")


def test_choose_first_offered_supported() -> None:
    supported = ch.REMOTE_COMMAND_WS_PROTOCOLS
    offered = ["v6.channel.k8s.io", "base64.channel.k8s.io", "v4.channel.k8s.io"]
    # The client's order wins, not ours.
    assert choose_subprotocol(offered, supported) == "base64.channel.k8s.io"
    assert choose_subprotocol([" v4.channel.k8s.io "], supported) == "v4.channel.k8s.io"


def test_choose_plain_only_when_nothing_offered() -> None:
    assert choose_subprotocol([], ch.PORT_FORWARD_WS_PROTOCOLS) == ""
    assert choose_subprotocol(["", " "], ch.PORT_FORWARD_WS_PROTOCOLS) == ""
    # Nothing offered but "" not supported: refuse.
    assert choose_subprotocol([], ["v4.channel.k8s.io"]) is None
    # Offered but nothing matches: refuse rather than fall back to "".
    assert choose_subprotocol(["v5.channel.k8s.io"], ch.PORT_FORWARD_WS_PROTOCOLS) is None
    assert choose_subprotocol(["SPDY/3.1+portforward.k8s.io"], ch.PORT_FORWARD_WS_PROTOCOLS) is None


# ---------------------------------------------------------------- binary codec


@pytest.mark.parametrize("protocol", BINARY)
def test_binary_encode_decode(protocol: str) -> None:
    codec = ChannelCodec(protocol)
    assert codec.encode(ch.STDIN, b"foo\n") == b"\x00foo\n"
    assert codec.encode(ch.STDOUT, b"") == b"\x01"
    assert codec.decode(b"\x00foo\n") == ChannelData(0, b"foo\n")
    assert codec.decode(b"\x02") == ChannelData(2, b"")
    # Text frames are read the same way.
    assert codec.decode("\x01hi") == ChannelData(1, b"hi")


@PROPS
@given(channel=st.integers(0, 254), data=st.binary(max_size=300))
def test_binary_round_trip(channel: int, data: bytes) -> None:
    codec = ChannelCodec(ch.PROTOCOL_V4_CHANNEL)
    message = codec.encode(channel, data)
    assert isinstance(message, bytes)
    assert codec.decode(message) == ChannelData(channel, data)


@pytest.mark.parametrize("protocol", BINARY + BASE64)
def test_empty_message_is_an_error(protocol: str) -> None:
    with pytest.raises(ChannelError, match="empty message"):
        ChannelCodec(protocol).decode(b"")
    with pytest.raises(ChannelError, match="empty message"):
        ChannelCodec(protocol).decode("")


@pytest.mark.parametrize("channel", [-1, 255, 256])
def test_binary_channel_out_of_range(channel: int) -> None:
    with pytest.raises(ChannelError, match="out of range"):
        ChannelCodec(ch.PROTOCOL_CHANNEL).encode(channel, b"x")


def test_channel_255_is_data_before_v5() -> None:
    # Before v5 255 is merely reserved; the server passes it on as a channel.
    assert ChannelCodec(ch.PROTOCOL_V4_CHANNEL).decode(b"\xff\x00") == ChannelData(255, b"\x00")


# ---------------------------------------------------------------- v5 close


def test_v5_close_round_trip() -> None:
    codec = ChannelCodec(ch.PROTOCOL_V5_CHANNEL)
    assert codec.encode_close(ch.STDIN) == b"\xff\x00"
    assert codec.decode(b"\xff\x00") == ChannelClose(0)
    assert codec.decode(codec.encode_close(4)) == ChannelClose(4)


@pytest.mark.parametrize("message", [b"\xff", b"\xff\x00\x01"])
def test_v5_close_needs_exactly_one_channel_byte(message: bytes) -> None:
    with pytest.raises(ChannelError, match="exactly one channel byte"):
        ChannelCodec(ch.PROTOCOL_V5_CHANNEL).decode(message)


@pytest.mark.parametrize("protocol", [p for p in BINARY + BASE64 if p != ch.PROTOCOL_V5_CHANNEL])
def test_close_only_in_v5(protocol: str) -> None:
    with pytest.raises(ChannelError, match="no close signal"):
        ChannelCodec(protocol).encode_close(0)


def test_close_channel_out_of_range() -> None:
    with pytest.raises(ChannelError, match="out of range"):
        ChannelCodec(ch.PROTOCOL_V5_CHANNEL).encode_close(255)


# ---------------------------------------------------------------- base64 codec


@pytest.mark.parametrize("protocol", BASE64)
def test_base64_encode_decode(protocol: str) -> None:
    codec = ChannelCodec(protocol)
    # The example session from wsstream's documentation.
    assert codec.encode(ch.STDOUT, b"\n") == "1Cg=="
    assert codec.decode(b"0Zm9vCg==") == ChannelData(0, b"foo\n")
    assert codec.decode("0Zm9vCg==") == ChannelData(0, b"foo\n")
    assert codec.encode(ch.ERROR, b"") == "3"
    assert codec.decode("3") == ChannelData(3, b"")


@PROPS
@given(channel=st.integers(0, 79), data=st.binary(max_size=300))
def test_base64_round_trip(channel: int, data: bytes) -> None:
    codec = ChannelCodec(ch.PROTOCOL_V4_BASE64_CHANNEL)
    message = codec.encode(channel, data)
    assert isinstance(message, str)
    assert message.isascii()
    assert message[0] == chr(ord("0") + channel)
    assert codec.decode(message) == ChannelData(channel, data)


def test_base64_ignores_line_breaks() -> None:
    codec = ChannelCodec(ch.PROTOCOL_BASE64_CHANNEL)
    assert codec.decode("0Zm9v\r\nCg==") == ChannelData(0, b"foo\n")


@pytest.mark.parametrize(
    "message", ["0Zm9vCg", "0Zm9v Cg==", "0Zm9v!g==", "0Zg=", "0=Zm9", "0Zm9vCg===", "0é"]
)
def test_base64_bad_payload(message: str) -> None:
    with pytest.raises(ChannelError, match="invalid base64 payload on channel 0"):
        ChannelCodec(ch.PROTOCOL_BASE64_CHANNEL).decode(message)


@pytest.mark.parametrize("message", ["/Zm9v", " Zm9v", "\x80Zg=="])
def test_base64_bad_channel_character(message: str) -> None:
    with pytest.raises(ChannelError, match="bad channel character"):
        ChannelCodec(ch.PROTOCOL_V4_BASE64_CHANNEL).decode(message)


def test_base64_channel_out_of_range() -> None:
    with pytest.raises(ChannelError, match=r"out of range 0\.\.79"):
        ChannelCodec(ch.PROTOCOL_BASE64_CHANNEL).encode(80, b"")


# ---------------------------------------------------------------- port-forward


def test_port_forward_channels() -> None:
    assert port_forward_channels(0) == (0, 1)
    assert port_forward_channels(3) == (6, 7)
    assert port_forward_channels(126) == (252, 253)
    with pytest.raises(ValueError, match="out of range"):
        port_forward_channels(127)


def test_port_prefix() -> None:
    assert port_prefix(80) == b"\x50\x00"
    assert port_prefix(8080) == b"\x90\x1f"
    assert port_prefix(65535) == b"\xff\xff"
    assert split_port_prefix(b"\x90\x1fhello") == (8080, b"hello")
    assert split_port_prefix(port_prefix(1)) == (1, b"")
    for bad in (0, -1, 65536):
        with pytest.raises(ValueError, match=r"out of range 1\.\.65535"):
            port_prefix(bad)
    with pytest.raises(ChannelError, match="needs 2 bytes"):
        split_port_prefix(b"\x50")


def test_parse_ports_good() -> None:
    assert parse_ports(["80"]) == [80]
    assert parse_ports(["80,443", "8080"]) == [80, 443, 8080]
    assert parse_ports(["1", "65535", "080"]) == [1, 65535, 80]
    assert parse_ports(["80", "80"]) == [80, 80]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([], 'query parameter "port" is required'),
        ([""], 'query parameter "port" cannot be empty'),
        (["80", ""], 'query parameter "port" cannot be empty'),
        (["http"], 'unable to parse "http" as a port: not a decimal number'),
        (["80,"], 'unable to parse "" as a port'),
        (["-1"], 'unable to parse "-1" as a port'),
        (["+80"], 'unable to parse "\\+80" as a port'),
        ([" 80"], 'unable to parse " 80" as a port'),
        (["8_0"], 'unable to parse "8_0" as a port'),
        (["65536"], 'unable to parse "65536" as a port: out of range'),
        (["0"], 'port "0" must be > 0'),
        (["22,0"], 'port "0" must be > 0'),
        ([",".join(["1"] * 128)], "too many ports: 128 requested, at most 127"),
    ],
)
def test_parse_ports_bad(values: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_ports(values)


# ---------------------------------------------------------------- statuses


def test_success_status_exact() -> None:
    assert success_status() == b'{"metadata":{},"status":"Success"}'


def test_exit_code_status_exact() -> None:
    assert exit_code_status(7, ["sh", "-c", "exit 7"]) == (
        b'{"metadata":{},"status":"Failure",'
        b'"message":"command terminated with non-zero exit code: '
        b'error executing command [sh -c exit 7], exit code 7",'
        b'"reason":"NonZeroExitCode",'
        b'"details":{"causes":[{"reason":"ExitCode","message":"7"}]}}'
    )
    assert exit_code_status(7) == (
        b'{"metadata":{},"status":"Failure",'
        b'"message":"command terminated with non-zero exit code: exit status 7",'
        b'"reason":"NonZeroExitCode",'
        b'"details":{"causes":[{"reason":"ExitCode","message":"7"}]}}'
    )


def test_exit_code_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="success_status"):
        exit_code_status(0)


def test_internal_error_status_exact() -> None:
    assert internal_error_status("error attaching to container: gone") == (
        b'{"metadata":{},"status":"Failure",'
        b'"message":"Internal error occurred: error attaching to container: gone",'
        b'"reason":"InternalError",'
        b'"details":{"causes":[{"message":"error attaching to container: gone"}]},'
        b'"code":500}'
    )
    # omitempty drops an empty cause message, leaving an empty cause.
    assert b'"causes":[{}]' in internal_error_status("")


def test_status_json_escapes_like_go() -> None:
    raw = exit_code_status(1, ["echo", "<a&b>", "caf\u00e9\u2028", "\x01\n"])
    assert b"\\u003ca\\u0026b\\u003e" in raw
    assert "caf\u00e9".encode() in raw  # non-ASCII stays raw UTF-8
    assert b"\\u2028" in raw
    assert b"\\u0001\\n" in raw
    assert json.loads(raw)["message"].endswith("[echo <a&b> caf\u00e9\u2028 \x01\n], exit code 1")
    # Invalid UTF-8 (as surrogateescape'd text) becomes U+FFFD, as in Go.
    bad = internal_error_status(b"x\xffy".decode("utf-8", "surrogateescape"))
    assert json.loads(bad)["details"]["causes"][0]["message"] == "x\ufffdy"


def test_status_for_version() -> None:
    for version in (4, 5):
        assert encode_status_for_version(version, success_status()) == success_status()
        assert encode_status_for_version(version, exit_code_status(7)) == exit_code_status(7)
    # Before v4: nothing on success, the bare message on failure.
    assert encode_status_for_version(1, success_status()) == b""
    assert encode_status_for_version(1, exit_code_status(7, ["false"])) == (
        b"command terminated with non-zero exit code: error executing command [false], exit code 7"
    )
    assert encode_status_for_version(3, internal_error_status("boom")) == (
        b"Internal error occurred: boom"
    )


def test_parse_exit_status() -> None:
    assert parse_exit_status(b"") is None
    assert parse_exit_status(success_status()) == 0
    assert parse_exit_status(exit_code_status(7, ["sh"])) == 7
    assert parse_exit_status(exit_code_status(255)) == 255
    with pytest.raises(RemoteCommandError, match=r"^Internal error occurred: boom$"):
        parse_exit_status(internal_error_status("boom"))


def _failure(details: object) -> bytes:
    return json.dumps(
        {"status": "Failure", "reason": "NonZeroExitCode", "details": details}
    ).encode()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"not json", "error stream protocol error: .* in b'not json'"),
        (b"[]", "not an object"),
        (b"{}", "unknown error"),
        (b'{"status":"Weird"}', "unknown error"),
        (_failure(None), "details must be set"),
        (_failure({"causes": []}), "no ExitCode cause given"),
        (_failure({"causes": [{"reason": "Other", "message": "3"}]}), "no ExitCode cause"),
        (_failure({"causes": [{"reason": "ExitCode", "message": "x"}]}), "invalid exit code"),
        (_failure({"causes": [{"reason": "ExitCode", "message": "256"}]}), "invalid exit code"),
        (_failure({"causes": [{"reason": "ExitCode", "message": "-1"}]}), "invalid exit code"),
        (_failure({"causes": [{"reason": "ExitCode"}]}), "invalid exit code"),
    ],
)
def test_parse_exit_status_errors(data: bytes, message: str) -> None:
    with pytest.raises(RemoteCommandError, match=message):
        parse_exit_status(data)


def test_parse_exit_status_skips_other_causes() -> None:
    data = _failure(
        {"causes": [{"reason": "Other", "message": "9"}, {"reason": "ExitCode", "message": "3"}]}
    )
    assert parse_exit_status(data) == 3


# ---------------------------------------------------------------- resize


def test_resize_one_object_per_chunk() -> None:
    decoder = ResizeDecoder()
    assert decoder.feed(b'{"Width":80,"Height":24}\n') == [TerminalSize(80, 24)]
    assert decoder.feed(b'{"Width":100,"Height":50}\n') == [TerminalSize(100, 50)]
    assert decoder.pending == 0


def test_resize_concatenated_and_split() -> None:
    decoder = ResizeDecoder()
    stream = b'{"Width":1,"Height":2}{"Width":3,"Height":4}\n {"Width":5,"Height":6}\n'
    assert decoder.feed(stream[:30]) == [TerminalSize(1, 2)]
    assert decoder.pending > 0
    assert decoder.feed(stream[30:]) == [TerminalSize(3, 4), TerminalSize(5, 6)]
    assert decoder.pending == 0


@PROPS
@given(
    sizes=st.lists(st.tuples(st.integers(0, 65535), st.integers(0, 65535)), max_size=6),
    cuts=st.lists(st.integers(0, 400), max_size=8),
    newline=st.booleans(),
)
def test_resize_any_chunking(sizes: list[tuple[int, int]], cuts: list[int], newline: bool) -> None:
    sep = b"\n" if newline else b""
    stream = b"".join(json.dumps({"Width": w, "Height": h}).encode() + sep for w, h in sizes)
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    decoder = ResizeDecoder()
    got: list[TerminalSize] = []
    for start, end in itertools.pairwise(points):
        got += decoder.feed(stream[start:end])
    assert got == [TerminalSize(w, h) for w, h in sizes]
    assert decoder.pending == 0


def test_resize_go_decoding_rules() -> None:
    decoder = ResizeDecoder()
    # Case-insensitive keys, unknown keys ignored, missing and null fields are 0,
    # braces inside strings do not confuse the scanner.
    assert decoder.feed(b'{"width":10,"HEIGHT":20,"x":{"y":"}{"}}') == [TerminalSize(10, 20)]
    assert decoder.feed(b'{"Height":5}') == [TerminalSize(0, 5)]
    assert decoder.feed(b'{"Width":null,"Height":7}') == [TerminalSize(0, 7)]
    # An escaped quote does not end a string: the object is still open.
    assert decoder.feed(b'{"Width":5,"x":"\\"}') == []
    assert decoder.pending > 0
    assert decoder.feed(b'"}') == [TerminalSize(5, 0)]


def test_resize_multibyte_split() -> None:
    decoder = ResizeDecoder()
    data = '{"note":"\u00e9\u6f22","Width":2,"Height":3}'.encode()
    assert decoder.feed(data[:10]) == []
    assert decoder.feed(data[10:]) == [TerminalSize(2, 3)]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"[1,2]", "expected a JSON object"),
        (b"null", "expected a JSON object"),
        (b'{"Width":80 "Height":24}', "invalid JSON"),
        (b'{"Width":"80"}', "Width must be an integer"),
        (b'{"Width":80.5}', "Width must be an integer"),
        (b'{"Width":true}', "Width must be an integer"),
        (b'{"Height":65536}', "Height 65536 is out of range"),
        (b'{"Height":-1}', "Height -1 is out of range"),
        (b'{"Width":1]', "invalid JSON"),
    ],
)
def test_resize_errors(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ResizeDecoder().feed(data)


def test_resize_buffer_limit() -> None:
    decoder = ResizeDecoder(max_buffer=16)
    with pytest.raises(ValueError, match="larger than 16 bytes"):
        decoder.feed(b'{"Width":1,"padding":"' + b"x" * 32)


# ---------------------------------------------------------------- tokens


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_token_format_and_single_use() -> None:
    cache: TokenCache[str] = TokenCache()
    token = cache.insert("exec")
    assert len(token) == TOKEN_LENGTH
    assert base64.urlsafe_b64decode(token) and token.isascii()
    assert set(token) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert len(cache) == 1
    assert cache.consume(token) == "exec"
    assert cache.consume(token) is None
    assert len(cache) == 0
    assert cache.consume("AAAAAAAA") is None


def test_tokens_are_distinct() -> None:
    cache: TokenCache[int] = TokenCache()
    tokens = [cache.insert(i) for i in range(500)]
    assert len(set(tokens)) == 500
    assert [cache.consume(t) for t in tokens] == list(range(500))


def test_token_ttl() -> None:
    clock = FakeClock()
    cache: TokenCache[str] = TokenCache(ttl=60.0, clock=clock)
    early = cache.insert("a")
    edge = cache.insert("b")
    late = cache.insert("c")
    clock.now += 60.0
    # Exactly at the TTL a token still works (Go: expired only when After).
    assert cache.consume(edge) == "b"
    clock.now += 0.001
    assert cache.consume(early) is None
    assert len(cache) == 0
    assert cache.consume(late) is None


def test_token_cap_and_eviction() -> None:
    clock = FakeClock()
    cache: TokenCache[int] = TokenCache(ttl=10.0, max_outstanding=3, clock=clock)
    first = cache.insert(1)
    clock.now += 5
    second = cache.insert(2)
    cache.insert(3)
    with pytest.raises(TooManyRequests, match="maximum number of in-flight stream requests"):
        cache.insert(4)
    # Once the oldest expires, inserting evicts it and makes room.
    clock.now += 5.5
    cache.insert(4)
    assert len(cache) == 3
    with pytest.raises(TooManyRequests):
        cache.insert(5)
    # Using a token frees its slot too.
    assert cache.consume(second) == 2
    cache.insert(5)
    clock.now += 5
    assert len(cache) == 2
    assert cache.consume(first) is None


def test_token_cache_arguments() -> None:
    with pytest.raises(ValueError, match="ttl"):
        TokenCache(ttl=0)
    with pytest.raises(ValueError, match="max_outstanding"):
        TokenCache(max_outstanding=0)


# ---------------------------------------------------------------- WebSocket end


def _pair(subprotocol: str = ch.PROTOCOL_V5_CHANNEL) -> tuple[WSConnection, WebSocketEnd]:
    """A wsproto client and the server end after the handshake."""
    client = WSConnection(ConnectionType.CLIENT)
    server = WSConnection(ConnectionType.SERVER)
    server.receive_data(client.send(WSRequest(host="h", target="/exec/t",
                                              subprotocols=[subprotocol])))
    assert any(isinstance(e, WSRequest) for e in server.events())
    client.receive_data(server.send(AcceptConnection(subprotocol=subprotocol)))
    assert any(isinstance(e, AcceptConnection) for e in client.events())
    return client, WebSocketEnd(server)


def _client_sees(client: WSConnection, data: bytes) -> list[object]:
    client.receive_data(data)
    return list(client.events())


def test_ws_end_messages_and_pings() -> None:
    client, end = _pair()
    got = end.receive(client.send(BytesMessage(data=b"\x00hel", message_finished=False))
                      + client.send(BytesMessage(data=b"lo"))
                      + client.send(Ping(payload=b"beat"))
                      + client.send(TextMessage(data="0aGk=")))
    assert got.messages == [b"\x00hello", "0aGk="]
    assert _client_sees(client, got.reply) == [Pong(payload=b"beat")]
    assert _client_sees(client, end.send(b"\x01out")) == [BytesMessage(data=b"\x01out")]


def test_ws_end_server_close_waits_for_the_clients_answer() -> None:
    """The sequence client-go takes as a normal end: our Close (1000), the client's
    answer, and only then is the session finished (and the connection may go)."""
    client, end = _pair()
    frame = end.close()
    assert _client_sees(client, frame) == [CloseConnection(code=1000, reason="")]
    assert not end.open and not end.finished
    assert end.close() == b""  # a second close sends nothing
    with pytest.raises(ConnectionResetError):
        end.send(b"\x01late")
    # A ping that crossed our Close (masked, key 0) is not answered: pongs are for open
    # connections.
    assert end.receive(b"\x89\x81\x00\x00\x00\x00x").reply == b""
    answer = client.send(CloseConnection(code=1000))
    got = end.receive(answer)
    assert got.reply == b"" and got.messages == []
    assert end.finished and end.peer_code == 1000
    assert end.receive(b"anything after the end") == Received()


def test_ws_end_client_close_is_answered() -> None:
    client, end = _pair()
    got = end.receive(client.send(BytesMessage(data=b"\x00last"))
                      + client.send(CloseConnection(code=1000, reason="bye")))
    assert got.messages == [b"\x00last"]
    assert _client_sees(client, got.reply) == [CloseConnection(code=1000, reason="bye")]
    assert end.finished and end.peer_code == 1000
    assert end.close() == b""


def test_ws_end_connection_lost() -> None:
    _, end = _pair()
    assert end.receive(b"") == Received()
    assert end.finished and end.peer_code == 1006
    assert end.close() == b""


def test_ws_end_bad_framing_is_closed_with_a_protocol_error() -> None:
    _, end = _pair()
    # A client frame without a mask (RFC 6455 5.1: the server must fail the connection).
    got = end.receive(b"\x82\x02\x01x")
    assert got.messages == []
    assert got.reply[0] == 0x88 and got.reply[1] < 126  # an unmasked Close frame
    assert int.from_bytes(got.reply[2:4], "big") == 1002
    assert end.finished and not end.open
