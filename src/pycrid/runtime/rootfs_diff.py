"""A container's writable layer as a checkpoint carries it, and back onto a new one.

Written from the overlay snapshot's upper directory (the container is frozen meanwhile),
in the form CRI-O and Podman write and read (``crutils.CRCreateRootFsDiffTar``,
``CRApplyRootFsDiffTar``, ``CRRemoveDeletedFiles``): ``rootfs-diff.tar``, a plain tar of
what the container added or changed, and ``deleted.files``, a JSON list of the paths it
removed (``/etc/motd``). containerd 2.x names its diff the same but writes a gzip OCI
layer with ``.wh.`` whiteouts; containerd 2.4 no longer restores at all, so the form the
remaining restorers read is the one written. Reading takes both: gzip or not, ``.wh.``
entries or the list.

What overlayfs keeps in the upper directory maps one to one: a 0/0 character device is a
removed name, a ``trusted.overlay.opaque`` directory one whose lower entries were removed
(each is listed), other ``trusted.overlay.*`` attributes are overlay's own and dropped.
pycrid mounts without ``redirect_dir`` and ``metacopy``, so every changed file is whole
in the upper directory (containerd's overlay differ relies on the same); a layer that
has either is refused rather than diffed wrong.

Applying goes through the image unpacker's safe paths (``images/layer_tar.py``) onto the
new snapshot's upper directory before it is mounted: names stay inside it, removals
become overlay whiteouts, directories made on the way take the lower layers' metadata.
"""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, cast

from isal import igzip

from pycrid.errors import Aborted, DataLoss, FailedPrecondition
from pycrid.images.layer_paths import (
    OVERLAY_XATTRS,
    WHITEOUT,
    clean_name,
    is_opaque,
    is_whiteout,
)
from pycrid.images.layer_tar import apply_tar
from pycrid.images.unpack import inherit_dirs

#: checkpointctl's RootFsDiffTar and DeletedFilesFile.
DIFF_TAR = "rootfs-diff.tar"
DELETED_FILES = "deleted.files"
_REFUSED_XATTRS = ("trusted.overlay.redirect", "trusted.overlay.metacopy")
_MAX_DELETED = 16 << 20


@dataclass(frozen=True)
class DiffSummary:
    #: Entries in rootfs-diff.tar, and paths in deleted.files.
    entries: int
    deleted: int


def _xattrs(path: str, what: str) -> dict[str, str]:
    """The entry's extended attributes as PAX records; overlay's own are dropped."""
    out: dict[str, str] = {}
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return out
    for name in names:
        if name in _REFUSED_XATTRS:
            raise FailedPrecondition(
                f"{what} uses overlayfs {name.rsplit('.', 1)[1]}, which a checkpoint's "
                "rootfs diff cannot carry")
        if name.startswith(OVERLAY_XATTRS):
            continue
        value = os.getxattr(path, name, follow_symlinks=False)
        out["SCHILY.xattr." + name] = value.decode("utf-8", "surrogateescape")
    return out


def _hidden(lowers: Sequence[str], rel: str, upper_names: set[str]) -> list[str]:
    """Names an opaque directory hides: what any lower layer has there, and the upper
    directory has not (an over-estimate only lists names that are gone anyway)."""
    found: set[str] = set()
    for lower in lowers:
        path = os.path.join(lower, rel)
        if os.path.isdir(path) and not os.path.islink(path):
            found.update(os.listdir(path))
    return sorted(n for n in found - upper_names if not n.startswith(WHITEOUT))


def write_diff(upper: str, lowers: Sequence[str], dest: str,
               stop: threading.Event | None = None) -> DiffSummary:
    """``dest``/rootfs-diff.tar and, when something was removed, ``dest``/deleted.files,
    from the upper directory ``upper`` over ``lowers`` (top first)."""
    deleted: list[str] = []
    entries = 0
    with tarfile.open(os.path.join(dest, DIFF_TAR), "w", format=tarfile.PAX_FORMAT) as tf:
        for dirpath, dirs, files in os.walk(upper):
            dirs.sort()
            rel_dir = os.path.relpath(dirpath, upper)
            rel_dir = "" if rel_dir == "." else rel_dir
            if rel_dir and is_opaque(dirpath):
                names = set(dirs) | set(files)
                deleted += [f"/{rel_dir}/{n}" for n in _hidden(lowers, rel_dir, names)]
            for name in [*sorted(files), *dirs]:
                if stop is not None and stop.is_set():
                    raise Aborted("the rootfs diff was stopped")
                path = os.path.join(dirpath, name)
                rel = os.path.join(rel_dir, name) if rel_dir else name
                st = os.lstat(path)
                if is_whiteout(st):
                    deleted.append("/" + rel)
                    continue
                entries += _add(tf, path, rel, st)
    if deleted:
        with open(os.path.join(dest, DELETED_FILES), "w") as f:
            json.dump(sorted(deleted), f)
    return DiffSummary(entries, len(deleted))


def _add(tf: tarfile.TarFile, path: str, rel: str, st: os.stat_result) -> int:
    if stat.S_ISSOCK(st.st_mode):
        return 0  # a socket's file is recreated by whoever binds it; tar cannot hold one
    info = tf.gettarinfo(path, arcname=rel)
    if info is None:
        return 0
    info.uname = info.gname = ""  # ids only: host user names mean nothing in the image
    info.pax_headers = _xattrs(path, f"/{rel}")
    if info.isreg():
        with open(path, "rb") as f:
            tf.addfile(info, f)
    else:
        tf.addfile(info)
    return 1


def apply_diff(src: str, upper: str, lowers: Sequence[str]) -> None:
    """Apply ``src``/rootfs-diff.tar (plain or gzip; ``.wh.`` whiteouts honoured) and then
    ``src``/deleted.files onto the upper directory of a new writable snapshot over
    ``lowers`` (top first), before it is mounted."""
    implicit: set[str] = set()
    tar_path = os.path.join(src, DIFF_TAR)
    if os.path.isfile(tar_path):
        with open(tar_path, "rb") as raw:
            stream: IO[bytes] = raw
            if raw.read(2) == b"\x1f\x8b":
                raw.seek(0)
                stream = cast(IO[bytes], igzip.GzipFile(  # type: ignore[no-untyped-call]
                    fileobj=raw, mode="rb"))
            else:
                raw.seek(0)
            implicit |= _applied(upper, stream, lowers, DIFF_TAR)
    removed = read_deleted(os.path.join(src, DELETED_FILES))
    if removed:
        implicit |= _applied(upper, io.BytesIO(whiteouts_tar(removed)), lowers, DELETED_FILES)
    inherit_dirs(upper, {os.path.relpath(p, os.path.realpath(upper)) for p in implicit},
                 lowers)


def _applied(upper: str, stream: IO[bytes], lowers: Sequence[str], what: str) -> set[str]:
    try:
        # A container with CAP_MKNOD may have made device nodes: the device cgroup, not
        # the diff, decides what they can reach (containerd applies them too).
        applied = apply_tar(upper, stream, allow_device_nodes=True, has_lower=True,
                            lowers=lowers)
    except DataLoss as e:
        raise DataLoss(f"checkpoint's {what}: {e}") from None
    return set(applied.implicit)


def read_deleted(path: str) -> list[str]:
    """deleted.files: a JSON list of absolute paths; [] when there is none."""
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_DELETED + 1)
    except FileNotFoundError:
        return []
    if len(data) > _MAX_DELETED:
        raise DataLoss(f"checkpoint's {DELETED_FILES} is larger than {_MAX_DELETED} bytes")
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise DataLoss(f"checkpoint's {DELETED_FILES} is not JSON: {e}") from None
    if not isinstance(doc, list) or not all(isinstance(p, str) for p in doc):
        raise DataLoss(f"checkpoint's {DELETED_FILES} is not a list of paths")
    return [p for p in doc if clean_name(p)]


def whiteouts_tar(paths: Sequence[str]) -> bytes:
    """A tar of ``.wh.`` entries, one per removed path: the unpacker turns each into an
    overlay whiteout (through its checks), as it does for an image layer's."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for p in paths:
            parent, base = os.path.split(clean_name(p))
            tf.addfile(tarfile.TarInfo(os.path.join(parent, WHITEOUT + base)))
    return buf.getvalue()
