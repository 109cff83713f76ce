"""Container and pod stats and cAdvisor-style metrics, from the daemon's sampling loop.

One pod holds a CPU burner, a memory hog and an idle container; the daemon samples
every second (``stats_collect_period = "1s"``). Values are polled until they move,
with deadlines, and checked against the cgroup files the kernel keeps.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
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
    # cAdvisor's label keys as the kubelet's /metrics/cadvisor serves them.
    assert descs["container_cpu_usage_seconds_total"] == [
        "pod", "namespace", "container", "id", "image", "name", "cpu"]
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
        assert list(cpu.label_values) == ["stats-pod", "default", cpu.label_values[2], cid,
                                          daemon.extra["busybox"], cid, "total"]
        assert series["container_memory_working_set_bytes"].metric_type == pb.GAUGE
    hog_ws = by_ctr[setup.hog]["container_memory_working_set_bytes"]
    assert hog_ws.value.value > 30 * MB
    assert hog_ws.label_values[2] == "hog"
    assert hog_ws.label_values[4] == daemon.extra["busybox"]
    pod_rx = [m for m in pm.metrics if m.name == "container_network_receive_bytes_total"]
    assert [list(m.label_values) for m in pod_rx] == [
        ["stats-pod", "default", "", setup.sid, "", setup.sid, "eth0"]]


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


# ---- the cAdvisor metric set, read from the kernel -------------------------------------------

V2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
MIB = 1 << 20


def kernel_file(controller: str, cid: str, name: str) -> str:
    """A container's cgroup file (cgroupfs driver: ``/k8s.io/<id>``) on v1 or v2."""
    if V2:
        return f"/sys/fs/cgroup/k8s.io/{cid}/{name}"
    return f"/sys/fs/cgroup/{controller}/k8s.io/{cid}/{name}"


def kernel_keyed(controller: str, cid: str, name: str) -> dict[str, int]:
    with open(kernel_file(controller, cid, name)) as f:
        return {k: int(v) for k, v in (line.split() for line in f if len(line.split()) == 2)}


def pod_metrics(d: Daemon, sid: str) -> pb.PodSandboxMetrics | None:
    for pm in d.client.runtime.ListPodSandboxMetrics(pb.ListPodSandboxMetricsRequest(),
                                                     timeout=30).pod_metrics:
        if pm.pod_sandbox_id == sid:
            return pm
    return None


def ctr_series(d: Daemon, sid: str, cid: str) -> dict[str, list[pb.Metric]]:
    """The container's series by name ({} until the pod has metrics)."""
    pm = pod_metrics(d, sid)
    out: dict[str, list[pb.Metric]] = {}
    for cm in pm.container_metrics if pm is not None else []:
        if cm.container_id == cid:
            for m in cm.metrics:
                out.setdefault(m.name, []).append(m)
    return out


def one(series: dict[str, list[pb.Metric]], name: str) -> int:
    """The value of a series that has exactly one value (-1 when it has none yet)."""
    values = series.get(name, [])
    assert len(values) <= 1, f"{name}: {values}"
    return int(values[0].value.value) if values else -1


def descriptors(d: Daemon) -> dict[str, list[str]]:
    return {x.name: list(x.label_keys) for x in d.client.runtime.ListMetricDescriptors(
        pb.ListMetricDescriptorsRequest(), timeout=30).descriptors}


@dataclass
class Limited:
    sid: str
    throttled: str
    oomy: str
    listener: str


@pytest.fixture(scope="module")
def limited(daemon: Daemon) -> Iterator[Limited]:
    """A pod whose containers have limits: a CPU burner under a 10% quota, a sleeper with
    a 32 MiB memory limit (for OOM kills), and two listening sockets."""
    pods = Pods(daemon.client)
    pod = pod_config("limited-pod")
    sid = pods.run(pod)
    image = daemon.extra["busybox"]

    def run(name: str, script: str, **res: int) -> str:
        return pods.run_container(sid, container_config(
            image, name, command=["sh", "-c", script],
            linux=pb.LinuxContainerConfig(resources=pb.LinuxContainerResources(**res))), pod)

    try:
        throttled = run("throttled", "while :; do :; done", cpu_period=100_000,
                        cpu_quota=10_000, cpu_shares=512, memory_limit_in_bytes=64 * MIB,
                        memory_swap_limit_in_bytes=64 * MIB)
        oomy = run("oomy", "sleep 1000", memory_limit_in_bytes=32 * MIB,
                   memory_swap_limit_in_bytes=32 * MIB)
        listener = run("listener", "nc -l -p 8080 & nc -l -p 8081 & wait")
        yield Limited(sid, throttled, oomy, listener)
    finally:
        pods.cleanup()


def test_every_descriptor_has_values_with_its_labels(daemon: Daemon, limited: Limited) -> None:
    """What the kubelet's CRI metrics collector needs: each value's labels are its
    descriptor's (it drops values that do not match), and the pod gives every descriptor
    a value (block I/O only where the kernel counted some)."""
    descs = descriptors(daemon)
    pm = wait_for(lambda: (p := pod_metrics(daemon, limited.sid)) and len(
        p.container_metrics) == 3 and p, 30, "metrics of the three containers")
    values = list(pm.metrics) + [m for cm in pm.container_metrics for m in cm.metrics]
    names = set()
    for m in values:
        assert m.name in descs, m.name
        keys = descs[m.name]
        assert len(m.label_values) == len(keys), (m.name, keys, m.label_values)
        labels = dict(zip(keys, m.label_values, strict=True))
        assert labels["pod"] == "limited-pod" and labels["namespace"] == "default"
        if "device" in labels:
            assert labels["device"], m.name
        if "major" in labels:
            assert labels["major"].isdigit() and labels["minor"].isdigit()
            assert labels["operation"] in ("Read", "Write", "Sync", "Async", "Discard",
                                           "Total")
        names.add(m.name)
    block_io = {"container_fs_reads_bytes_total", "container_fs_reads_total",
                "container_fs_writes_bytes_total", "container_fs_writes_total",
                "container_blkio_device_usage_total"}
    assert set(descs) - names <= block_io, set(descs) - names - block_io
    for cm in pm.container_metrics:
        by_name = {m.name: m for m in cm.metrics}
        assert by_name["container_processes"].value.value >= 1
        assert by_name["container_fs_limit_bytes"].value.value > 0
        assert by_name["container_fs_inodes_total"].value.value >= (
            by_name["container_fs_inodes_free"].value.value)


def test_cfs_throttling_under_a_tight_quota(daemon: Daemon, limited: Limited) -> None:
    cid = limited.throttled
    s = wait_for(lambda: (s := ctr_series(daemon, limited.sid, cid)) and one(
        s, "container_cpu_cfs_throttled_seconds_total") >= 1 and s, 60,
        "a second of throttling under a 10% quota")
    periods = one(s, "container_cpu_cfs_periods_total")
    throttled = one(s, "container_cpu_cfs_throttled_periods_total")
    assert 0 < throttled <= periods
    assert s["container_cpu_cfs_periods_total"][0].metric_type == pb.COUNTER
    kernel = kernel_keyed("cpu", cid, "cpu.stat")
    assert kernel["nr_periods"] >= periods and kernel["nr_throttled"] >= throttled
    # 10 ms a 100 ms period: the burner got about a hundredth of a second a period
    assert one(s, "container_cpu_usage_seconds_total") <= periods // 100 + 1
    assert one(s, "container_spec_cpu_period") == 100_000
    assert one(s, "container_spec_cpu_quota") == 10_000
    if V2:  # the weight runc wrote, in cAdvisor's shares scale
        with open(kernel_file("cpu", cid, "cpu.weight")) as f:
            shares = 2 + (int(f.read()) - 1) * 262142 // 9999
    else:
        shares = 512
    assert one(s, "container_spec_cpu_shares") == shares
    assert one(s, "container_spec_memory_limit_bytes") == 64 * MIB
    # v1 holds memory+swap (64 MiB: no swap), v2 swap alone (0: none)
    assert one(s, "container_spec_memory_swap_limit_bytes") == (0 if V2 else 64 * MIB)
    # an unlimited container has no CFS series, as in cAdvisor
    idle = ctr_series(daemon, limited.sid, limited.listener)
    assert "container_cpu_cfs_periods_total" not in idle
    assert one(idle, "container_spec_cpu_period") == 100_000
    # CRI stats: the swap the limit leaves (none) and the usage
    cs = ctr_stats(daemon, cid)
    assert cs.swap.swap_usage_bytes.value == 0
    assert cs.swap.HasField("swap_available_bytes") and cs.swap.swap_available_bytes.value == 0
    assert 0 < cs.memory.available_bytes.value <= 64 * MIB


def test_oom_events_after_an_oom_kill(daemon: Daemon, limited: Limited) -> None:
    cid = limited.oomy
    before = wait_for(lambda: (s := ctr_series(daemon, limited.sid, cid)) and s, 30,
                      "metrics of the container")
    assert one(before, "container_oom_events_total") == 0
    assert one(before, "container_spec_memory_limit_bytes") == 32 * MIB
    oom_file = "memory.events" if V2 else "memory.oom_control"
    # 64 MB in one shell variable under a 32 MiB limit: the kernel kills that shell. It
    # may instead fail an allocation of the shell's (a fork, a pipe page) with ENOMEM, which
    # is no OOM kill: then once more, up to three times, until the kernel counts one.
    tries = []
    for _ in range(3):
        r = daemon.client.runtime.ExecSync(pb.ExecSyncRequest(
            container_id=cid, cmd=["sh", "-c", 'x=$(head -c 64000000 /dev/zero | tr "\\0" a); '
                                   'echo ${#x}'], timeout=60), timeout=90)
        assert r.exit_code != 0, r.stdout
        tries.append((r.exit_code, r.stderr[-300:]))
        with contextlib.suppress(AssertionError):
            wait_for(lambda: kernel_keyed("memory", cid, oom_file).get("oom_kill", 0) >= 1, 5,
                     "the kernel's OOM kill count")
            break
    killed = kernel_keyed("memory", cid, oom_file).get("oom_kill", 0)
    assert killed >= 1, f"no OOM kill counted by the kernel; exec exit codes, stderr: {tries}"
    after = wait_for(lambda: (s := ctr_series(daemon, limited.sid, cid)) and one(
        s, "container_oom_events_total") >= 1 and s, 30,
        f"the OOM kill in the metrics (the kernel counted {killed})")
    events = kernel_keyed("memory", cid, oom_file)
    assert events["oom_kill"] == one(after, "container_oom_events_total")
    # Failed charges: v2 counts them in memory.events; v1 in memory.failcnt or, against
    # the memory+swap limit, memory.memsw.failcnt (6.x kernels count neither when the
    # two limits are equal, as here: the kernel's number is the check, not "> 0").
    if V2:
        failcnt = events["max"]
    else:
        failcnt = sum(cgroup_int(kernel_file("memory", cid, f))
                      for f in ("memory.failcnt", "memory.memsw.failcnt"))
    assert one(after, "container_memory_failcnt") == failcnt
    assert after["container_oom_events_total"][0].metric_type == pb.COUNTER
    # the container itself lives on
    st = daemon.client.runtime.ContainerStatus(pb.ContainerStatusRequest(container_id=cid),
                                               timeout=30).status
    assert st.state == pb.CONTAINER_RUNNING


def _host_fd_counts(cid: str) -> tuple[int, int]:
    with open(kernel_file("memory", cid, "cgroup.procs")) as f:
        pids = [int(p) for p in f.read().split()]
    fds = sockets = 0
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            fds += 1
            sockets += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    return fds, sockets


def test_descriptors_and_sockets(daemon: Daemon, limited: Limited) -> None:
    cid = limited.listener
    s = wait_for(lambda: (s := ctr_series(daemon, limited.sid, cid)) and one(
        s, "container_sockets") >= 2 and s, 30, "the two listening sockets")
    fds, sockets = _host_fd_counts(cid)
    assert one(s, "container_sockets") == sockets == 2
    assert one(s, "container_file_descriptors") == fds
    assert one(s, "container_processes") == 3  # the shell and two nc


THREADS_C = """
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>
static void *idle(void *arg) { (void)arg; for (;;) pause(); return 0; }
int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1;
    pthread_t t;
    for (int i = 0; i < n; i++) pthread_create(&t, 0, idle, 0);
    for (;;) pause();
}
"""


@pytest.fixture(scope="module")
def threads_binary(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A static program that starts N idle threads (busybox has none that threads)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("no gcc to build the thread-starting program")
    d = tmp_path_factory.mktemp("threads")
    (d / "threads.c").write_text(THREADS_C)
    out = d / "threads"
    r = subprocess.run([gcc, "-static", "-O2", "-pthread", "-o", str(out), str(d / "threads.c")],
                       capture_output=True, text=True, timeout=120, check=False)
    if r.returncode != 0:
        pytest.skip(f"gcc cannot link a static threaded program here: {r.stderr[-300:]}")
    return str(out)


def test_threads_counts_the_threads_started(daemon: Daemon, pods: Pods,
                                            threads_binary: str) -> None:
    pod = pod_config("threads-pod")
    sid = pods.run(pod)
    cid = pods.run_container(sid, container_config(
        daemon.extra["busybox"], "threads", command=["/threads", "7"],
        mounts=[pb.Mount(container_path="/threads", host_path=threads_binary,
                         readonly=True)]), pod)
    s = wait_for(lambda: (s := ctr_series(daemon, sid, cid)) and one(
        s, "container_threads") == 8 and s, 30, "main + 7 threads")
    assert one(s, "container_processes") == 1
    assert one(s, "container_threads_max") == 0  # no pids limit
    assert cgroup_int(kernel_file("pids", cid, "pids.current")) == 8
    # the pod's CRI process count is processes (pause + this one), not threads
    ps = daemon.client.runtime.PodSandboxStats(pb.PodSandboxStatsRequest(pod_sandbox_id=sid),
                                               timeout=30).stats
    assert ps.linux.process.process_count.value == 2


def _blkio_writes(cid: str) -> int:
    """Bytes the kernel counted as written by the container's cgroup (0 if none)."""
    if V2:
        path = kernel_file("io", cid, "io.stat")
        with open(path) as f:
            return sum(int(kv.split("=")[1]) for line in f for kv in line.split()[1:]
                       if kv.startswith("wbytes="))
    total = 0
    for name in ("blkio.throttle.io_service_bytes_recursive",
                 "blkio.io_service_bytes_recursive"):
        with contextlib.suppress(FileNotFoundError):
            with open(kernel_file("blkio", cid, name)) as f:
                total = max(total, sum(int(p[2]) for p in (line.split() for line in f)
                                       if len(p) == 3 and p[1] == "Write"))
    return total


def test_fs_writes_grow_after_writing(daemon: Daemon, limited: Limited) -> None:
    cid = limited.listener

    def written(s: dict[str, list[pb.Metric]]) -> int:
        return sum(int(m.value.value) for m in s.get("container_fs_writes_bytes_total", []))

    before_kernel = _blkio_writes(cid)
    before = wait_for(lambda: (s := ctr_series(daemon, limited.sid, cid)) and s, 30,
                      "metrics of the container")
    # Direct I/O: page-cache writeback is not charged to the writer on cgroup v1.
    r = daemon.client.runtime.ExecSync(pb.ExecSyncRequest(
        container_id=cid, cmd=["sh", "-c", "dd if=/dev/zero of=/direct bs=1M count=8 "
                               "oflag=direct && rm /direct"], timeout=60), timeout=90)
    assert r.exit_code == 0, r.stderr
    if _blkio_writes(cid) < before_kernel + 8 * MIB:
        pytest.skip("the kernel did not charge the container's direct writes to its cgroup "
                    "(cgroup v1 counts block I/O per cgroup only while blk-throttle is "
                    "active on the device)")
    after = wait_for(lambda: (s := ctr_series(daemon, limited.sid, cid)) and written(
        s) >= written(before) + 8 * MIB and s, 30, "8 MiB more written in the metrics")
    assert written(after) <= _blkio_writes(cid)
    ops = sum(int(m.value.value) for m in after["container_fs_writes_total"])
    assert ops >= sum(int(m.value.value) for m in before.get("container_fs_writes_total", []))
    assert ops >= 8  # at least one write per MiB block
    usage = {(m.label_values[6], m.label_values[9]): int(m.value.value)
             for m in after["container_blkio_device_usage_total"]}
    devices = {m.label_values[6] for m in after["container_fs_writes_bytes_total"]}
    assert all(d.startswith("/dev/") for d in devices), devices
    assert sum(v for (_d, op), v in usage.items() if op == "Write") == written(after)


def test_fs_usage_limit_and_inodes(daemon: Daemon, limited: Limited) -> None:
    s = wait_for(lambda: (s := ctr_series(daemon, limited.sid, limited.listener)) and s, 30,
                 "metrics of the container")
    st = os.statvfs(daemon.root)
    assert one(s, "container_fs_limit_bytes") == st.f_blocks * st.f_frsize
    assert one(s, "container_fs_inodes_total") == st.f_files
    free = one(s, "container_fs_inodes_free")
    assert 0 < free <= st.f_files
    device = s["container_fs_usage_bytes"][0].label_values[6]
    assert device and s["container_fs_limit_bytes"][0].label_values[6] == device


def test_cri_stats_pressure_where_the_kernel_has_it(daemon: Daemon, limited: Limited) -> None:
    cid = limited.throttled
    pressure = kernel_file("unified", cid, "cpu.pressure")  # v1: the hybrid cgroup2 mount
    if not os.path.exists(pressure):
        pytest.skip(f"no pressure files for the container ({pressure})")
    cs = ctr_stats(daemon, cid)
    assert cs.cpu.HasField("psi") and cs.memory.HasField("psi")
    assert cs.io.HasField("psi") and cs.io.timestamp == cs.cpu.timestamp
    with open(pressure) as f:
        kernel_some = int(f.readline().split("total=")[1])
    assert cs.cpu.psi.Some.Total <= kernel_some * 1000
