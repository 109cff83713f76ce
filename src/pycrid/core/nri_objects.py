"""Pods and containers as NRI sees them: pure conversions from records, OCI specs and CRI
resources to ``nri.pkg.api.v1alpha1`` messages, and NRI resources back to OCI.

The mapping follows containerd's CRI domain (``internal/cri/nri/nri_api_linux.go``,
NRI-PROTOCOL.md section e): identity and labels from the CRI metadata, everything
the container will run with (args, env, mounts, hooks, namespaces, devices,
resources, rlimits, user) from its OCI spec. Two deliberate differences: an
exited container is reported STOPPED (containerd says UNKNOWN), and pod
namespaces are derived from the pod config instead of re-reading its spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cri_api.v1 import api_pb2 as pb

from pycrid.errors import InvalidArgument
from pycrid.nri import api
from pycrid.oci.seccomp import parse_profile_string
from pycrid.oci.spec import Namespaces
from pycrid.store.records import ContainerRecord, SandboxRecord

_STATES = {
    pb.CONTAINER_CREATED: api.CONTAINER_CREATED,
    pb.CONTAINER_RUNNING: api.CONTAINER_RUNNING,
    pb.CONTAINER_EXITED: api.CONTAINER_STOPPED,
    pb.CONTAINER_UNKNOWN: api.CONTAINER_UNKNOWN,
}

_KIND_TYPES = {
    "RuntimeDefault": api.SecurityProfile.RUNTIME_DEFAULT,
    "Unconfined": api.SecurityProfile.UNCONFINED,
    "Localhost": api.SecurityProfile.LOCALHOST,
}
_PROFILE_TYPES = {
    pb.SecurityProfile.RuntimeDefault: api.SecurityProfile.RUNTIME_DEFAULT,
    pb.SecurityProfile.Unconfined: api.SecurityProfile.UNCONFINED,
    pb.SecurityProfile.Localhost: api.SecurityProfile.LOCALHOST,
}


# ---- resources ---------------------------------------------------------------------------


def resources_from_cri(res: pb.LinuxContainerResources) -> api.LinuxResources:
    """CRI container resources as NRI LinuxResources (zero CRI values are "not set")."""
    out = api.LinuxResources()
    if res.memory_limit_in_bytes:
        out.memory.limit.value = res.memory_limit_in_bytes
    if res.memory_swap_limit_in_bytes:
        out.memory.swap.value = res.memory_swap_limit_in_bytes
    if res.cpu_shares:
        out.cpu.shares.value = res.cpu_shares
    if res.cpu_quota:
        out.cpu.quota.value = res.cpu_quota
    if res.cpu_period:
        out.cpu.period.value = res.cpu_period
    out.cpu.cpus = res.cpuset_cpus
    out.cpu.mems = res.cpuset_mems
    for h in res.hugepage_limits:
        out.hugepage_limits.add(page_size=h.page_size, limit=h.limit)
    out.unified.update(res.unified)
    return out


def resources_from_oci(res: Mapping[str, Any]) -> api.LinuxResources:
    """An OCI ``linux.resources`` object as NRI LinuxResources."""
    out = api.LinuxResources()
    mem = res.get("memory") or {}
    for key, field in (("limit", "limit"), ("reservation", "reservation"), ("swap", "swap"),
                       ("kernel", "kernel"), ("kernelTCP", "kernel_tcp")):
        if mem.get(key) is not None:
            getattr(out.memory, field).value = mem[key]
    if mem.get("swappiness") is not None:
        out.memory.swappiness.value = mem["swappiness"]
    if mem.get("disableOOMKiller") is not None:
        out.memory.disable_oom_killer.value = mem["disableOOMKiller"]
    if mem.get("useHierarchy") is not None:
        out.memory.use_hierarchy.value = mem["useHierarchy"]
    cpu = res.get("cpu") or {}
    for key, field in (("shares", "shares"), ("quota", "quota"), ("period", "period"),
                       ("realtimeRuntime", "realtime_runtime"),
                       ("realtimePeriod", "realtime_period")):
        if cpu.get(key) is not None:
            getattr(out.cpu, field).value = cpu[key]
    out.cpu.cpus = cpu.get("cpus") or ""
    out.cpu.mems = cpu.get("mems") or ""
    for h in res.get("hugepageLimits") or ():
        out.hugepage_limits.add(page_size=h["pageSize"], limit=h["limit"])
    out.unified.update(res.get("unified") or {})
    for d in res.get("devices") or ():
        rule = out.devices.add(allow=d.get("allow", False), type=d.get("type", ""),
                               access=d.get("access", ""))
        if d.get("major") is not None:
            rule.major.value = d["major"]
        if d.get("minor") is not None:
            rule.minor.value = d["minor"]
    if (res.get("pids") or {}).get("limit") is not None:
        out.pids.limit = res["pids"]["limit"]
    return out


def oci_resource_update(res: api.LinuxResources) -> dict[str, Any]:
    """The part of NRI LinuxResources that ``runc update`` applies to a running container
    (containerd maps the same set through UpdateContainerResources)."""
    out: dict[str, Any] = {}
    mem: dict[str, Any] = {}
    if res.memory.HasField("limit"):
        mem["limit"] = res.memory.limit.value
    if res.memory.HasField("swap"):
        mem["swap"] = res.memory.swap.value
    if res.memory.HasField("reservation"):
        mem["reservation"] = res.memory.reservation.value
    if mem:
        out["memory"] = mem
    cpu: dict[str, Any] = {}
    for field, key in (("shares", "shares"), ("quota", "quota"), ("period", "period"),
                       ("realtime_runtime", "realtimeRuntime"),
                       ("realtime_period", "realtimePeriod")):
        if res.cpu.HasField(field):
            cpu[key] = getattr(res.cpu, field).value
    if res.cpu.cpus:
        cpu["cpus"] = res.cpu.cpus
    if res.cpu.mems:
        cpu["mems"] = res.cpu.mems
    if cpu:
        out["cpu"] = cpu
    if res.HasField("pids") and res.pids.limit:
        out["pids"] = {"limit": res.pids.limit}
    if res.hugepage_limits:
        out["hugepageLimits"] = [{"pageSize": h.page_size, "limit": h.limit}
                                 for h in res.hugepage_limits]
    if res.unified:
        out["unified"] = dict(res.unified)
    return out


# ---- pods -------------------------------------------------------------------------------


def pod_object(rec: SandboxRecord, cgroups_path: str,
               namespaces: Namespaces | None = None) -> api.PodSandbox:
    """The pod as plugins see it. A pod without a pause process (``namespaces``: the
    namespaces its containers join) has pid 0 and names its pinned namespaces by path,
    as CRI-O presents a pod whose infra container it dropped. A pod in a user namespace
    shows it, by the path of its pin (the NRI API has no field for id mappings: a
    plugin reads them from the pod's config, or from ``/proc/<pid>/uid_map`` of its
    containers)."""
    cfg, md = rec.config, rec.config.metadata
    pod = api.PodSandbox(id=rec.id, name=md.name, uid=md.uid, namespace=md.namespace,
                         labels=dict(cfg.labels), annotations=dict(cfg.annotations),
                         runtime_handler=rec.runtime_handler, pid=rec.pid, ips=list(rec.ips))
    linux = pod.linux
    linux.cgroup_parent = cfg.linux.cgroup_parent
    linux.cgroups_path = cgroups_path
    if cfg.linux.HasField("resources"):
        linux.pod_resources.CopyFrom(resources_from_cri(cfg.linux.resources))
    if cfg.linux.HasField("overhead"):
        linux.pod_overhead.CopyFrom(resources_from_cri(cfg.linux.overhead))
    user = namespaces.user if namespaces is not None else None
    if rec.controller == "pinned" and namespaces is not None:
        for kind, path in (("ipc", namespaces.ipc), ("uts", namespaces.uts),
                           ("network", namespaces.network), ("user", user)):
            if path is not None:
                linux.namespaces.add(type=kind, path=path)
        return pod
    opts = cfg.linux.security_context.namespace_options
    if opts.pid != pb.NODE:
        linux.namespaces.add(type="pid")
    if opts.ipc != pb.NODE:
        linux.namespaces.add(type="ipc")
    linux.namespaces.add(type="uts")
    linux.namespaces.add(type="mount")
    if rec.netns:
        linux.namespaces.add(type="network", path=rec.netns)
    if user is not None:
        linux.namespaces.add(type="user", path=user)
    return pod


# ---- containers -------------------------------------------------------------------------


def container_object(rec: ContainerRecord, spec: Mapping[str, Any]) -> api.Container:
    cfg = rec.config
    proc = spec.get("process") or {}
    linux_spec = spec.get("linux") or {}
    ctr = api.Container(
        id=rec.id, pod_sandbox_id=rec.sandbox_id, name=cfg.metadata.name,
        labels=dict(cfg.labels),
        annotations={**(spec.get("annotations") or {}), **cfg.annotations},
        args=list(proc.get("args") or ()), env=list(proc.get("env") or ()),
        pid=max(rec.pid, 0), created_at=rec.created_at)
    set_status(ctr, rec)
    for m in spec.get("mounts") or ():
        ctr.mounts.add(destination=m["destination"], type=m.get("type", ""),
                       source=m.get("source", ""), options=list(m.get("options") or ()))
    hooks = spec.get("hooks") or {}
    for oci_name, field in (("prestart", "prestart"), ("createRuntime", "create_runtime"),
                            ("createContainer", "create_container"),
                            ("startContainer", "start_container"), ("poststart", "poststart"),
                            ("poststop", "poststop")):
        for h in hooks.get(oci_name) or ():
            hook = getattr(ctr.hooks, field).add(path=h["path"], args=h.get("args") or [],
                                                 env=h.get("env") or [])
            if h.get("timeout") is not None:
                hook.timeout.value = h["timeout"]
    for r in proc.get("rlimits") or ():
        ctr.rlimits.add(type=r["type"], hard=r["hard"], soft=r["soft"])
    user = proc.get("user") or {}
    ctr.user.uid = user.get("uid", 0)
    ctr.user.gid = user.get("gid", 0)
    ctr.user.additional_gids.extend(user.get("additionalGids") or ())
    ctr.CDI_devices.extend(api.CDIDevice(name=d.name) for d in cfg.CDI_devices)
    ctr.image.name = rec.image_name
    ctr.image.config_digest = rec.image_id
    if "@" in rec.image_ref:  # a repo digest, name@sha256:...
        ctr.image.digest = rec.image_ref.split("@", 1)[1]
    linux = ctr.linux
    for ns in linux_spec.get("namespaces") or ():
        linux.namespaces.add(type=ns["type"], path=ns.get("path", ""))
    for d in linux_spec.get("devices") or ():
        dev = linux.devices.add(path=d["path"], type=d.get("type", ""),
                                major=d.get("major", 0), minor=d.get("minor", 0))
        if d.get("fileMode") is not None:
            dev.file_mode.value = d["fileMode"]
        if d.get("uid") is not None:
            dev.uid.value = d["uid"]
        if d.get("gid") is not None:
            dev.gid.value = d["gid"]
    linux.resources.CopyFrom(resources_from_oci(linux_spec.get("resources") or {}))
    if proc.get("oomScoreAdj") is not None:
        linux.oom_score_adj.value = proc["oomScoreAdj"]
    linux.cgroups_path = linux_spec.get("cgroupsPath", "")
    linux.sysctl.update(linux_spec.get("sysctl") or {})
    _set_seccomp_profile(linux, cfg.linux.security_context)
    return ctr


def _set_seccomp_profile(linux: api.LinuxContainer, sc: pb.LinuxContainerSecurityContext) -> None:
    """The profile the container asked for, as containerd reports it (none when the
    request names none), plus two cases where upstream under-reports: the deprecated
    ``seccomp_profile_path`` string, and privileged (which runs without a filter)."""
    if sc.privileged:
        linux.seccomp_profile.profile_type = api.SecurityProfile.UNCONFINED
        return
    if sc.HasField("seccomp"):
        linux.seccomp_profile.profile_type = _PROFILE_TYPES.get(
            sc.seccomp.profile_type, api.SecurityProfile.RUNTIME_DEFAULT)
        linux.seccomp_profile.localhost_ref = sc.seccomp.localhost_ref
        return
    if sc.seccomp_profile_path:
        try:
            profile = parse_profile_string(sc.seccomp_profile_path)
        except InvalidArgument:
            return  # cannot happen for a created container: creation parsed it
        linux.seccomp_profile.profile_type = _KIND_TYPES[profile.kind]
        linux.seccomp_profile.localhost_ref = profile.ref


def set_status(ctr: api.Container, rec: ContainerRecord) -> None:
    """Refresh the lifecycle part of ``ctr`` (state, times, exit) from its record."""
    ctr.state = _STATES.get(rec.state, api.CONTAINER_UNKNOWN)
    ctr.pid = max(rec.pid, 0)
    ctr.started_at = rec.started_at
    ctr.finished_at = rec.finished_at
    ctr.exit_code = rec.exit_code
    ctr.status_reason = rec.reason
    ctr.status_message = rec.message
