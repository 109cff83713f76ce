"""The zstd:chunked table of contents, from bytes we do not trust (sans-IO).

containers/storage's format (pkg/chunked): an ordinary zstd-compressed tar whose regular
files each start a new zstd frame (or several), followed by zstd skippable frames that
plain readers ignore: the compressed TOC (JSON: ``version`` 1, ``entries`` with each
file's name, type, size, sha256 ``digest`` and the blob offsets ``offset``/``endOffset``
of its frames, and ``tarSplitDigest``), the compressed tar-split, and a 64-byte footer.
The layer's descriptor says where the first two are, so no footer is read:

    io.github.containers.zstd-chunked.manifest-position  <offset>:<length>:<size>:1
    io.github.containers.zstd-chunked.manifest-checksum  sha256 of the compressed TOC
    io.github.containers.zstd-chunked.tarsplit-position  <offset>:<length>:<size>

The TOC is trusted only once its bytes match the checksum in the (verified) manifest,
and the tar-split once its bytes match ``tarSplitDigest``. Every shape check failing is
``Unusable``: the layer is then downloaded whole.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import zstandard

from pycrid.images.mediatypes import sha256_digest
from pycrid.images.partial.layout import (
    DIGEST_RE,
    MAX_ENTRIES,
    FileData,
    Unusable,
    check_name,
    toc_count,
)

POSITION = "io.github.containers.zstd-chunked.manifest-position"
CHECKSUM = "io.github.containers.zstd-chunked.manifest-checksum"
TARSPLIT_POSITION = "io.github.containers.zstd-chunked.tarsplit-position"
#: eStargz's annotation: a layer claiming both formats is pulled whole.
ESTARGZ_TOC_DIGEST = "containerd.io/snapshot/stargz/toc.digest"

#: Largest TOC and tar-split handled in memory, uncompressed (containers/storage: 150
#: MiB for the TOC); a layer with more is pulled whole.
MAX_TOC = 64 << 20
MAX_TARSPLIT = 128 << 20
#: A zstd skippable frame's header (magic, length) precedes each metadata frame.
_SKIPPABLE_HEADER = 8
_TYPES = frozenset({"reg", "hardlink", "char", "block", "dir", "fifo", "symlink", "chunk"})


@dataclass(frozen=True)
class Span:
    """A compressed frame's place in the blob and its uncompressed length."""

    offset: int
    length: int
    size: int

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True)
class Position:
    """Where a zstd:chunked layer's metadata lies."""

    toc: Span
    toc_digest: str
    tarsplit: Span

    def metadata_range(self) -> tuple[int, int]:
        """The one byte range holding both the TOC and the tar-split."""
        return min(self.toc.offset, self.tarsplit.offset), max(self.toc.end, self.tarsplit.end)


@dataclass(frozen=True)
class Toc:
    """The regular files with contents, by their name in the tar, and the tar-split's
    digest. File data lies below ``data_end``."""

    files: dict[str, FileData]
    tarsplit_digest: str
    data_end: int


def is_chunked(annotations: dict[str, str]) -> bool:
    return CHECKSUM in annotations or POSITION in annotations


def locate(annotations: dict[str, str], blob_size: int) -> Position:
    """The metadata's position from the layer descriptor's annotations."""
    if ESTARGZ_TOC_DIGEST in annotations:
        raise Unusable("the layer claims both a zstd:chunked and an eStargz TOC")
    digest = annotations.get(CHECKSUM, "")
    if not DIGEST_RE.match(digest):
        raise Unusable(f"{CHECKSUM} is missing or not a sha256 digest")
    toc = _span(annotations.get(POSITION, ""), POSITION, 4, blob_size)
    if annotations.get(POSITION, "").rsplit(":", 1)[-1] != "1":
        raise Unusable(f"{POSITION}: unknown TOC type")
    if TARSPLIT_POSITION not in annotations:
        raise Unusable("no tar-split (an older zstd:chunked layer): its diff id cannot be "
                       "verified without the whole blob")
    tarsplit = _span(annotations[TARSPLIT_POSITION], TARSPLIT_POSITION, 3, blob_size)
    if max(toc.size, toc.length) > MAX_TOC or max(tarsplit.size, tarsplit.length) > MAX_TARSPLIT:
        raise Unusable("the TOC or the tar-split is too large to handle in memory")
    pos = Position(toc, digest, tarsplit)
    start, end = pos.metadata_range()
    if end - start > toc.length + tarsplit.length + (64 << 10):
        raise Unusable("the TOC and the tar-split lie far apart")
    return pos


def _span(value: str, key: str, fields: int, blob_size: int) -> Span:
    parts = value.split(":")
    if len(parts) != fields or not all(p.isdigit() and len(p) <= 19 for p in parts):
        raise Unusable(f"{key} {value!r} is malformed")
    offset, length, size = (int(p) for p in parts[:3])
    if offset < _SKIPPABLE_HEADER or length == 0 or offset + length > blob_size:
        raise Unusable(f"{key} {value!r} lies outside the {blob_size}-byte blob")
    return Span(offset, length, size)


def _inflate(data: bytes, span: Span, what: str) -> bytes:
    """A metadata frame, decompressed to exactly its declared size (never more)."""
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True)
        out = reader.read(span.size + 1)
    except zstandard.ZstdError as e:
        raise Unusable(f"the {what} does not decompress: {e}") from None
    if len(out) != span.size:
        raise Unusable(f"the {what} is {len(out)} bytes uncompressed, not the declared "
                       f"{span.size}")
    return out


def open_metadata(pos: Position, data: bytes) -> tuple[bytes, bytes]:
    """The TOC's JSON and the tar-split's NDJSON from the bytes of ``metadata_range``,
    the TOC verified against the manifest's checksum. The tar-split is verified by
    ``parse_toc``'s caller against the TOC (``check_tarsplit``)."""
    start, end = pos.metadata_range()
    if len(data) != end - start:
        raise Unusable(f"got {len(data)} bytes of metadata, wanted {end - start}")
    toc_z = data[pos.toc.offset - start:pos.toc.end - start]
    if sha256_digest(toc_z) != pos.toc_digest:
        raise Unusable("the TOC does not match the manifest's checksum")
    tarsplit_z = data[pos.tarsplit.offset - start:pos.tarsplit.end - start]
    return _inflate(toc_z, pos.toc, "TOC"), tarsplit_z


def inflate_tarsplit(pos: Position, toc: Toc, tarsplit_z: bytes) -> bytes:
    """The tar-split's NDJSON, once its compressed bytes match the TOC's digest."""
    if sha256_digest(tarsplit_z) != toc.tarsplit_digest:
        raise Unusable("the tar-split does not match the TOC's tarSplitDigest")
    return _inflate(tarsplit_z, pos.tarsplit, "tar-split")


def parse_toc(doc_bytes: bytes, pos: Position) -> Toc:
    """The TOC's regular files with contents; every entry's shape is checked."""
    try:
        doc = json.loads(doc_bytes)
    except (ValueError, RecursionError) as err:
        raise Unusable(f"the TOC is not JSON: {str(err)[:200]}") from None
    if not isinstance(doc, dict) or doc.get("version") != 1:
        raise Unusable("the TOC is not a version 1 zstd:chunked TOC")
    entries, ts = doc.get("entries"), doc.get("tarSplitDigest")
    if not isinstance(entries, list) or len(entries) > MAX_ENTRIES:
        raise Unusable("the TOC's entries are missing or too many")
    if not isinstance(ts, str) or not DIGEST_RE.match(ts):
        raise Unusable("the TOC names no tar-split digest")
    data_end = min(pos.toc.offset, pos.tarsplit.offset) - _SKIPPABLE_HEADER
    files: dict[str, FileData] = {}
    for e in entries:
        f = _entry(e, data_end)
        if f is None:
            continue
        if f.name in files:
            raise Unusable(f"the TOC lists {f.name!r} twice")
        files[f.name] = f
    return Toc(files, ts, data_end)


def _count(e: dict[str, Any], key: str) -> int:
    return toc_count(e, key, "TOC")


def _entry(e: Any, data_end: int) -> FileData | None:
    """A regular file with contents, or None for any other well-formed entry."""
    if not isinstance(e, dict):
        raise Unusable("a TOC entry is not an object")
    kind, name = e.get("type"), e.get("name")
    if kind not in _TYPES or not isinstance(name, str):
        raise Unusable(f"TOC entry of type {str(kind)[:20]!r} named {str(name)[:100]!r}")
    check_name(name, "TOC")
    size = _count(e, "size")
    if kind != "reg" or size == 0:
        return None
    digest, start, end = e.get("digest"), _count(e, "offset"), _count(e, "endOffset")
    if not isinstance(digest, str) or not DIGEST_RE.match(digest):
        raise Unusable(f"TOC entry {name!r} has no sha256 digest")
    if not 0 < start < end <= data_end:
        raise Unusable(f"TOC entry {name!r}: its data at {start}:{end} lies outside the "
                       f"blob's file data (0:{data_end})")
    return FileData(name, size, digest, start, end)
