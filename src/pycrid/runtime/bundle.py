"""OCI bundles on disk: a directory with ``config.json`` and ``rootfs`` (a mounted snapshot).

Every path is derived from the object's id, so the same ``remove_bundle`` undoes
a half-made bundle, removes a finished one, and cleans up after a crash.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pycrid.errors import FailedPrecondition, InvalidArgument, NotFound
from pycrid.host import space
from pycrid.host.mounts import mount, mounts_under, unmount
from pycrid.host.userns import open_to_mapped_root
from pycrid.images.snapshots import Snapshotter
from pycrid.runtime.mapped_rootfs import RootfsMapping, mount_snapshot

_MAX_ETC_FILE = 4 * 1024 * 1024


@dataclass(frozen=True)
class ContainerPaths:
    """Where a container's files live: its bundle on the state tmpfs, the copies of its
    image's VOLUMEs under the root directory."""

    state_dir: str
    root_dir: str

    def bundle(self, cid: str) -> str:
        return os.path.join(self.state_dir, "containers", cid)

    def volumes(self, cid: str) -> str:
        return os.path.join(self.root_dir, "containers", cid)

    def checkpoint(self, cid: str) -> str:
        """Where a checkpoint is gathered before it is archived (on disk, beside the
        container's other files, removed with them; containerd's ``ctrd-checkpoint``)."""
        return os.path.join(self.volumes(cid), "checkpoint")

    def restore(self, cid: str) -> str:
        """Where a restored container's archive is unpacked until StartContainer restores
        it (containerd's ``ctrd-restore``)."""
        return os.path.join(self.volumes(cid), "restore")


def rootfs_of(bundle: str) -> str:
    return os.path.join(bundle, "rootfs")


def prepare_rootfs(snapshotter: Snapshotter, key: str, parent: str | None,
                   bundle: str, mapping: RootfsMapping | None = None,
                   fill: Callable[[], None] | None = None) -> str:
    """A writable snapshot of ``parent`` named ``key``, mounted at ``<bundle>/rootfs``;
    with ``mapping``, as a pod in a user namespace sees it (runtime/mapped_rootfs.py),
    the bundle open to the pod's root. ``fill`` writes into its upper directory first
    (overlayfs must not see its layers change while mounted); a restore, which is
    refused for pods in a user namespace, is its one user."""
    if mapping is not None and fill is not None:
        raise InvalidArgument("a container of a pod in a user namespace cannot be restored "
                              "from a checkpoint")
    os.makedirs(bundle, mode=0o700, exist_ok=True)
    target = rootfs_of(bundle)
    os.makedirs(target, mode=0o755, exist_ok=True)
    labels = {"pycrid.io/bundle": bundle}
    if mapping is not None:
        open_to_mapped_root(bundle, mapping.idmap)
        mount_snapshot(snapshotter, key, parent, target, mapping, scratch_dir=bundle,
                       labels=labels)
        return target
    mounts = snapshotter.prepare(key, parent, labels=labels)
    try:
        if fill is not None:
            fill()
        for m in mounts:
            mount(m, target)
    except BaseException:
        with contextlib.suppress(Exception):
            snapshotter.remove(key)
        raise
    return target


def write_spec(bundle: str, spec: dict[str, Any]) -> None:
    path = os.path.join(bundle, "config.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(spec, f)  # no indent: json's C encoder only runs without one (5x faster)
    os.replace(tmp, path)


def read_spec(bundle: str) -> dict[str, Any]:
    try:
        with open(os.path.join(bundle, "config.json")) as f:
            spec: dict[str, Any] = json.load(f)
    except FileNotFoundError:
        raise NotFound(f"bundle {bundle} has no config.json") from None
    return spec


def read_etc(rootfs: str, name: str) -> str | None:
    """``/etc/<name>`` of a container rootfs, or None; never follows a link out of it."""
    path = os.path.join(rootfs, "etc", name)
    real = os.path.realpath(path)
    root = os.path.realpath(rootfs)
    if not real.startswith(root + os.sep) or not os.path.isfile(real):
        return None
    with open(real, "rb") as f:
        data = f.read(_MAX_ETC_FILE)
    return data.decode("utf-8", errors="replace")


def copy_image_volume(rootfs: str, dest: str, target: str) -> None:
    """Fill a new volume directory with what the image has at ``dest`` (CRI-TO-OCI.md §2.7)."""
    os.makedirs(target, mode=0o755, exist_ok=True)
    root = os.path.realpath(rootfs)
    src = os.path.realpath(os.path.join(root, dest.lstrip("/")))
    if src != root and not src.startswith(root + os.sep):
        raise FailedPrecondition(f"image volume {dest} points outside the image")
    if os.path.isdir(src):
        def copy(src: str, dst: str) -> object:
            # A full disk must stop the copy as such (copytree would gather it into a
            # list of failed files and go on).
            with space.writing(f"image volume {dest}", dst):
                return shutil.copy2(src, dst)

        shutil.copytree(src, target, symlinks=True, dirs_exist_ok=True, copy_function=copy)


def remove_bundle(snapshotter: Snapshotter, key: str, bundle: str) -> list[str]:
    """Unmount everything under the bundle, drop its snapshot, delete the directory.

    Returns the dropped snapshot's parent (a chain an image may no longer hold), if any.
    """
    if os.path.isdir(bundle):
        for mp in mounts_under(bundle):
            unmount(mp, detach=True)
    parents = []
    with contextlib.suppress(NotFound):
        parent = snapshotter.stat(key).parent
        snapshotter.remove(key)
        if parent:
            parents.append(parent)
    shutil.rmtree(bundle, ignore_errors=True)
    return parents
