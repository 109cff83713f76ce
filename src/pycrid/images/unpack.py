"""Apply image layers safely: nothing outside the snapshot root is ever touched.

Every entry name is cleaned lexically (``..`` clamps at the root, absolute
names are rooted there), then its parent directories are resolved one
component at a time, symlinks included, as if the root were ``/`` - the way
containerd resolves them, so images whose paths go through links keep
working. The last component is never followed. Hard links must point inside
the layer's root, device nodes are refused unless allowed, and whiteouts
delete through the overlay mount, which records them as overlay whiteouts.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import logging
import os
import posixpath
import secrets
import shutil
import stat
import tarfile
import zlib
from typing import IO, Any, BinaryIO, cast

import zstandard

from pycrid.errors import DataLoss, InvalidArgument, NotFound, PermissionDenied
from pycrid.faults import failpoint
from pycrid.images import mount as mnt
from pycrid.images import oci
from pycrid.images.snapshots import TEMP_PREFIX, Kind, Snapshotter

log = logging.getLogger(__name__)

_MAX_LINK_HOPS = 255
_WHITEOUT = ".wh."
_OPAQUE = ".wh..wh..opq"
_CHUNK = 1 << 20


class _Resolver:
    """Resolves names inside ``root``; remembers what this layer created (for opaque dirs)."""

    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)
        self.created: set[str] = set()

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
            try:
                st = os.lstat(candidate)
            except FileNotFoundError:
                if not create:
                    raise NotFound(f"{candidate[len(self.root):] or '/'} does not exist") from None
                os.mkdir(candidate, 0o755)
                self.created.add(candidate)
                current = candidate
                continue
            if stat.S_ISLNK(st.st_mode):
                hops += 1
                if hops > _MAX_LINK_HOPS:
                    raise DataLoss(f"too many levels of symbolic links under {rel_dir!r}")
                target = os.readlink(candidate)
                if target.startswith("/"):
                    current = self.root
                todo = [c for c in target.split("/") if c] + todo
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


def _clear_opaque(directory: str, created: set[str]) -> None:
    """Empty ``directory`` of everything this layer did not write, at any depth.

    A directory this layer wrote may still hold entries of lower layers (a dir
    entry over an existing dir keeps it), so the sweep descends into it.
    """
    for name in os.listdir(directory):
        child = os.path.join(directory, name)
        if child not in created:
            _remove(child)
        elif stat.S_ISDIR(os.lstat(child).st_mode):
            _clear_opaque(child, created)


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
            try:
                os.setxattr(path, name, value.encode("utf-8", "surrogateescape"),
                            follow_symlinks=False)
            except OSError as e:
                # trusted.* and security.* need privileges a filesystem may not grant;
                # containerd likewise warns and goes on.
                log.warning("layer entry %s: cannot set xattr %s: %s", info.name, name, e)


def apply_tar(
    root: str, tar_stream: IO[bytes] | _HashingReader, *, allow_device_nodes: bool = False
) -> int:
    """Apply the uncompressed tar ``tar_stream`` onto directory ``root``; bytes written."""
    res = _Resolver(root)
    written = 0
    dir_times: list[tuple[str, float]] = []
    try:
        tf = tarfile.open(fileobj=cast(IO[bytes], tar_stream), mode="r|", errorlevel=2)
    except (tarfile.TarError, EOFError, OSError, zlib.error, zstandard.ZstdError) as e:
        raise DataLoss(f"layer is not a readable tar archive: {e}") from None
    try:
        for info in tf:
            written += _apply_entry(res, tf, info, allow_device_nodes, dir_times)
    except (tarfile.TarError, EOFError, zlib.error, zstandard.ZstdError) as e:
        raise DataLoss(f"layer archive is corrupt or truncated: {e}") from None
    except OSError as e:
        if isinstance(e, (gzip.BadGzipFile,)):
            raise DataLoss(f"layer archive is corrupt: {e}") from None
        raise
    for path, mtime in reversed(dir_times):
        if _is_real_dir_inside(res.root, path):
            os.utime(path, (mtime, mtime), follow_symlinks=False)
    return written


def _apply_entry(res: _Resolver, tf: tarfile.TarFile, info: tarfile.TarInfo,
                 allow_device_nodes: bool, dir_times: list[tuple[str, float]]) -> int:
    rel = _clean(info.name)
    if rel == "":
        return 0  # the root itself: its metadata belongs to the runtime, not the layer
    rel_dir, base = posixpath.split(rel)
    what = f"layer entry {info.name!r}"
    if base.startswith(_WHITEOUT):
        try:
            parent = res.parent(rel_dir, create=False)
        except NotFound:
            return 0  # nothing there to hide
        if base == _OPAQUE:
            _clear_opaque(parent, res.created)
            return 0
        hidden = base[len(_WHITEOUT):]
        if hidden in ("", ".", "..") or hidden.startswith(_WHITEOUT):
            # ".wh.." would name the parent itself and ".wh..." its parent: a whiteout
            # may only ever hide an entry *inside* the directory it sits in.
            raise DataLoss(f"{what}: malformed whiteout")
        _remove(os.path.join(parent, hidden))
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
                os.mkdir(path, 0o700)
        except FileNotFoundError:
            os.mkdir(path, 0o700)
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
        except (NotFound, FileNotFoundError):
            raise DataLoss(f"{what}: hard link target {info.linkname!r} does not exist") from None
        if stat.S_ISDIR(tst.st_mode):
            raise DataLoss(f"{what}: hard link target {info.linkname!r} is a directory")
        if target != path:
            _remove(path)
            os.link(target, path, follow_symlinks=False)
        res.created.add(path)
        return 0
    else:
        _remove(path)
        if info.isreg():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as out:
                src = tf.extractfile(info)
                assert src is not None
                while chunk := src.read(_CHUNK):
                    out.write(chunk)
                    written += len(chunk)
        elif info.issym():
            os.symlink(info.linkname, path)
        elif info.isfifo():
            os.mkfifo(path, 0o600)
        elif info.ischr() or info.isblk():
            kind = stat.S_IFCHR if info.ischr() else stat.S_IFBLK
            os.mknod(path, kind | 0o600, os.makedev(info.devmajor, info.devminor))
        else:
            raise DataLoss(f"{what}: unsupported tar entry type {info.type!r}")
    res.created.add(path)
    _set_meta(path, info, is_link=info.issym())
    if not info.isdir():
        os.utime(path, (info.mtime, info.mtime), follow_symlinks=False)
    return written


class _HashingReader:
    """Reads through to ``inner`` and hashes what passes: the layer's diff id."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.hash = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data: bytes = self._inner.read(n)
        self.hash.update(data)
        return data

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


def _decompressed(raw: BinaryIO, media_type: str) -> Any:
    """A reader of the uncompressed tar; the format is told by the stream's magic bytes."""
    if media_type and media_type not in LAYER_MEDIA_TYPES:
        raise InvalidArgument(f"unsupported layer media type {media_type!r}")
    head = raw.read(4)
    raw.seek(0)
    if head[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if head == b"\x28\xb5\x2f\xfd":
        return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    return raw


def cleanup_mounts(mount_dir: str) -> list[str]:
    """Unmount and remove unpack mount points a crash left behind (start-up)."""
    removed: list[str] = []
    if not os.path.isdir(mount_dir):
        return removed
    for mp in mnt.mounts_under(mount_dir):
        if mp != os.path.realpath(mount_dir):
            mnt.unmount(mp, detach=True)
            removed.append(f"mount {mp}")
    for name in os.listdir(mount_dir):
        with contextlib.suppress(OSError):
            os.rmdir(os.path.join(mount_dir, name))
    return removed


def unpack_layer(snapshotter: Snapshotter, *, blob_path: str, media_type: str, diff_id: str,
                 chain_id: str, parent: str | None, allow_device_nodes: bool,
                 mount_dir: str) -> None:
    """Unpack one layer blob into a committed snapshot named ``chain_id``; all or nothing."""
    try:
        if snapshotter.stat(chain_id).kind is Kind.COMMITTED:
            return
    except NotFound:
        pass
    key = f"{TEMP_PREFIX}{secrets.token_hex(6)}-{chain_id}"
    mounts = snapshotter.prepare(key, parent)
    target: str | None = None
    try:
        if parent is None:
            root = snapshotter.upper_dir(key)
        else:
            os.makedirs(mount_dir, mode=0o700, exist_ok=True)
            target = os.path.join(mount_dir, secrets.token_hex(6))
            os.mkdir(target, 0o700)
            mnt.mount(mounts[0], target)
            root = target
        with open(blob_path, "rb") as raw:
            try:
                reader = _HashingReader(_decompressed(raw, media_type))
                apply_tar(root, reader, allow_device_nodes=allow_device_nodes)
                reader.drain()  # tar padding after the end marker counts for the diff id
            except (EOFError, zlib.error, zstandard.ZstdError, gzip.BadGzipFile) as e:
                raise DataLoss(f"layer {os.path.basename(blob_path)} is corrupt: {e}") from None
        got = "sha256:" + reader.hash.hexdigest()
        if got != diff_id:
            raise DataLoss(f"layer diffID mismatch: config says {diff_id}, content is {got}")
        failpoint("pull.unpacking")  # applied, scratch snapshot (and mount) not yet committed
    except BaseException:
        _discard(snapshotter, key, target)
        raise
    try:
        _release(target)
        snapshotter.commit(chain_id, key)
    except BaseException:
        _discard(snapshotter, key, target)
        raise


def _discard(snapshotter: Snapshotter, key: str, target: str | None) -> None:
    """Undo a failed unpack without hiding why it failed; ``cleanup()`` catches the rest."""
    try:
        _release(target)
        snapshotter.remove(key)
    except Exception:
        log.exception("cannot remove scratch snapshot %s of a failed unpack", key)


def _release(target: str | None) -> None:
    if target is None:
        return
    try:
        mnt.unmount(target)
    except Exception:
        with contextlib.suppress(Exception):
            mnt.unmount(target, detach=True)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(target)
