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

from pycrid.errors import FailedPrecondition, NotFound
from pycrid.host.mounts import mount, mounts_under, unmount
from pycrid.images.snapshots import Snapshotter

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
                   bundle: str, fill: Callable[[], None] | None = None) -> str:
    """A writable snapshot of ``parent`` named ``key``, mounted at ``<bundle>/rootfs``;
    ``fill`` writes into its upper directory first (overlayfs must not see its layers
    change while mounted)."""
    os.makedirs(bundle, mode=0o700, exist_ok=True)
    target = rootfs_of(bundle)
    os.makedirs(target, mode=0o755, exist_ok=True)
    mounts = snapshotter.prepare(key, parent, labels={"pycrid.io/bundle": bundle})
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
        shutil.copytree(src, target, symlinks=True, dirs_exist_ok=True)


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
