"""Host device nodes for a container spec (CRI-TO-OCI.md §2.8, §2.10).

The spec builder is pure; this is the part that looks at the host: a CRI
Device's host path (a node, or a directory of nodes) becomes ``DeviceNode``s.
"""

from __future__ import annotations

import os
import stat

from cri_api.v1 import api_pb2 as pb

from pycrid.errors import InvalidArgument
from pycrid.oci.spec import DeviceNode

#: Directories containerd skips when it walks a device directory.
_SKIP_DIRS = {"pts", "shm", "fd", "mqueue", ".lxc", ".lxd-mounts", ".udev"}


def _node(path: str, container_path: str, permissions: str) -> DeviceNode | None:
    st = os.stat(path)
    if stat.S_ISCHR(st.st_mode):
        kind = "c"
    elif stat.S_ISBLK(st.st_mode):
        kind = "b"
    else:
        return None
    return DeviceNode(path=container_path, type=kind, major=os.major(st.st_rdev),
                      minor=os.minor(st.st_rdev), file_mode=stat.S_IMODE(st.st_mode),
                      uid=st.st_uid, gid=st.st_gid, permissions=permissions)


def nodes_under(host_dir: str, container_dir: str, permissions: str = "rwm") -> list[DeviceNode]:
    found: list[DeviceNode] = []
    for dirpath, dirnames, filenames in os.walk(host_dir):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in sorted(filenames):
            if dirpath == host_dir and name == "console":
                continue
            path = os.path.join(dirpath, name)
            try:
                node = _node(path, os.path.join(container_dir,
                                                os.path.relpath(path, host_dir)), permissions)
            except OSError:
                continue
            if node is not None:
                found.append(node)
    return found


def cri_devices(devices: list[pb.Device]) -> list[DeviceNode]:
    """The nodes a container's CRI devices name; a path that is no device is an error."""
    out: list[DeviceNode] = []
    for d in devices:
        if not d.host_path:
            raise InvalidArgument("device host_path must not be empty")
        real = os.path.realpath(d.host_path)
        if not os.path.exists(real):
            raise InvalidArgument(f"device {d.host_path!r} does not exist on the host")
        perms = d.permissions or "rwm"
        if any(c not in "rwm" for c in perms):
            raise InvalidArgument(f"device {d.host_path!r}: permissions {perms!r} "
                                  "are not a subset of 'rwm'")
        target = d.container_path or d.host_path
        if os.path.isdir(real):
            out += nodes_under(real, target, perms)
            continue
        node = _node(real, target, perms)
        if node is None:
            raise InvalidArgument(f"{d.host_path!r} is not a device node")
        out.append(node)
    return out
