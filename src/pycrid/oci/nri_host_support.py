"""What the host and its runc can honour (``HostSupport``), and how an NRI adjustment is
refused: bad values are InvalidArgument, what this host cannot honour FailedPrecondition.

``HostSupport`` holds the node's ``HostFacts`` (probed once at start), and one reader
that cannot be a fact: the propagation of a mount's source, read from the mount table at
each use since mounts come and go.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pycrid.errors import FailedPrecondition, InvalidArgument
from pycrid.host.facts import HostFacts, RuncVersion, mount_propagation

Version = RuncVersion

# The runc release that first reads each spec field; older runc ignores the
# field without a word. Checked against runc's CHANGELOG.md and
# libcontainer/specconv/spec_linux.go at tags v1.1.5, v1.2.0, v1.3.0, v1.4.0.
MIN_RUNC_FOR: dict[str, Version] = {
    "linux.io_priority": (1, 2, 0),            # process.ioPriority
    "linux.scheduler": (1, 2, 0),              # process.scheduler
    "linux.seccomp_policy.flags": (1, 2, 0),   # 1.1 rejects any seccomp flag
    "linux.namespaces[time]": (1, 2, 0),       # time namespace
    "linux.net_devices": (1, 4, 0),            # linux.netDevices
    "linux.memory_policy": (1, 4, 0),          # linux.memoryPolicy
    "linux.rdt.schemata": (1, 4, 0),           # linux.intelRdt.schemata
    "linux.rdt.enable_monitoring": (1, 4, 0),  # linux.intelRdt.enableMonitoring
}


@dataclass(frozen=True)
class HostSupport:
    """What this host and its runc can honour; the runtime fills it in once at start."""

    runc_version: Version
    cgroup_v2: bool
    hugepage_sizes: frozenset[str]
    """As NRI and runc name them: "2MB", "1GB" (from /sys/kernel/mm/hugepages)."""
    rdt: bool
    """resctrl is mounted (Intel RDT / AMD PQoS usable)."""
    blockio_classes: frozenset[str] = frozenset()
    """pycrid has no class → blockIO table yet, so every class is refused."""
    min_oom_score_adj: int = 0
    """The daemon's own oom_score_adj; lower values are clamped up to it."""
    rlimit_hard: Mapping[str, int] = field(default_factory=dict)
    """The daemon's hard limits by OCI name; a higher hard limit is refused."""
    source_propagation: Callable[[str], str] | None = None
    """Propagation ("rshared", "rslave", "") of the host mount holding a path;
    None refuses rshared/rslave mounts, which need the check."""

    @classmethod
    def from_facts(cls, host: HostFacts) -> HostSupport:
        return cls(runc_version=host.runc_version, cgroup_v2=host.cgroups.unified,
                   hugepage_sizes=frozenset(host.cgroups.hugepage_sizes), rdt=host.rdt,
                   min_oom_score_adj=host.oom_score_adj, rlimit_hard=host.rlimit_hard,
                   source_propagation=mount_propagation)


def need_runc(host: HostSupport, what: str) -> None:
    need = MIN_RUNC_FOR[what]
    if host.runc_version < need:
        have = ".".join(map(str, host.runc_version))
        raise FailedPrecondition(
            f"NRI adjustment {what} needs runc >= {'.'.join(map(str, need))}; "
            f"this host has runc {have}")


def bad(what: str, why: str) -> InvalidArgument:
    return InvalidArgument(f"NRI adjustment {what}: {why}")


def cannot(what: str, why: str) -> FailedPrecondition:
    return FailedPrecondition(f"NRI adjustment {what}: {why}")

