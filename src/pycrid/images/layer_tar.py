"""Apply one uncompressed layer tar onto the layer's own directory.

Entries go through ``layer_paths`` (names resolved inside the root). Hard links must
point inside the layer, device nodes are refused unless allowed, and whiteouts become
what overlayfs reads in a lower directory: ``.wh.name`` a 0/0 character device, and
``.wh..wh..opq`` the ``trusted.overlay.opaque`` xattr (in the bottom layer, where there
is nothing to hide, they only remove what the layer itself wrote). A layer cannot set
``trusted.overlay.*`` xattrs itself. The tar is read once, in order, hashed as it
passes: that hash is the layer's diff id.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import posixpath
import shutil
import stat
import tarfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any, cast

import zstandard
from isal import isal_zlib

from pycrid.errors import DataLoss, NotFound, PermissionDenied
from pycrid.host import space
from pycrid.images.layer_paths import (
    OPAQUE,
    OPAQUE_XATTR,
    OVERLAY_XATTRS,
    WHITEOUT,
    Resolver,
    clean_name,
    escapes,
    is_real_dir_inside,
    is_whiteout,
    make_dir,
    make_whiteout,
    remove_entry,
)

log = logging.getLogger(__name__)

CHUNK = 1 << 20
#: What a corrupt or truncated compressed stream raises (the decompressor sits under
#: the tar reader, so reading an entry can raise them too).
CODEC_ERRORS: tuple[type[Exception], ...] = (
    EOFError, gzip.BadGzipFile, zlib.error, cast(type[Exception], isal_zlib.error),
    zstandard.ZstdError)
_TAR_ERRORS: tuple[type[Exception], ...] = (tarfile.TarError, *CODEC_ERRORS)
_OPEN_ERRORS: tuple[type[Exception], ...] = (*_TAR_ERRORS, OSError)


def _set_meta(path: str, info: tarfile.TarInfo, *, is_link: bool) -> None:
    os.lchown(path, info.uid, info.gid)
    if not is_link:
        os.chmod(path, stat.S_IMODE(info.mode))
    for key, value in info.pax_headers.items():
        if key.startswith("SCHILY.xattr."):
            name = key[len("SCHILY.xattr."):]
            if name.startswith(OVERLAY_XATTRS):
                # overlayfs reads these in a lower directory (opaque dirs, redirects):
                # only the unpacker's own whiteout conversion may write them.
                log.warning("layer entry %s: xattr %s is not allowed in an image layer; "
                            "skipped", info.name, name)
                continue
            try:
                os.setxattr(path, name, value.encode("utf-8", "surrogateescape"),
                            follow_symlinks=False)
            except OSError as e:
                # trusted.* and security.* need privileges a filesystem may not grant;
                # containerd likewise warns and goes on.
                log.warning("layer entry %s: cannot set xattr %s: %s", info.name, name, e)


#: Puts a regular file at its (resolved, free) path itself, taking its data from the
#: stream, and says so; False lets the unpacker write it. A partial pull shares files
#: the node has this way (images/partial/materialize.py).
FilePlacer = Callable[[tarfile.TarInfo, str, "TarStream"], bool]


@dataclass(frozen=True)
class Applied:
    #: Bytes of file data written.
    size: int
    #: Directories made for entries whose parents the layer does not list (real paths).
    implicit: frozenset[str]


def apply_tar(root: str, tar_stream: IO[bytes] | TarStream, *,
              allow_device_nodes: bool = False, has_lower: bool = False,
              lowers: Sequence[str] = (), place: FilePlacer | None = None) -> Applied:
    """Apply the uncompressed tar ``tar_stream`` onto directory ``root``, the layer's own
    directory; ``has_lower``: layers lie below it (whiteouts are then kept as overlayfs
    whiteouts rather than only removing what this layer wrote); ``lowers``: their
    directories, top first, when they are committed already."""
    res = Resolver(root, has_lower=has_lower, lowers=lowers)
    src = tar_stream if isinstance(tar_stream, TarStream) else TarStream(tar_stream)
    written = 0
    dir_times: list[tuple[str, float]] = []
    try:
        tf = tarfile.open(fileobj=cast(IO[bytes], src), mode="r:", errorlevel=2)
    except _OPEN_ERRORS as e:
        if space.is_no_space(e):  # writing the blob as it is read: the node's problem
            raise
        raise DataLoss(f"layer is not a readable tar archive: {e}") from None
    try:
        for info in tf:
            written += _apply_entry(res, tf, src, info, allow_device_nodes, dir_times, place)
    except _TAR_ERRORS as e:
        raise DataLoss(f"layer archive is corrupt or truncated: {e}") from None
    for path, mtime in reversed(dir_times):
        if is_real_dir_inside(res.root, path):
            os.utime(path, (mtime, mtime), follow_symlinks=False)
    return Applied(written, frozenset(res.implicit))


def _apply_entry(res: Resolver, tf: tarfile.TarFile, src: TarStream, info: tarfile.TarInfo,
                 allow_device_nodes: bool, dir_times: list[tuple[str, float]],
                 place: FilePlacer | None) -> int:
    rel = clean_name(info.name)
    if rel == "":
        return 0  # the root itself: its metadata belongs to the runtime, not the layer
    rel_dir, base = posixpath.split(rel)
    what = f"layer entry {info.name!r}"
    if base.startswith(WHITEOUT):
        _apply_whiteout(res, rel_dir, base, what)
        return 0
    if info.ischr() or info.isblk():
        if not allow_device_nodes:
            raise PermissionDenied(f"{what}: device nodes are not allowed in image layers "
                                   "(allow_device_nodes is false)")
    parent = res.parent(rel_dir, create=True)
    path = os.path.join(parent, base)
    written = 0
    if info.isdir():
        try:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode):
                remove_entry(path)
                # Over this layer's own whiteout: a directory that hides the lower one.
                make_dir(path, opaque=res.has_lower and is_whiteout(st))
        except FileNotFoundError:
            os.mkdir(path, 0o700)
        res.implicit.discard(path)
        dir_times.append((path, info.mtime))
    elif info.islnk():
        if escapes(info.linkname.lstrip("/") if info.linkname.startswith("/")
                    else info.linkname):
            raise PermissionDenied(
                f"{what}: hard link target {info.linkname!r} lies outside the layer")
        target_rel = clean_name(info.linkname)
        t_dir, t_base = posixpath.split(target_rel)
        try:
            target = os.path.join(res.parent(t_dir, create=False), t_base)
            tst = os.lstat(target)
            if is_whiteout(tst):
                raise FileNotFoundError(target)
        except (NotFound, FileNotFoundError):
            raise DataLoss(f"{what}: hard link target {info.linkname!r} does not exist") from None
        if stat.S_ISDIR(tst.st_mode):
            raise DataLoss(f"{what}: hard link target {info.linkname!r} is a directory")
        if target != path:
            remove_entry(path)
            os.link(target, path, follow_symlinks=False)
        return 0
    else:
        remove_entry(path)
        if info.isreg() and place is not None and not info.issparse() and place(info, path, src):
            return info.size  # its metadata is the shared file's, already the entry's
        if info.isreg():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as out:
                written = _copy_data(tf, src, info, out, what)
        elif info.issym():
            os.symlink(info.linkname, path)
        elif info.isfifo():
            os.mkfifo(path, 0o600)
        elif info.ischr() or info.isblk():
            kind = stat.S_IFCHR if info.ischr() else stat.S_IFBLK
            os.mknod(path, kind | 0o600, os.makedev(info.devmajor, info.devminor))
        else:
            raise DataLoss(f"{what}: unsupported tar entry type {info.type!r}")
    _set_meta(path, info, is_link=info.issym())
    if not info.isdir():
        os.utime(path, (info.mtime, info.mtime), follow_symlinks=False)
    return written


def _apply_whiteout(res: Resolver, rel_dir: str, base: str, what: str) -> None:
    """``.wh.name`` removes ``name`` (what this layer wrote there before, and, as a whiteout,
    what lower layers have); ``.wh..wh..opq`` hides the directory's lower entries but not
    this layer's own, whatever their order."""
    hidden = "" if base == OPAQUE else base[len(WHITEOUT):]
    if base != OPAQUE and (hidden in ("", ".", "..") or hidden.startswith(WHITEOUT)):
        # ".wh.." would name the parent itself and ".wh..." its parent: a whiteout
        # may only ever hide an entry *inside* the directory it sits in.
        raise DataLoss(f"{what}: malformed whiteout")
    if not res.has_lower:
        # Nothing below to hide: only what this layer wrote earlier goes.
        try:
            parent = res.parent(rel_dir, create=False)
        except NotFound:
            return
        if hidden:
            remove_entry(os.path.join(parent, hidden))
        return
    # containerd makes missing parents of a whiteout too: the lower layers may have them.
    parent = res.parent(rel_dir, create=True)
    if not hidden:
        os.setxattr(parent, OPAQUE_XATTR, b"y", follow_symlinks=False)
        return
    path = os.path.join(parent, hidden)
    remove_entry(path)
    make_whiteout(path)


def _copy_data(tf: tarfile.TarFile, src: TarStream, info: tarfile.TarInfo, out: IO[bytes],
               what: str) -> int:
    """A regular member's data into ``out``: straight from the stream (it starts where the
    header ended), or through tarfile for a sparse one, which needs its map."""
    if info.issparse():
        data = tf.extractfile(info)
        assert data is not None
        shutil.copyfileobj(data, out, CHUNK)
        return info.size
    left = info.size
    while left:
        chunk = src.read(min(left, CHUNK))
        if not chunk:
            raise DataLoss(f"{what}: the archive ends inside the file's data")
        out.write(chunk)
        left -= len(chunk)
    return info.size


class TarStream:
    """The uncompressed layer as tarfile reads it: in order, hashed as it passes (the diff
    id). tarfile parses the headers in its random-access mode, which only ever seeks
    forward over a stream read in order, or back into the bytes just read (to check that
    a member's data is all there); file data is copied straight from here, without the
    copies its stream mode makes."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.hash = hashlib.sha256()
        self._pos = 0
        self._recent = b""  # the last bytes read, for a step back
        self._again = b""  # stepped back over: read again before anything new

    def tell(self) -> int:
        return self._pos

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            return b"".join(iter(lambda: self.read(CHUNK), b""))
        parts = []
        if self._again:
            parts.append(self._again[:n])
            self._again = self._again[n:]
        want = n - len(parts[0]) if parts else n
        while want > 0:  # whole reads: tarfile takes a short header block for the end
            data: bytes = self._inner.read(want)
            if not data:
                break
            self.hash.update(data)
            parts.append(data)
            want -= len(data)
        out = parts[0] if len(parts) == 1 else b"".join(parts)
        self._pos += len(out)
        self._recent = (self._recent + out)[-tarfile.BLOCKSIZE:] if len(out) < \
            tarfile.BLOCKSIZE else out[-tarfile.BLOCKSIZE:]
        return out

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        if whence != os.SEEK_SET:
            raise OSError("a layer stream seeks to absolute positions only")
        if pos < self._pos:
            back = self._pos - pos
            if back > len(self._recent):
                raise OSError(f"a layer stream cannot go back {back} bytes")
            self._again = self._recent[len(self._recent) - back:] + self._again
            self._recent = self._recent[:len(self._recent) - back]
            self._pos = pos
        while self._pos < pos and self.read(min(pos - self._pos, CHUNK)):
            pass
        return self._pos

    def drain(self) -> None:
        while self.read(CHUNK):
            pass

