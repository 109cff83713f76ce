"""The pause container's spec (config.json), as containerd builds it (CRI-TO-OCI.md §1).

A pure function over the CRI request, the pause image and the facts its caller
(the pause sandbox controller) passes in.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

from cri_api.v1 import api_pb2 as pb

from pycrid.errors import InvalidArgument
from pycrid.oci.defaults import Spec, default_spec
from pycrid.oci.security import apply_seccomp, selinux_ignored
from pycrid.oci.spec import (
    A,
    cgroups_path,
    idmaps,
    image_section,
    pass_through,
    pod_sysctls,
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
from pycrid.oci.spec_mounts import SandboxFiles, sandbox_mounts
from pycrid.oci.user import resolve_user

SANDBOX_OOM_SCORE_ADJ = -998


@dataclass(frozen=True)
class SandboxSpecRequest:
    """The pod whose pause container the spec describes."""

    config: pb.PodSandboxConfig
    sandbox_id: str
    #: The pause image's reference (an annotation).
    pause_image: str
    files: SandboxFiles
    #: The pod's network namespace ("" for the host's) and its pinned user namespace
    #: ("": none, or none pinned).
    netns_path: str = ""
    userns_path: str = ""


def sandbox_spec(req: SandboxSpecRequest, image: ImageInput, *,
                 host: HostInput = DEFAULT_HOST, policy: SpecPolicy = DEFAULT_POLICY,
                 handler: HandlerOptions = NO_HANDLER) -> Spec:
    """The pause container's spec (§1.2-§1.9), from the handler's base spec instead of
    the default when it has one."""
    config = req.config
    spec = copy.deepcopy(handler.base_spec) if handler.base_spec is not None \
        else default_spec()
    proc = spec["process"]
    linux = spec["linux"]
    img = image_section(image.config)
    sc = config.linux.security_context
    opts = sc.namespace_options

    args = list(img.get("Entrypoint") or []) + list(img.get("Cmd") or [])
    if not args:
        raise InvalidArgument(f"pause image {req.pause_image!r} has no entrypoint or cmd")
    proc["args"] = args
    proc["env"] = list(img.get("Env") or [])
    proc["cwd"] = img.get("WorkingDir") or "/"
    proc["terminal"] = False
    spec["hostname"] = config.hostname
    spec["root"]["readonly"] = True

    user = user_string(sc, img.get("User") or "", with_username=False)
    if user:
        resolved = resolve_user(user, image.etc_passwd, image.etc_group)
        proc["user"] = {"uid": resolved.uid, "gid": resolved.gid,
                        "additionalGids": [resolved.gid]}
    elif sc.supplemental_groups:
        proc["user"]["additionalGids"] = list(sc.supplemental_groups)

    host_net = opts.network == pb.NODE
    userns = pod_userns(opts)
    namespaces: list[Spec] = []
    for ns in linux["namespaces"]:
        kind = ns["type"]
        if host_net and kind in ("network", "uts"):
            continue
        if (kind == "pid" and opts.pid == pb.NODE) or (kind == "ipc" and opts.ipc == pb.NODE):
            continue
        if kind == "network":
            ns = {"type": "network", "path": req.netns_path}
        namespaces.append(ns)
    if userns is not None:
        # The pod's pinned user namespace (sandbox/pod_userns.py); without one, runc
        # makes a new one with the pod's mappings.
        user_ns: Spec = {"type": "user"}
        if req.userns_path:
            user_ns["path"] = req.userns_path  # runc reads the maps from it
        else:
            linux["uidMappings"] = idmaps(userns.uids)
            linux["gidMappings"] = idmaps(userns.gids)
        namespaces.append(user_ns)
    linux["namespaces"] = namespaces

    spec["mounts"] = sandbox_mounts(spec["mounts"], req.files, host_ipc=opts.ipc == pb.NODE,
                                    bind_sys=host_net and userns is not None)
    if sc.privileged:
        sysfs_rw(spec["mounts"])

    sysctls = pod_sysctls(config, unprivileged_ports=policy.unprivileged_ports,
                          unprivileged_icmp=policy.unprivileged_icmp and userns is None
                          and not host.in_userns)
    if sysctls:
        linux["sysctl"] = sysctls
    linux["cgroupsPath"] = cgroups_path(config.linux.cgroup_parent, req.sandbox_id,
                                        policy.cgroup_driver)
    proc["oomScoreAdj"] = max(SANDBOX_OOM_SCORE_ADJ, host.min_oom_score_adj)
    selinux_ignored(sc, host.security, "sandbox")
    apply_seccomp(spec, sc, privileged=sc.privileged, host=host.security,
                  unset_profile=policy.unset_seccomp_profile)
    spec["annotations"] = _sandbox_annotations(req, handler.pod_annotations)
    return spec


def _sandbox_annotations(req: SandboxSpecRequest, globs: Sequence[str]) -> dict[str, str]:
    config = req.config
    out = pass_through(config.annotations, globs)
    out.update({
        A + "container-type": "sandbox",
        A + "sandbox-id": req.sandbox_id,
        A + "sandbox-name": config.metadata.name,
        A + "sandbox-namespace": config.metadata.namespace,
        A + "sandbox-uid": config.metadata.uid,
        A + "sandbox-log-directory": config.log_directory,
        A + "podsandbox.image-name": req.pause_image,
    })
    if config.linux.HasField("resources"):
        res = config.linux.resources
        out[A + "sandbox-cpu-period"] = str(res.cpu_period)
        out[A + "sandbox-cpu-quota"] = str(res.cpu_quota)
        out[A + "sandbox-cpu-shares"] = str(res.cpu_shares)
        out[A + "sandbox-memory"] = str(res.memory_limit_in_bytes)
    return out
