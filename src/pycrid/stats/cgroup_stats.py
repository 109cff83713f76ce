"""One reading of one cgroup, and the figures derived from readings.

The record both cgroup versions read into (:mod:`pycrid.stats.cgroup_readers`) and
everything downstream consumes (CRI stats, cAdvisor metrics, pod sums), so its
consumers need not know how it was read.
"""

from __future__ import annotations

from dataclasses import dataclass

from pycrid.stats.cgfiles import IoEntry, Psi


@dataclass(frozen=True)
class CgroupStats:
    """One reading of one cgroup; counters are cumulative, sizes in bytes. A field is
    None when this kernel or cgroup version does not report it."""

    cpu_ns: int | None = None
    cpu_user_ns: int | None = None
    cpu_system_ns: int | None = None
    #: CFS bandwidth: enforcement periods so far, those throttled, time throttled.
    cfs_periods: int | None = None
    cfs_throttled_periods: int | None = None
    cfs_throttled_ns: int | None = None
    #: CPU settings: CFS period and quota (None: no quota), in microseconds; shares
    #: (v2: the weight in shares' scale).
    cpu_period_us: int | None = None
    cpu_quota_us: int | None = None
    cpu_shares: int | None = None
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
    #: Times usage hit the limit (v1 memory.failcnt, v2 memory.events "max").
    memory_failcnt: int | None = None
    kernel_memory: int | None = None
    #: Swap in use (0 when the kernel does not account swap per cgroup, as cAdvisor).
    swap: int | None = None
    #: The kernel's swap limit as the cgroup states it (v1: memory+swap, v2: swap
    #: alone; None when unlimited): what container_spec_memory_swap_limit_bytes shows.
    swap_limit: int | None = None
    #: Swap the container may still use (None when unlimited).
    swap_available: int | None = None
    #: Processes the OOM killer killed in this cgroup.
    oom_kills: int | None = None
    #: Processes (cgroup.procs) and threads (the pids controller counts tasks).
    processes: int | None = None
    threads: int | None = None
    #: None when unlimited.
    threads_max: int | None = None
    #: Open descriptors of the processes, and how many are sockets.
    fds: int | None = None
    sockets: int | None = None
    #: Block I/O per device: bytes and operations (runc's io_service_bytes/io_serviced).
    io_bytes: tuple[IoEntry, ...] = ()
    io_ops: tuple[IoEntry, ...] = ()
    #: Pressure stall information (v2, or the unified hierarchy of a hybrid host).
    cpu_psi: Psi | None = None
    memory_psi: Psi | None = None
    io_psi: Psi | None = None

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


__all__ = ["CgroupStats", "nano_cores", "working_set"]
