"""Stats and metrics views as CRI protobufs. No behaviour here; timestamps are ns.

Field choices follow containerd's (internal/cri/server/container_stats_list.go,
sandbox_stats_linux.go): working set = usage - inactive file, rss from total_rss
(v1) or anon (v2), available = limit - working set only when there is a limit,
usage_nano_cores only once two samples exist, pressure totals in nanoseconds. Swap
(which containerd leaves out) is what the kubelet's cAdvisor path reports: usage,
and what is left under the swap limit when there is one. The kubelet reads these
fields into /stats/summary (cri_stats_provider.go makeContainerStats and the
addCRIPod* helpers); container log usage it measures itself, CRI has no field.
"""

from __future__ import annotations

from cri_api.v1 import api_pb2 as pb

from pycrid.core.stats_queries import ContainerStatsView, PodStatsView
from pycrid.stats.cgfiles import Psi, PsiData
from pycrid.stats.cgroup_stats import CgroupStats
from pycrid.stats.metrics import COUNTER, Descriptor, MetricValue
from pycrid.stats.netdev import InterfaceCounters, default_interface


def _u64(value: int) -> pb.UInt64Value:
    return pb.UInt64Value(value=max(int(value), 0))


def _psi_data(d: PsiData) -> pb.PsiData:
    return pb.PsiData(Total=d.total_us * 1000, Avg10=d.avg10, Avg60=d.avg60, Avg300=d.avg300)


def psi_pb(psi: Psi | None) -> pb.PsiStats | None:
    if psi is None:
        return None
    out = pb.PsiStats()
    if psi.some is not None:
        out.Some.CopyFrom(_psi_data(psi.some))
    if psi.full is not None:
        out.Full.CopyFrom(_psi_data(psi.full))
    return out


def cpu_pb(cg: CgroupStats, timestamp: int, nano_cores: int | None) -> pb.CpuUsage | None:
    if cg.cpu_ns is None:
        return None
    cpu = pb.CpuUsage(timestamp=timestamp, usage_core_nano_seconds=_u64(cg.cpu_ns),
                      psi=psi_pb(cg.cpu_psi))
    if nano_cores is not None:
        cpu.usage_nano_cores.value = nano_cores
    return cpu


def memory_pb(cg: CgroupStats, timestamp: int) -> pb.MemoryUsage | None:
    if cg.memory_usage is None:
        return None
    mem = pb.MemoryUsage(
        timestamp=timestamp, working_set_bytes=_u64(cg.working_set or 0),
        usage_bytes=_u64(cg.memory_usage), rss_bytes=_u64(cg.rss),
        page_faults=_u64(cg.pgfault), major_page_faults=_u64(cg.pgmajfault),
        available_bytes=_u64(cg.available or 0), psi=psi_pb(cg.memory_psi))
    return mem


def swap_pb(cg: CgroupStats, timestamp: int) -> pb.SwapUsage | None:
    if cg.swap is None:
        return None
    swap = pb.SwapUsage(timestamp=timestamp, swap_usage_bytes=_u64(cg.swap))
    if cg.swap_available is not None:
        swap.swap_available_bytes.value = cg.swap_available
    return swap


def io_pb(cg: CgroupStats, timestamp: int) -> pb.IoUsage | None:
    """CRI's IoUsage carries pressure only; none without it (cgroup v1 alone)."""
    if cg.io_psi is None:
        return None
    return pb.IoUsage(timestamp=timestamp, psi=psi_pb(cg.io_psi))


def container_stats_pb(view: ContainerStatsView) -> pb.ContainerStats:
    rec = view.record
    cs = pb.ContainerStats(attributes=pb.ContainerAttributes(
        id=rec.id, metadata=rec.config.metadata, labels=rec.config.labels,
        annotations=rec.config.annotations))
    s = view.sample
    if s is None:
        return cs
    if s.cgroup is not None:
        if (cpu := cpu_pb(s.cgroup, s.timestamp, view.nano_cores)) is not None:
            cs.cpu.CopyFrom(cpu)
        if (mem := memory_pb(s.cgroup, s.timestamp)) is not None:
            cs.memory.CopyFrom(mem)
        if (swap := swap_pb(s.cgroup, s.timestamp)) is not None:
            cs.swap.CopyFrom(swap)
        if (io := io_pb(s.cgroup, s.timestamp)) is not None:
            cs.io.CopyFrom(io)
    if s.layer is not None:
        cs.writable_layer.CopyFrom(pb.FilesystemUsage(
            timestamp=s.timestamp, fs_id=pb.FilesystemIdentifier(mountpoint=view.fs_mountpoint),
            used_bytes=_u64(s.layer.used_bytes), inodes_used=_u64(s.layer.inodes_used)))
    return cs


def _iface_pb(i: InterfaceCounters) -> pb.NetworkInterfaceUsage:
    return pb.NetworkInterfaceUsage(name=i.name, rx_bytes=_u64(i.rx_bytes),
                                    rx_errors=_u64(i.rx_errors), tx_bytes=_u64(i.tx_bytes),
                                    tx_errors=_u64(i.tx_errors))


def pod_stats_pb(view: PodStatsView) -> pb.PodSandboxStats:
    rec = view.record
    linux = pb.LinuxPodSandboxStats()
    ts = view.timestamp
    if view.usage is not None:
        if (cpu := cpu_pb(view.usage, ts, view.nano_cores)) is not None:
            linux.cpu.CopyFrom(cpu)
        if (mem := memory_pb(view.usage, ts)) is not None:
            linux.memory.CopyFrom(mem)
            linux.memory.ClearField("available_bytes")  # limits do not add up
        if view.usage.processes is not None:
            linux.process.CopyFrom(pb.ProcessUsage(timestamp=ts,
                                                   process_count=_u64(view.usage.processes)))
    if view.network is not None:
        net = pb.NetworkUsage(timestamp=ts, interfaces=[_iface_pb(i) for i in view.network])
        if (d := default_interface(list(view.network))) is not None:
            net.default_interface.CopyFrom(_iface_pb(d))
        linux.network.CopyFrom(net)
    linux.containers.extend(container_stats_pb(c) for c in view.containers)
    return pb.PodSandboxStats(
        attributes=pb.PodSandboxAttributes(id=rec.id, metadata=rec.config.metadata,
                                           labels=rec.config.labels,
                                           annotations=rec.config.annotations),
        linux=linux)


def descriptor_pb(d: Descriptor) -> pb.MetricDescriptor:
    return pb.MetricDescriptor(name=d.name, help=d.help, label_keys=list(d.label_keys))


def metric_pb(m: MetricValue) -> pb.Metric:
    return pb.Metric(name=m.name, timestamp=m.timestamp,
                     metric_type=pb.COUNTER if m.type == COUNTER else pb.GAUGE,
                     label_values=list(m.label_values), value=_u64(m.value))


def pod_metrics_pb(pod_id: str, pod_series: list[MetricValue],
                   containers: list[tuple[str, list[MetricValue]]]) -> pb.PodSandboxMetrics:
    return pb.PodSandboxMetrics(
        pod_sandbox_id=pod_id, metrics=[metric_pb(m) for m in pod_series],
        container_metrics=[pb.ContainerMetrics(container_id=cid,
                                                metrics=[metric_pb(m) for m in series])
                           for cid, series in containers])


__all__ = ["container_stats_pb", "descriptor_pb", "metric_pb", "pod_metrics_pb",
           "pod_stats_pb"]
