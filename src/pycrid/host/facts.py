"""What this node offers, probed once at start and handed to every part that needs it.

Nothing here changes while the daemon runs (a reboot or a new kernel does that), so
probing it in constructors, or per request, only costs time and lets two parts disagree.
Parts take a ``HostFacts`` (or the piece of it they use) and stay pure; tests build one
that describes any host.
"""

from __future__ import annotations

import asyncio
import os
import re
import resource
from collections.abc import Mapping
from dataclasses import dataclass, field

from pycrid.host import cgroups, criu, mountinfo
from pycrid.host.cgroups import CgroupHost
from pycrid.host.criu import CriuSupport
from pycrid.host.mountinfo import MountEntry

RuncVersion = tuple[int, int, int]

#: runc's rlimit table (rlimit_linux.go): it fails on any other name.
RLIMIT_NAMES: tuple[str, ...] = (
    "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_DATA", "RLIMIT_STACK", "RLIMIT_CORE",
    "RLIMIT_RSS", "RLIMIT_NPROC", "RLIMIT_NOFILE", "RLIMIT_MEMLOCK", "RLIMIT_AS",
    "RLIMIT_LOCKS", "RLIMIT_SIGPENDING", "RLIMIT_MSGQUEUE", "RLIMIT_NICE",
    "RLIMIT_RTPRIO", "RLIMIT_RTTIME",
)
RLIM_INFINITY = 2**64 - 1

APPARMOR_ENABLED = "/sys/module/apparmor/parameters/enabled"
APPARMOR_PROFILES = "/sys/kernel/security/apparmor/profiles"
SELINUX_ENFORCE = "/sys/fs/selinux/enforce"


@dataclass(frozen=True)
class HostSecurity:
    """Which Linux security modules this host offers containers."""

    seccomp: bool
    apparmor: bool
    selinux: bool
    apparmor_profiles: str = APPARMOR_PROFILES

    def apparmor_profile_loaded(self, name: str) -> bool:
        """Loaded profiles are listed one a line as ``name (mode)``; read at each call
        because profiles come and go while the daemon runs."""
        try:
            with open(self.apparmor_profiles, encoding="utf-8", errors="replace") as f:
                return any(line.startswith(name + " (") for line in f)
        except OSError:
            return False


#: A host with seccomp only, the common case and this project's test machine.
SECCOMP_ONLY = HostSecurity(seccomp=True, apparmor=False, selinux=False)


@dataclass(frozen=True)
class HostFacts:
    oom_score_adj: int = 0
    """The daemon's own oom_score_adj: without CAP_SYS_RESOURCE no child may go lower."""
    capabilities: tuple[str, ...] = ()
    """The daemon's effective capabilities by name: all a privileged container gets."""
    security: HostSecurity = SECCOMP_ONLY
    cgroups: CgroupHost = field(default_factory=CgroupHost)
    cgroup_mounts: tuple[MountEntry, ...] = ()
    """The cgroup and cgroup2 mounts, in mount-table order."""
    runc_version: RuncVersion = (0, 0, 0)
    rdt: bool = False
    """resctrl is mounted (Intel RDT / AMD PQoS usable)."""
    rlimit_hard: Mapping[str, int] = field(default_factory=dict)
    """The daemon's hard limits by OCI name: a container cannot be given more."""
    criu: CriuSupport = CriuSupport()
    """The CRIU runc checkpoints and restores with, and whether it works here."""


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""


def own_oom_score_adj(proc: str = "/proc") -> int:
    try:
        return int(_read(os.path.join(proc, "self/oom_score_adj")) or 0)
    except ValueError:
        return 0


def own_capabilities(status: str, names: tuple[str, ...]) -> tuple[str, ...]:
    """The names (``names`` in bit order) set in ``CapEff`` of a /proc status text; all
    of them when the line is missing."""
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            mask = int(line.split(":", 1)[1].strip(), 16)
            return tuple(name for bit, name in enumerate(names) if mask >> bit & 1)
    return names


def seccomp_supported(status: str) -> bool:
    """The kernel knows seccomp when /proc/self/status has a ``Seccomp:`` line."""
    return any(line.startswith("Seccomp:") for line in status.splitlines())


def rlimit_hard() -> dict[str, int]:
    hard: dict[str, int] = {}
    for name in RLIMIT_NAMES:
        number = getattr(resource, name, None)
        if number is not None:
            limit = resource.getrlimit(number)[1]
            hard[name] = RLIM_INFINITY if limit == resource.RLIM_INFINITY else limit
    return hard


def mount_propagation(path: str) -> str:
    """"rshared", "rslave" or "" for the host mount that holds ``path``, read now: unlike
    the facts above, mounts come and go while the daemon runs."""
    entry = mountinfo.holder_of(os.path.realpath(path), mountinfo.read())
    return entry.propagation if entry is not None else ""


def parse_runc_version(text: str) -> RuncVersion:
    m = re.search(r"runc version (\d+)\.(\d+)\.(\d+)", text)
    return (int(m[1]), int(m[2]), int(m[3])) if m else (0, 0, 0)


async def runc_version(runc: str) -> RuncVersion:
    """``runc --version``, asked without blocking the loop; (0, 0, 0) when it fails."""
    try:
        proc = await asyncio.create_subprocess_exec(
            runc, "--version", stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL)
    except OSError:
        return (0, 0, 0)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 10)
    except TimeoutError:
        proc.kill()  # a hung runc is not left behind
        await proc.wait()
        return (0, 0, 0)
    return parse_runc_version(out.decode(errors="replace"))


async def probe(runc: str, capability_names: tuple[str, ...], criu_path: str = "") -> HostFacts:
    """Every fact of this node, once: runc and CRIU (``criu_path``, else ``criu`` on the
    search path) are asked at the same time without blocking the loop, the files are read
    in a worker thread."""
    version, criu_support = await asyncio.gather(runc_version(runc), criu.probe(criu_path))
    return await asyncio.to_thread(read_facts, version, capability_names, criu_support)


def read_facts(version: RuncVersion, capability_names: tuple[str, ...],
               criu_support: CriuSupport | None = None) -> HostFacts:
    """The facts that come from files (blocking)."""
    status = _read("/proc/self/status")
    security = HostSecurity(
        seccomp=seccomp_supported(status),
        apparmor=_read(APPARMOR_ENABLED) == "Y" and os.path.exists(APPARMOR_PROFILES),
        selinux=os.path.exists(SELINUX_ENFORCE))
    mounts = tuple(m for m in mountinfo.read() if m.fstype in ("cgroup", "cgroup2"))
    return HostFacts(
        oom_score_adj=own_oom_score_adj(),
        capabilities=own_capabilities(status, capability_names),
        security=security,
        cgroups=cgroups.probe(),
        cgroup_mounts=mounts,
        runc_version=version,
        rdt=os.path.exists("/sys/fs/resctrl/schemata"),
        rlimit_hard=rlimit_hard(),
        criu=criu_support or CriuSupport(),
    )
