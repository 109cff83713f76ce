"""Cgroup readers: pure functions over directories, for cgroup v1 and v2.

They read what cAdvisor reads for a container (usage, throttling, memory events,
block I/O, pids, pressure) plus the descriptor counts of its processes, so the CRI
stats and the cAdvisor-named metrics come from one reading. A missing file leaves
its field unset; a missing directory means the object went away, which the
caller tolerates. Finding a container's cgroup directories is
:mod:`pycrid.stats.cgroup_hierarchy`'s job.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace

from pycrid.stats.cgfiles import (
    IoEntry,
    Psi,
    limit,
    parse_blkio,
    parse_cpu_max,
    parse_io_stat,
    read_ids,
    read_int,
    read_keyed,
    read_limit,
    read_psi,
    read_text,
    weight_to_shares,
)
from pycrid.stats.cgroup_stats import CgroupStats
from pycrid.stats.device_names import block_device
from pycrid.stats.procfs import descriptor_counts

#: v1 blkio statistics files, in runc's order of preference: (operations, bytes). The
#: first pair whose operations file has entries wins (bfq and cfq only count for
#: devices using those schedulers; the throttle files count whatever blk-throttle saw).
_BLKIO_FILES = (
    ("blkio.bfq.io_serviced_recursive", "blkio.bfq.io_service_bytes_recursive"),
    ("blkio.io_serviced_recursive", "blkio.io_service_bytes_recursive"),
    ("blkio.throttle.io_serviced_recursive", "blkio.throttle.io_service_bytes_recursive"),
    ("blkio.throttle.io_serviced", "blkio.throttle.io_service_bytes"),
)

#: v2 memory.stat keys that make up kernel memory on kernels without the "kernel" key.
_V2_KERNEL_KEYS = ("kernel_stack", "pagetables", "sec_pagetables", "percpu", "sock",
                   "vmalloc", "slab")


def _join(directory: str | None, name: str) -> str | None:
    return os.path.join(directory, name) if directory else None


def _named(entries: list[IoEntry], sysfs: str) -> tuple[IoEntry, ...]:
    return tuple(replace(e, device=block_device(e.major, e.minor, sysfs)) for e in entries)


def _v1_failcnt(mem: str | None) -> int | None:
    """Failed charges against the memory limit or the memory+swap limit: a failure
    counts in the counter that refused it (memory+swap is charged first), so the two
    together are the times usage hit a limit. (Kernel 6.18 counts neither when the two
    limits are equal, the kubelet's usual "no swap": the reading is then 0.)"""
    if not mem:
        return None
    counts = [read_int(os.path.join(mem, f)) for f in ("memory.failcnt",
                                                        "memory.memsw.failcnt")]
    known = [c for c in counts if c is not None]
    return sum(known) if known else None


def _v1_blkio(directory: str) -> tuple[list[IoEntry], list[IoEntry]]:
    for ops_file, bytes_file in _BLKIO_FILES:
        text = read_text(os.path.join(directory, ops_file))
        ops = parse_blkio(text) if text is not None else []
        if ops:
            return parse_blkio(read_text(os.path.join(directory, bytes_file)) or ""), ops
    return [], []


@dataclass(frozen=True)
class _Tasks:
    processes: int | None = None
    threads: int | None = None
    fds: int | None = None
    sockets: int | None = None


def _tasks(procs_dir: str | None, threads: int | None, threads_file: str, proc: str) -> _Tasks:
    """Processes, threads (counted in ``threads_file`` when the pids controller gave
    none), descriptors and sockets of the cgroup whose cgroup.procs is in ``procs_dir``."""
    pids = read_ids(os.path.join(procs_dir, "cgroup.procs")) if procs_dir else None
    if pids is None or procs_dir is None:
        return _Tasks(threads=threads)
    if threads is None:
        tids = read_ids(os.path.join(procs_dir, threads_file))
        threads = len(tids) if tids is not None else None
    counts = descriptor_counts(pids, proc)
    return _Tasks(processes=len(pids), threads=threads, fds=counts.fds, sockets=counts.sockets)


def _psi(directory: str | None) -> tuple[Psi | None, Psi | None, Psi | None]:
    """cpu, memory and io pressure of a cgroup2 directory."""
    if not directory or not os.path.isdir(directory):
        return None, None, None
    return read_psi(directory, "cpu"), read_psi(directory, "memory"), read_psi(directory, "io")


def read_v1(dirs: Mapping[str, str], *, unified: str | None = None, proc: str = "/proc",
            sysfs: str = "/sys") -> CgroupStats | None:
    """Read a v1 cgroup given each controller's directory for it (``{"memory": ...}``);
    ``unified`` is the same cgroup in a hybrid host's cgroup2 mount (pressure files).
    None when none of the directories exists (the cgroup is gone)."""
    present = {c: d for c, d in dirs.items() if os.path.isdir(d)}
    if not present:
        return None
    cpu, acct = present.get("cpu"), present.get("cpuacct")
    mem, pids_dir, blkio = present.get("memory"), present.get("pids"), present.get("blkio")

    def val(directory: str | None, name: str) -> int | None:
        path = _join(directory, name)
        return read_int(path) if path else None

    stat = read_keyed(os.path.join(mem, "memory.stat")) if mem else {}
    cpu_stat = read_keyed(os.path.join(cpu, "cpu.stat")) if cpu else {}
    oom = read_keyed(os.path.join(mem, "memory.oom_control")) if mem else {}
    memory_limit = limit(val(mem, "memory.limit_in_bytes"))
    memsw_limit = limit(val(mem, "memory.memsw.limit_in_bytes"))
    swap = stat.get("total_swap", 0) if mem else None
    swap_available = None
    if memsw_limit is not None and memory_limit is not None and swap is not None:
        swap_available = max(memsw_limit - memory_limit - swap, 0)
    quota = val(cpu, "cpu.cfs_quota_us")
    io_bytes, io_ops = _v1_blkio(blkio) if blkio else ([], [])
    procs_dir = next((d for d in (pids_dir, mem, cpu, acct, blkio) if d), None)
    tasks = _tasks(procs_dir, val(pids_dir, "pids.current"), "tasks", proc)
    psi = _psi(unified)
    return CgroupStats(
        cpu_ns=val(acct, "cpuacct.usage"),
        cpu_user_ns=val(acct, "cpuacct.usage_user"),
        cpu_system_ns=val(acct, "cpuacct.usage_sys"),
        cfs_periods=cpu_stat.get("nr_periods"),
        cfs_throttled_periods=cpu_stat.get("nr_throttled"),
        cfs_throttled_ns=cpu_stat.get("throttled_time"),
        cpu_period_us=val(cpu, "cpu.cfs_period_us"),
        cpu_quota_us=quota if quota is not None and quota > 0 else None,
        cpu_shares=val(cpu, "cpu.shares"),
        memory_usage=val(mem, "memory.usage_in_bytes"),
        memory_limit=memory_limit,
        memory_max_usage=val(mem, "memory.max_usage_in_bytes"),
        inactive_file=stat.get("total_inactive_file", 0),
        active_file=stat.get("total_active_file", 0),
        rss=stat.get("total_rss", 0),
        cache=stat.get("total_cache", 0),
        mapped_file=stat.get("total_mapped_file", 0),
        pgfault=stat.get("total_pgfault", 0),
        pgmajfault=stat.get("total_pgmajfault", 0),
        memory_failcnt=_v1_failcnt(mem),
        kernel_memory=val(mem, "memory.kmem.usage_in_bytes"),
        swap=swap,
        swap_limit=memsw_limit,
        swap_available=swap_available,
        oom_kills=oom.get("oom_kill"),
        threads_max=read_limit(os.path.join(pids_dir, "pids.max")) if pids_dir else None,
        io_bytes=_named(io_bytes, sysfs),
        io_ops=_named(io_ops, sysfs),
        processes=tasks.processes, threads=tasks.threads, fds=tasks.fds, sockets=tasks.sockets,
        cpu_psi=psi[0], memory_psi=psi[1], io_psi=psi[2],
    )


def _v2_kernel(stat: Mapping[str, int]) -> int | None:
    if "kernel" in stat:
        return stat["kernel"]
    parts = [stat[k] for k in _V2_KERNEL_KEYS if k in stat]
    return sum(parts) if parts else None


def read_v2(directory: str, *, proc: str = "/proc", sysfs: str = "/sys") -> CgroupStats | None:
    """Read a v2 cgroup directory; None when it does not exist."""
    if not os.path.isdir(directory):
        return None

    def path(name: str) -> str:
        return os.path.join(directory, name)

    cpu = read_keyed(path("cpu.stat"))
    stat = read_keyed(path("memory.stat"))
    events = read_keyed(path("memory.events"))

    def usec(key: str) -> int | None:
        return cpu[key] * 1000 if key in cpu else None

    cpu_max = read_text(path("cpu.max"))
    quota, period = parse_cpu_max(cpu_max) if cpu_max is not None else (None, None)
    weight = read_int(path("cpu.weight"))
    memory_usage = read_int(path("memory.current"))
    swap_current = read_int(path("memory.swap.current"))
    swap = swap_current if swap_current is not None else (0 if memory_usage is not None
                                                          else None)
    swap_limit = read_limit(path("memory.swap.max"))
    io_text = read_text(path("io.stat"))
    io_bytes, io_ops = parse_io_stat(io_text) if io_text is not None else ([], [])
    tasks = _tasks(directory, read_int(path("pids.current")), "cgroup.threads", proc)
    psi = _psi(directory)
    return CgroupStats(
        cpu_ns=usec("usage_usec"),
        cpu_user_ns=usec("user_usec"),
        cpu_system_ns=usec("system_usec"),
        cfs_periods=cpu.get("nr_periods"),
        cfs_throttled_periods=cpu.get("nr_throttled"),
        cfs_throttled_ns=usec("throttled_usec"),
        cpu_period_us=period,
        cpu_quota_us=quota,
        cpu_shares=weight_to_shares(weight) if weight is not None else None,
        memory_usage=memory_usage,
        memory_limit=read_limit(path("memory.max")),
        memory_max_usage=read_int(path("memory.peak")),
        inactive_file=stat.get("inactive_file", 0),
        active_file=stat.get("active_file", 0),
        rss=stat.get("anon", 0),
        cache=stat.get("file", 0),
        mapped_file=stat.get("file_mapped", 0),
        pgfault=stat.get("pgfault", 0),
        pgmajfault=stat.get("pgmajfault", 0),
        memory_failcnt=events.get("max"),
        kernel_memory=_v2_kernel(stat),
        swap=swap,
        swap_limit=swap_limit,
        swap_available=(max(swap_limit - (swap or 0), 0) if swap_limit is not None
                        and swap_current is not None else None),
        oom_kills=events.get("oom_kill"),
        threads_max=read_limit(path("pids.max")),
        io_bytes=_named(io_bytes, sysfs),
        io_ops=_named(io_ops, sysfs),
        processes=tasks.processes, threads=tasks.threads, fds=tasks.fds, sockets=tasks.sockets,
        cpu_psi=psi[0], memory_psi=psi[1], io_psi=psi[2],
    )


__all__ = ["read_v1", "read_v2"]
