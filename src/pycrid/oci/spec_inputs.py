"""The typed inputs of the two spec builders (oci/sandbox_spec.py, oci/container_spec.py).

Grouped by where each fact comes from, so a caller fills each group from one place:
the image (``ImageInput``), the host, probed once (``HostInput``), the node's
configuration (``SpecPolicy``) and the pod's runtime handler (``HandlerOptions``).
Every field has the default a test or a minimal caller wants.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pycrid.host.facts import SECCOMP_ONLY, HostFacts, HostSecurity
from pycrid.oci.defaults import ALL_CAPABILITIES, Spec
from pycrid.oci.resources import ResourcePolicy
from pycrid.oci.spec import CgroupDriver


@dataclass(frozen=True)
class ImageInput:
    """What the image gives a spec: its config JSON, and its rootfs's /etc/passwd and
    /etc/group to resolve user names (None: the file is missing)."""

    config: Mapping[str, Any] = field(default_factory=dict)
    etc_passwd: str | None = None
    etc_group: str | None = None


@dataclass(frozen=True)
class HostInput:
    """Facts of this host and of the daemon, probed by the caller."""

    #: The daemon's own oom_score_adj: a container may not ask for less (the kernel
    #: refuses to lower it without CAP_SYS_RESOURCE).
    min_oom_score_adj: int = -1000
    #: Which security modules the host offers (seccomp, AppArmor, SELinux).
    security: HostSecurity = SECCOMP_ONLY
    #: The daemon's capabilities: what ``ALL`` means, and what a privileged container gets.
    capabilities: Sequence[str] = ALL_CAPABILITIES
    #: Options of the host's cgroup2 mount (nsdelegate, memory_recursiveprot) that a
    #: container without a cgroup namespace keeps.
    cgroup_options: Sequence[str] = ()
    cgroup_v2: bool = True
    #: The daemon runs in a user namespace (it cannot widen ping_group_range).
    in_userns: bool = False
    #: The node's hostname: HOSTNAME of a container whose pod sets none.
    hostname: str = ""

    @classmethod
    def from_facts(cls, host: HostFacts) -> HostInput:
        return cls(min_oom_score_adj=host.oom_score_adj, security=host.security,
                   capabilities=host.capabilities, cgroup_v2=host.cgroups.unified)


@dataclass(frozen=True)
class SpecPolicy:
    """The node's configuration of specs (the CRI runtime config's keys)."""

    cgroup_driver: CgroupDriver = "auto"
    #: The seccomp profile of a container that asks for none ("": unconfined).
    unset_seccomp_profile: str = ""
    #: The resource rules and the host cgroup facts they depend on.
    resources: ResourcePolicy = field(default_factory=ResourcePolicy)
    cgroup_writable: bool = False
    disable_proc_mount: bool = False
    ignore_image_defined_volumes: bool = False
    #: containerd's defaults for a pod with a network of its own (pod_sysctls).
    unprivileged_ports: bool = True
    unprivileged_icmp: bool = True


@dataclass(frozen=True)
class HandlerOptions:
    """What the pod's runtime handler (RuntimeClass) sets in its specs."""

    #: Replaces the default spec (a handler's base_runtime_spec).
    base_spec: Spec | None = None
    #: Globs of the pod's and the container's annotations copied into the spec.
    pod_annotations: Sequence[str] = ()
    container_annotations: Sequence[str] = ()
    privileged_without_host_devices: bool = False
    #: The handler's runc can make recursive read-only mounts.
    rro_supported: bool = False
    #: The handler runs pods in an application kernel (gVisor): the pod's PID namespace
    #: is the sandbox's own, and another container's cannot be joined.
    sandboxed: bool = False
    #: The capabilities the handler's runtime knows (None: all the host has); ALL and
    #: privileged stop at them, and naming another one is refused.
    capabilities: frozenset[str] | None = None


#: The defaults, for callers that leave a group out.
DEFAULT_HOST = HostInput()
DEFAULT_POLICY = SpecPolicy()
NO_HANDLER = HandlerOptions()
