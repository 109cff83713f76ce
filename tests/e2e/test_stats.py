"""Container and pod stats and cAdvisor-style metrics, from the daemon's sampling loop.

One pod holds a CPU burner, a memory hog and an idle container; the daemon samples
every second (``stats_collect_period = "1s"``). Values are polled until they move,
with deadlines, and checked against the cgroup files the kernel keeps.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from tests.support.daemon import Daemon
from tests.support.images import TestImages
from tests.support.pods import (
    Pods,
    busybox_daemon,
    container_config,
    daemon_config,
    pod_config,
    wait_for,
)
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e

CPUACCT = "/sys/fs/cgroup/cpuacct"
MEMORY = "/sys/fs/cgroup/memory"
MB = 1_000_000


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, registry: LocalRegistry,
           test_images: TestImages) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("stats")
    config = (daemon_config(registry, test_images, base)
              + '[plugins."pycrid.cri.v1.runtime"]\nstats_collect_period = "1s"\n')
    with busybox_daemon(base, registry, test_images, config) as d:
        yield d


@dataclass
class Setup:
    sid: str
    pod: pb.PodSandboxConfig
    burner: str
    hog: str
    idle: str


@pytest.fixture(scope="module")
def setup(daemon: Daemon) -> Iterator[Setup]:
    pods = Pods(daemon.client)
    pod = pod_config("stats-pod", labels={"app": "stats"})
    sid = pods.run(pod)
    image = daemon.extra["busybox"]

    def run(name: str, script: str, role: str) -> str:
        return pods.run_container(sid, container_config(
            image, name, command=["sh", "-c", script], labels={"role": role}), pod)

    burner = run("burner", "while :; do :; done", "cpu")
    # The shell must outlive the sleep (sh execs a last command, freeing the variable).
    hog = run("hog", 'x=$(head -c 40000000 /dev/zero | tr "\\0" a); sleep 1000; echo ${#x}',
              "mem")
    idle = run("idle", "sleep 1000", "idle")
    yield Setup(sid, pod, burner, hog, idle)
    pods.cleanup()


def ctr_stats(d: Daemon, cid: str) -> pb.ContainerStats:
    return d.client.runtime.ContainerStats(pb.ContainerStatsRequest(container_id=cid),
                                           timeout=30).stats


def cgroup_int(path: str) -> int:
    with open(path) as f:
        return int(f.read().strip())


def test_cpu_burner_rate_and_cumulative(daemon: Daemon, setup: Setup) -> None:
    def busy() -> pb.ContainerStats | None:
        s = ctr_stats(daemon, setup.burner)
        return s if s.cpu.usage_nano_cores.value > 500_000_000 else None

    first = wait_for(busy, 30, "the burner to use more than half a core")
    assert first.attributes.id == setup.burner
    assert first.attributes.metadata.name == "burner"
    assert first.cpu.timestamp > 0
    # The kernel's own counter is at least what the last sample saw.
    kernel = cgroup_int(f"{CPUACCT}/k8s.io/{setup.burner}/cpuacct.usage")
    assert kernel >= first.cpu.usage_core_nano_seconds.value > 0
    later = wait_for(lambda: (s := ctr_stats(daemon, setup.burner)).cpu.timestamp
                     > first.cpu.timestamp and s, 30, "a newer sample")
    assert later.cpu.usage_core_nano_seconds.value > first.cpu.usage_core_nano_seconds.value
    # An idle container's rate is far below the burner's.
    idle = wait_for(lambda: (s := ctr_stats(daemon, setup.idle)).cpu.HasField(
        "usage_nano_cores") and s, 30, "a rate for the idle container")
    assert idle.cpu.usage_nano_cores.value < 100_000_000


def test_memory_working_set(daemon: Daemon, setup: Setup) -> None:
    s = wait_for(lambda: (s := ctr_stats(daemon, setup.hog)).memory.working_set_bytes.value
                 > 30 * MB and s, 30, "the hog's working set to pass 30 MB")
    mem = s.memory
    assert mem.usage_bytes.value >= mem.working_set_bytes.value
    assert mem.rss_bytes.value > 30 * MB
    assert mem.page_faults.value > 0
    assert mem.available_bytes.value == 0  # no limit set
    kernel = cgroup_int(f"{MEMORY}/k8s.io/{setup.hog}/memory.usage_in_bytes")
    assert kernel > 30 * MB


def test_writable_layer_grows(daemon: Daemon, setup: Setup) -> None:
    before = wait_for(lambda: (s := ctr_stats(daemon, setup.idle)).HasField("writable_layer")
                      and s, 30, "a writable layer sample").writable_layer
    assert before.fs_id.mountpoint
    r = daemon.client.runtime.ExecSync(pb.ExecSyncRequest(
        container_id=setup.idle, cmd=["sh", "-c", "head -c 5242880 /dev/zero > /big"],
        timeout=30), timeout=60)
    assert r.exit_code == 0, r.stderr
    after = wait_for(lambda: (w := ctr_stats(daemon, setup.idle).writable_layer).used_bytes.value
                     >= before.used_bytes.value + 5 * 1048576 and w, 30,
                     "the writable layer to grow by 5 MiB")
    assert after.inodes_used.value > before.inodes_used.value
    assert after.timestamp > before.timestamp


def test_list_container_stats_filters(daemon: Daemon, setup: Setup) -> None:
    rt = daemon.client.runtime

    def ids(**flt: object) -> set[str]:
        req = pb.ListContainerStatsRequest(filter=pb.ContainerStatsFilter(**flt))  # type: ignore[arg-type]
        return {s.attributes.id for s in rt.ListContainerStats(req, timeout=30).stats}

    mine = {setup.burner, setup.hog, setup.idle}
    everything = {s.attributes.id for s in rt.ListContainerStats(
        pb.ListContainerStatsRequest(), timeout=30).stats}
    assert mine <= everything
    assert ids(id=setup.hog) == {setup.hog}
    assert ids(id=setup.hog[:12]) == {setup.hog}
    assert ids(pod_sandbox_id=setup.sid) == mine
    assert ids(pod_sandbox_id=setup.sid[:10]) == mine
    assert ids(label_selector={"role": "cpu"}) == {setup.burner}
    assert ids(pod_sandbox_id=setup.sid, label_selector={"role": "nope"}) == set()
    assert ids(id="f" * 64) == set()
    listed = {s.attributes.id: s for s in rt.ListContainerStats(pb.ListContainerStatsRequest(
        filter=pb.ContainerStatsFilter(pod_sandbox_id=setup.sid)), timeout=30).stats}
    assert all(s.HasField("cpu") and s.HasField("memory") for s in listed.values())


def test_pod_sandbox_stats_aggregate(daemon: Daemon, setup: Setup) -> None:
    rt = daemon.client.runtime

    def pod_stats() -> pb.PodSandboxStats:
        return rt.PodSandboxStats(pb.PodSandboxStatsRequest(pod_sandbox_id=setup.sid),
                                  timeout=30).stats

    ps = wait_for(lambda: (p := pod_stats()).linux.memory.working_set_bytes.value > 30 * MB
                  and p.linux.cpu.usage_nano_cores.value > 500_000_000 and p, 30,
                  "pod stats to show the hog and the burner")
    assert ps.attributes.id == setup.sid
    assert ps.attributes.metadata.name == "stats-pod"
    linux = ps.linux
    members = {c.attributes.id: c for c in linux.containers}
    assert set(members) == {setup.burner, setup.hog, setup.idle}
    # The pod is the sum of its members (pause included), so at least their sum.
    assert linux.cpu.usage_core_nano_seconds.value >= sum(
        c.cpu.usage_core_nano_seconds.value for c in members.values())
    assert linux.memory.working_set_bytes.value >= sum(
        c.memory.working_set_bytes.value for c in members.values())
    # pause + three shells (+ the hog's sleep/children): at least four processes.
    assert linux.process.process_count.value >= 4
    net = linux.network
    assert net.default_interface.name == "eth0"
    assert [i.name for i in net.interfaces] == ["eth0"]
    # 20 datagrams of 1000 bytes from the host to the pod show in its eth0 counters.
    before = net.default_interface.rx_bytes.value
    ip = rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=setup.sid),
                             timeout=30).status.network.ip
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        for _ in range(20):
            udp.sendto(b"x" * 1000, (ip, 9))
    wait_for(lambda: pod_stats().linux.network.default_interface.rx_bytes.value
             >= before + 20_000, 30, "the datagrams in the pod's rx counter")
    listed = rt.ListPodSandboxStats(pb.ListPodSandboxStatsRequest(
        filter=pb.PodSandboxStatsFilter(label_selector={"app": "stats"})), timeout=30).stats
    assert [p.attributes.id for p in listed] == [setup.sid]
    listed = rt.ListPodSandboxStats(pb.ListPodSandboxStatsRequest(
        filter=pb.PodSandboxStatsFilter(id=setup.sid[:8])), timeout=30).stats
    assert [p.attributes.id for p in listed] == [setup.sid]


def test_pod_sandbox_metrics(daemon: Daemon, setup: Setup) -> None:
    rt = daemon.client.runtime
    descs = {d.name: list(d.label_keys) for d in rt.ListMetricDescriptors(
        pb.ListMetricDescriptorsRequest(), timeout=30).descriptors}
    assert descs["container_cpu_usage_seconds_total"] == [
        "pod", "namespace", "container", "id", "image"]
    assert descs["container_network_receive_bytes_total"][-1] == "interface"

    def ours() -> pb.PodSandboxMetrics | None:
        for pm in rt.ListPodSandboxMetrics(pb.ListPodSandboxMetricsRequest(),
                                           timeout=30).pod_metrics:
            if pm.pod_sandbox_id == setup.sid:
                return pm
        return None

    pm = wait_for(ours, 30, "metrics of the pod")
    by_ctr = {cm.container_id: {m.name: m for m in cm.metrics} for cm in pm.container_metrics}
    assert set(by_ctr) == {setup.burner, setup.hog, setup.idle}
    for cid, series in by_ctr.items():
        for m in series.values():
            assert len(m.label_values) == len(descs[m.name]), m.name
        cpu = series["container_cpu_usage_seconds_total"]
        assert cpu.metric_type == pb.COUNTER
        assert list(cpu.label_values)[:4] == ["stats-pod", "default",
                                              cpu.label_values[2], cid]
        assert series["container_memory_working_set_bytes"].metric_type == pb.GAUGE
    hog_ws = by_ctr[setup.hog]["container_memory_working_set_bytes"]
    assert hog_ws.value.value > 30 * MB
    assert hog_ws.label_values[2] == "hog"
    assert hog_ws.label_values[4] == daemon.extra["busybox"]
    pod_rx = [m for m in pm.metrics if m.name == "container_network_receive_bytes_total"]
    assert [list(m.label_values) for m in pod_rx] == [
        ["stats-pod", "default", "", setup.sid, "", "eth0"]]


def test_unknown_ids_are_not_found(daemon: Daemon) -> None:
    rt = daemon.client.runtime
    with pytest.raises(grpc.RpcError) as e:
        rt.ContainerStats(pb.ContainerStatsRequest(container_id="0" * 64), timeout=30)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as e:
        rt.PodSandboxStats(pb.PodSandboxStatsRequest(pod_sandbox_id="0" * 64), timeout=30)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_stopped_pod_leaves_the_stats(daemon: Daemon, pods: Pods) -> None:
    pod = pod_config()
    sid = pods.run(pod)
    cid = pods.run_container(sid, container_config(daemon.extra["busybox"], "s",
                                                   command=["sleep", "1000"]), pod)
    assert ctr_stats(daemon, cid).HasField("memory")  # sampled on demand if need be
    pods.stop_pod(sid)
    s = ctr_stats(daemon, cid)
    assert not s.HasField("cpu") and not s.HasField("memory")  # nothing runs to measure
    with pytest.raises(grpc.RpcError) as e:
        daemon.client.runtime.PodSandboxStats(pb.PodSandboxStatsRequest(pod_sandbox_id=sid),
                                              timeout=30)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    listed = daemon.client.runtime.ListPodSandboxStats(pb.ListPodSandboxStatsRequest(),
                                                       timeout=30).stats
    assert sid not in {p.attributes.id for p in listed}
