"""An app container's spec (config.json), as containerd builds it (CRI-TO-OCI.md §2).

A pure function over the CRI request, the image and the facts its caller passes in;
every rule cites its section of CRI-TO-OCI.md. Resources come from oci/resources.py,
seccomp/AppArmor/SELinux/sysctl rules from oci/security.py. Not here: SELinux labels
(no host here has SELinux; options are accepted and ignored, as containerd does
without it), host device discovery (runtime/devices.py), CDI, NRI adjustments
(oci/nri_apply.py).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cri_api.v1 import api_pb2 as pb

from pycrid.errors import InvalidArgument
from pycrid.oci.defaults import (
    DEFAULT_MASKED_PATHS,
    DEFAULT_PATH,
    DEFAULT_READONLY_PATHS,
    Spec,
    default_spec,
)
from pycrid.oci.resources import with_resources
from pycrid.oci.security import apply_container_security
from pycrid.oci.spec import (
    A,
    DeviceNode,
    Namespaces,
    cgroups_path,
    idmaps,
    image_section,
    pass_through,
    pod_userns,
    sysfs_rw,
    user_string,
)
from pycrid.oci.spec_inputs import (
    DEFAULT_HOST,
    DEFAULT_POLICY,
    NO_HANDLER,
    HandlerOptions,
    HostInput,
    ImageInput,
    SpecPolicy,
)
from pycrid.oci.spec_mounts import SandboxFiles, container_mounts, image_volumes, sys_bind
from pycrid.oci.user import ResolvedUser, image_groups, resolve_user, sorted_gids


@dataclass(frozen=True)
class ContainerSpecRequest:
    """The container the spec describes and what its pod gives it."""

    config: pb.ContainerConfig
    #: The pod's config (its cgroup parent as the create asked for it).
    sandbox: pb.PodSandboxConfig
    container_id: str
    sandbox_id: str
    #: The image as the kubelet named it (an annotation).
    image_name: str
    #: The pod's namespaces and files the container joins and mounts.
    namespaces: Namespaces
    files: SandboxFiles
    #: Where the image's VOLUMEs get their host directories; ``image_volumes()`` tells
    #: the caller what to copy there.
    volumes_dir: str
    #: The pid of the container whose PID namespace a TARGET one joins.
    target_pid: int | None = None
    #: Nodes the caller found on the host: the CRI devices, and all of /dev for a
    #: privileged container.
    devices: Sequence[DeviceNode] = ()
    host_devices: Sequence[DeviceNode] = ()


def container_spec(req: ContainerSpecRequest, image: ImageInput, *,
                   host: HostInput = DEFAULT_HOST, policy: SpecPolicy = DEFAULT_POLICY,
                   handler: HandlerOptions = NO_HANDLER) -> Spec:
    """An app container's spec (§2.1-§2.11, §2.14, §2.15), from the handler's base spec
    instead of the default when it has one."""
    config, sandbox = req.config, req.sandbox
    spec = copy.deepcopy(handler.base_spec) if handler.base_spec is not None \
        else default_spec()
    proc = spec["process"]
    linux = spec["linux"]
    img = image_section(image.config)
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
    defaults.append(f"HOSTNAME={sandbox.hostname or host.hostname}")
    overrides = list(img.get("Env") or []) + [f"{e.key}={e.value}" for e in config.envs]
    proc["env"] = container_env(defaults, overrides)
    proc["user"] = _container_user(sc, img, image)

    cgroupns = host.cgroup_v2 and not privileged
    cgroup_opts = ["nosuid", "noexec", "nodev", "relatime",
                   "rw" if policy.cgroup_writable or privileged else "ro"]
    if not cgroupns:
        cgroup_opts += [o for o in ("nsdelegate", "memory_recursiveprot")
                        if o in host.cgroup_options]
    cgroup_mount = {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
                    "options": cgroup_opts}
    volumes = [] if policy.ignore_image_defined_volumes else image_volumes(
        config, dict(image.config), container_id=req.container_id,
        volumes_dir=req.volumes_dir)
    userns = pod_userns(popts)
    base = spec["mounts"]
    if popts.network == pb.NODE and userns is not None:
        base = [sys_bind() if m["destination"] == "/sys" else m for m in base]
    mounts, propagation = container_mounts(
        base, cgroup_mount, config, req.files, volumes,
        handler=handler, userns=userns)
    spec["mounts"] = mounts
    if propagation:
        linux["rootfsPropagation"] = propagation

    if policy.disable_proc_mount:
        linux["maskedPaths"] = list(DEFAULT_MASKED_PATHS)
        linux["readonlyPaths"] = list(DEFAULT_READONLY_PATHS)
    else:
        linux["maskedPaths"] = list(sc.masked_paths)
        linux["readonlyPaths"] = list(sc.readonly_paths)

    if req.devices:
        linux["devices"] = [d.linux_device() for d in req.devices]
        linux["resources"]["devices"] += [d.rule() for d in req.devices]
    known = handler.capabilities
    host_caps = [c for c in host.capabilities if known is None or c in known]
    proc["capabilities"] = capabilities(
        sc.capabilities if sc.HasField("capabilities") else None,
        proc["capabilities"]["bounding"], host_caps)
    if known is not None:
        _refuse_unknown_caps(proc["capabilities"], known)
    if privileged:
        _apply_privileged(spec, host_caps, req.host_devices,
                          handler.privileged_without_host_devices)
    if sc.readonly_rootfs:
        spec["root"]["readonly"] = True
    linux["cgroupsPath"] = cgroups_path(sandbox.linux.cgroup_parent, req.container_id,
                                        policy.cgroup_driver)
    with_resources(spec, config.linux.resources if config.linux.HasField("resources") else None,
                   policy.resources, host.min_oom_score_adj)  # §2.13
    linux["namespaces"] = _container_namespaces(
        sc.namespace_options, req.namespaces, req.target_pid, cgroupns=cgroupns,
        userns=userns is not None, sandboxed=handler.sandboxed)
    if userns is not None:
        if not sc.namespace_options.HasField("userns_options") or \
                sc.namespace_options.userns_options != popts.userns_options:
            raise InvalidArgument("container user namespace options differ from the sandbox's")
        if req.namespaces.user is None:
            # Joining the pod's pinned user namespace, runc reads the maps from it and
            # warns when the spec repeats them ("you may only provide one").
            linux["uidMappings"] = idmaps(userns.uids)
            linux["gidMappings"] = idmaps(userns.gids)
    apply_container_security(spec, sc, privileged=privileged, host=host.security,
                             unset_profile=policy.unset_seccomp_profile)
    spec["annotations"] = _container_annotations(req, handler)
    return spec


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


def _container_user(sc: Any, img: Mapping[str, Any], image: ImageInput) -> Spec:
    """§2.5: primary uid/gid plus additionalGids by supplemental_groups_policy."""
    etc_passwd, etc_group = image.etc_passwd, image.etc_group
    image_user = img.get("User") or ""
    user = user_string(sc, image_user, with_username=True)
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
    sysfs_rw(spec["mounts"])
    if not without_devices:
        linux["devices"] = [*linux.get("devices", []), *(d.linux_device() for d in host_devices)]
        linux["resources"]["devices"] = [{"allow": True, "access": "rwm"}]


def _refuse_unknown_caps(caps: Spec, known: frozenset[str]) -> None:
    unknown = sorted({c for values in caps.values() for c in values if c not in known})
    if unknown:
        raise InvalidArgument(
            f"capabilities {', '.join(unknown)}: the pod's runtime handler does not know "
            "them (gVisor's runsc before 2023-02 knows capabilities up to CAP_AUDIT_READ)")


def _container_namespaces(
    opts: pb.NamespaceOption, pod: Namespaces, target_pid: int | None,
    *, cgroupns: bool, userns: bool, sandboxed: bool = False,
) -> list[Spec]:
    """§2.14: join the pod's namespaces by path (the pause's /proc/<pid>/ns/*, or the
    pinned files of a pod without one); one the pod takes from the host is left out.

    Under gVisor the pod's PID namespace is the sandbox's root one, which a container
    gets by having no PID namespace of its own (runsc matches namespace paths between
    containers, and the pause's has none: runsc/boot/loader.go); joining another
    container's is not possible there."""
    out: list[Spec] = []
    if opts.pid == pb.CONTAINER:
        out.append({"type": "pid"})
    elif opts.pid == pb.TARGET and sandboxed:
        raise InvalidArgument(
            "namespace_options.pid = TARGET: gVisor (runsc) cannot put a container in "
            "another container's PID namespace")
    elif opts.pid == pb.POD and sandboxed and pod.pid is not None:
        pass
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
        out.append({"type": "user", "path": pod.user} if pod.user else {"type": "user"})
    return out


def _container_annotations(req: ContainerSpecRequest,
                           handler: HandlerOptions) -> dict[str, str]:
    config, sandbox = req.config, req.sandbox
    out = pass_through(sandbox.annotations, handler.pod_annotations)
    out.update(pass_through(config.annotations, handler.container_annotations))
    out.update({
        A + "container-type": "container",
        A + "sandbox-id": req.sandbox_id,
        A + "sandbox-namespace": sandbox.metadata.namespace,
        A + "sandbox-uid": sandbox.metadata.uid,
        A + "sandbox-name": sandbox.metadata.name,
        A + "container-name": config.metadata.name,
        A + "image-name": config.image.user_specified_image or req.image_name,
    })
    return out
