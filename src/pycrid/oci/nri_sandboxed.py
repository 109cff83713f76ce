"""NRI adjustments a gVisor (runsc) container cannot have: refused, naming the field.

A container under gVisor runs on the sandbox's own kernel. runsc (2022 releases, the ones
Debian ships) takes from its spec the process (args, env, user, rlimits, capabilities),
the mounts, the OCI seccomp policy (with ``--oci-seccomp``, which pycrid turns on) and
the prestart, createRuntime and poststart hooks. What acts on the host's kernel for one
container has no effect inside the sandbox, so an adjustment of it would be dropped
without a word; it is refused instead, as pycrid refuses what the host cannot honour
(nri_host_support.py). What is left alone: annotations, args, env, mounts, rlimits,
oom_score_adj (runsc gives the sandbox the lowest of its containers'), seccomp when the
handler applies it, and removals of anything.
"""

from __future__ import annotations

from google.protobuf.message import Message

from pycrid.nri import api
from pycrid.oci.nri_host_support import cannot

_NO_HOST_CGROUP = ("a container inside the gVisor sandbox has no host cgroup of its own: "
                   "only the pod's cgroup limits the sandbox")


def _set(msg: Message, name: str) -> bool:
    return msg.HasField(name)


def refuse_unhonoured(adjust: api.ContainerAdjustment, *, seccomp: bool) -> None:
    """FailedPrecondition for the first field of ``adjust`` gVisor would drop; ``seccomp``:
    the handler applies OCI seccomp policies (runsc --oci-seccomp)."""
    linux = adjust.linux
    hooks = adjust.hooks
    for name in ("create_container", "start_container"):
        if getattr(hooks, name):
            raise cannot(f"hooks.{name}", "runsc does not run these hooks (they would run "
                         "in the container's namespaces, which live in the sandbox)")
    if any(not api.is_marked_for_removal(d.path) for d in linux.devices):
        raise cannot("linux.devices", "gVisor does not give a container host device nodes")
    if adjust.CDI_devices:
        raise cannot("CDI_devices", "gVisor does not give a container host device nodes")
    if linux.cgroups_path:
        raise cannot("linux.cgroups_path", _NO_HOST_CGROUP)
    if _set(linux, "resources"):
        _refuse_resources(linux.resources)
    if any(not api.is_marked_for_removal(ns.type) for ns in linux.namespaces):
        raise cannot("linux.namespaces", "the sandbox makes its containers' namespaces; "
                     "runsc joins none by path")
    if any(not api.is_marked_for_removal(k) for k in linux.sysctl):
        raise cannot("linux.sysctl", "runsc does not set a container's sysctls in the "
                     "sandbox's kernel")
    if any(not api.is_marked_for_removal(k) for k in linux.net_devices):
        raise cannot("linux.net_devices", "runsc does not move host network devices into "
                     "a container")
    for name in ("io_priority", "scheduler", "memory_policy", "rdt"):
        if _set(linux, name):
            raise cannot(f"linux.{name}", "runsc does not apply it to a process in the "
                         "sandbox")
    if _set(linux, "seccomp_policy") and not seccomp:
        raise cannot("linux.seccomp_policy", "this runsc handler does not apply OCI seccomp "
                     "policies (its runsc_config sets oci-seccomp = \"false\")")


def _refuse_resources(r: api.LinuxResources) -> None:
    for group in ("memory", "cpu", "pids"):
        if _set(r, group):
            msg = getattr(r, group)
            for field, _ in msg.ListFields():
                raise cannot(f"linux.resources.{group}.{field.name}", _NO_HOST_CGROUP)
    if r.hugepage_limits:
        raise cannot("linux.resources.hugepage_limits", _NO_HOST_CGROUP)
    if any(not api.is_marked_for_removal(k) for k in r.unified):
        raise cannot("linux.resources.unified", _NO_HOST_CGROUP)
    for name in ("blockio_class", "rdt_class"):
        if _set(r, name):
            raise cannot(f"linux.resources.{name}", _NO_HOST_CGROUP)
    if r.devices:
        raise cannot("linux.resources.devices", "gVisor does not give a container host "
                     "device nodes")
