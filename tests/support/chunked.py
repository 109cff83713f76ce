"""zstd:chunked layers written in Python, for unit tests that need to bend the format.

The real producer is skopeo (``tests/data/zstd-chunked/`` holds a layer it wrote, and
the e2e tests use it directly); this writer lays a tar out the same way
(containers/storage's pkg/chunked): every regular file's contents in a zstd frame of
its own, the headers and padding between them in frames of their own, then skippable
frames with the TOC, the tar-split and the 64-byte footer. ``toc_hook`` and
``tarsplit_hook`` change the metadata before it is written, and the annotations are
computed afterwards: a producer that lies consistently, which only the diff id and
the files' digests can catch.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import struct
import tarfile
from collections.abc import Callable
from typing import Any

import zstandard

_SKIPPABLE = b"\x50\x2a\x4d\x18"
_FOOTER_MAGIC = b"GNUlInUx"
_TYPES = {tarfile.REGTYPE: "reg", tarfile.AREGTYPE: "reg", tarfile.DIRTYPE: "dir",
          tarfile.SYMTYPE: "symlink", tarfile.LNKTYPE: "hardlink", tarfile.CHRTYPE: "char",
          tarfile.BLKTYPE: "block", tarfile.FIFOTYPE: "fifo"}

Hook = Callable[[Any], None]


def _sha(b: bytes) -> str:
    return "sha256:" + hashlib.sha256(b).hexdigest()


def _skippable(data: bytes) -> bytes:
    return _SKIPPABLE + struct.pack("<I", len(data)) + data


def zstd_chunked(tar: bytes, *, toc_hook: Hook | None = None,
                 tarsplit_hook: Hook | None = None) -> tuple[bytes, dict[str, str]]:
    """The zstd:chunked blob of ``tar`` and its layer annotations."""
    z = zstandard.ZstdCompressor(level=3)
    out = bytearray()
    pending = bytearray()  # uncompressed bytes of the frame being gathered
    entries: list[dict[str, Any]] = []
    split: list[dict[str, Any]] = []
    pos = 0
    with tarfile.open(fileobj=io.BytesIO(tar), mode="r:") as tf:
        for m in tf:
            seg = tar[pos:m.offset_data]
            pending += seg
            split.append({"type": 2, "payload": base64.b64encode(seg).decode()})
            e: dict[str, Any] = {"type": _TYPES[m.type], "name": m.name, "mode": m.mode}
            if m.linkname:
                e["linkName"] = m.linkname
            if m.uid:
                e["uid"] = m.uid
            if m.gid:
                e["gid"] = m.gid
            pos = m.offset_data
            if m.isreg() and m.size:
                out += z.compress(bytes(pending))
                pending.clear()
                data = tar[pos:pos + m.size]
                e.update(size=m.size, digest=_sha(data), offset=len(out))
                out += z.compress(data)
                e["endOffset"] = len(out)
                pos += m.size
            split.append({"type": 1, "name": m.name, **({"size": m.size} if m.isreg()
                                                        and m.size else {})})
            entries.append(e)
    rest = tar[pos:]
    pending += rest
    split.append({"type": 2, "payload": base64.b64encode(rest).decode()})
    out += z.compress(bytes(pending))
    if tarsplit_hook is not None:
        tarsplit_hook(split)
    split_json = b"".join(json.dumps(s).encode() + b"\n" for s in split)
    split_z = z.compress(split_json)
    toc: dict[str, Any] = {"version": 1, "entries": entries, "tarSplitDigest": _sha(split_z)}
    if toc_hook is not None:
        toc_hook(toc)
    toc_json = json.dumps(toc).encode()
    toc_z = z.compress(toc_json)
    toc_at = len(out) + 8
    out += _skippable(toc_z)
    split_at = len(out) + 8
    out += _skippable(split_z)
    out += _skippable(struct.pack("<7Q", toc_at, len(toc_z), len(toc_json), 1, split_at,
                                  len(split_z), len(split_json)) + _FOOTER_MAGIC)
    return bytes(out), {
        "io.github.containers.zstd-chunked.manifest-checksum": _sha(toc_z),
        "io.github.containers.zstd-chunked.manifest-position":
            f"{toc_at}:{len(toc_z)}:{len(toc_json)}:1",
        "io.github.containers.zstd-chunked.tarsplit-position":
            f"{split_at}:{len(split_z)}:{len(split_json)}",
    }
