"""What a partial pull knows of a layer: its uncompressed tar as raw segments and files.

A layer's tar is rebuilt in order from two kinds of pieces: ``bytes`` (headers and
padding, exactly as in the tar) and ``FileData`` (a regular file's contents, which
lie compressed at ``start:end`` in the blob and hash to ``digest``). Parsers of the
formats (``chunked_toc``, ``tarsplit``) produce them; ``Unusable`` says why a layer
cannot be pulled partially (it is then pulled whole).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

#: A sha256 digest as the TOCs write it.
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")

#: At most this many TOC or tar-split entries in a layer (about a million files).
MAX_ENTRIES = 1 << 20


class Unusable(Exception):
    """This layer cannot be pulled partially; the message says why (it is logged, and the
    layer is downloaded whole instead)."""


@dataclass(frozen=True)
class FileData:
    """A regular file's contents in the layer: ``size`` bytes hashing to ``digest``,
    compressed (``codec``: zstd or gzip) at ``start:end`` of the blob. For eStargz that
    span goes on past the contents with ``tail``, the tar's bytes up to the next file's
    contents (which the layout then gives as a piece of its own)."""

    name: str
    size: int
    digest: str
    start: int
    end: int
    codec: str = "zstd"
    tail: bytes = field(default=b"", repr=False)


#: The uncompressed tar, in order.
Piece = bytes | FileData


@dataclass(frozen=True)
class Layout:
    """The layer rebuilt from pieces; ``tar_size`` is the uncompressed tar's length."""

    pieces: tuple[Piece, ...]
    tar_size: int

    def files(self) -> list[FileData]:
        return [p for p in self.pieces if isinstance(p, FileData)]


def check_name(name: str, what: str) -> str:
    """A TOC or tar-split entry name, refused when it could name something outside the
    layer (absolute, ``..``) or is not a plain string (NUL); the ordinary unpacker
    clamps such names, which a layer pulled whole then gets."""
    if not name or "\0" in name:
        raise Unusable(f"{what}: entry name {name!r} is empty or holds NUL")
    if name.startswith("/"):
        raise Unusable(f"{what}: entry name {name!r} is absolute")
    if ".." in name.split("/"):
        raise Unusable(f"{what}: entry name {name!r} climbs out with '..'")
    return name


def toc_count(e: dict[str, Any], key: str, what: str) -> int:
    """A TOC entry's non-negative integer ``key`` (0 when absent); ``what`` names the TOC
    in the message."""
    v = e.get(key, 0)
    if type(v) is not int or v < 0:
        raise Unusable(f"{what} entry {str(e.get('name'))[:100]!r}: {key} is not a count")
    return v
