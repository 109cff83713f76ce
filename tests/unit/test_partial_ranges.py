"""Range coalescing, multipart/byteranges parsing and routing (sans-IO)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pycrid.errors import DataLoss
from pycrid.images.partial.ranges import (
    Multipart,
    Part,
    Router,
    boundary_of,
    coalesce,
    content_range,
    range_header,
    request_batches,
)

BLOB = os.urandom(5000)


def multipart(parts: list[tuple[int, int]], boundary: bytes = b"XyZ", preamble: bytes = b"",
              epilogue: bytes = b"\r\n") -> bytes:
    """What Go's http.ServeContent sends for several ranges."""
    out = bytearray(preamble)
    for i, (s, e) in enumerate(parts):
        out += (b"\r\n" if i or preamble else b"") + b"--" + boundary + b"\r\n"
        out += b"Content-Range: bytes %d-%d/%d\r\n" % (s, e - 1, len(BLOB))
        out += b"Content-Type: application/octet-stream\r\n\r\n" + BLOB[s:e]
    return bytes(out + b"\r\n--" + boundary + b"--" + epilogue)


def route(wanted: list[tuple[int, int]], body: bytes, cuts: list[int]) -> tuple[bytes, Router]:
    mp, router = Multipart(b"XyZ", len(BLOB)), Router(wanted)
    got = bytearray()
    pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    for piece in pieces:
        for ev in mp.feed(piece):
            if isinstance(ev, Part):
                router.part(ev)
            else:
                for b in router.data(ev):
                    got += b
    assert mp.done
    return bytes(got), router


def test_coalesce_and_batches() -> None:
    assert coalesce([(50, 60), (0, 10), (12, 20), (5, 8)], gap=2) == [(0, 20), (50, 60)]
    assert coalesce([(0, 10), (100, 110)], gap=89) == [(0, 10), (100, 110)]
    assert coalesce([(0, 10), (100, 110)], gap=90) == [(0, 110)]
    assert request_batches([(i, i + 1) for i in range(5)], 2) == [
        [(0, 1), (1, 2)], [(2, 3), (3, 4)], [(4, 5)]]
    assert range_header([(0, 10), (20, 21)]) == "bytes=0-9,20-20"


def test_content_range_and_boundary() -> None:
    assert content_range("bytes 10-19/100", 100) == (10, 20)
    assert content_range("bytes 0-0/*", 100) == (0, 1)
    for bad in ("bytes 10-5/100", "bytes 0-100/100", "bytes 0-1/99", "items 0-1/100", "x"):
        with pytest.raises(DataLoss):
            content_range(bad, 100)
    assert boundary_of("multipart/byteranges; boundary=abc") == b"abc"
    assert boundary_of('multipart/byteranges; boundary="a b"') == b"a b"
    assert boundary_of("application/octet-stream") is None
    with pytest.raises(DataLoss, match="without a boundary"):
        boundary_of("multipart/byteranges")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 4999), min_size=2, max_size=12, unique=True).map(sorted),
       st.lists(st.integers(1, 3000), max_size=8), st.booleans())
def test_multipart_in_any_pieces(bounds: list[int], cuts: list[int], preamble: bool) -> None:
    ranges = [(bounds[i], bounds[i + 1]) for i in range(0, len(bounds) - 1, 2)]
    body = multipart(ranges, preamble=b"ignored preamble" if preamble else b"")
    got, router = route(ranges, body, sorted({c for c in cuts if c < len(body)}))
    assert got == b"".join(BLOB[s:e] for s, e in ranges)
    assert router.complete and router.remaining() == []


def test_merged_parts_are_routed_and_gaps_dropped() -> None:
    wanted = [(10, 20), (30, 40), (100, 110)]
    got, router = route(wanted, multipart([(10, 40), (100, 110)]), [7, 300])
    assert got == BLOB[10:20] + BLOB[30:40] + BLOB[100:110]
    assert router.complete


def test_fewer_parts_leave_the_rest_to_ask_again() -> None:
    wanted = [(10, 20), (30, 40), (100, 110)]
    got, router = route(wanted, multipart([(10, 35)]), [])
    assert got == BLOB[10:20] + BLOB[30:35]
    assert router.remaining() == [(35, 40), (100, 110)]


def test_a_part_that_skips_asked_bytes_is_refused() -> None:
    router = Router([(10, 20)])
    with pytest.raises(DataLoss, match="skipping"):
        router.part(Part(15, 20))
    router = Router([(10, 20)])
    with pytest.raises(DataLoss, match="outside"):
        router.data(b"x")  # no part announced
    router.part(Part(10, 12))
    with pytest.raises(DataLoss, match="outside"):
        router.data(b"xyz")


@pytest.mark.parametrize(("body", "why"), [
    (b"--XyZ\r\nContent-Range: bytes 0-9/5000\r\n\r\n" + b"x" * 11, "longer"),
    (b"--XyZ\r\nContent-Type: a\r\n\r\n", "without a Content-Range"),
    (b"--XyZ\r\nContent-Range: bytes 0-9/9\r\n\r\n", "does not fit"),
    (b"--XyZzz", "malformed"),
    (b"x" * 20000, "before the first part"),
    (b"--XyZ\r\n" + b"H" * 20000, "in a part's headers"),
])
def test_garbage_multipart(body: bytes, why: str) -> None:
    with pytest.raises(DataLoss, match=why):
        Multipart(b"XyZ", 5000).feed(body)


def test_part_without_headers_is_refused_and_epilogue_ignored() -> None:
    with pytest.raises(DataLoss, match="without a Content-Range"):
        Multipart(b"XyZ", 5000).feed(b"--XyZ\r\n\r\nabc")
    mp = Multipart(b"XyZ", len(BLOB))
    events = mp.feed(multipart([(0, 3)], epilogue=b"\r\ntrailing junk"))
    assert events == [Part(0, 3), BLOB[0:3]] and mp.done
