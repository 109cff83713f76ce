"""The tar-split of a zstd:chunked layer: the tar's own bytes around the files (sans-IO).

vbatts/tar-split's JSON packer writes one entry per line: ``{"type": 2, "payload":
<base64>}`` holds raw tar bytes (headers, padding, the end-of-archive blocks) and
``{"type": 1, "name": ..., "size": n}`` stands for a file's contents (its ``payload``
is a crc64, unused here: the TOC's sha256 is stronger). The segments and the files'
contents, in order, are the exact uncompressed tar, so its sha256 is the diff id.

Here the tar-split and the TOC must tell the same story: every file with contents is
in both, with the same size, in the same order as its data lies in the blob. A layer
whose two disagree is pulled whole.
"""

from __future__ import annotations

import binascii
import json
from typing import Any

from pycrid.images.partial.chunked_toc import Toc
from pycrid.images.partial.layout import MAX_ENTRIES, FileData, Layout, Piece, Unusable, check_name

_SEGMENT, _FILE = 2, 1


def layout(ndjson: bytes, toc: Toc) -> Layout:
    """The layer's tar as pieces: raw bytes from the tar-split, file contents from the TOC."""
    lines = [line for line in ndjson.split(b"\n") if line.strip()]
    if len(lines) > 2 * MAX_ENTRIES + 2:
        raise Unusable("the tar-split has too many entries")
    try:
        entries = json.loads(b"[" + b",".join(lines) + b"]")
    except (ValueError, RecursionError) as err:
        raise Unusable(f"the tar-split is not JSON lines: {str(err)[:200]}") from None
    pieces: list[Piece] = []
    raw: list[bytes] = []
    used: set[str] = set()
    size = last_end = 0
    for e in entries:
        kind = e.get("type") if isinstance(e, dict) else None
        if kind == _SEGMENT:
            raw.append(_payload(e))
            size += len(raw[-1])
            continue
        if kind != _FILE:
            raise Unusable(f"a tar-split entry is of unknown type {str(kind)[:20]!r}")
        f = _file(e, toc, used)
        if f is None:
            continue
        if f.start < last_end:
            raise Unusable(f"{f.name!r}: its data in the blob overlaps or precedes the "
                           "previous file's")
        last_end = f.end
        if raw:
            pieces.append(b"".join(raw))
            raw = []
        pieces.append(f)
        size += f.size
    if raw:
        pieces.append(b"".join(raw))
    missing = toc.files.keys() - used
    if missing:
        raise Unusable(f"the TOC lists files the tar-split does not, e.g. {min(missing)!r}")
    return Layout(tuple(pieces), size)


def _payload(e: dict[str, Any]) -> bytes:
    p = e.get("payload")
    if p is None:
        return b""
    if not isinstance(p, str):
        raise Unusable("a tar-split segment's payload is not base64")
    try:
        return binascii.a2b_base64(p, strict_mode=True)
    except binascii.Error:
        raise Unusable("a tar-split segment's payload is not base64") from None


def _file(e: dict[str, Any], toc: Toc, used: set[str]) -> FileData | None:
    """The TOC's account of a tar-split file entry with contents (None when empty)."""
    if "name_raw" in e:
        # Not UTF-8: the TOC's JSON cannot hold the same name to match it by.
        raise Unusable("a tar-split file name is not UTF-8")
    name, size = e.get("name"), e.get("size", 0)
    if not isinstance(name, str) or type(size) is not int or size < 0:
        raise Unusable(f"tar-split file entry {str(name)[:100]!r} is malformed")
    check_name(name, "tar-split")
    if size == 0:
        return None
    f = toc.files.get(name)
    if f is None or name in used:
        raise Unusable(f"{name!r} has contents in the tar-split but "
                       f"{'is listed twice' if f else 'no TOC entry'}")
    if f.size != size:
        raise Unusable(f"{name!r} is {size} bytes in the tar-split, {f.size} in the TOC")
    used.add(name)
    return f
