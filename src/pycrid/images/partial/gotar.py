"""Tar headers as Go's archive/tar writes them, from an eStargz TOC entry (sans-IO).

An eStargz layer has no tar-split: the header of each file lies at the end of the
previous file's gzip member, so a file taken from this node leaves a gap in the tar
where the headers after it were. eStargz producers (stargz-snapshotter's estargz
package, which ctr-remote, nerdctl and BuildKit use) write every header with Go's
archive/tar (vbatts/tar-split's copy of it), and the TOC holds every field it writes
for the usual producers' headers (USTAR, or PAX for what USTAR cannot hold, and
xattrs). So the headers are written again here the way Go writes them. Nothing rests on
it: the rebuilt tar must still hash to the layer's diff id, and the headers of every
member that is fetched are compared with these first; a layer whose headers do not come
out the same (GNU headers, PAX records the TOC does not keep, sub-second times) is
pulled whole.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

BLOCK = 512
_NAME, _PREFIX, _LINK, _USER = 100, 155, 100, 32
TYPES = {"reg": b"0", "hardlink": b"1", "symlink": b"2", "char": b"3", "block": b"4",
          "dir": b"5", "fifo": b"6"}


@dataclass(frozen=True)
class Entry:
    """The header fields of one tar entry (what an eStargz TOC entry records)."""

    name: str
    kind: str
    mode: int
    uid: int
    gid: int
    size: int = 0
    mtime: int = 0
    linkname: str = ""
    uname: str = ""
    gname: str = ""
    devmajor: int = 0
    devminor: int = 0
    xattrs: dict[str, bytes] = field(default_factory=dict)


def padding(size: int) -> bytes:
    return bytes(-size % BLOCK)


def _fits_octal(width: int, x: int) -> bool:
    return x >= 0 and (width >= 22 or x < 1 << ((width - 1) * 3))


def _put_str(blk: bytearray, at: int, width: int, s: bytes) -> None:
    blk[at:at + width] = s[:width].ljust(width, b"\0")
    if len(s) > width and blk[at + width - 1:at + width] == b"/":
        # Go ends a cut name that ends in '/' with NUL instead (buggy readers).
        n = len(s[:width].rstrip(b"/"))
        blk[at + n] = 0


def _put_octal(blk: bytearray, at: int, width: int, x: int) -> None:
    if not _fits_octal(width, x):
        x = 0  # what Go writes for a number the field cannot hold
    _put_str(blk, at, width, format(x, "o").rjust(width - 1, "0").encode())


def _finish(blk: bytearray) -> bytes:
    blk[257:263], blk[263:265] = b"ustar\0", b"00"
    chksum = sum(blk[:148]) + 8 * 32 + sum(blk[156:])
    blk[148:156] = format(chksum, "o").rjust(6, "0").encode() + b"\0 "
    return bytes(blk)


def _split_ustar(name: str) -> tuple[str, str] | None:
    """Go's USTAR prefix/suffix split of a long name, if it has one."""
    if len(name) <= _NAME or not name.isascii():
        return None
    length = len(name)
    if length > _PREFIX + 1:
        length = _PREFIX + 1
    elif name[length - 1] == "/":
        length -= 1
    i = name.rfind("/", 0, length)
    suffix, prefix = len(name) - i - 1, i
    if i <= 0 or suffix > _NAME or suffix == 0 or prefix > _PREFIX:
        return None
    return name[:i], name[i + 1:]


def _pax_record(k: str, v: str) -> bytes:
    size = len(k.encode()) + len(v.encode()) + 3
    size += len(str(size))
    rec = f"{size} {k}={v}\n"
    if len(rec.encode()) != size:
        rec = f"{len(rec.encode())} {k}={v}\n"
    return rec.encode()


def _ascii(s: str) -> bytes:
    return bytes(c for c in s.encode() if c < 0x80 and c != 0)


def _v7(e: Entry, name: bytes, kind: bytes) -> bytearray:
    blk = bytearray(BLOCK)
    _put_str(blk, 0, _NAME, name)
    _put_octal(blk, 100, 8, e.mode)
    _put_octal(blk, 108, 8, e.uid)
    _put_octal(blk, 116, 8, e.gid)
    _put_octal(blk, 124, 12, e.size)
    _put_octal(blk, 136, 12, e.mtime)
    blk[156:157] = kind
    return blk


def header(e: Entry, *, pax_names: bool = False) -> bytes:
    """The header block(s) Go's tar writer emits for ``e``: USTAR when every field fits
    (long names split between the name and prefix fields), else a PAX extended header and
    the main header. ``pax_names``: the producer's input gave long names as PAX records
    (GNU and Python tar do; Go's own writer splits them), which Go writes again as such."""
    pax: dict[str, str] = {}
    ustar = True

    def text(value: str, width: int, key: str, splits: bool = False) -> None:
        nonlocal ustar
        if not value.isascii() or len(value) > width:
            if not (splits and not pax_names and _split_ustar(value)):
                ustar = False
            pax[key] = value

    def number(value: int, width: int, key: str) -> None:
        nonlocal ustar
        if not _fits_octal(width, value):
            ustar = False
            pax[key] = str(value)

    text(e.name, _NAME, "path", splits=True)
    text(e.linkname, _LINK, "linkpath")
    text(e.uname, _USER, "uname")
    text(e.gname, _USER, "gname")
    number(e.uid, 8, "uid")
    number(e.gid, 8, "gid")
    number(e.size, 12, "size")
    for k, v in e.xattrs.items():
        pax["SCHILY.xattr." + k] = v.decode("utf-8", "surrogateescape")
    if e.xattrs:
        ustar = False
    kind = TYPES[e.kind]
    if ustar:
        split = _split_ustar(e.name)
        prefix, name = split if split else ("", e.name)
        blk = _v7(e, name.encode(), kind)
        _put_str(blk, 157, _LINK, e.linkname.encode())
        _user_fields(blk, e, lambda s: s.encode())
        _put_str(blk, 345, _PREFIX, prefix.encode())
        return _finish(blk)
    data = b"".join(_pax_record(k, pax[k]) for k in sorted(pax))
    head, base = posixpath.split(e.name)
    xname = _ascii(posixpath.join(head, "PaxHeaders.0", base))[:_NAME].rstrip(b"/")
    ext = bytearray(BLOCK)
    _put_str(ext, 0, _NAME, xname)
    for at, width in ((100, 8), (108, 8), (116, 8), (136, 12)):
        _put_octal(ext, at, width, 0)
    _put_octal(ext, 124, 12, len(data))
    ext[156:157] = b"x"
    blk = _v7(e, _ascii(e.name), kind)
    _put_str(blk, 157, _LINK, _ascii(e.linkname))
    _user_fields(blk, e, _ascii)
    return _finish(ext) + data + padding(len(data)) + _finish(blk)


def _user_fields(blk: bytearray, e: Entry, enc: object) -> None:
    assert callable(enc)
    _put_str(blk, 265, _USER, enc(e.uname))
    _put_str(blk, 297, _USER, enc(e.gname))
    _put_octal(blk, 329, 8, e.devmajor)
    _put_octal(blk, 337, 8, e.devminor)
