"""What the pause container's spec and an app container's spec share (CRI-TO-OCI.md).

The two builders are oci/sandbox_spec.py and oci/container_spec.py, their typed
inputs oci/spec_inputs.py. Here: the cgroup path rule, the pod's namespaces, user
namespace mappings, the user string, annotation pass-through and the pod's sysctls.
"""

from __future__ import annotations

import fnmatch
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cri_api.v1 import api_pb2 as pb

from pycrid.errors import InvalidArgument
from pycrid.host.idmap import IDMap, IDRange
from pycrid.oci.defaults import Spec
from pycrid.oci.security import validate_sysctls

#: The prefix of the annotations containerd sets on every spec.
A = "io.kubernetes.cri."
CgroupDriver = Literal["auto", "cgroupfs", "systemd"]


def configured_driver(cgroup_driver: str) -> CgroupDriver:
    """The runtime config's ``cgroup_driver`` (checked at load to be one of the two)."""
    return "systemd" if cgroup_driver == "systemd" else "cgroupfs"


@dataclass(frozen=True)
class DeviceNode:
    """A host device node already stat'ed by the caller (§2.8, §2.10)."""

    path: str
    type: str
    major: int
    minor: int
    file_mode: int = 0o666
    uid: int = 0
    gid: int = 0
    permissions: str = "rwm"

    def linux_device(self) -> Spec:
        return {"path": self.path, "type": self.type, "major": self.major,
                "minor": self.minor, "fileMode": self.file_mode,
                "uid": self.uid, "gid": self.gid}

    def rule(self) -> Spec:
        return {"allow": True, "type": self.type, "major": self.major,
                "minor": self.minor, "access": self.permissions}


@dataclass(frozen=True)
class Namespaces:
    """Where a pod's containers find the namespaces they share (OCI namespace paths);
    None for one the pod takes from the host (the container then gets no namespace of
    that kind, so it shares the host's), and for ``pid`` also when the pod has no PID
    namespace of its own to share."""

    network: str | None = None
    ipc: str | None = None
    uts: str | None = None
    pid: str | None = None
    user: str | None = None


def cgroups_path(parent: str, object_id: str, driver: CgroupDriver = "auto") -> str:
    """§1.8: the rule is containerd's (``.slice`` suffix picks systemd form).

    ``driver`` other than "auto" only checks that the parent's form fits the
    configured driver, so a misconfigured node fails loudly instead of at runc.
    """
    if not parent:
        if driver == "systemd":
            raise InvalidArgument("systemd cgroup driver needs a .slice cgroup_parent")
        return f"/k8s.io/{object_id}"
    base = posixpath.basename(parent.rstrip("/"))
    is_slice = base.endswith(".slice")
    if driver == "systemd" and not is_slice:
        raise InvalidArgument(f"cgroup_parent {parent!r} is not a systemd slice")
    if driver == "cgroupfs" and is_slice:
        raise InvalidArgument(f"cgroup_parent {parent!r} is a systemd slice, driver is cgroupfs")
    if is_slice:
        return f"{base}:cri-containerd:{object_id}"
    return posixpath.normpath(posixpath.join(parent, object_id))


def image_section(image_config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The ``config`` object of an OCI image config (Entrypoint, Cmd, Env, User...)."""
    return image_config.get("config") or {}


def pass_through(annotations: Mapping[str, str], globs: Sequence[str]) -> dict[str, str]:
    return {k: v for k, v in sorted(annotations.items())
            if any(fnmatch.fnmatchcase(k, g) for g in globs)}


def pod_userns(opts: pb.NamespaceOption) -> pb.UserNamespace | None:
    """The POD user namespace request, None for none; validates §1.4's rules."""
    if not opts.HasField("userns_options"):
        return None
    userns = opts.userns_options
    if userns.mode == pb.NODE:
        if userns.uids or userns.gids:
            raise InvalidArgument("user namespace mode NODE must not carry id mappings")
        return None
    if userns.mode != pb.POD:
        raise InvalidArgument(f"user namespace mode {pb.NamespaceMode.Name(userns.mode)} "
                              "is not supported")
    if len(userns.uids) != 1 or len(userns.gids) != 1:
        raise InvalidArgument("user namespace needs exactly one uid and one gid mapping")
    return userns


def pod_idmap(opts: pb.NamespaceOption) -> IDMap | None:
    """The pod's user namespace mappings, None for a pod in the node's user namespace.
    Container id 0 must be mapped (containerd's RootPair check): the pod's root owns
    its rootfs and files."""
    userns = pod_userns(opts)
    if userns is None:
        return None
    out = IDMap(tuple(IDRange(m.container_id, m.host_id, m.length) for m in userns.uids),
                tuple(IDRange(m.container_id, m.host_id, m.length) for m in userns.gids))
    if any(r.size < 1 for r in (*out.uids, *out.gids)):
        raise InvalidArgument("user namespace mapping length must be at least 1")
    try:
        out.root()
    except ValueError:
        raise InvalidArgument("user namespace mappings must map container uid and gid 0 "
                              "(the pod's root)") from None
    return out


def idmaps(maps: Sequence[pb.IDMapping]) -> list[Spec]:
    return [{"containerID": m.container_id, "hostID": m.host_id, "size": m.length}
            for m in maps]


def user_string(sc: Any, image_user: str, *, with_username: bool) -> str:
    """§1.3/§2.5 primary user string; a group without a user is an error."""
    user = ""
    if with_username and sc.run_as_username:
        user = sc.run_as_username
    elif sc.HasField("run_as_user"):
        user = str(sc.run_as_user.value)
    if sc.HasField("run_as_group"):
        if not user:
            raise InvalidArgument(
                f'user group "{sc.run_as_group.value}" is specified without user'
            )
        return f"{user}:{sc.run_as_group.value}"
    return user or image_user


def pod_sysctls(config: pb.PodSandboxConfig, *, unprivileged_ports: bool = True,
                unprivileged_icmp: bool = True) -> dict[str, str]:
    """The pod's sysctls (names normalised) plus containerd's defaults for a pod with a
    network of its own: any port may be bound and any group may ping without privilege."""
    opts = config.linux.security_context.namespace_options
    sysctls = validate_sysctls(config.linux.sysctls, opts)
    if opts.network != pb.NODE:
        if unprivileged_ports:
            sysctls.setdefault("net.ipv4.ip_unprivileged_port_start", "0")
        if unprivileged_icmp:
            sysctls.setdefault("net.ipv4.ping_group_range", "0 2147483647")
    return sysctls


def sysfs_rw(mounts: list[Spec]) -> None:
    """A privileged spec's sysfs and cgroup mounts are writable."""
    for m in mounts:
        if m["type"] in ("sysfs", "cgroup"):
            m["options"] = ["rw" if o == "ro" else o for o in m["options"]]
