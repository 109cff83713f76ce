"""A pod's user namespace on disk: pinned at ``<state>/sandboxes/<id>/ns/user``, and the
directories its mapped root has to pass through.

With a network namespace of its own, the pod's user namespace is the one that netns was
made in (network/netns.py), pinned from it; a host-network pod gets a new one with the
pod's mappings (containerd lets the pause's runc make that one; pinning it here serves
pods without a pause process too). Both controllers pin it before anything runs, and
unpin it when the pod stops.
"""

from __future__ import annotations

import os

from pycrid.errors import FailedPrecondition
from pycrid.host import pins
from pycrid.host.idmap import IDMap
from pycrid.host.userns import NamespaceRequest, blocked_dir, pin_namespaces, pin_owner


def user_pin(pod_dir: str) -> str:
    return os.path.join(pod_dir, "ns", "user")


def pin_pod_userns(pod_dir: str, netns: str, idmap: IDMap) -> str:
    """Pin the pod's user namespace; returns where."""
    path = user_pin(pod_dir)
    if netns:
        pin_owner(netns, path)
    else:
        pin_namespaces(NamespaceRequest(pins={"user": path}, idmap=idmap))
    return path


def unpin_pod_userns(pod_dir: str) -> None:
    pins.unpin(user_pin(pod_dir))


def check_reachable(path: str, idmap: IDMap) -> None:
    """Refuse a pod whose mapped root could not reach ``path`` (the directory holding the
    bundles), naming the directory in the way, before anything is made."""
    uid, gid = idmap.root()
    blocked = blocked_dir(path, uid, gid)
    if blocked is not None:
        raise FailedPrecondition(
            f"a user-namespace pod's root (uid {uid}, gid {gid} on the node) cannot enter "
            f"{blocked}, on the way to its bundle in {path}: runc sets the rootfs up from "
            "inside the pod's user namespace; make every directory above the state "
            "directory searchable by others (chmod o+x)")
