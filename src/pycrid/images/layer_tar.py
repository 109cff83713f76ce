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
import logging
import os
import posixpath
import stat
import tarfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, cast

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
from pycrid.images.tar_headers import FastTarInfo
from pycrid.images.tar_stream import CHUNK, TarStream, write_all

log = logging.getLogger(__name__)

#: What a corrupt or truncated compressed stream raises (the decompressor sits under
#: the tar reader, so reading an entry can raise them too).
CODEC_ERRORS: tuple[type[Exception], ...] = (
    EOFError, gzip.BadGzipFile, zlib.error, cast(type[Exception], isal_zlib.error),
    zstandard.ZstdError)
_TAR_ERRORS: tuple[type[Exception], ...] = (tarfile.TarError, *CODEC_ERRORS)
_OPEN_ERRORS: tuple[type[Exception], ...] = (*_TAR_ERRORS, OSError)


def _what(info: tarfile.TarInfo) -> str:
    """How messages name an entry (made only when one is needed)."""
    return f"layer entry {info.name!r}"


def _set_meta(path: str, info: tarfile.TarInfo, *, is_link: bool) -> None:
    """Owner, mode (not a symlink's), xattrs and times, through ``path`` (never followed);
    regular files get theirs through their descriptor."""
    os.lchown(path, info.uid, info.gid)
    if not is_link:
        os.chmod(path, stat.S_IMODE(info.mode))
    _set_xattrs(path, info)
    if not info.isdir():  # directories get their times after the whole layer
        os.utime(path, (info.mtime, info.mtime), follow_symlinks=False)


def _set_xattrs(path: str | int, info: tarfile.TarInfo) -> None:
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
                            follow_symlinks=isinstance(path, int))
            except OSError as e:
                # trusted.* and security.* need privileges a filesystem may not grant;
                # containerd likewise warns and goes on.
                log.warning("layer entry %s: cannot set xattr %s: %s", info.name, name, e)


#: Puts a regular file at its resolved path itself, taking its data from the stream, and
#: says so; False lets the unpacker write it (also when the name is taken already: an
#: earlier entry of the layer). A partial pull shares files the node has this way
#: (images/partial/materialize.py).
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
        tf = tarfile.open(fileobj=cast(IO[bytes], src), mode="r:", errorlevel=2,
                          tarinfo=FastTarInfo)
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
    rel_dir, _, base = rel.rpartition("/")
    if base.startswith(WHITEOUT):
        _apply_whiteout(res, rel_dir, base, _what(info))
        return 0
    if info.ischr() or info.isblk():
        if not allow_device_nodes:
            raise PermissionDenied(f"{_what(info)}: device nodes are not allowed in image "
                                   "layers (allow_device_nodes is false)")
    # The parent is a real path inside the root, never "/" itself.
    path = res.parent(rel_dir, create=True) + "/" + base
    if info.isreg():
        # The placer links only at a free name (a name an earlier entry took is left to
        # the write below, which replaces it).
        if place is not None and not info.issparse() and place(info, path, src):
            return info.size  # its metadata is the shared file's, already the entry's
        # Most entries: made with O_EXCL (nothing there is ever followed or reused), the
        # rest through the descriptor, so no name is looked up again.
        fd = _create(res, path)
        try:
            written = _copy_data(tf, src, info, fd)
            os.fchown(fd, info.uid, info.gid)
            os.fchmod(fd, stat.S_IMODE(info.mode))  # after the owner: chown clears set-id bits
            if info.pax_headers:
                _set_xattrs(fd, info)
            os.utime(fd, (info.mtime, info.mtime))
        finally:
            os.close(fd)
        return written
    what = _what(info)
    if info.isdir():
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode):
                _remove(res, path)
                # Over this layer's own whiteout: a directory that hides the lower one.
                make_dir(path, opaque=res.has_lower and is_whiteout(st))
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
            _remove(res, path)
            os.link(target, path, follow_symlinks=False)
        return 0
    else:
        _remove(res, path)
        if info.issym():
            os.symlink(info.linkname, path)
        elif info.isfifo():
            os.mkfifo(path, 0o600)
        elif info.ischr() or info.isblk():
            kind = stat.S_IFCHR if info.ischr() else stat.S_IFBLK
            os.mknod(path, kind | 0o600, os.makedev(info.devmajor, info.devminor))
        else:
            raise DataLoss(f"{what}: unsupported tar entry type {info.type!r}")
    _set_meta(path, info, is_link=info.issym())
    return 0


def _create(res: Resolver, path: str) -> int:
    """A new regular file at ``path`` (in a directory of the layer's own), open for
    writing; whatever the name held before (an earlier entry) is removed first."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags, 0o600)
    except FileExistsError:
        _remove(res, path)
        return os.open(path, flags, 0o600)


def _remove(res: Resolver, path: str) -> None:
    """Remove what ``path`` holds; resolved directories are forgotten if it held anything."""
    if remove_entry(path):
        res.forget()


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
            _remove(res, os.path.join(parent, hidden))
        return
    # containerd makes missing parents of a whiteout too: the lower layers may have them.
    parent = res.parent(rel_dir, create=True)
    if not hidden:
        os.setxattr(parent, OPAQUE_XATTR, b"y", follow_symlinks=False)
        return
    path = os.path.join(parent, hidden)
    _remove(res, path)
    make_whiteout(path)


def _copy_data(tf: tarfile.TarFile, src: TarStream, info: tarfile.TarInfo, fd: int) -> int:
    """A regular member's data into ``fd``: straight from the stream (it starts where the
    header ended), or through tarfile for a sparse one, which needs its map."""
    if info.issparse():
        data = tf.extractfile(info)
        assert data is not None
        while chunk := data.read(CHUNK):
            write_all(fd, chunk)
        return info.size
    if src.copy_to(fd, info.size) < info.size:
        raise DataLoss(f"{_what(info)}: the archive ends inside the file's data")
    return info.size
