"""Root filesystems (and image volumes) of pods in a user namespace.

The image's files belong to the node's ids (root's are uid 0), which mean nothing in
the pod's user namespace. containerd 2.x, followed here:

- **idmapped layers** (core/mount/mount_linux.go ``prepareIDMappedOverlay``): the
  directory holding the snapshots is bound, read-only and idmapped with the pod's
  user namespace, on a scratch point inside the bundle; the overlay takes its lower
  layers through that bind (overlayfs accepts idmapped layers since Linux 5.19) and
  the scratch bind goes once the overlay holds them. A single-layer view is one
  idmapped bind. The writable layer's top directory belongs to the pod's root
  (plugins/snapshots/overlay/overlay.go chowns ``fs`` to the mapping's root pair), so
  what the container writes lands on disk as its host ids.
- **a chowned copy** where the kernel or the file system cannot make idmapped mounts,
  and only with ``slow_chown`` (containerd's key; without it containerd refuses, and
  so does pycrid): a committed snapshot on the image, keyed by the image and the
  mappings, whose files were all chowned to the pod's host ids (containerd's
  ``remapRootFS`` in client/snapshotter_opts_unix.go). Containers of pods with the same
  mappings share it; it is collected with the image's unused snapshots.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import stat
from dataclasses import dataclass

from pycrid.errors import AlreadyExists, FailedPrecondition, Internal, NotFound
from pycrid.faults import failpoint
from pycrid.host.idmap import IDMap
from pycrid.host.mounts import Mount, idmapped_bind, mount, unmount
from pycrid.host.userns import open_userns
from pycrid.images.snapshots import TEMP_PREFIX, Snapshotter

log = logging.getLogger(__name__)

#: Keys of chowned copies: ``remapped-<sha256 of the image chain id and the mappings>``.
REMAPPED_PREFIX = "remapped-"
_SCRATCH = ".idmapped-layers"


@dataclass(frozen=True)
class RootfsMapping:
    """How a snapshot must be shown to a pod in a user namespace."""

    idmap: IDMap
    #: The pinned user namespace whose maps shift the layers.
    userns: str
    #: Fall back to a chowned copy where idmapped layers fail (containerd's slow_chown).
    slow_chown: bool = False
    #: Whose layers ("sandbox", "container"): names the fail points on the way.
    stage: str = "container"


def mount_snapshot(snapshotter: Snapshotter, key: str, parent: str | None, target: str,
                   mapping: RootfsMapping, *, scratch_dir: str, view: bool = False,
                   labels: dict[str, str] | None = None) -> None:
    """A new writable snapshot (a read-only view with ``view``) of ``parent`` named
    ``key``, mounted at ``target`` the way the pod's root must see it. On failure the
    snapshot and its mounts are left for the caller's cleanup, as every other step of a
    create leaves its part."""
    make = snapshotter.view if view else snapshotter.prepare
    mounts = make(key, parent, labels)
    if not view:
        os.lchown(snapshotter.upper_dir(key), *mapping.idmap.root())
    try:
        failpoint(f"{mapping.stage}.idmap")
        _mount_idmapped(mounts, target, mapping, scratch_dir)
    except (OSError, Internal) as err:
        _undo(snapshotter, key, target)
        if not mapping.slow_chown:
            raise FailedPrecondition(
                f"cannot show the image's layers to the pod's user namespace with idmapped "
                f"mounts here ({err}); set slow_chown = true in [plugins.\"pycrid.cri.v1."
                "images\"] to give such pods a chowned copy of the image instead") from None
        log.warning("idmapped layers failed for %s (%s); using a chowned copy", key, err)
        copy = remapped_parent(snapshotter, parent, mapping.idmap, scratch_dir)
        mounts = make(key, copy, labels)
        if not view:  # before the mount: the overlay takes its root's owner from it
            os.lchown(snapshotter.upper_dir(key), *mapping.idmap.root())
        for m in mounts:
            mount(m, target)


def _undo(snapshotter: Snapshotter, key: str, target: str) -> None:
    while os.path.ismount(target):
        unmount(target, detach=True)
    with contextlib.suppress(NotFound):
        snapshotter.remove(key)


def _mount_idmapped(mounts: list[Mount], target: str, mapping: RootfsMapping,
                    scratch_dir: str) -> None:
    fd = open_userns(mapping.userns)
    try:
        for m in mounts:
            if m.type == "bind" and "ro" not in m.options:
                mount(m, target)  # a writable layer with nothing under it: chowned already
            elif m.type == "bind":
                idmapped_bind(m.source, target, fd, readonly=True)
            elif m.type == "overlay":
                _overlay(m, target, fd, scratch_dir, mapping.stage)
            else:
                raise Internal(f"cannot idmap a {m.type} mount")
    finally:
        os.close(fd)


def _overlay(m: Mount, target: str, userns_fd: int, scratch_dir: str, stage: str) -> None:
    """The overlay with every lower layer taken through one idmapped, read-only bind of
    the directory that holds them."""
    options = list(m.options)
    i, lowers = next((i, o.split("=", 1)[1].split(":")) for i, o in enumerate(options)
                     if o.startswith("lowerdir="))
    common = os.path.commonpath(lowers)
    if common in lowers:  # one layer (or one inside another): bind the one above
        common = os.path.dirname(common)
    if common in ("", "/"):
        raise Internal(f"no common directory above the layers {lowers}")
    scratch = os.path.join(scratch_dir, _SCRATCH)
    os.makedirs(scratch, mode=0o700, exist_ok=True)
    idmapped_bind(common, scratch, userns_fd, readonly=True)
    try:
        failpoint(f"{stage}.idmapped_layers")
        shifted = [os.path.join(scratch, os.path.relpath(p, common)) for p in lowers]
        options[i] = "lowerdir=" + ":".join(shifted)
        mount(Mount(m.type, m.source, tuple(options)), target)
    finally:
        unmount(scratch, detach=True)
        os.rmdir(scratch)


def remapped_key(parent: str, idmap: IDMap) -> str:
    digest = hashlib.sha256(
        f"{parent}\0{idmap.map_file('uid')}\0{idmap.map_file('gid')}".encode()).hexdigest()
    return REMAPPED_PREFIX + digest


def remapped_parent(snapshotter: Snapshotter, parent: str | None, idmap: IDMap,
                    scratch_dir: str) -> str:
    """The committed chowned copy of ``parent`` for these mappings, made if missing."""
    if parent is None:
        raise Internal("an image without layers has nothing to copy")
    key = remapped_key(parent, idmap)
    with contextlib.suppress(NotFound):
        snapshotter.stat(key)
        return key
    tmp = f"{TEMP_PREFIX}remap-{secrets.token_hex(8)}"
    where = os.path.join(scratch_dir, ".remap")
    os.makedirs(where, mode=0o700, exist_ok=True)
    try:
        for m in snapshotter.prepare(tmp, parent):
            mount(m, where)
        try:
            chown_tree(where, idmap)
        finally:
            while os.path.ismount(where):
                unmount(where, detach=True)
        try:
            snapshotter.commit(key, tmp)
        except AlreadyExists:  # another container of these mappings made it first
            snapshotter.remove(tmp)
    except BaseException:
        with contextlib.suppress(NotFound):
            snapshotter.remove(tmp)
        raise
    finally:
        os.rmdir(where)
    return key


def chown_tree(root: str, idmap: IDMap) -> None:
    """Every file under ``root`` (links themselves, never followed) to the host ids its
    ids have in the pod; set-id bits, which chown clears, are put back. A file with
    several names is changed once where that changes every name (a plain directory);
    through overlayfs (``index=off``, pycrid's mounts) a chown copies one name up and the
    other names still show the lower file, so each is changed in its turn (image layers
    have hard links of their own, and partial pulls with ``use_hard_links`` add some)."""
    done: set[tuple[int, int]] = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [".", *dirnames, *filenames] if dirpath == root else \
                [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            linked = st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode)
            if linked and (st.st_dev, st.st_ino) in done:
                continue
            uid, gid = idmap.uid(st.st_uid), idmap.gid(st.st_gid)
            if uid is None or gid is None:
                raise FailedPrecondition(
                    f"{os.path.relpath(path, root)} in the image is owned by "
                    f"{st.st_uid}:{st.st_gid}, outside the pod's user namespace mappings")
            os.lchown(path, uid, gid)
            if linked and os.lstat(path).st_ino == st.st_ino:
                done.add((st.st_dev, st.st_ino))  # changed in place: every name shows it
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                os.chmod(path, stat.S_IMODE(st.st_mode))
