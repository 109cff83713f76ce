"""Stats readers, sampler and metrics over fake cgroup and /proc trees."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from cri_api.v1 import api_pb2 as pb

from pycrid.core.stats import ContainerStatsView, PodStatsView
from pycrid.cri import stats as stats_pb
from pycrid.stats import metrics
from pycrid.stats.cgroups import (
    CgroupStats,
    Hierarchy,
    nano_cores,
    parse_mountinfo,
    read_v1,
    read_v2,
    relative_cgroup,
    working_set,
)
from pycrid.stats.netdev import default_interface, parse_net_dev
from pycrid.stats.pod import sum_cgroups, sum_rates
from pycrid.stats.sampler import LayerUsage, Sample, Sampler, Target
from pycrid.store.pods import ContainerRecord, SandboxRecord

V1_MEMORY_STAT = """cache 100
rss 200
total_cache 4096000
total_rss 30000000
total_mapped_file 8192
total_pgfault 1234
total_pgmajfault 7
total_inactive_file 1000000
total_active_file 2000000
"""


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def v1_tree(root: Path, rel: str, *, cpu: int, usage: int = 50_000_000,
            limit: int = 9223372036854771712, pids: int | None = 3) -> dict[str, str]:
    dirs = {c: str(root / c / rel) for c in ("cpuacct", "memory", "pids")}
    write(root / "cpuacct" / rel / "cpuacct.usage", f"{cpu}\n")
    write(root / "cpuacct" / rel / "cpuacct.usage_user", f"{cpu * 3 // 4}\n")
    write(root / "cpuacct" / rel / "cpuacct.usage_sys", f"{cpu // 4}\n")
    write(root / "memory" / rel / "memory.usage_in_bytes", f"{usage}\n")
    write(root / "memory" / rel / "memory.limit_in_bytes", f"{limit}\n")
    write(root / "memory" / rel / "memory.max_usage_in_bytes", "60000000\n")
    write(root / "memory" / rel / "memory.stat", V1_MEMORY_STAT)
    write(root / "memory" / rel / "cgroup.procs", "10\n11\n")
    if pids is not None:
        write(root / "pids" / rel / "pids.current", f"{pids}\n")
    return dirs


def v2_tree(d: Path, *, usage_usec: int = 2_500_000, current: int = 40_000_000,
            maximum: str = "max", pids: bool = True) -> None:
    write(d / "cpu.stat", f"usage_usec {usage_usec}\nuser_usec 2000000\nsystem_usec 500000\n"
          "nr_periods 0\nnr_throttled 0\nthrottled_usec 0\n")
    write(d / "memory.current", f"{current}\n")
    write(d / "memory.max", f"{maximum}\n")
    write(d / "memory.stat", "anon 30000000\nfile 9000000\nfile_mapped 4096\n"
          "active_file 1000\ninactive_file 5000000\npgfault 55\npgmajfault 2\n")
    write(d / "cgroup.procs", "1\n2\n3\n4\n")
    if pids:
        write(d / "pids.current", "2\n")


# ---- cgroup v1 -------------------------------------------------------------------------------


def test_v1_reader(tmp_path: Path) -> None:
    dirs = v1_tree(tmp_path, "k8s.io/abc", cpu=5_000_000_000, limit=100_000_000)
    s = read_v1(dirs)
    assert s is not None
    assert s.cpu_ns == 5_000_000_000
    assert s.cpu_user_ns == 3_750_000_000 and s.cpu_system_ns == 1_250_000_000
    assert s.memory_usage == 50_000_000
    assert s.memory_limit == 100_000_000
    assert s.memory_max_usage == 60_000_000
    assert (s.rss, s.cache, s.mapped_file) == (30_000_000, 4_096_000, 8192)
    assert (s.pgfault, s.pgmajfault) == (1234, 7)
    assert (s.inactive_file, s.active_file) == (1_000_000, 2_000_000)
    assert s.working_set == 49_000_000
    assert s.available == 100_000_000 - 49_000_000
    assert s.pids == 3


def test_v1_unlimited_and_pids_from_procs(tmp_path: Path) -> None:
    dirs = v1_tree(tmp_path, "x", cpu=1, pids=None)
    s = read_v1(dirs)
    assert s is not None
    assert s.memory_limit is None and s.available is None
    assert s.pids == 2  # lines of cgroup.procs when pids.current is missing


def test_v1_gone(tmp_path: Path) -> None:
    assert read_v1({"memory": str(tmp_path / "nope"), "cpuacct": str(tmp_path / "no")}) is None


# ---- cgroup v2 -------------------------------------------------------------------------------


def test_v2_reader(tmp_path: Path) -> None:
    v2_tree(tmp_path / "k8s.io" / "abc", maximum="67108864")
    s = read_v2(str(tmp_path / "k8s.io" / "abc"))
    assert s is not None
    assert s.cpu_ns == 2_500_000_000
    assert s.cpu_user_ns == 2_000_000_000 and s.cpu_system_ns == 500_000_000
    assert s.memory_usage == 40_000_000
    assert s.memory_limit == 67108864
    assert s.rss == 30_000_000 and s.cache == 9_000_000 and s.mapped_file == 4096
    assert (s.pgfault, s.pgmajfault) == (55, 2)
    assert s.working_set == 35_000_000
    assert s.available == 67108864 - 35_000_000
    assert s.pids == 2


def test_v2_max_and_procs_fallback(tmp_path: Path) -> None:
    v2_tree(tmp_path, maximum="max", pids=False)
    s = read_v2(str(tmp_path))
    assert s is not None
    assert s.memory_limit is None
    assert s.pids == 4
    assert read_v2(str(tmp_path / "gone")) is None


def test_v2_missing_files_leave_fields_unset(tmp_path: Path) -> None:
    (tmp_path / "cg").mkdir()
    s = read_v2(str(tmp_path / "cg"))
    assert s is not None
    assert s.cpu_ns is None and s.memory_usage is None and s.working_set is None


def test_hierarchy_reads_v2_by_cgroups_path(tmp_path: Path) -> None:
    v2_tree(tmp_path / "k8s.io" / "cid")
    h = Hierarchy(unified=str(tmp_path))
    assert h.is_v2
    s = h.read("/k8s.io/cid")
    assert s is not None and s.cpu_ns == 2_500_000_000


def test_hierarchy_reads_v1_by_cgroups_path(tmp_path: Path) -> None:
    v1_tree(tmp_path, "kubepods/pod1/cid", cpu=42)
    h = Hierarchy(v1={c: str(tmp_path / c) for c in ("cpuacct", "memory", "pids")},
                  unified="/sys/fs/cgroup/unified")
    assert not h.is_v2
    s = h.read("/kubepods/pod1/cid")
    assert s is not None and s.cpu_ns == 42


# ---- locating cgroups ------------------------------------------------------------------------


def test_relative_cgroup_forms() -> None:
    assert relative_cgroup("/k8s.io/abc") == "k8s.io/abc"
    assert relative_cgroup("/kubepods/burstable/pod1/abc/") == "kubepods/burstable/pod1/abc"
    assert relative_cgroup("kubepods-burstable-pod1.slice:cri-containerd:abc") == (
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/"
        "cri-containerd-abc.scope")
    assert relative_cgroup(":cri:abc") == "system.slice/cri-abc.scope"
    assert relative_cgroup("-.slice:p:abc") == "p-abc.scope"
    assert relative_cgroup("bad--.slice:p:abc") is None
    assert relative_cgroup("a:b") is None
    assert relative_cgroup("") is None


HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""

PURE_V2 = """\
25 30 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw
26 30 0:23 / /proc rw - proc proc rw
"""


def test_parse_mountinfo() -> None:
    h = parse_mountinfo(HYBRID)
    assert h.v1 == {"cpuacct": "/sys/fs/cgroup/cpu,cpuacct", "memory": "/sys/fs/cgroup/memory",
                    "pids": "/sys/fs/cgroup/pids"}
    assert not h.is_v2
    v2 = parse_mountinfo(PURE_V2)
    assert v2.is_v2 and v2.unified == "/sys/fs/cgroup"


# ---- arithmetic ------------------------------------------------------------------------------


def test_working_set_floors_at_zero() -> None:
    assert working_set(100, 30) == 70
    assert working_set(100, 300) == 0


def test_nano_cores() -> None:
    # half a core: 0.5 s of CPU over 1 s
    assert nano_cores(1_000_000_000, 0, 1_500_000_000, 1_000_000_000) == 500_000_000
    # two full cores over 2 s
    assert nano_cores(0, 10, 4_000_000_000, 2_000_000_010) == 2_000_000_000
    assert nano_cores(5, 10, 6, 10) is None  # no time passed
    assert nano_cores(5, 10, 4, 20) is None  # counter went backwards (a new cgroup)


def test_sum_cgroups() -> None:
    a = CgroupStats(cpu_ns=10, memory_usage=100, inactive_file=10, rss=5, pids=1,
                    memory_limit=1000)
    b = CgroupStats(cpu_ns=20, memory_usage=50, inactive_file=0, rss=7, pids=None)
    s = sum_cgroups([a, b])
    assert s is not None
    assert (s.cpu_ns, s.memory_usage, s.working_set, s.rss, s.pids) == (30, 150, 140, 12, 1)
    assert s.memory_limit is None
    assert sum_cgroups([]) is None
    assert sum_rates([None, 5, 7]) == 12 and sum_rates([None]) is None


# ---- /proc/<pid>/net/dev ---------------------------------------------------------------------

NET_DEV = (
    "Inter-|   Receive                                                |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast"
    "|bytes    packets errs drop fifo colls carrier compressed\n"
    "    lo: 12345 10 0 0 0 0 0 0 12345 10 0 0 0 0 0 0\n"
    "  eth1:   100  2 1 0 0 0 0 0   200  3 0 4 0 0 0 0\n"
    "  eth0: 2331295 59932 5 6 0 0 0 0 3668725 35873 7 8 0 0 0 0\n"
)


def test_parse_net_dev() -> None:
    ifaces = parse_net_dev(NET_DEV)
    assert [i.name for i in ifaces] == ["eth1", "eth0"]
    eth0 = ifaces[1]
    assert (eth0.rx_bytes, eth0.rx_packets, eth0.rx_errors, eth0.rx_dropped) == (
        2331295, 59932, 5, 6)
    assert (eth0.tx_bytes, eth0.tx_packets, eth0.tx_errors, eth0.tx_dropped) == (
        3668725, 35873, 7, 8)
    d = default_interface(ifaces)
    assert d is not None and d.name == "eth0"
    d1 = default_interface(ifaces[:1])
    assert d1 is not None and d1.name == "eth1"
    assert default_interface([]) is None


# ---- sampler ---------------------------------------------------------------------------------


def test_sampler_two_samples_rate_vanish_and_prune(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    v1_tree(root, "k8s.io/c1", cpu=1_000_000_000)
    spec = tmp_path / "bundle" / "config.json"
    write(spec, json.dumps({"linux": {"cgroupsPath": "/k8s.io/c1"}}))
    write(tmp_path / "proc" / "77" / "net" / "dev", NET_DEV)
    targets = [
        Target(id="c1", cgroups_path="/wrong", spec=str(spec), layer_key="c1"),
        Target(id="gone", cgroups_path="/k8s.io/gone", layer_key="gone"),
        Target(id="pod", cgroups_path="", net_pid=77),
    ]

    def layer(key: str) -> LayerUsage:
        if key == "gone":
            raise FileNotFoundError(key)
        return LayerUsage(used_bytes=4096, inodes_used=3)

    sampler = Sampler(period=1, targets=lambda: targets, layer_usage=layer,
                      hierarchy=Hierarchy(v1={c: str(root / c) for c in
                                              ("cpuacct", "memory", "pids")}),
                      proc=str(tmp_path / "proc"))

    async def go() -> None:
        await sampler.collect()
        first = sampler.latest("c1")
        assert first is not None and first.cgroup is not None
        assert first.cgroup.cpu_ns == 1_000_000_000  # the spec's path won over "/wrong"
        assert first.layer == LayerUsage(4096, 3)
        assert sampler.nano_cores("c1") is None  # one sample: no rate yet
        gone = sampler.latest("gone")
        assert gone is not None and gone.cgroup is None and gone.layer is None
        pod = sampler.latest("pod")
        assert pod is not None and pod.network is not None
        assert [i.name for i in pod.network] == ["eth1", "eth0"]
        write(root / "cpuacct" / "k8s.io" / "c1" / "cpuacct.usage", "3000000000\n")
        await sampler.collect()
        second = sampler.latest("c1")
        assert second is not None and second.mono > first.mono
        rate = sampler.nano_cores("c1")
        assert rate is not None and rate > 0
        assert rate == (2_000_000_000 * 1_000_000_000) // (second.mono - first.mono)
        targets.pop(1)
        await sampler.collect()
        assert sampler.latest("gone") is None
        assert sampler.passes == 3
        third = sampler.latest("c1")
        # on demand: only what has no sample yet is read
        targets.append(Target(id="new", cgroups_path="/k8s.io/c1"))
        await sampler.ensure(targets)
        assert sampler.latest("new") is not None
        assert sampler.latest("c1") is third
        assert sampler.passes == 3

    asyncio.run(go())


def test_sampler_loop_starts_and_stops(tmp_path: Path) -> None:
    calls: list[int] = []

    async def go() -> None:
        three = asyncio.Event()

        def targets() -> list[Target]:
            calls.append(1)
            if len(calls) >= 3:
                three.set()
            return []

        sampler = Sampler(period=0.01, targets=targets, hierarchy=Hierarchy())
        sampler.start()
        await asyncio.wait_for(three.wait(), 10)
        await sampler.aclose()
        n = len(calls)
        await asyncio.sleep(0.05)
        assert len(calls) == n

    asyncio.run(go())


# ---- metrics and protobuf shape --------------------------------------------------------------


def _record() -> ContainerRecord:
    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="app", attempt=1),
                             image=pb.ImageSpec(image="busybox:1", user_specified_image="bb"),
                             labels={"k": "v"})
    return ContainerRecord(id="c" * 64, sandbox_id="p" * 64, name="n", config=cfg,
                           created_at=1, phase="created", started_at=5_000_000_000)


def _sample() -> Sample:
    cg = CgroupStats(cpu_ns=7_500_000_000, cpu_user_ns=5_000_000_000,
                     cpu_system_ns=2_500_000_000, memory_usage=50_000_000,
                     memory_limit=None, inactive_file=1_000_000, rss=40_000_000, pgfault=9,
                     pgmajfault=1, pids=2)
    return Sample(timestamp=123_000_000_000, mono=1, cgroup=cg,
                  layer=LayerUsage(used_bytes=5_242_880, inodes_used=4),
                  network=tuple(parse_net_dev(NET_DEV)))


def test_descriptors_are_unique_and_typed() -> None:
    names = [d.name for d in metrics.DESCRIPTORS]
    assert len(names) == len(set(names))
    for d in metrics.DESCRIPTORS:
        assert d.type in (metrics.COUNTER, metrics.GAUGE)
        assert d.label_keys[:5] == metrics.BASE_LABELS
        assert d.help
        assert d.name.endswith("_total") == (d.type == metrics.COUNTER), d.name


def test_container_metrics_shape() -> None:
    pod = metrics.PodInfo(id="p" * 64, name="web", namespace="ns")
    rec = _record()
    info = metrics.ContainerInfo(id=rec.id, name="app", image="bb", started_at=rec.started_at)
    values = metrics.container_metrics(pod, info, _sample(), now=0)
    by = {(v.name, v.label_values[-2] if v.name == "container_memory_failures_total" else ""): v
          for v in values}
    keys = {d.name: d.label_keys for d in metrics.DESCRIPTORS}
    for v in values:
        assert len(v.label_values) == len(keys[v.name])
        assert v.label_values[:5] == ("web", "ns", "app", rec.id, "bb")
        assert v.timestamp == 123_000_000_000
    assert by[("container_cpu_usage_seconds_total", "")].value == 7
    assert by[("container_cpu_usage_seconds_total", "")].type == metrics.COUNTER
    assert by[("container_memory_working_set_bytes", "")].value == 49_000_000
    assert by[("container_memory_working_set_bytes", "")].type == metrics.GAUGE
    assert by[("container_memory_failures_total", "pgmajfault")].value == 1
    assert by[("container_spec_memory_limit_bytes", "")].value == 0
    assert by[("container_fs_usage_bytes", "")].value == 5_242_880
    assert by[("container_start_time_seconds", "")].value == 5
    assert by[("container_processes", "")].value == 2
    net = metrics.network_metrics(pod, parse_net_dev(NET_DEV), 9)
    rx = [m for m in net if m.name == "container_network_receive_bytes_total"]
    assert [m.label_values for m in rx] == [("web", "ns", "", "p" * 64, "", "eth1"),
                                            ("web", "ns", "", "p" * 64, "", "eth0")]
    assert [m.value for m in rx] == [100, 2331295]


def test_protobuf_conversion() -> None:
    rec = _record()
    view = ContainerStatsView(record=rec, sample=_sample(), nano_cores=250_000_000,
                              fs_mountpoint="/var/lib/pycrid")
    cs = stats_pb.container_stats_pb(view)
    assert cs.attributes.id == rec.id and cs.attributes.labels == {"k": "v"}
    assert cs.cpu.timestamp == 123_000_000_000
    assert cs.cpu.usage_core_nano_seconds.value == 7_500_000_000
    assert cs.cpu.usage_nano_cores.value == 250_000_000
    assert cs.memory.working_set_bytes.value == 49_000_000
    assert cs.memory.rss_bytes.value == 40_000_000
    assert cs.memory.available_bytes.value == 0  # no limit (containerd's choice)
    assert cs.writable_layer.used_bytes.value == 5_242_880
    assert cs.writable_layer.fs_id.mountpoint == "/var/lib/pycrid"
    bare = stats_pb.container_stats_pb(ContainerStatsView(rec, None, None, "/x"))
    assert not bare.HasField("cpu") and not bare.HasField("memory")
    no_rate = stats_pb.container_stats_pb(ContainerStatsView(rec, _sample(), None, "/x"))
    assert not no_rate.cpu.HasField("usage_nano_cores")

    pod_rec = SandboxRecord(id="p" * 64, name="pod", created_at=1, phase="ready",
                            config=pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(
                                name="web", namespace="ns", uid="u")), runtime_handler="")
    s = _sample()
    assert s.cgroup is not None
    ps = stats_pb.pod_stats_pb(PodStatsView(
        record=pod_rec, timestamp=s.timestamp, usage=sum_cgroups([s.cgroup, s.cgroup]),
        nano_cores=500, network=s.network, containers=[view]))
    assert ps.attributes.metadata.name == "web"
    assert ps.linux.cpu.usage_core_nano_seconds.value == 15_000_000_000
    assert ps.linux.cpu.usage_nano_cores.value == 500
    assert ps.linux.memory.working_set_bytes.value == 98_000_000
    assert not ps.linux.memory.HasField("available_bytes")
    assert ps.linux.process.process_count.value == 4
    assert ps.linux.network.default_interface.name == "eth0"
    assert [i.name for i in ps.linux.network.interfaces] == ["eth1", "eth0"]
    assert ps.linux.network.default_interface.rx_bytes.value == 2331295
    assert [c.attributes.id for c in ps.linux.containers] == [rec.id]

    m = stats_pb.metric_pb(metrics.MetricValue("container_cpu_usage_seconds_total",
                                               metrics.COUNTER, ("a",), 3, 9))
    assert m.metric_type == pb.COUNTER and m.value.value == 3 and m.timestamp == 9
    d = stats_pb.descriptor_pb(metrics.DESCRIPTORS[0])
    assert list(d.label_keys) == list(metrics.BASE_LABELS)
