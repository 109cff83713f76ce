"""Apply image layers safely: nothing outside the layer's own directory is ever touched.

Each layer is unpacked into a directory of its own, independently of the layers below
it (so layers unpack side by side while they download), the way containerd applies a
layer to an overlay snapshot's upper directory. Every entry name is cleaned lexically
(``..`` clamps at the root, absolute names are rooted there), then its parent
directories are resolved one component at a time, symlinks included, as if the layer's
directory were ``/``. The last component is never followed. Hard links must point
inside the layer, device nodes are refused unless allowed, and whiteouts become what
overlayfs reads in a lower directory: ``.wh.name`` a 0/0 character device, and
``.wh..wh..opq`` the ``trusted.overlay.opaque`` xattr (in the bottom layer, where there
is nothing to hide, they only remove what the layer itself wrote). A layer cannot set
``trusted.overlay.*`` xattrs itself.

A directory the layer's tar does not list but its entries need ("implicit") is made
on the spot. Once the layers below are committed it takes their metadata for that
directory (``inherit_dirs``); and when they show a symlink there instead (``lib ->
usr/lib`` in a merged-/usr image, written through by a later layer) or a file, the
layer is unpacked again from its verified blob with the layers below in view, so
names resolve through them as they would in the assembled image (``needs_lowers``).
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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import IO, Any, cast

import zstandard
from isal import igzip, isal_zlib

from pycrid.errors import DataLoss, InvalidArgument, NotFound, PermissionDenied
from pycrid.images import mediatypes as oci
from pycrid.images.content import BlobReader

log = logging.getLogger(__name__)

_MAX_LINK_HOPS = 255
_WHITEOUT = ".wh."
_OPAQUE = ".wh..wh..opq"
_OVERLAY_XATTRS = "trusted.overlay."
OPAQUE_XATTR = "trusted.overlay.opaque"
_CHUNK = 1 << 20
#: What a corrupt or truncated compressed stream raises.
_CODEC_ERRORS: tuple[type[Exception], ...] = (
    EOFError, gzip.BadGzipFile, zlib.error, cast(type[Exception], isal_zlib.error),
    zstandard.ZstdError)
_TAR_ERRORS: tuple[type[Exception], ...] = (tarfile.TarError, *_CODEC_ERRORS)
_OPEN_ERRORS: tuple[type[Exception], ...] = (*_TAR_ERRORS, OSError)


def is_whiteout(st: os.stat_result) -> bool:
    """An overlayfs whiteout: a character device with device number 0/0."""
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _make_whiteout(path: str) -> None:
    os.mknod(path, stat.S_IFCHR, 0)


def _make_dir(path: str, *, opaque: bool) -> None:
    os.mkdir(path, 0o755)
    if opaque:
        os.setxattr(path, OPAQUE_XATTR, b"y", follow_symlinks=False)


def _is_opaque(path: str) -> bool:
    try:
        return os.getxattr(path, OPAQUE_XATTR, follow_symlinks=False) == b"y"
    except OSError:
        return False


def _below(root: str, lowers: Sequence[str], rel: str) -> tuple[str, os.stat_result] | None:
    """What the layers ``lowers`` (top first) show at ``rel`` under the layer at ``root``,
    looked up as overlayfs does: the topmost lower entry, unless a whiteout, an opaque
    directory or a non-directory on the way (in this layer or below) hides it."""
    parts = rel.split("/")
    current = root
    for comp in parts[:-1]:
        current = os.path.join(current, comp)
        if _is_opaque(current):
            return None
    for lower in lowers:
        current, last = lower, False
        for comp in parts[:-1]:
            current = os.path.join(current, comp)
            try:
                st = os.lstat(current)
            except FileNotFoundError:
                break
            if not stat.S_ISDIR(st.st_mode):
                return None
            last = last or _is_opaque(current)
        else:
            path = os.path.join(lower, rel)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                pass
            else:
                return None if is_whiteout(st) else (path, st)
        if last:
            return None
    return None


class _Resolver:
    """Resolves names inside ``root``; remembers the directories it made for entries whose
    parents the layer does not list (they take their metadata from the layers below)."""

    def __init__(self, root: str, *, has_lower: bool = False,
                 lowers: Sequence[str] = ()) -> None:
        self.root = os.path.realpath(root)
        self.has_lower = has_lower or bool(lowers)
        #: The committed layers below, top first, when known: missing components are then
        #: looked up in them (a symlink there is followed, a file refused).
        self.lowers = lowers
        self.implicit: set[str] = set()

    def parent(self, rel_dir: str, *, create: bool) -> str:
        """The real path of directory ``rel_dir`` (cleaned, relative to root), inside root."""
        todo = [c for c in rel_dir.split("/") if c]
        current = self.root
        hops = 0
        while todo:
            comp = todo.pop(0)
            if comp == ".":
                continue
            if comp == "..":
                current = self.root if current == self.root else os.path.dirname(current)
                continue
            candidate = os.path.join(current, comp)
            link = candidate
            try:
                st = os.lstat(candidate)
            except FileNotFoundError:
                below = (_below(self.root, self.lowers, os.path.relpath(candidate, self.root))
                         if self.lowers else None)
                if below is None or stat.S_ISDIR(below[1].st_mode):
                    if not create:
                        raise NotFound(
                            f"{candidate[len(self.root):] or '/'} does not exist") from None
                    _make_dir(candidate, opaque=False)
                    self.implicit.add(candidate)
                    current = candidate
                    continue
                link, st = below
            if stat.S_ISLNK(st.st_mode):
                hops += 1
                if hops > _MAX_LINK_HOPS:
                    raise DataLoss(f"too many levels of symbolic links under {rel_dir!r}")
                target = os.readlink(link)
                if target.startswith("/"):
                    current = self.root
                todo = [c for c in target.split("/") if c] + todo
                continue
            if create and self.has_lower and is_whiteout(st):
                # This layer whited the name out, then puts entries under it: a directory
                # that hides what lower layers had there (what overlayfs itself makes).
                os.unlink(candidate)
                _make_dir(candidate, opaque=True)
                self.implicit.add(candidate)
                current = candidate
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise DataLoss(f"{candidate[len(self.root):]} is not a directory")
            current = candidate
        return current


def _clean(name: str) -> str:
    """The entry name as a path relative to root, ``..`` clamped ('' is the root itself)."""
    return posixpath.normpath("/" + name).lstrip("/")


def _escapes(linkname: str) -> bool:
    """True when a relative name climbs above where it starts (``a/../../x``)."""
    depth = 0
    for comp in linkname.split("/"):
        if comp == "..":
            depth -= 1
            if depth < 0:
                return True
        elif comp not in ("", "."):
            depth += 1
    return False


def _remove(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _is_real_dir_inside(root: str, path: str) -> bool:
    """True when every component from ``root`` down to ``path`` is a directory, not a link.

    Directory times are set after the whole layer, when a later entry may have
    turned one of the path's parents into a symlink; a path that no longer
    passes this check is skipped rather than followed out of the root.
    """
    current = root
    for comp in os.path.relpath(path, root).split("/"):
        if comp in ("", ".", ".."):
            return False
        current = os.path.join(current, comp)
        try:
            if not stat.S_ISDIR(os.lstat(current).st_mode):
                return False
        except FileNotFoundError:
            return False
    return True


def _set_meta(path: str, info: tarfile.TarInfo, *, is_link: bool) -> None:
    os.lchown(path, info.uid, info.gid)
    if not is_link:
        os.chmod(path, stat.S_IMODE(info.mode))
    for key, value in info.pax_headers.items():
        if key.startswith("SCHILY.xattr."):
            name = key[len("SCHILY.xattr."):]
            if name.startswith(_OVERLAY_XATTRS):
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


@dataclass(frozen=True)
class Applied:
    #: Bytes of file data written.
    size: int
    #: Directories made for entries whose parents the layer does not list (real paths).
    implicit: frozenset[str]


def apply_tar(root: str, tar_stream: IO[bytes] | _TarSource, *,
              allow_device_nodes: bool = False, has_lower: bool = False,
              lowers: Sequence[str] = ()) -> Applied:
    """Apply the uncompressed tar ``tar_stream`` onto directory ``root``, the layer's own
    directory; ``has_lower``: layers lie below it (whiteouts are then kept as overlayfs
    whiteouts rather than only removing what this layer wrote); ``lowers``: their
    directories, top first, when they are committed already."""
    res = _Resolver(root, has_lower=has_lower, lowers=lowers)
    src = tar_stream if isinstance(tar_stream, _TarSource) else _TarSource(tar_stream)
    written = 0
    dir_times: list[tuple[str, float]] = []
    try:
        tf = tarfile.open(fileobj=cast(IO[bytes], src), mode="r:", errorlevel=2)
    except _OPEN_ERRORS as e:
        raise DataLoss(f"layer is not a readable tar archive: {e}") from None
    try:
        for info in tf:
            written += _apply_entry(res, tf, src, info, allow_device_nodes, dir_times)
    except _TAR_ERRORS as e:
        raise DataLoss(f"layer archive is corrupt or truncated: {e}") from None
    for path, mtime in reversed(dir_times):
        if _is_real_dir_inside(res.root, path):
            os.utime(path, (mtime, mtime), follow_symlinks=False)
    return Applied(written, frozenset(res.implicit))


def _apply_entry(res: _Resolver, tf: tarfile.TarFile, src: _TarSource, info: tarfile.TarInfo,
                 allow_device_nodes: bool, dir_times: list[tuple[str, float]]) -> int:
    rel = _clean(info.name)
    if rel == "":
        return 0  # the root itself: its metadata belongs to the runtime, not the layer
    rel_dir, base = posixpath.split(rel)
    what = f"layer entry {info.name!r}"
    if base.startswith(_WHITEOUT):
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
                _remove(path)
                # Over this layer's own whiteout: a directory that hides the lower one.
                _make_dir(path, opaque=res.has_lower and is_whiteout(st))
        except FileNotFoundError:
            os.mkdir(path, 0o700)
        res.implicit.discard(path)
        dir_times.append((path, info.mtime))
    elif info.islnk():
        if _escapes(info.linkname.lstrip("/") if info.linkname.startswith("/")
                    else info.linkname):
            raise PermissionDenied(
                f"{what}: hard link target {info.linkname!r} lies outside the layer")
        target_rel = _clean(info.linkname)
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
            _remove(path)
            os.link(target, path, follow_symlinks=False)
        return 0
    else:
        _remove(path)
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


def _apply_whiteout(res: _Resolver, rel_dir: str, base: str, what: str) -> None:
    """``.wh.name`` removes ``name`` (what this layer wrote there before, and, as a whiteout,
    what lower layers have); ``.wh..wh..opq`` hides the directory's lower entries but not
    this layer's own, whatever their order."""
    hidden = "" if base == _OPAQUE else base[len(_WHITEOUT):]
    if base != _OPAQUE and (hidden in ("", ".", "..") or hidden.startswith(_WHITEOUT)):
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
            _remove(os.path.join(parent, hidden))
        return
    # containerd makes missing parents of a whiteout too: the lower layers may have them.
    parent = res.parent(rel_dir, create=True)
    if not hidden:
        os.setxattr(parent, OPAQUE_XATTR, b"y", follow_symlinks=False)
        return
    path = os.path.join(parent, hidden)
    _remove(path)
    _make_whiteout(path)


def _copy_data(tf: tarfile.TarFile, src: _TarSource, info: tarfile.TarInfo, out: IO[bytes],
               what: str) -> int:
    """A regular member's data into ``out``: straight from the stream (it starts where the
    header ended), or through tarfile for a sparse one, which needs its map."""
    if info.issparse():
        data = tf.extractfile(info)
        assert data is not None
        shutil.copyfileobj(data, out, _CHUNK)
        return info.size
    left = info.size
    while left:
        chunk = src.read(min(left, _CHUNK))
        if not chunk:
            raise DataLoss(f"{what}: the archive ends inside the file's data")
        out.write(chunk)
        left -= len(chunk)
    return info.size


class _TarSource:
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
            return b"".join(iter(lambda: self.read(_CHUNK), b""))
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
        while self._pos < pos and self.read(min(pos - self._pos, _CHUNK)):
            pass
        return self._pos

    def drain(self) -> None:
        while self.read(_CHUNK):
            pass


#: Layer types we unpack. The compression is then told by magic bytes, not by the
#: type, because registries are known to label gzip layers as plain tar and back.
LAYER_MEDIA_TYPES = frozenset({
    oci.MT_OCI_LAYER, oci.MT_OCI_LAYER_GZIP, oci.MT_OCI_LAYER_ZSTD,
    oci.MT_OCI_LAYER_NONDIST_GZIP, oci.MT_DOCKER_LAYER, oci.MT_DOCKER_LAYER_GZIP,
    "application/vnd.oci.image.layer.nondistributable.v1.tar",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
})


def check_layer_type(media_type: str) -> None:
    """Refuse a layer we could not unpack before anything of it is fetched."""
    if media_type and media_type not in LAYER_MEDIA_TYPES:
        raise InvalidArgument(f"unsupported layer media type {media_type!r}")


def _decompressed(raw: BlobReader) -> Any:
    """A reader of the uncompressed tar; the format is told by the stream's magic bytes.
    gzip goes through ISA-L (several times zlib's speed), zstd through libzstd."""
    head = raw.peek(4)[:4]
    if head[:2] == b"\x1f\x8b":
        return igzip.GzipFile(fileobj=cast(IO[bytes], raw), mode="rb")  # type: ignore[no-untyped-call]
    if head == b"\x28\xb5\x2f\xfd":
        return zstandard.ZstdDecompressor().stream_reader(
            cast(IO[bytes], raw), read_size=_CHUNK, read_across_frames=True)
    return raw


@dataclass(frozen=True)
class Extracted:
    #: sha256 of the uncompressed tar (to compare with the config's diff id).
    diff_id: str
    #: Directories made only to hold entries, relative to the layer's root.
    implicit: tuple[str, ...]


def extract(raw: BlobReader, root: str, *, name: str, has_lower: bool,
            allow_device_nodes: bool, lowers: Sequence[str] = ()) -> Extracted:
    """Decompress and apply one layer blob (read as it downloads) onto its own directory
    ``root``; runs in a worker thread. ``name`` (the blob digest) is for messages."""
    try:
        reader = _TarSource(_decompressed(raw))
        applied = apply_tar(root, reader, allow_device_nodes=allow_device_nodes,
                            has_lower=has_lower, lowers=lowers)
        reader.drain()  # tar padding after the end marker counts for the diff id
    except _CODEC_ERRORS as e:
        raise DataLoss(f"layer {name} is corrupt: {e}") from None
    except DataLoss as e:
        raise DataLoss(f"layer {name}: {e}") from None
    real = os.path.realpath(root)
    return Extracted("sha256:" + reader.hash.hexdigest(),
                     tuple(sorted(os.path.relpath(p, real) for p in applied.implicit)))


def needs_lowers(root: str, implicit: Iterable[str], lowers: Sequence[str]) -> bool:
    """True when a directory the layer made on its own stands where the layers below show
    a symlink or a file: unpacked with them in view, its entries land elsewhere (through
    the link) or are refused."""
    real = os.path.realpath(root)
    for rel in implicit:
        if not _is_real_dir_inside(real, os.path.join(real, rel)):
            continue
        below = _below(real, lowers, rel)
        if below is not None and not stat.S_ISDIR(below[1].st_mode):
            return True
    return False


def inherit_dirs(root: str, implicit: Iterable[str], lowers: Sequence[str]) -> None:
    """Give the directories a layer made only to hold its entries the owner, mode, times
    and xattrs the layers below (top first) show for them, as overlayfs copies a
    directory up (and containerd does); where they show none, 0755 root stays."""
    real = os.path.realpath(root)
    for rel in implicit:
        path = os.path.join(real, rel)
        if not _is_real_dir_inside(real, path):
            continue
        below = _below(real, lowers, rel)
        if below is None or not stat.S_ISDIR(below[1].st_mode):
            continue
        src, st = below
        os.lchown(path, st.st_uid, st.st_gid)
        os.chmod(path, stat.S_IMODE(st.st_mode))
        for attr in os.listxattr(src, follow_symlinks=False):
            if not attr.startswith(_OVERLAY_XATTRS):
                os.setxattr(path, attr, os.getxattr(src, attr, follow_symlinks=False),
                            follow_symlinks=False)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
