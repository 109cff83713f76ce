"""cAdvisor-style metrics (CRI ListMetricDescriptors / ListPodSandboxMetrics) from samples.

The names and label keys are the ones containerd and cAdvisor export, so the
kubelet's /metrics/cadvisor reads the same series whichever runtime serves it.
Only the metrics pycrid actually measures are described: a descriptor without
values would be a promise the samples cannot keep. Values are whole numbers
(CRI carries UInt64Value), so seconds are truncated as containerd does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pycrid.stats.cgroups import CgroupStats
from pycrid.stats.netdev import InterfaceCounters
from pycrid.stats.sampler import Sample

COUNTER = "counter"
GAUGE = "gauge"

BASE_LABELS = ("pod", "namespace", "container", "id", "image")
NET_LABELS = (*BASE_LABELS, "interface")
DISK_LABELS = (*BASE_LABELS, "device")
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
    _d("container_cpu_usage_seconds_total", COUNTER, "CPU time used so far, in seconds."),
    _d("container_cpu_user_seconds_total", COUNTER, "CPU time used so far in user mode, seconds."),
    _d("container_cpu_system_seconds_total", COUNTER,
       "CPU time used so far in kernel mode, seconds."),
    # memory
    _d("container_memory_usage_bytes", GAUGE,
       "Memory charged to the container now, page cache included."),
    _d("container_memory_working_set_bytes", GAUGE,
       "Memory in active use: usage minus the inactive file cache."),
    _d("container_memory_max_usage_bytes", GAUGE, "Highest memory usage seen, in bytes."),
    _d("container_memory_rss", GAUGE, "Anonymous memory (and swap cache), in bytes."),
    _d("container_memory_cache", GAUGE, "Page cache charged to the container, in bytes."),
    _d("container_memory_mapped_file", GAUGE, "Bytes of memory-mapped files."),
    _d("container_memory_total_active_file_bytes", GAUGE,
       "File cache on the active LRU list, in bytes."),
    _d("container_memory_total_inactive_file_bytes", GAUGE,
       "File cache on the inactive LRU list (reclaimable first), in bytes."),
    _d("container_memory_failures_total", COUNTER,
       "Page faults so far, by failure type (pgfault, pgmajfault) and scope.", FAILURE_LABELS),
    _d("container_spec_memory_limit_bytes", GAUGE, "The memory limit; 0 when there is none."),
    # disk
    _d("container_fs_usage_bytes", GAUGE,
       "Bytes the container's writable layer takes on disk.", DISK_LABELS),
    # process
    _d("container_processes", GAUGE, "Processes in the container's cgroup."),
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
       "Outgoing packets dropped so far.", NET_LABELS),
    _d("container_network_transmit_errors_total", COUNTER, "Transmit errors so far.",
       NET_LABELS),
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
    """The pod-level series: container and image labels empty, id = the pod's id."""
    out = _Out(timestamp)
    for i in ifaces:
        labels = (pod.name, pod.namespace, "", pod.id, "", i.name)
        out.add("container_network_receive_bytes_total", labels, i.rx_bytes)
        out.add("container_network_receive_packets_total", labels, i.rx_packets)
        out.add("container_network_receive_packets_dropped_total", labels, i.rx_dropped)
        out.add("container_network_receive_errors_total", labels, i.rx_errors)
        out.add("container_network_transmit_bytes_total", labels, i.tx_bytes)
        out.add("container_network_transmit_packets_total", labels, i.tx_packets)
        out.add("container_network_transmit_packets_dropped_total", labels, i.tx_dropped)
        out.add("container_network_transmit_errors_total", labels, i.tx_errors)
    return out.values


def _cgroup_metrics(out: _Out, labels: tuple[str, ...], cg: CgroupStats) -> None:
    def secs(ns: int | None) -> int | None:
        return None if ns is None else ns // NS_PER_S

    out.add("container_cpu_usage_seconds_total", labels, secs(cg.cpu_ns))
    out.add("container_cpu_user_seconds_total", labels, secs(cg.cpu_user_ns))
    out.add("container_cpu_system_seconds_total", labels, secs(cg.cpu_system_ns))
    if cg.memory_usage is not None:
        out.add("container_memory_usage_bytes", labels, cg.memory_usage)
        out.add("container_memory_working_set_bytes", labels, cg.working_set)
        out.add("container_memory_max_usage_bytes", labels, cg.memory_max_usage)
        out.add("container_memory_rss", labels, cg.rss)
        out.add("container_memory_cache", labels, cg.cache)
        out.add("container_memory_mapped_file", labels, cg.mapped_file)
        out.add("container_memory_total_active_file_bytes", labels, cg.active_file)
        out.add("container_memory_total_inactive_file_bytes", labels, cg.inactive_file)
        out.add("container_memory_failures_total", (*labels, "pgfault", "container"),
                cg.pgfault)
        out.add("container_memory_failures_total", (*labels, "pgmajfault", "container"),
                cg.pgmajfault)
        out.add("container_spec_memory_limit_bytes", labels, cg.memory_limit or 0)
    out.add("container_processes", labels, cg.pids)


def container_metrics(pod: PodInfo, ctr: ContainerInfo, sample: Sample | None,
                      now: int) -> list[MetricValue]:
    """One container's series, labelled (pod, namespace, container, id, image)."""
    out = _Out(sample.timestamp if sample is not None else now)
    labels = (pod.name, pod.namespace, ctr.name, ctr.id, ctr.image)
    out.add("container_start_time_seconds", labels,
            ctr.started_at // NS_PER_S if ctr.started_at else None)
    if sample is None:
        return out.values
    out.add("container_last_seen", labels, sample.timestamp // NS_PER_S)
    if sample.cgroup is not None:
        _cgroup_metrics(out, labels, sample.cgroup)
    if sample.layer is not None:
        out.add("container_fs_usage_bytes", (*labels, "/"), sample.layer.used_bytes)
    return out.values


__all__ = ["BASE_LABELS", "COUNTER", "DESCRIPTORS", "GAUGE", "ContainerInfo", "Descriptor",
           "MetricValue", "PodInfo", "container_metrics", "network_metrics"]
