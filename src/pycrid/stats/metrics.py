"""cAdvisor-style metrics (CRI ListMetricDescriptors / ListPodSandboxMetrics) from samples.

The names, label keys and units are cAdvisor's, the set the kubelet's
/metrics/cadvisor serves when it takes pod and container metrics from the runtime
(PodAndContainerStatsFromCRI): the kubelet turns each descriptor into a Prometheus
description and drops any value whose labels do not match it, so every value here
carries exactly its descriptor's labels (``_Out`` checks). Only what pycrid
measures is described. Values are whole numbers (CRI carries UInt64Value), so
seconds are truncated as containerd does; "unlimited" reads as 0, as in cAdvisor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pycrid.stats.cgroup_stats import CgroupStats
from pycrid.stats.netdev import InterfaceCounters
from pycrid.stats.sampler import LayerUsage, Sample

COUNTER = "counter"
GAUGE = "gauge"

#: cAdvisor's labels as the kubelet sets them: ``name`` is the first alias of the cgroup,
#: for a containerd container (and so for pycrid's, see pycrid/cadvisor) its id.
BASE_LABELS = ("pod", "namespace", "container", "id", "image", "name")
#: cAdvisor's CPU usage carries ``cpu="total"`` (per-CPU series are off in the kubelet).
CPU_LABELS = (*BASE_LABELS, "cpu")
NET_LABELS = (*BASE_LABELS, "interface")
DISK_LABELS = (*BASE_LABELS, "device")
BLKIO_LABELS = (*DISK_LABELS, "major", "minor", "operation")
FAILURE_LABELS = (*BASE_LABELS, "failure_type", "scope")

NS_PER_S = 1_000_000_000


@dataclass(frozen=True)
class Descriptor:
    name: str
    help: str
    label_keys: tuple[str, ...]
    type: str


@dataclass(frozen=True)
class MetricValue:
    name: str
    type: str
    label_values: tuple[str, ...]
    value: int
    timestamp: int


def _d(name: str, kind: str, help_: str, labels: tuple[str, ...] = BASE_LABELS) -> Descriptor:
    return Descriptor(name, help_, labels, kind)


DESCRIPTORS: tuple[Descriptor, ...] = (
    # cpu
    _d("container_cpu_usage_seconds_total", COUNTER, "CPU time used so far, in seconds.",
       CPU_LABELS),
    _d("container_cpu_user_seconds_total", COUNTER, "CPU time used so far in user mode, seconds."),
    _d("container_cpu_system_seconds_total", COUNTER,
       "CPU time used so far in kernel mode, seconds."),
    _d("container_cpu_cfs_periods_total", COUNTER,
       "CFS enforcement periods that have elapsed (containers with a CPU quota)."),
    _d("container_cpu_cfs_throttled_periods_total", COUNTER,
       "CFS enforcement periods in which the container was throttled."),
    _d("container_cpu_cfs_throttled_seconds_total", COUNTER,
       "Time the container spent throttled by its CPU quota, in seconds."),
    # memory
    _d("container_memory_usage_bytes", GAUGE,
       "Memory charged to the container now, page cache included."),
    _d("container_memory_working_set_bytes", GAUGE,
       "Memory in active use: usage minus the inactive file cache."),
    _d("container_memory_max_usage_bytes", GAUGE, "Highest memory usage seen, in bytes."),
    _d("container_memory_rss", GAUGE, "Anonymous memory (and swap cache), in bytes."),
    _d("container_memory_cache", GAUGE, "Page cache charged to the container, in bytes."),
    _d("container_memory_mapped_file", GAUGE, "Bytes of memory-mapped files."),
    _d("container_memory_kernel_usage", GAUGE,
       "Kernel memory charged to the container (page tables, slab, sockets...), in bytes."),
    _d("container_memory_swap", GAUGE, "Swap the container uses, in bytes."),
    _d("container_memory_failcnt", COUNTER,
       "How many times memory usage reached the container's limit."),
    _d("container_memory_total_active_file_bytes", GAUGE,
       "File cache on the active LRU list, in bytes."),
    _d("container_memory_total_inactive_file_bytes", GAUGE,
       "File cache on the inactive LRU list (reclaimable first), in bytes."),
    _d("container_memory_failures_total", COUNTER,
       "Page faults so far, by failure type (pgfault, pgmajfault) and scope.", FAILURE_LABELS),
    _d("container_oom_events_total", COUNTER,
       "Processes of the container killed by the out-of-memory killer."),
    # disk usage: the filesystem of the writable layer
    _d("container_fs_usage_bytes", GAUGE,
       "Bytes the container's writable layer takes on this filesystem.", DISK_LABELS),
    _d("container_fs_limit_bytes", GAUGE,
       "Bytes the container could use on this filesystem (its size).", DISK_LABELS),
    _d("container_fs_inodes_total", GAUGE, "Inodes of this filesystem.", DISK_LABELS),
    _d("container_fs_inodes_free", GAUGE, "Inodes still free on this filesystem.",
       DISK_LABELS),
    # disk io: the container's block I/O by device
    _d("container_fs_reads_bytes_total", COUNTER, "Bytes read from the device so far.",
       DISK_LABELS),
    _d("container_fs_reads_total", COUNTER, "Reads from the device completed so far.",
       DISK_LABELS),
    _d("container_fs_writes_bytes_total", COUNTER, "Bytes written to the device so far.",
       DISK_LABELS),
    _d("container_fs_writes_total", COUNTER, "Writes to the device completed so far.",
       DISK_LABELS),
    _d("container_blkio_device_usage_total", COUNTER,
       "Bytes of block I/O to the device so far, by operation.", BLKIO_LABELS),
    # process
    _d("container_processes", GAUGE, "Processes in the container's cgroup."),
    _d("container_threads", GAUGE, "Threads in the container's cgroup."),
    _d("container_threads_max", GAUGE,
       "Most threads the container may have; 0 when there is no limit."),
    _d("container_file_descriptors", GAUGE,
       "File descriptors the container's processes hold open."),
    _d("container_sockets", GAUGE, "Sockets the container's processes hold open."),
    # misc
    _d("container_last_seen", GAUGE, "When the container was last sampled, Unix seconds."),
    _d("container_start_time_seconds", GAUGE, "When the container started, Unix seconds."),
    # network (pod level: containers share the pod's namespace)
    _d("container_network_receive_bytes_total", COUNTER, "Bytes received so far.", NET_LABELS),
    _d("container_network_receive_packets_total", COUNTER, "Packets received so far.",
       NET_LABELS),
    _d("container_network_receive_packets_dropped_total", COUNTER,
       "Received packets dropped so far.", NET_LABELS),
    _d("container_network_receive_errors_total", COUNTER, "Receive errors so far.", NET_LABELS),
    _d("container_network_transmit_bytes_total", COUNTER, "Bytes sent so far.", NET_LABELS),
    _d("container_network_transmit_packets_total", COUNTER, "Packets sent so far.", NET_LABELS),
    _d("container_network_transmit_packets_dropped_total", COUNTER,
       "Packets dropped while sending so far.", NET_LABELS),
    _d("container_network_transmit_errors_total", COUNTER, "Send errors so far.", NET_LABELS),
    # container spec: the settings the cgroup holds now
    _d("container_spec_cpu_period", GAUGE, "The CFS period, in microseconds."),
    _d("container_spec_cpu_quota", GAUGE,
       "The CFS quota per period, in microseconds (containers with a quota)."),
    _d("container_spec_cpu_shares", GAUGE, "The container's relative CPU weight, in shares."),
    _d("container_spec_memory_limit_bytes", GAUGE, "The memory limit; 0 when there is none."),
    _d("container_spec_memory_swap_limit_bytes", GAUGE,
       "The swap limit as the kernel holds it (cgroup v1: memory plus swap); 0 when none."),
)

_BY_NAME = {d.name: d for d in DESCRIPTORS}


@dataclass(frozen=True)
class PodInfo:
    id: str
    name: str
    namespace: str


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    name: str
    #: The image as the user wrote it (the "image" label).
    image: str
    started_at: int


class _Out:
    """Collects values, checking each against its descriptor (a typo fails tests)."""

    def __init__(self, timestamp: int) -> None:
        self.timestamp = timestamp
        self.values: list[MetricValue] = []

    def add(self, name: str, labels: tuple[str, ...], value: int | None) -> None:
        if value is None:
            return
        d = _BY_NAME[name]
        assert len(labels) == len(d.label_keys), name
        self.values.append(MetricValue(name, d.type, labels, max(int(value), 0),
                                       self.timestamp))


def network_metrics(pod: PodInfo, ifaces: Sequence[InterfaceCounters],
                    timestamp: int) -> list[MetricValue]:
    """The pod-level series: container and image labels empty, id and name the pod's id
    (cAdvisor's are its sandbox container's)."""
    out = _Out(timestamp)
    for i in ifaces:
        labels = (pod.name, pod.namespace, "", pod.id, "", pod.id, i.name)
        out.add("container_network_receive_bytes_total", labels, i.rx_bytes)
        out.add("container_network_receive_packets_total", labels, i.rx_packets)
        out.add("container_network_receive_packets_dropped_total", labels, i.rx_dropped)
        out.add("container_network_receive_errors_total", labels, i.rx_errors)
        out.add("container_network_transmit_bytes_total", labels, i.tx_bytes)
        out.add("container_network_transmit_packets_total", labels, i.tx_packets)
        out.add("container_network_transmit_packets_dropped_total", labels, i.tx_dropped)
        out.add("container_network_transmit_errors_total", labels, i.tx_errors)
    return out.values


def _secs(ns: int | None) -> int | None:
    return None if ns is None else ns // NS_PER_S


def _cpu(out: _Out, labels: tuple[str, ...], cg: CgroupStats) -> None:
    out.add("container_cpu_usage_seconds_total", (*labels, "total"), _secs(cg.cpu_ns))
    out.add("container_cpu_user_seconds_total", labels, _secs(cg.cpu_user_ns))
    out.add("container_cpu_system_seconds_total", labels, _secs(cg.cpu_system_ns))
    out.add("container_spec_cpu_period", labels, cg.cpu_period_us)
    out.add("container_spec_cpu_shares", labels, cg.cpu_shares)
    if cg.cpu_quota_us is not None:
        # cAdvisor reports CFS bandwidth only for containers that have a quota.
        out.add("container_spec_cpu_quota", labels, cg.cpu_quota_us)
        out.add("container_cpu_cfs_periods_total", labels, cg.cfs_periods)
        out.add("container_cpu_cfs_throttled_periods_total", labels, cg.cfs_throttled_periods)
        out.add("container_cpu_cfs_throttled_seconds_total", labels, _secs(cg.cfs_throttled_ns))


def _memory(out: _Out, labels: tuple[str, ...], cg: CgroupStats) -> None:
    if cg.memory_usage is None:
        return
    out.add("container_memory_usage_bytes", labels, cg.memory_usage)
    out.add("container_memory_working_set_bytes", labels, cg.working_set)
    out.add("container_memory_max_usage_bytes", labels, cg.memory_max_usage)
    out.add("container_memory_rss", labels, cg.rss)
    out.add("container_memory_cache", labels, cg.cache)
    out.add("container_memory_mapped_file", labels, cg.mapped_file)
    out.add("container_memory_kernel_usage", labels, cg.kernel_memory)
    out.add("container_memory_swap", labels, cg.swap)
    out.add("container_memory_failcnt", labels, cg.memory_failcnt)
    out.add("container_memory_total_active_file_bytes", labels, cg.active_file)
    out.add("container_memory_total_inactive_file_bytes", labels, cg.inactive_file)
    out.add("container_memory_failures_total", (*labels, "pgfault", "container"), cg.pgfault)
    out.add("container_memory_failures_total", (*labels, "pgmajfault", "container"),
            cg.pgmajfault)
    out.add("container_oom_events_total", labels, cg.oom_kills)
    out.add("container_spec_memory_limit_bytes", labels, cg.memory_limit or 0)
    out.add("container_spec_memory_swap_limit_bytes", labels, cg.swap_limit or 0)


def _processes(out: _Out, labels: tuple[str, ...], cg: CgroupStats) -> None:
    out.add("container_processes", labels, cg.processes)
    out.add("container_file_descriptors", labels, cg.fds)
    out.add("container_sockets", labels, cg.sockets)
    if cg.threads is not None:
        out.add("container_threads", labels, cg.threads)
        out.add("container_threads_max", labels, cg.threads_max or 0)


#: io_service_bytes / io_serviced operations -> the per-device series they feed.
_IO_BYTES = {"Read": "container_fs_reads_bytes_total", "Write": "container_fs_writes_bytes_total"}
_IO_OPS = {"Read": "container_fs_reads_total", "Write": "container_fs_writes_total"}


def _block_io(out: _Out, labels: tuple[str, ...], cg: CgroupStats) -> None:
    for e in cg.io_bytes:
        out.add("container_blkio_device_usage_total",
                (*labels, e.device, str(e.major), str(e.minor), e.op), e.value)
        if e.op in _IO_BYTES:
            out.add(_IO_BYTES[e.op], (*labels, e.device), e.value)
    for e in cg.io_ops:
        if e.op in _IO_OPS:
            out.add(_IO_OPS[e.op], (*labels, e.device), e.value)


def _filesystem(out: _Out, labels: tuple[str, ...], layer: LayerUsage) -> None:
    fs = (*labels, layer.device)
    out.add("container_fs_usage_bytes", fs, layer.used_bytes)
    out.add("container_fs_limit_bytes", fs, layer.capacity_bytes)
    out.add("container_fs_inodes_total", fs, layer.inodes_total)
    out.add("container_fs_inodes_free", fs, layer.inodes_free)


def container_metrics(pod: PodInfo, ctr: ContainerInfo, sample: Sample | None,
                      now: int) -> list[MetricValue]:
    """One container's series, labelled (pod, namespace, container, id, image, name)."""
    out = _Out(sample.timestamp if sample is not None else now)
    labels = (pod.name, pod.namespace, ctr.name, ctr.id, ctr.image, ctr.id)
    out.add("container_start_time_seconds", labels,
            ctr.started_at // NS_PER_S if ctr.started_at else None)
    if sample is None:
        return out.values
    out.add("container_last_seen", labels, sample.timestamp // NS_PER_S)
    if (cg := sample.cgroup) is not None:
        _cpu(out, labels, cg)
        _memory(out, labels, cg)
        _processes(out, labels, cg)
        _block_io(out, labels, cg)
    if sample.layer is not None:
        _filesystem(out, labels, sample.layer)
    return out.values


__all__ = ["BASE_LABELS", "COUNTER", "DESCRIPTORS", "GAUGE", "ContainerInfo", "Descriptor",
           "MetricValue", "PodInfo", "container_metrics", "network_metrics"]
