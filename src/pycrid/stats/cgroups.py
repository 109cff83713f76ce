"""Cgroup readers: pure functions over a directory, for cgroup v1 and v2.

They read the few files cAdvisor and containerd's task metrics read and nothing
else, so one pass over every container stays cheap. A missing file leaves its
field unset; a missing directory means the object went away, which the caller
tolerates.
"""

from __future__ import annotations

import logging
import os
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

#: Above this a memory limit means "none": the kernel rounds its "unlimited" down to a page
#: multiple, so it is never exactly 2^63-1 (containerd and cAdvisor use the same bound).
UNLIMITED = 1 << 62

#: The v1 controllers the readers use.
V1_CONTROLLERS = ("cpuacct", "memory", "pids")


@dataclass(frozen=True)
class CgroupStats:
    """One reading of one cgroup; counters are cumulative, sizes in bytes."""

    cpu_ns: int | None = None
    cpu_user_ns: int | None = None
    cpu_system_ns: int | None = None
    memory_usage: int | None = None
    #: None when unlimited.
    memory_limit: int | None = None
    memory_max_usage: int | None = None
    inactive_file: int = 0
    active_file: int = 0
    rss: int = 0
    cache: int = 0
    mapped_file: int = 0
    pgfault: int = 0
    pgmajfault: int = 0
    pids: int | None = None

    @property
    def working_set(self) -> int | None:
        if self.memory_usage is None:
            return None
        return working_set(self.memory_usage, self.inactive_file)

    @property
    def available(self) -> int | None:
        """limit - working set (kubelet's definition); None without a limit."""
        ws = self.working_set
        if self.memory_limit is None or ws is None:
            return None
        return max(self.memory_limit - ws, 0)


def working_set(usage: int, inactive_file: int) -> int:
    """usage - inactive file cache, floored at 0 (cAdvisor's and containerd's rule)."""
    return max(usage - inactive_file, 0)


def nano_cores(prev_cpu_ns: int, prev_ns: int, cpu_ns: int, now_ns: int) -> int | None:
    """Average CPU use between two samples, in billionths of a core; None when the two
    samples cannot give a rate (no time between them, or the counter went backwards)."""
    elapsed = now_ns - prev_ns
    if elapsed <= 0 or cpu_ns < prev_cpu_ns:
        return None
    return (cpu_ns - prev_cpu_ns) * 1_000_000_000 // elapsed


# ---- file parsing ----------------------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError, OSError):
        return None


def _int(path: str) -> int | None:
    text = _read(path)
    if text is None:
        return None
    text = text.strip()
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def parse_flat_keyed(text: str) -> dict[str, int]:
    """``memory.stat`` / ``cpu.stat``: one "key value" a line."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return out


def _keyed(path: str) -> dict[str, int]:
    text = _read(path)
    return parse_flat_keyed(text) if text is not None else {}


def _procs(directory: str) -> int | None:
    text = _read(os.path.join(directory, "cgroup.procs"))
    if text is None:
        return None
    return sum(1 for line in text.splitlines() if line.strip())


def _limit(value: int | None) -> int | None:
    return None if value is None or value > UNLIMITED else value


# ---- readers ---------------------------------------------------------------------------------


def read_v1(dirs: Mapping[str, str]) -> CgroupStats | None:
    """Read a v1 cgroup given each controller's directory for it (``{"memory": ...}``);
    None when none of the directories exists (the cgroup is gone)."""
    if not any(os.path.isdir(d) for d in dirs.values()):
        return None
    cpu = dirs.get("cpuacct", "")
    mem = dirs.get("memory", "")
    pids_dir = dirs.get("pids", "")
    stat = _keyed(os.path.join(mem, "memory.stat")) if mem else {}
    pids = _int(os.path.join(pids_dir, "pids.current")) if pids_dir else None
    if pids is None:
        for d in (pids_dir, mem, cpu):
            if d and (pids := _procs(d)) is not None:
                break
    return CgroupStats(
        cpu_ns=_int(os.path.join(cpu, "cpuacct.usage")) if cpu else None,
        cpu_user_ns=_int(os.path.join(cpu, "cpuacct.usage_user")) if cpu else None,
        cpu_system_ns=_int(os.path.join(cpu, "cpuacct.usage_sys")) if cpu else None,
        memory_usage=_int(os.path.join(mem, "memory.usage_in_bytes")) if mem else None,
        memory_limit=_limit(_int(os.path.join(mem, "memory.limit_in_bytes"))) if mem else None,
        memory_max_usage=_int(os.path.join(mem, "memory.max_usage_in_bytes")) if mem else None,
        inactive_file=stat.get("total_inactive_file", 0),
        active_file=stat.get("total_active_file", 0),
        rss=stat.get("total_rss", 0),
        cache=stat.get("total_cache", 0),
        mapped_file=stat.get("total_mapped_file", 0),
        pgfault=stat.get("total_pgfault", 0),
        pgmajfault=stat.get("total_pgmajfault", 0),
        pids=pids,
    )


def read_v2(directory: str) -> CgroupStats | None:
    """Read a v2 cgroup directory; None when it does not exist."""
    if not os.path.isdir(directory):
        return None
    cpu = _keyed(os.path.join(directory, "cpu.stat"))
    stat = _keyed(os.path.join(directory, "memory.stat"))

    def usec(key: str) -> int | None:
        return cpu[key] * 1000 if key in cpu else None

    pids = _int(os.path.join(directory, "pids.current"))
    return CgroupStats(
        cpu_ns=usec("usage_usec"),
        cpu_user_ns=usec("user_usec"),
        cpu_system_ns=usec("system_usec"),
        memory_usage=_int(os.path.join(directory, "memory.current")),
        memory_limit=_limit(_int(os.path.join(directory, "memory.max"))),
        memory_max_usage=_int(os.path.join(directory, "memory.peak")),
        inactive_file=stat.get("inactive_file", 0),
        active_file=stat.get("active_file", 0),
        rss=stat.get("anon", 0),
        cache=stat.get("file", 0),
        mapped_file=stat.get("file_mapped", 0),
        pgfault=stat.get("pgfault", 0),
        pgmajfault=stat.get("pgmajfault", 0),
        pids=pids if pids is not None else _procs(directory),
    )


# ---- where a cgroup lives ----------------------------------------------------------------------


def _expand_slice(slice_: str) -> str:
    """systemd's slice nesting: ``a-b-c.slice`` lives at ``a.slice/a-b.slice/a-b-c.slice``."""
    if slice_ in ("", "-.slice"):
        return ""
    if not slice_.endswith(".slice") or "/" in slice_:
        raise ValueError(f"invalid slice name {slice_!r}")
    stem = slice_[: -len(".slice")]
    parts, prefix = [], ""
    for word in stem.split("-"):
        if not word:
            raise ValueError(f"invalid slice name {slice_!r}")
        prefix = f"{prefix}-{word}" if prefix else word
        parts.append(prefix + ".slice")
    return "/".join(parts)


def relative_cgroup(cgroups_path: str) -> str | None:
    """The cgroup directory (relative to a hierarchy's root) that runc makes for an OCI
    ``linux.cgroupsPath``: cgroupfs form (``/k8s.io/<id>``) or systemd form
    (``slice:prefix:name``, which runc turns into ``<slices>/<prefix>-<name>.scope``).
    None when the path cannot be understood (logged)."""
    if not cgroups_path:
        return None
    if ":" in cgroups_path:
        parts = cgroups_path.split(":")
        if len(parts) != 3:
            log.warning("cgroupsPath %r is neither cgroupfs nor slice:prefix:name; no stats",
                        cgroups_path)
            return None
        slice_, prefix, name = parts
        try:
            parent = _expand_slice(slice_ or "system.slice")
        except ValueError:
            log.warning("cgroupsPath %r: unsupported systemd slice; no stats", cgroups_path)
            return None
        unit = name if name.endswith(".slice") else (
            f"{prefix}-{name}.scope" if prefix else f"{name}.scope")
        return posixpath.join(parent, unit) if parent else unit
    return posixpath.normpath("/" + cgroups_path).lstrip("/")


@dataclass(frozen=True)
class Hierarchy:
    """Where the host mounts its cgroups: the v1 controllers' mount points, or the
    unified (v2) mount when no v1 controller we need is mounted."""

    v1: dict[str, str] = field(default_factory=dict)
    unified: str | None = None

    @property
    def is_v2(self) -> bool:
        return not self.v1 and self.unified is not None

    def read(self, cgroups_path: str) -> CgroupStats | None:
        rel = relative_cgroup(cgroups_path)
        if rel is None:
            return None
        if self.v1:
            return read_v1({c: os.path.join(m, rel) for c, m in self.v1.items()})
        if self.unified is not None:
            return read_v2(os.path.join(self.unified, rel))
        return None


def oom_kills(hierarchy: Hierarchy, cgroups_path: str) -> int | None:
    """How many processes the kernel's OOM killer ended in the cgroup (v1
    ``memory.oom_control``'s ``oom_kill``, v2 ``memory.events``'); None when the cgroup or
    the counter is not there."""
    rel = relative_cgroup(cgroups_path)
    if rel is None:
        return None
    if "memory" in hierarchy.v1:
        path = os.path.join(hierarchy.v1["memory"], rel, "memory.oom_control")
    elif hierarchy.unified is not None:
        path = os.path.join(hierarchy.unified, rel, "memory.events")
    else:
        return None
    return _keyed(path).get("oom_kill")


def parse_mountinfo(text: str) -> Hierarchy:
    """Find the cgroup mounts in ``/proc/self/mountinfo`` text. On a hybrid host the v1
    controllers win (the unified mount then has no controllers)."""
    v1: dict[str, str] = {}
    unified: str | None = None
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        mountpoint, fstype = fields[4], rfields[0]
        if fstype == "cgroup2":
            unified = unified or mountpoint
        elif fstype == "cgroup":
            for opt in rfields[2].split(","):
                if opt in V1_CONTROLLERS and opt not in v1:
                    v1[opt] = mountpoint
    return Hierarchy(v1=v1, unified=unified)


def host_hierarchy(mountinfo: str = "/proc/self/mountinfo") -> Hierarchy:
    text = _read(mountinfo) or ""
    h = parse_mountinfo(text)
    if not h.v1 and h.unified is None:
        log.warning("no cgroup mount found in %s: container stats will be empty", mountinfo)
    return h


__all__ = ["UNLIMITED", "CgroupStats", "Hierarchy", "host_hierarchy", "nano_cores",
           "oom_kills", "parse_flat_keyed", "parse_mountinfo", "read_v1", "read_v2",
           "relative_cgroup", "working_set"]
