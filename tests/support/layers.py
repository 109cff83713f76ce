"""Build layer tarballs in memory for tests: ordinary, whiteout and hostile ones."""

from __future__ import annotations

import gzip
import io
import tarfile
from dataclasses import dataclass, field

import zstandard


@dataclass
class Entry:
    """One tar member. ``kind``: file, dir, symlink, hardlink, char, block, fifo."""

    name: str
    kind: str = "file"
    data: bytes = b""
    mode: int = 0o644
    linkname: str = ""
    uid: int = 0
    gid: int = 0
    devmajor: int = 0
    devminor: int = 0
    pax: dict[str, str] = field(default_factory=dict)


_TYPES = {
    "file": tarfile.REGTYPE,
    "dir": tarfile.DIRTYPE,
    "symlink": tarfile.SYMTYPE,
    "hardlink": tarfile.LNKTYPE,
    "char": tarfile.CHRTYPE,
    "block": tarfile.BLKTYPE,
    "fifo": tarfile.FIFOTYPE,
}


def tar_bytes(entries: list[Entry]) -> bytes:
    """An uncompressed tar (PAX format) holding ``entries`` in order, names kept verbatim."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for e in entries:
            info = tarfile.TarInfo(e.name)
            info.type = _TYPES[e.kind]
            info.mode = e.mode if e.kind != "dir" or e.mode != 0o644 else 0o755
            info.uid, info.gid = e.uid, e.gid
            info.mtime = 1_700_000_000
            info.linkname = e.linkname
            info.devmajor, info.devminor = e.devmajor, e.devminor
            info.pax_headers = dict(e.pax)
            if e.kind == "file":
                info.size = len(e.data)
                tf.addfile(info, io.BytesIO(e.data))
            else:
                tf.addfile(info)
    return buf.getvalue()


def compress(tar: bytes, compression: str) -> bytes:
    """``compression``: "none", "gzip" or "zstd"."""
    if compression == "none":
        return tar
    if compression == "gzip":
        return gzip.compress(tar, mtime=0)
    if compression == "zstd":
        return zstandard.ZstdCompressor().compress(tar)
    raise ValueError(compression)
