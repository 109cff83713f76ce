"""Image volumes (CRI ``Mount.image``, KEP-4639): a pulled image mounted read-only in a container.

Each is a read-only snapshot view of the image's layers (overlayfs lowerdirs, no
upper layer) mounted at ``<bundle>/image-volumes/<n>``, ``n`` the mount's index in
the container config. containerd shares one mount per pod and image (under
``<state>/image-volumes/<pod>/<digest>``) and drops it when the pod stops; here each
container has its own, named for the container (snapshot key
``image-volume/<container id>/<n>``), so whatever removes a container's bundle and
rootfs (RemoveContainer, the undo of a failed create, recovery, the orphan sweep)
removes its image volumes too, and a removed container leaves none behind.
"""

from __future__ import annotations

import errno
import os

from pycrid.errors import InvalidArgument, NotFound
from pycrid.host.mounts import mount, real_dir_beneath
from pycrid.images.snapshots import Snapshotter
from pycrid.runtime.mapped_rootfs import RootfsMapping, mount_snapshot

PREFIX = "image-volume/"


def snapshot_key(container_id: str, index: int) -> str:
    return f"{PREFIX}{container_id}/{index}"


def owner_of(key: str) -> str | None:
    """The container whose image volume snapshot ``key`` is, or None for other keys."""
    if not key.startswith(PREFIX):
        return None
    owner, _, index = key[len(PREFIX):].partition("/")
    return owner if owner and index else None


def target_of(bundle: str, index: int) -> str:
    return os.path.join(bundle, "image-volumes", str(index))


def mount_image_volume(snapshotter: Snapshotter, *, container_id: str, index: int,
                       parent: str | None, bundle: str, sub_path: str, what: str,
                       mapping: RootfsMapping | None = None) -> str:
    """Mount a read-only view of snapshot ``parent`` (an image's top chain id) for the
    container's mount ``index``; returns the host path to bind (``sub_path`` inside it).

    On failure the view and its mount stay for the caller's cleanup
    (``remove_image_volumes`` after unmounting the bundle), as every other step of a
    create does. ``what`` names the mount and image in errors. With ``mapping`` (a pod
    in a user namespace) the image's layers are idmapped as its rootfs's are
    (containerd gives image volume snapshots the pod's remapping labels too).
    """
    target = target_of(bundle, index)
    os.makedirs(target, mode=0o755, exist_ok=True)
    key, labels = snapshot_key(container_id, index), {"pycrid.io/container": container_id}
    if mapping is not None:
        mount_snapshot(snapshotter, key, parent, target, mapping, scratch_dir=bundle,
                       view=True, labels=labels)
    else:
        for m in snapshotter.view(key, parent, labels=labels):
            mount(m, target)
    if not sub_path:
        return target
    try:
        return real_dir_beneath(target, sub_path)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise NotFound(f"{what}: image_sub_path {sub_path!r} does not exist in the "
                           "image") from None
        if e.errno == errno.ENOTDIR:
            raise InvalidArgument(f"{what}: image_sub_path {sub_path!r} is not a directory "
                                  "(only directories can be mounted)") from None
        if e.errno in (errno.EXDEV, errno.ELOOP):
            raise InvalidArgument(f"{what}: image_sub_path {sub_path!r} escapes the "
                                  "image's root") from None
        raise


def remove_image_volumes(snapshotter: Snapshotter, container_id: str) -> list[str]:
    """Drop the container's image volume views (unmounted already); returns their parents."""
    parents = []
    for info in snapshotter.walk(prefix=f"{PREFIX}{container_id}/"):
        snapshotter.remove(info.key)
        if info.parent:
            parents.append(info.parent)
    return parents
