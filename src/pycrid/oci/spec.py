"""OCI runtime specs (config.json) for pause and app containers, as containerd builds them.

Pure functions over the CRI request, the image config dict and host facts the
caller passes in; every rule cites its section of CRI-TO-OCI.md. Resources come
from oci/resources.py, seccomp/AppArmor/SELinux/sysctl rules from oci/security.py.
Not here: SELinux labels (no host here has SELinux; options are accepted and
ignored, as containerd does without it), host device discovery, CDI, NRI
adjustments (oci/nri_apply.py).
"""

from __future__ import annotations

import copy
import fnmatch
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cri_api.v1 import api_pb2 as pb

from pycrid.errors import InvalidArgument
from pycrid.oci.defaults import (
    ALL_CAPABILITIES,
    DEFAULT_MASKED_PATHS,
    DEFAULT_PATH,
    DEFAULT_READONLY_PATHS,
    Spec,
    default_spec,
)
from pycrid.oci.mounts import (
    ImageVolume,
    SandboxFiles,
    container_mounts,
    image_volumes,
    sandbox_mounts,
    sys_bind,
)
from pycrid.oci.resources import ResourcePolicy, with_resources
from pycrid.oci.security import (
    SECCOMP_ONLY,
    HostSecurity,
    apply_container_security,
    apply_seccomp,
    selinux_ignored,
    validate_sysctls,
)
from pycrid.oci.user import ResolvedUser, image_groups, resolve_user, sorted_gids

__all__ = [
    "DeviceNode",
    "ImageVolume",
    "SandboxFiles",
    "cgroups_path",
    "container_spec",
    "default_spec",
    "image_volumes",
    "sandbox_spec",
]

A = "io.kubernetes.cri."
SANDBOX_OOM_SCORE_ADJ = -998
CgroupDriver = Literal["auto", "cgroupfs", "systemd"]


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


def _image(image_config: Mapping[str, Any]) -> Mapping[str, Any]:
    return image_config.get("config") or {}


def _pass_through(annotations: Mapping[str, str], globs: Sequence[str]) -> dict[str, str]:
    return {k: v for k, v in sorted(annotations.items())
            if any(fnmatch.fnmatchcase(k, g) for g in globs)}


def _userns(opts: pb.NamespaceOption) -> pb.UserNamespace | None:
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


def _idmaps(maps: Sequence[pb.IDMapping]) -> list[Spec]:
    return [{"containerID": m.container_id, "hostID": m.host_id, "size": m.length}
            for m in maps]


def _user_string(sc: Any, image_user: str, *, with_username: bool) -> str:
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


def sandbox_spec(
    config: pb.PodSandboxConfig,
    image_config: Mapping[str, Any],
    *,
    sandbox_id: str,
    pause_image: str,
    files: SandboxFiles,
    netns_path: str = "",
    userns_path: str = "",
    etc_passwd: str | None = None,
    etc_group: str | None = None,
    cgroup_driver: CgroupDriver = "auto",
    min_oom_score_adj: int = -1000,
    pod_annotation_globs: Sequence[str] = (),
    unprivileged_ports: bool = True,
    unprivileged_icmp: bool = True,
    daemon_in_userns: bool = False,
    base_spec: Spec | None = None,
    host_security: HostSecurity = SECCOMP_ONLY,
    unset_seccomp_profile: str = "",
) -> Spec:
    """The pause container's spec (§1.2-§1.9), from ``base_spec`` (a runtime handler's
    base_runtime_spec) instead of the default when given."""
    spec = copy.deepcopy(base_spec) if base_spec is not None else default_spec()
    proc = spec["process"]
    linux = spec["linux"]
    img = _image(image_config)
    sc = config.linux.security_context
    opts = sc.namespace_options

    args = list(img.get("Entrypoint") or []) + list(img.get("Cmd") or [])
    if not args:
        raise InvalidArgument(f"pause image {pause_image!r} has no entrypoint or cmd")
    proc["args"] = args
    proc["env"] = list(img.get("Env") or [])
    proc["cwd"] = img.get("WorkingDir") or "/"
    proc["terminal"] = False
    spec["hostname"] = config.hostname
    spec["root"]["readonly"] = True

    user = _user_string(sc, img.get("User") or "", with_username=False)
    if user:
        resolved = resolve_user(user, etc_passwd, etc_group)
        proc["user"] = {"uid": resolved.uid, "gid": resolved.gid,
                        "additionalGids": [resolved.gid]}
    elif sc.supplemental_groups:
        proc["user"]["additionalGids"] = list(sc.supplemental_groups)

    host_net = opts.network == pb.NODE
    userns = _userns(opts)
    namespaces: list[Spec] = []
    for ns in linux["namespaces"]:
        kind = ns["type"]
        if host_net and kind in ("network", "uts"):
            continue
        if (kind == "pid" and opts.pid == pb.NODE) or (kind == "ipc" and opts.ipc == pb.NODE):
            continue
        if kind == "network":
            ns = {"type": "network", "path": netns_path}
        namespaces.append(ns)
    if userns is not None:
        user_ns: Spec = {"type": "user"}
        if not host_net:
            user_ns["path"] = userns_path
        namespaces.append(user_ns)
        linux["uidMappings"] = _idmaps(userns.uids)
        linux["gidMappings"] = _idmaps(userns.gids)
    linux["namespaces"] = namespaces

    spec["mounts"] = sandbox_mounts(spec["mounts"], files, host_ipc=opts.ipc == pb.NODE,
                                    bind_sys=host_net and userns is not None)
    if sc.privileged:
        _sysfs_rw(spec["mounts"])

    sysctls = pod_sysctls(config, unprivileged_ports=unprivileged_ports,
                          unprivileged_icmp=unprivileged_icmp and userns is None
                          and not daemon_in_userns)
    if sysctls:
        linux["sysctl"] = sysctls
    linux["cgroupsPath"] = cgroups_path(config.linux.cgroup_parent, sandbox_id, cgroup_driver)
    proc["oomScoreAdj"] = max(SANDBOX_OOM_SCORE_ADJ, min_oom_score_adj)
    selinux_ignored(sc, host_security, "sandbox")
    apply_seccomp(spec, sc, privileged=sc.privileged, host=host_security,
                  unset_profile=unset_seccomp_profile)
    spec["annotations"] = _sandbox_annotations(config, sandbox_id, pause_image,
                                               pod_annotation_globs)
    return spec


def _sandbox_annotations(config: pb.PodSandboxConfig, sandbox_id: str, pause_image: str,
                         globs: Sequence[str]) -> dict[str, str]:
    out = _pass_through(config.annotations, globs)
    out.update({
        A + "container-type": "sandbox",
        A + "sandbox-id": sandbox_id,
        A + "sandbox-name": config.metadata.name,
        A + "sandbox-namespace": config.metadata.namespace,
        A + "sandbox-uid": config.metadata.uid,
        A + "sandbox-log-directory": config.log_directory,
        A + "podsandbox.image-name": pause_image,
    })
    if config.linux.HasField("resources"):
        res = config.linux.resources
        out[A + "sandbox-cpu-period"] = str(res.cpu_period)
        out[A + "sandbox-cpu-quota"] = str(res.cpu_quota)
        out[A + "sandbox-cpu-shares"] = str(res.cpu_shares)
        out[A + "sandbox-memory"] = str(res.memory_limit_in_bytes)
    return out


def _sysfs_rw(mounts: list[Spec]) -> None:
    for m in mounts:
        if m["type"] in ("sysfs", "cgroup"):
            m["options"] = ["rw" if o == "ro" else o for o in m["options"]]


def container_args(config: pb.ContainerConfig, img: Mapping[str, Any]) -> list[str]:
    """§2.2: CRI command replaces image Entrypoint+Cmd; CRI args replace only Cmd."""
    entrypoint = list(img.get("Entrypoint") or [])
    if entrypoint == [""]:
        entrypoint = []
    if config.command:
        args = list(config.command) + list(config.args)
    elif config.args:
        args = entrypoint + list(config.args)
    else:
        args = entrypoint + list(img.get("Cmd") or [])
    if not args:
        raise InvalidArgument("no command specified")
    return args


def container_env(defaults: Sequence[str], overrides: Sequence[str]) -> list[str]:
    """§2.3: overrides replace a default key in place, delete it without '=',
    else are appended (no de-duplication among overrides)."""
    env: list[str | None] = list(defaults)
    index = {e.split("=", 1)[0]: i for i, e in enumerate(defaults)}
    for entry in overrides:
        key = entry.split("=", 1)[0]
        if key in index:
            env[index[key]] = entry if "=" in entry else None
        elif "=" in entry:
            env.append(entry)
    return [e for e in env if e is not None]


def capabilities(
    cap: pb.Capability | None, defaults: Sequence[str], host_caps: Sequence[str]
) -> Spec:
    """§2.9: ALL in add ⇒ host caps; ALL in drop ⇒ none; then the named adds and drops."""
    sets = {k: list(defaults) for k in ("bounding", "effective", "permitted")}
    inheritable: list[str] = []
    if cap is not None:
        adds = list(cap.add_capabilities)
        drops = list(cap.drop_capabilities)
        if any(c.upper() == "ALL" for c in adds):
            sets = {k: list(host_caps) for k in sets}
        if any(c.upper() == "ALL" for c in drops):
            sets = {k: [] for k in sets}
            inheritable = []
        for c in adds:
            name = "CAP_" + c.upper()
            if c.upper() == "ALL":
                continue
            for values in sets.values():
                if name not in values:
                    values.append(name)
        for c in drops:
            name = "CAP_" + c.upper()
            for values in (*sets.values(), inheritable):
                if name in values:
                    values.remove(name)
    return {**sets, **({"inheritable": inheritable} if inheritable else {})}


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


def container_spec(
    config: pb.ContainerConfig,
    sandbox: pb.PodSandboxConfig,
    image_config: Mapping[str, Any],
    *,
    container_id: str,
    sandbox_id: str,
    namespaces: Namespaces,
    etc_passwd: str | None,
    etc_group: str | None,
    image_name: str,
    files: SandboxFiles,
    volumes_dir: str,
    node_hostname: str = "",
    target_pid: int | None = None,
    devices: Sequence[DeviceNode] = (),
    host_devices: Sequence[DeviceNode] = (),
    host_capabilities: Sequence[str] = ALL_CAPABILITIES,
    host_cgroup_options: Sequence[str] = (),
    cgroup_v2: bool = True,
    cgroup_driver: CgroupDriver = "auto",
    cgroup_writable: bool = False,
    privileged_without_host_devices: bool = False,
    ignore_image_defined_volumes: bool = False,
    disable_proc_mount: bool = False,
    rro_supported: bool = False,
    min_oom_score_adj: int = -1000,
    resource_policy: ResourcePolicy | None = None,
    pod_annotation_globs: Sequence[str] = (),
    container_annotation_globs: Sequence[str] = (),
    base_spec: Spec | None = None,
    host_security: HostSecurity = SECCOMP_ONLY,
    unset_seccomp_profile: str = "",
) -> Spec:
    """An app container's spec (§2.1-§2.11, §2.14, §2.15).

    ``devices``/``host_devices`` are nodes the caller found on the host (CRI
    devices, and all of /dev for privileged). Image VOLUMEs become bind mounts
    from ``volumes_dir``; ``image_volumes()`` tells the caller what to copy.
    ``base_spec`` replaces the default spec (a runtime handler's base_runtime_spec).
    """
    spec = copy.deepcopy(base_spec) if base_spec is not None else default_spec()
    proc = spec["process"]
    linux = spec["linux"]
    img = _image(image_config)
    sc = config.linux.security_context
    psc = sandbox.linux.security_context
    popts = psc.namespace_options
    privileged = sc.privileged
    if privileged and not psc.privileged:
        raise InvalidArgument("no privileged container allowed in sandbox")

    proc["args"] = container_args(config, img)
    proc["noNewPrivileges"] = sc.no_new_privs
    proc["cwd"] = config.working_dir or img.get("WorkingDir") or "/"
    defaults = [DEFAULT_PATH]
    if config.tty:
        proc["terminal"] = True
        defaults.append("TERM=xterm")
    defaults.append(f"HOSTNAME={sandbox.hostname or node_hostname}")
    overrides = list(img.get("Env") or []) + [f"{e.key}={e.value}" for e in config.envs]
    proc["env"] = container_env(defaults, overrides)
    proc["user"] = _container_user(sc, img, etc_passwd, etc_group)

    cgroupns = cgroup_v2 and not privileged
    cgroup_opts = ["nosuid", "noexec", "nodev", "relatime",
                   "rw" if cgroup_writable or privileged else "ro"]
    if not cgroupns:
        cgroup_opts += [o for o in ("nsdelegate", "memory_recursiveprot")
                        if o in host_cgroup_options]
    cgroup_mount = {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
                    "options": cgroup_opts}
    volumes = [] if ignore_image_defined_volumes else image_volumes(
        config, dict(image_config), container_id=container_id, volumes_dir=volumes_dir)
    userns = _userns(popts)
    base = spec["mounts"]
    if popts.network == pb.NODE and userns is not None:
        base = [sys_bind() if m["destination"] == "/sys" else m for m in base]
    mounts, propagation = container_mounts(
        base, cgroup_mount, config, files, volumes,
        readonly_rootfs=sc.readonly_rootfs, host_ipc=sc.namespace_options.ipc == pb.NODE,
        rro_supported=rro_supported)
    spec["mounts"] = mounts
    if propagation:
        linux["rootfsPropagation"] = propagation

    if disable_proc_mount:
        linux["maskedPaths"] = list(DEFAULT_MASKED_PATHS)
        linux["readonlyPaths"] = list(DEFAULT_READONLY_PATHS)
    else:
        linux["maskedPaths"] = list(sc.masked_paths)
        linux["readonlyPaths"] = list(sc.readonly_paths)

    if devices:
        linux["devices"] = [d.linux_device() for d in devices]
        linux["resources"]["devices"] += [d.rule() for d in devices]
    proc["capabilities"] = capabilities(
        sc.capabilities if sc.HasField("capabilities") else None,
        proc["capabilities"]["bounding"], host_capabilities)
    if privileged:
        _apply_privileged(spec, host_capabilities, host_devices, privileged_without_host_devices)
    if sc.readonly_rootfs:
        spec["root"]["readonly"] = True
    linux["cgroupsPath"] = cgroups_path(sandbox.linux.cgroup_parent, container_id,
                                        cgroup_driver)
    with_resources(spec, config.linux.resources if config.linux.HasField("resources") else None,
                   resource_policy or ResourcePolicy(), min_oom_score_adj)  # §2.13
    linux["namespaces"] = _container_namespaces(
        sc.namespace_options, namespaces, target_pid, cgroupns=cgroupns,
        userns=_userns(popts) is not None)
    if userns is not None:
        if not sc.namespace_options.HasField("userns_options") or \
                sc.namespace_options.userns_options != popts.userns_options:
            raise InvalidArgument("container user namespace options differ from the sandbox's")
        linux["uidMappings"] = _idmaps(userns.uids)
        linux["gidMappings"] = _idmaps(userns.gids)
    apply_container_security(spec, sc, privileged=privileged, host=host_security,
                             unset_profile=unset_seccomp_profile)
    spec["annotations"] = _container_annotations(
        config, sandbox, sandbox_id, image_name,
        pod_annotation_globs, container_annotation_globs)
    return spec


def _container_user(sc: Any, img: Mapping[str, Any], etc_passwd: str | None,
                    etc_group: str | None) -> Spec:
    """§2.5: primary uid/gid plus additionalGids by supplemental_groups_policy."""
    image_user = img.get("User") or ""
    user = _user_string(sc, image_user, with_username=True)
    resolved = resolve_user(user, etc_passwd, etc_group) if user else ResolvedUser(0, 0)
    policy = sc.supplemental_groups_policy
    extra: list[int] = []
    if policy == pb.Merge:
        if sc.run_as_username:
            who = sc.run_as_username
        elif sc.HasField("run_as_user"):
            who = str(sc.run_as_user.value)
        else:
            who = image_user.split(":", 1)[0] or "0"
        extra = image_groups(who, etc_passwd, etc_group)
    elif policy != pb.Strict:
        raise InvalidArgument(f"supplemental_groups_policy {policy} is not implemented")
    gids = sorted_gids(resolved.gid, [*extra, *sc.supplemental_groups])
    return {"uid": resolved.uid, "gid": resolved.gid, "additionalGids": gids}


def _apply_privileged(spec: Spec, host_caps: Sequence[str],
                      host_devices: Sequence[DeviceNode], without_devices: bool) -> None:
    """§2.10: host caps, nothing masked, sysfs/cgroup rw, host devices, allow-all rule."""
    caps = list(host_caps)
    spec["process"]["capabilities"] = {"bounding": list(caps), "effective": list(caps),
                                       "permitted": list(caps)}
    linux = spec["linux"]
    linux.pop("maskedPaths", None)
    linux.pop("readonlyPaths", None)
    _sysfs_rw(spec["mounts"])
    if not without_devices:
        linux["devices"] = [*linux.get("devices", []), *(d.linux_device() for d in host_devices)]
        linux["resources"]["devices"] = [{"allow": True, "access": "rwm"}]


def _container_namespaces(
    opts: pb.NamespaceOption, pod: Namespaces, target_pid: int | None,
    *, cgroupns: bool, userns: bool,
) -> list[Spec]:
    """§2.14: join the pod's namespaces by path (the pause's /proc/<pid>/ns/*, or the
    pinned files of a pod without one); one the pod takes from the host is left out."""
    out: list[Spec] = []
    if opts.pid == pb.CONTAINER:
        out.append({"type": "pid"})
    elif opts.pid == pb.TARGET:
        if target_pid is None:
            raise InvalidArgument(f"target container {opts.target_id!r} is not running")
        out.append({"type": "pid", "path": f"/proc/{target_pid}/ns/pid"})
    elif pod.pid is not None:
        out.append({"type": "pid", "path": pod.pid})
    elif opts.pid == pb.POD:
        raise InvalidArgument("namespace_options.pid is POD but the pod shares no PID "
                              "namespace (its own pid option is not POD)")
    for kind, path in (("ipc", pod.ipc), ("uts", pod.uts)):
        if path is not None:
            out.append({"type": kind, "path": path})
    out.append({"type": "mount"})
    if pod.network is not None:
        out.append({"type": "network", "path": pod.network})
    if cgroupns:
        out.append({"type": "cgroup"})
    if userns:
        out.append({"type": "user", "path": pod.user})
    return out


def _container_annotations(
    config: pb.ContainerConfig, sandbox: pb.PodSandboxConfig, sandbox_id: str,
    image_name: str, pod_globs: Sequence[str], container_globs: Sequence[str],
) -> dict[str, str]:
    out = _pass_through(sandbox.annotations, pod_globs)
    out.update(_pass_through(config.annotations, container_globs))
    out.update({
        A + "container-type": "container",
        A + "sandbox-id": sandbox_id,
        A + "sandbox-namespace": sandbox.metadata.namespace,
        A + "sandbox-uid": sandbox.metadata.uid,
        A + "sandbox-name": sandbox.metadata.name,
        A + "container-name": config.metadata.name,
        A + "image-name": config.image.user_specified_image or image_name,
    })
    return out
