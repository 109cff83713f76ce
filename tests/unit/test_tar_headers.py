"""FastTarInfo (images/tar_headers.py) reads a header block exactly as tarfile's own
TarInfo.frombuf does: the same fields, or the same error, for real headers of every kind
and for arbitrary damage done to them."""

from __future__ import annotations

import io
import tarfile
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pycrid.images.tar_headers import FastTarInfo

SLOTS = tuple(tarfile.TarInfo.__slots__)


def _entries() -> list[tarfile.TarInfo]:
    out = []
    for kind in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE,
                 tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE,
                 tarfile.CONTTYPE):
        info = tarfile.TarInfo("usr/lib/x86_64-linux-gnu/some-file.so.1")
        info.type, info.mode, info.uid, info.gid = kind, 0o4755, 1000, 50
        info.mtime, info.linkname, info.uname, info.gname = 1_700_000_000, "target", "u", "g"
        info.devmajor, info.devminor = 1, 3
        out.append(info)
    long_dir = tarfile.TarInfo("a" * 120 + "/" + "b" * 60 + "/")  # ustar prefix + name
    long_dir.type = tarfile.DIRTYPE
    out.append(long_dir)
    v7_dir = tarfile.TarInfo("old-style/")
    v7_dir.type = tarfile.AREGTYPE
    out.append(v7_dir)
    big = tarfile.TarInfo("big")
    big.size, big.uid = 9 << 30, 3 << 24  # base-256 under GNU
    out.append(big)
    return out


def _blocks() -> list[bytes]:
    blocks = []
    for info in _entries():
        for fmt in (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
            try:
                data = info.tobuf(fmt, "utf-8", "surrogateescape")
            except ValueError:
                continue  # does not fit the format
            # every header block of it: extended headers and GNU long names included
            blocks += [data[i:i + tarfile.BLOCKSIZE]
                       for i in range(0, len(data), tarfile.BLOCKSIZE)]
    return blocks


BLOCKS = _blocks()


def _parse(cls: type[tarfile.TarInfo], buf: bytes) -> tuple[str, Any]:
    try:
        info = cls.frombuf(buf, "utf-8", "surrogateescape")
    except Exception as e:  # the kind of error is what is compared
        return "error", (type(e), str(e))
    return "ok", {k: getattr(info, k, None) for k in SLOTS}


def test_real_headers_read_the_same() -> None:
    assert len(BLOCKS) > 20
    for buf in BLOCKS:
        assert _parse(FastTarInfo, buf) == _parse(tarfile.TarInfo, buf)


def test_a_whole_archive_reads_the_same() -> None:
    """Through TarFile, as the unpacker reads: every member and its offsets alike."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for info in _entries()[:-1]:
            data = info.isreg() and not info.name.endswith("/")  # a V7 directory has none
            info.size = 700 if data else 0
            tf.addfile(info, io.BytesIO(b"x" * 700) if data else None)
        pax = tarfile.TarInfo("caf\u00e9/" + "n" * 200)  # a pax header carries the name
        pax.pax_headers = {"SCHILY.xattr.user.k": "v"}
        tf.addfile(pax, io.BytesIO())

    def members(cls: type[tarfile.TarInfo]) -> list[dict[str, Any]]:
        with tarfile.open(fileobj=io.BytesIO(buf.getvalue()), tarinfo=cls) as tf:
            return [{k: getattr(m, k, None) for k in SLOTS if k != "tarfile"} for m in tf]

    assert members(FastTarInfo) == members(tarfile.TarInfo)
    assert len(members(FastTarInfo)) == len(_entries())


@pytest.mark.parametrize("buf", [b"", b"\0" * 512, b"\0" * 100, b"x" * 512, b" " * 512],
                         ids=["empty", "zeros", "short", "garbage", "spaces"])
def test_end_and_broken_blocks_fail_the_same(buf: bytes) -> None:
    assert _parse(FastTarInfo, buf) == _parse(tarfile.TarInfo, buf)
    assert _parse(FastTarInfo, buf)[0] == "error"


@settings(max_examples=600, deadline=None)
@given(st.sampled_from(BLOCKS), st.lists(st.tuples(st.integers(0, 511), st.integers(0, 255)),
                                         min_size=1, max_size=6))
def test_damaged_headers_read_the_same(buf: bytes, changes: list[tuple[int, int]]) -> None:
    block = bytearray(buf)
    for pos, value in changes:
        block[pos] = value
    assert _parse(FastTarInfo, bytes(block)) == _parse(tarfile.TarInfo, bytes(block))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(BLOCKS), st.integers(100, 344), st.binary(min_size=1, max_size=12))
def test_rewritten_fields_read_the_same(buf: bytes, pos: int, data: bytes) -> None:
    """Numbers and names rewritten (octal with spaces, signs, underscores, base-256 marks,
    non-ASCII), the checksum fixed up so the block gets past it."""
    block = bytearray(buf)
    block[pos:pos + len(data)] = data
    del block[512:]
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % (sum(block) & 0o777777)
    assert _parse(FastTarInfo, bytes(block)) == _parse(tarfile.TarInfo, bytes(block))
