"""The eStargz TOC, from bytes we do not trust (sans-IO).

eStargz (containerd/stargz-snapshotter docs/estargz.md) is a gzip layer made of gzip
members: one starting at each regular file's contents (and at each chunk of a large
file), so a file's contents can be fetched alone, and a last one holding the TOC as a
tar entry ``stargz.index.json`` (JSON: ``version`` 1, ``entries`` with each entry's name,
type, mode, owner, mtime, size, sha256 ``digest`` and the ``offset`` of its member),
followed by a 51-byte footer: an empty gzip member whose extra field says where the TOC
member starts (``%016xSTARGZ``). The layer's descriptor carries the TOC's digest
(``containerd.io/snapshot/stargz/toc.digest``, the sha256 of the JSON), which is all
the TOC is trusted on.

``layout`` turns the entries into the pieces of the layer's tar: the headers, written
again as the producer's Go tar writer wrote them (``gotar``), each file's contents and
the compressed span holding them (the file's member up to the next file's), and the TOC
member itself. Anything out of shape is ``Unusable``: the layer is then pulled whole.
"""

from __future__ import annotations

import base64
import binascii
import calendar
import json
import re
import struct
import time
import zlib
from dataclasses import dataclass
from typing import Any

from pycrid.images.mediatypes import sha256_digest
from pycrid.images.partial import gotar
from pycrid.images.partial.layout import (
    DIGEST_RE,
    MAX_ENTRIES,
    FileData,
    Layout,
    Piece,
    Unusable,
    check_name,
    toc_count,
)

TOC_DIGEST = "containerd.io/snapshot/stargz/toc.digest"
FOOTER = 51
TOC_NAME = "stargz.index.json"
#: The TOC's JSON handled in memory, at most (a layer with more is pulled whole).
MAX_TOC = 64 << 20
_FOOTER_HEAD = b"\x1f\x8b\x08\x04"
_FOOTER_TAIL = b"\x01\x00\x00\xff\xff" + bytes(8)
_OFFSET_RE = re.compile(rb"^([0-9a-f]{16})STARGZ$")
_RFC3339 = re.compile(r"^(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)Z$")


def footer_offset(footer: bytes, blob_size: int) -> int:
    """Where the TOC member starts, from the blob's last 51 bytes."""
    if len(footer) != FOOTER or not footer.startswith(_FOOTER_HEAD) \
            or not footer.endswith(_FOOTER_TAIL):
        raise Unusable("the blob does not end with an eStargz footer")
    xlen, si, length = struct.unpack_from("<H2sH", footer, 10)
    m = _OFFSET_RE.match(footer[16:38])
    if xlen != 26 or si != b"SG" or length != 22 or m is None:
        raise Unusable("the eStargz footer's extra field is malformed")
    offset = int(m[1], 16)
    if not 0 < offset < blob_size - FOOTER:
        raise Unusable(f"the eStargz TOC offset {offset} lies outside the blob")
    return offset


def toc_json(member: bytes, digest: str) -> tuple[bytes, bytes]:
    """The TOC's JSON from its gzip member, once it matches the descriptor's digest, and
    the member's bytes uncompressed (the end of the layer's tar)."""
    d = zlib.decompressobj(31)
    try:
        tar = d.decompress(member, MAX_TOC + 3 * gotar.BLOCK)
    except zlib.error as e:
        raise Unusable(f"the eStargz TOC does not decompress: {e}") from None
    if len(tar) < gotar.BLOCK or tar[:len(TOC_NAME) + 1] != TOC_NAME.encode() + b"\0":
        raise Unusable("the eStargz TOC member does not hold stargz.index.json")
    try:
        size = int(tar[124:136].rstrip(b"\0 ") or b"0", 8)
    except ValueError:
        raise Unusable("the eStargz TOC's tar header is malformed") from None
    data = tar[gotar.BLOCK:gotar.BLOCK + size]
    if size > MAX_TOC or len(data) != size:
        raise Unusable("the eStargz TOC is truncated or too large")
    if sha256_digest(data) != digest:
        raise Unusable("the eStargz TOC does not match the descriptor's toc.digest")
    if not d.eof or d.unused_data:
        raise Unusable("the eStargz TOC member is not one whole gzip member")
    return data, tar


@dataclass(frozen=True)
class TocEntry:
    header: gotar.Entry
    digest: str = ""
    offset: int = 0


def parse(doc_bytes: bytes, toc_offset: int) -> list[TocEntry]:
    """The tar entries in order (chunk entries checked, then dropped: a file's span
    runs to the next file's member)."""
    try:
        doc = json.loads(doc_bytes)
    except (ValueError, RecursionError) as err:
        raise Unusable(f"the eStargz TOC is not JSON: {str(err)[:200]}") from None
    entries = doc.get("entries") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or doc.get("version") != 1 or not isinstance(entries, list):
        raise Unusable("the TOC is not a version 1 eStargz TOC")
    if len(entries) > MAX_ENTRIES:
        raise Unusable("the eStargz TOC has too many entries")
    out: list[TocEntry] = []
    names: dict[str, dict[int, str]] = {"user": {}, "group": {}}
    last = 0
    for e in entries:
        if not isinstance(e, dict):
            raise Unusable("an eStargz TOC entry is not an object")
        if _count(e, "innerOffset"):
            raise Unusable("eStargz members shared by several files (innerOffset) are "
                           "not supported")
        if e.get("type") == "chunk":
            if not out or _count(e, "offset") <= last or e.get("name") != out[-1].header.name:
                raise Unusable("an eStargz chunk entry does not follow its file")
            last = _count(e, "offset")
            continue
        t = _entry(e, names, toc_offset)
        if t.offset:
            if t.offset <= last:
                raise Unusable(f"{t.header.name!r}: its member lies before the previous one")
            last = t.offset
        out.append(t)
    if last >= toc_offset:
        raise Unusable("an eStargz member lies beyond the TOC")
    return out


def _count(e: dict[str, Any], key: str) -> int:
    return toc_count(e, key, "eStargz TOC")


def _text(e: dict[str, Any], key: str) -> str:
    v = e.get(key, "")
    if not isinstance(v, str):
        raise Unusable(f"eStargz TOC entry {str(e.get('name'))[:100]!r}: {key} is not text")
    return v


def _entry(e: dict[str, Any], names: dict[str, dict[int, str]], toc_offset: int) -> TocEntry:
    kind, name = e.get("type"), e.get("name")
    if kind not in gotar.TYPES or not isinstance(name, str):
        raise Unusable(f"eStargz TOC entry of type {str(kind)[:20]!r} named "
                       f"{str(name)[:100]!r}")
    check_name(name, "eStargz TOC")
    if name.strip("/") == TOC_NAME:
        raise Unusable("the eStargz TOC lists stargz.index.json")
    uid, gid = _count(e, "uid"), _count(e, "gid")
    # The writer records a user or group name only where it changes for its id.
    for key, idx in (("userName", uid), ("groupName", gid)):
        if _text(e, key):
            names["user" if key == "userName" else "group"][idx] = _text(e, key)
    header = gotar.Entry(
        name=name, kind=kind, mode=_count(e, "mode"), uid=uid, gid=gid,
        size=_count(e, "size") if kind == "reg" else 0, mtime=_mtime(_text(e, "modtime")),
        linkname=_text(e, "linkName"), uname=names["user"].get(uid, ""),
        gname=names["group"].get(gid, ""), devmajor=_count(e, "devMajor"),
        devminor=_count(e, "devMinor"), xattrs=_xattrs(e))
    if kind != "reg" or header.size == 0:
        return TocEntry(header)
    digest, offset = _text(e, "digest"), _count(e, "offset")
    if not DIGEST_RE.match(digest):
        raise Unusable(f"eStargz TOC entry {name!r} has no sha256 digest")
    if not 0 < offset < toc_offset:
        raise Unusable(f"eStargz TOC entry {name!r}: its member at {offset} lies outside "
                       "the blob's file data")
    return TocEntry(header, digest, offset)


def _mtime(value: str) -> int:
    if not value:
        return 0
    m = _RFC3339.match(value)
    if m is None:
        raise Unusable(f"eStargz modtime {value[:40]!r} is not RFC 3339 UTC to the second")
    return calendar.timegm(time.struct_time((*map(int, m.groups()), 0, 0, 0)))


def _xattrs(e: dict[str, Any]) -> dict[str, bytes]:
    x = e.get("xattrs") or {}
    if not isinstance(x, dict):
        raise Unusable("eStargz xattrs are not an object")
    try:
        return {str(k): base64.b64decode(v, validate=True) for k, v in x.items()
                if isinstance(v, str)}
    except binascii.Error:
        raise Unusable("eStargz xattrs are not base64") from None


def layout(entries: list[TocEntry], toc_offset: int, toc_tar: bytes, *,
           pax_names: bool = False) -> tuple[Layout, int]:
    """The layer's tar as pieces, and where the first file's member starts (the headers
    before it are fetched too, to check them against these). ``toc_tar`` is the TOC
    member uncompressed: the tar's end. ``pax_names``: see ``gotar.header``."""
    files = [i for i, t in enumerate(entries) if t.offset]
    ends = dict(zip(files, [*(entries[j].offset for j in files[1:]), toc_offset],
                    strict=True))
    pieces: list[Piece] = []
    headers: list[bytes] = []
    current = -1  # the file whose member the headers so far close

    def close() -> None:
        tail = b"".join(headers)
        headers.clear()
        if current < 0:
            pieces.append(tail)
            return
        h = entries[current].header
        tail = gotar.padding(h.size) + tail
        pieces.append(FileData(h.name, h.size, entries[current].digest,
                               entries[current].offset, ends[current], codec="gzip",
                               tail=tail))
        pieces.append(tail)

    for i, t in enumerate(entries):
        headers.append(gotar.header(t.header, pax_names=pax_names))
        if t.offset:
            close()
            current = i
    close()
    pieces.append(toc_tar)
    size = sum(len(p) if isinstance(p, bytes) else p.size for p in pieces)
    return Layout(tuple(pieces), size), entries[files[0]].offset if files else toc_offset


@dataclass(frozen=True)
class Styles:
    """The layer's tar written again both ways a long name can have been written (see
    ``gotar.header``): ``split`` and ``pax``, the same object when the layer has no name
    where it matters. ``probe``: the blob span whose real bytes tell which is right (the
    headers before the first file, or the member whose tail holds the first such name)."""

    split: Layout
    pax: Layout
    probe: tuple[int, int]


def styles(entries: list[TocEntry], toc_offset: int, toc_tar: bytes) -> Styles:
    split, head_end = layout(entries, toc_offset, toc_tar)
    pax, _ = layout(entries, toc_offset, toc_tar, pax_names=True)
    if pax.pieces == split.pieces:
        return Styles(split, split, (0, head_end))
    i = next(i for i, (a, b) in enumerate(zip(split.pieces, pax.pieces, strict=True))
             if a != b)
    # The first file whose tail differs (its piece carries the tail), or the head.
    at = split.pieces[i]
    probe = (at.start, at.end) if isinstance(at, FileData) else (0, head_end)
    return Styles(split, pax, probe)


def choose(s: Styles, probe: bytes) -> Layout:
    """The layout the probe's real (compressed) bytes agree with."""
    try:
        real = _gunzip(probe)
    except zlib.error as e:
        raise Unusable(f"the eStargz members do not decompress: {e}") from None
    for lay in (s.split, s.pax):
        if _agrees(lay, s.probe, real):
            return lay
    raise Unusable("the layer's tar headers are not the ones its TOC implies (not written "
                   "by Go's tar writer, or with fields the TOC does not keep)")


def _agrees(lay: Layout, span: tuple[int, int], real: bytes) -> bool:
    if span[0] == 0:
        return real == lay.pieces[0]
    return any(isinstance(p, FileData) and (p.start, p.end) == span
               and real[p.size:] == p.tail for p in lay.pieces)


def _gunzip(data: bytes) -> bytes:
    """Every gzip member of ``data``, uncompressed."""
    out = []
    while data:
        d = zlib.decompressobj(31)
        out.append(d.decompress(data))
        if not d.eof:
            raise zlib.error("a member is cut short")
        data = d.unused_data
    return b"".join(out)
