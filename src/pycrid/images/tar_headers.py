"""Tar headers read in fewer steps: ``tarfile`` parses a header block field by field in
Python (a function call per number and per string, two checksum sums), which is most of
what a layer of many small files costs in Python.

:class:`FastTarInfo` is a ``tarfile.TarInfo`` whose ``frombuf`` splits the block with one
``struct`` call and checks the (unsigned) checksum with one sum, for the plain member
types (file, hard link, symlink, devices, directory, fifo); everything else (extended
headers, GNU long names, sparse files, base-256 numbers, a checksum that only matches
signed, an invalid or end-of-archive block) goes to ``tarfile``'s own ``frombuf``, and
so do the rest of the reading (``TarFile`` drives it) and every decision it makes. Its
result is the same object ``tarfile`` would build (tests compare the two on arbitrary
blocks).
"""

from __future__ import annotations

import struct
import tarfile
from typing import Self
from zlib import adler32

#: name, mode, uid, gid, size, mtime, chksum, type, linkname, (magic, version),
#: uname, gname, devmajor, devminor, prefix, (padding).
_BLOCK = struct.Struct("100s8s8s8s12s12s8s1s100s8x32s32s8s8s155s12x")
#: The member types parsed here: REGTYPE, AREGTYPE, LNK, SYM, CHR, BLK, DIR, FIFO, CONT.
_PLAIN_TYPES = frozenset(b"01234567") | {0}
_BASE256 = (0o200, 0o377)


#: Octal fields seen, by their bytes: modes, owners, times and device numbers repeat from
#: member to member (a field is parsed, and checked, the first time it is seen).
_SEEN: dict[bytes, int] = {}
_SEEN_MAX = 4096


def _number(field: bytes) -> int:
    """tarfile's ``nti`` for an octal field; ValueError for what it would refuse or parse
    some other way (base-256)."""
    if field[0] in _BASE256:
        raise ValueError("base-256")
    return int(field.split(b"\0", 1)[0].decode("ascii").strip() or "0", 8)


def _repeated(field: bytes) -> int:
    n = _SEEN.get(field)
    if n is None:
        n = _number(field)
        if len(_SEEN) < _SEEN_MAX:
            _SEEN[field] = n
    return n


def _text(field: bytes, encoding: str, errors: str) -> str:
    if not field[0]:
        return ""
    return field.split(b"\0", 1)[0].decode(encoding, errors)


def _byte_sum(buf: bytes | bytearray) -> int:
    """The sum of a block's 512 bytes, in C: the first half of Adler-32 is 1 + the sum of
    the bytes modulo 65521, and no 256 bytes add up to that much."""
    return (adler32(buf[:256]) & 0xFFFF) + (adler32(buf[256:]) & 0xFFFF) - 2


class FastTarInfo(tarfile.TarInfo):
    __slots__ = ()

    @classmethod
    def frombuf(cls, buf: bytes | bytearray, encoding: str, errors: str) -> Self:
        if (len(buf) != tarfile.BLOCKSIZE or buf[156] not in _PLAIN_TYPES
                or buf.count(0) == tarfile.BLOCKSIZE):
            return super().frombuf(buf, encoding, errors)
        (name, mode, uid, gid, size, mtime, chk, kind, linkname, uname, gname, major, minor,
         prefix) = _BLOCK.unpack(buf)
        try:
            chksum = _number(chk)
            # The checksum field counts as eight spaces: 256 in all.
            if chksum != 256 + _byte_sum(buf) - sum(chk):
                raise ValueError("not the unsigned checksum")
            obj = cls()
            obj.size, obj.chksum = _number(size), chksum
            obj.mode, obj.uid, obj.gid = _repeated(mode), _repeated(uid), _repeated(gid)
            obj.mtime = _repeated(mtime)
            obj.devmajor, obj.devminor = _repeated(major), _repeated(minor)
        except ValueError:
            return super().frombuf(buf, encoding, errors)  # raises, or parses what is rare
        obj.name = _text(name, encoding, errors)
        obj.type = kind
        obj.linkname = _text(linkname, encoding, errors)
        obj.uname = _text(uname, encoding, errors)
        obj.gname = _text(gname, encoding, errors)
        long_prefix = _text(prefix, encoding, errors)
        # As tarfile: a V7 directory is a file whose name ends in a slash; a directory's
        # name loses its trailing slashes; a ustar name is prefix/name.
        if kind == tarfile.AREGTYPE and obj.name.endswith("/"):
            obj.type = tarfile.DIRTYPE
        if obj.type == tarfile.DIRTYPE:
            obj.name = obj.name.rstrip("/")
        if long_prefix:
            obj.name = long_prefix + "/" + obj.name
        return obj
