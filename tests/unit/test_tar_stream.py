"""TarStream (images/tar_stream.py): whatever the mix of small reads, large reads, copies
to a file and steps back that tarfile makes, the bytes come out in order and whole, and
the hash is that of the whole stream."""

from __future__ import annotations

import hashlib
import io
import os

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pycrid.images.tar_stream import LOOKAHEAD, TarStream

DATA = bytes(range(256)) * 600 + os.urandom(50_000)  # ~200 KiB


class Trickle(io.RawIOBase):
    """A stream that hands out at most ``piece`` bytes a read (as a download does)."""

    def __init__(self, data: bytes, piece: int) -> None:
        self._data, self._piece, self._at = data, piece, 0

    def read(self, n: int = -1) -> bytes:
        n = self._piece if n < 0 else min(n, self._piece)
        out = self._data[self._at:self._at + n]
        self._at += len(out)
        return out


op = st.one_of(
    st.tuples(st.just("read"), st.integers(0, 3 * LOOKAHEAD)),
    st.tuples(st.just("read"), st.integers(0, 600)),
    st.tuples(st.just("copy"), st.integers(0, 200_000)),
    st.tuples(st.just("back"), st.integers(1, 512)),
    st.tuples(st.just("skip"), st.integers(0, 5000)),
)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 70_000), st.lists(op, max_size=30))
# A step back, nothing read, another step back: 513 bytes behind the furthest point read,
# which tarfile never asks (the model's rule once allowed it).
@example(piece=1, ops=[("read", 65537), ("back", 257), ("read", 0), ("back", 256)])
def test_any_mix_of_reads_sees_the_stream_in_order(tmp_path_factory: pytest.TempPathFactory,
                                                    piece: int,
                                                    ops: list[tuple[str, int]]) -> None:
    out = tmp_path_factory.mktemp("copy") / "f"
    src = TarStream(Trickle(DATA, piece))
    copied = []
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        # What a step back may reach: the last 512 bytes before the furthest point read
        # (tarfile steps back only into the block it just read; a step back, a read
        # that stays behind that point and another step back must stay within it too).
        furthest = 0
        for kind, n in ops:
            pos = src.tell()
            if kind == "back":
                if n <= pos and pos - n >= furthest - 512:
                    assert src.seek(pos - n) == pos - n
                continue
            end = min(pos + n, len(DATA))
            if kind == "read":
                assert src.read(n) == DATA[pos:end]
            elif kind == "copy":
                assert src.copy_to(fd, n) == end - pos
                copied.append(DATA[pos:end])
            else:
                assert src.seek(pos + n) == end
            assert src.tell() == end
            furthest = max(furthest, end)
    finally:
        os.close(fd)
    assert out.read_bytes() == b"".join(copied)
    src.drain()
    assert src.tell() == len(DATA)
    assert src.hash is not None and src.hash.hexdigest() == hashlib.sha256(DATA).hexdigest()


def test_a_step_back_too_far_is_refused() -> None:
    src = TarStream(io.BytesIO(DATA))
    src.read(1000)
    with pytest.raises(OSError, match="cannot go back"):
        src.seek(100)
    assert src.seek(1000 - 512) == 488
    assert src.read(512) == DATA[488:1000]


def test_unhashed() -> None:
    src = TarStream(io.BytesIO(DATA), hashed=False)
    assert src.read() == DATA and src.hash is None
