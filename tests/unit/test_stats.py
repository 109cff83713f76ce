"""Stats readers, sampler and metrics over fake cgroup and /proc trees."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import socket
from pathlib import Path

from cri_api.v1 import api_pb2 as pb

from pycrid.core.stats_queries import ContainerStatsView, PodStatsView
from pycrid.cri import stats_messages as stats_pb
from pycrid.host import mountinfo
from pycrid.stats import metrics
from pycrid.stats.cgfiles import (
    IoEntry,
    Psi,
    PsiData,
    parse_blkio,
    parse_cpu_max,
    parse_io_stat,
    parse_psi,
    weight_to_shares,
)
from pycrid.stats.cgroup_hierarchy import Hierarchy, hierarchy_of, relative_cgroup
from pycrid.stats.cgroup_readers import read_v1, read_v2
from pycrid.stats.cgroup_stats import CgroupStats, nano_cores, working_set
from pycrid.stats.device_names import block_device, filesystem_device, mount_source
from pycrid.stats.netdev import default_interface, parse_net_dev
from pycrid.stats.pod_usage import sum_cgroups, sum_rates
from pycrid.stats.procfs import DescriptorCounts, descriptor_counts
from pycrid.stats.sampler import LayerUsage, Sample, Sampler, Target
from pycrid.store.records import ContainerRecord, SandboxRecord

V1_MEMORY_STAT = """cache 100
rss 200
total_cache 4096000
total_rss 30000000
total_mapped_file 8192
total_pgfault 1234
total_pgmajfault 7
total_inactive_file 1000000
total_active_file 2000000
total_swap 65536
"""

V1_BLKIO_BYTES = """254:0 Read 4096
254:0 Write 8388608
254:0 Sync 8392704
254:0 Async 0
254:0 Discard 0
254:0 Total 8392704
7:3 Read 512
7:3 Write 0
7:3 Total 512
Total 8393216
"""

V1_BLKIO_OPS = """254:0 Read 1
254:0 Write 8
254:0 Total 9
7:3 Read 1
7:3 Write 0
7:3 Total 1
Total 10
"""

PSI_TEXT = ("some avg10=1.50 avg60=0.25 avg300=0.00 total=123456\n"
            "full avg10=0.00 avg60=0.00 avg300=0.00 total=789\n")


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def fake_proc(root: Path, fds: dict[int, list[str]]) -> str:
    """A /proc with an fd directory per pid: each entry a symlink to the given target
    (what readlink shows: "socket:[1]", "pipe:[2]", "/dev/null"...)."""
    for pid, targets in fds.items():
        d = root / str(pid) / "fd"
        d.mkdir(parents=True, exist_ok=True)
        for n, target in enumerate(targets):
            (d / str(n)).symlink_to(target)
    return str(root)


def fake_sysfs(root: Path) -> str:
    write(root / "dev" / "block" / "254:0" / "uevent", "MAJOR=254\nMINOR=0\nDEVNAME=vda\n"
          "DEVTYPE=disk\n")
    return str(root)


def v1_tree(root: Path, rel: str, *, cpu: int, usage: int = 50_000_000,
            limit: int = 9223372036854771712, memsw: int = 9223372036854771712,
            pids: int | None = 3, quota: int = -1) -> dict[str, str]:
    dirs = {c: str(root / c / rel) for c in ("cpu", "cpuacct", "memory", "pids", "blkio")}
    write(root / "cpuacct" / rel / "cpuacct.usage", f"{cpu}\n")
    write(root / "cpuacct" / rel / "cpuacct.usage_user", f"{cpu * 3 // 4}\n")
    write(root / "cpuacct" / rel / "cpuacct.usage_sys", f"{cpu // 4}\n")
    write(root / "cpu" / rel / "cpu.stat", "nr_periods 500\nnr_throttled 40\n"
          "throttled_time 2500000000\nnr_bursts 0\nburst_time 0\n")
    write(root / "cpu" / rel / "cpu.cfs_period_us", "100000\n")
    write(root / "cpu" / rel / "cpu.cfs_quota_us", f"{quota}\n")
    write(root / "cpu" / rel / "cpu.shares", "512\n")
    write(root / "memory" / rel / "memory.usage_in_bytes", f"{usage}\n")
    write(root / "memory" / rel / "memory.limit_in_bytes", f"{limit}\n")
    write(root / "memory" / rel / "memory.memsw.limit_in_bytes", f"{memsw}\n")
    write(root / "memory" / rel / "memory.max_usage_in_bytes", "60000000\n")
    write(root / "memory" / rel / "memory.failcnt", "17\n")
    write(root / "memory" / rel / "memory.memsw.failcnt", "3\n")
    write(root / "memory" / rel / "memory.kmem.usage_in_bytes", "372736\n")
    write(root / "memory" / rel / "memory.oom_control",
          "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    write(root / "memory" / rel / "memory.stat", V1_MEMORY_STAT)
    write(root / "memory" / rel / "cgroup.procs", "10\n11\n")
    write(root / "memory" / rel / "tasks", "10\n11\n12\n13\n14\n")
    write(root / "blkio" / rel / "blkio.bfq.io_serviced_recursive", "Total 0\n")
    write(root / "blkio" / rel / "blkio.throttle.io_serviced_recursive", V1_BLKIO_OPS)
    write(root / "blkio" / rel / "blkio.throttle.io_service_bytes_recursive", V1_BLKIO_BYTES)
    if pids is not None:
        write(root / "pids" / rel / "pids.current", f"{pids}\n")
        write(root / "pids" / rel / "pids.max", "max\n")
        write(root / "pids" / rel / "cgroup.procs", "10\n11\n")
    return dirs


def v2_tree(d: Path, *, usage_usec: int = 2_500_000, current: int = 40_000_000,
            maximum: str = "max", pids: bool = True, swap: bool = True,
            kernel_key: bool = True) -> None:
    write(d / "cpu.stat", f"usage_usec {usage_usec}\nuser_usec 2000000\nsystem_usec 500000\n"
          "nr_periods 300\nnr_throttled 30\nthrottled_usec 1500000\n")
    write(d / "cpu.max", "20000 100000\n")
    write(d / "cpu.weight", "100\n")
    write(d / "memory.current", f"{current}\n")
    write(d / "memory.max", f"{maximum}\n")
    write(d / "memory.stat", "anon 30000000\nfile 9000000\nfile_mapped 4096\n"
          "active_file 1000\ninactive_file 5000000\npgfault 55\npgmajfault 2\n"
          + ("kernel 700000\n" if kernel_key else "")
          + "kernel_stack 100000\npagetables 200000\npercpu 1000\nsock 0\nvmalloc 0\n"
          "slab 300000\n")
    write(d / "memory.events", "low 0\nhigh 0\nmax 9\noom 1\noom_kill 1\noom_group_kill 0\n")
    if swap:
        write(d / "memory.swap.current", "4096\n")
        write(d / "memory.swap.max", "1048576\n")
    write(d / "io.stat", "254:0 rbytes=4096 wbytes=8388608 rios=1 wios=8 dbytes=0 dios=0\n")
    write(d / "cpu.pressure", PSI_TEXT)
    write(d / "memory.pressure", PSI_TEXT)
    write(d / "io.pressure", PSI_TEXT)
    write(d / "cgroup.procs", "1\n2\n3\n4\n")
    write(d / "cgroup.threads", "1\n2\n3\n4\n5\n6\n")
    if pids:
        write(d / "pids.current", "2\n")
        write(d / "pids.max", "100\n")


# ---- cgroup v1 -------------------------------------------------------------------------------


def test_v1_reader(tmp_path: Path) -> None:
    dirs = v1_tree(tmp_path, "k8s.io/abc", cpu=5_000_000_000, limit=100_000_000,
                   memsw=150_000_000, quota=20000)
    proc = fake_proc(tmp_path / "proc", {10: ["/dev/null", "pipe:[7]", "socket:[9]"],
                                         11: ["socket:[10]"]})
    s = read_v1(dirs, proc=proc, sysfs=fake_sysfs(tmp_path / "sys"))
    assert s is not None
    assert s.cpu_ns == 5_000_000_000
    assert s.cpu_user_ns == 3_750_000_000 and s.cpu_system_ns == 1_250_000_000
    assert (s.cfs_periods, s.cfs_throttled_periods, s.cfs_throttled_ns) == (
        500, 40, 2_500_000_000)
    assert (s.cpu_period_us, s.cpu_quota_us, s.cpu_shares) == (100000, 20000, 512)
    assert s.memory_usage == 50_000_000
    assert s.memory_limit == 100_000_000
    assert s.memory_max_usage == 60_000_000
    assert (s.rss, s.cache, s.mapped_file) == (30_000_000, 4_096_000, 8192)
    assert (s.pgfault, s.pgmajfault) == (1234, 7)
    assert (s.inactive_file, s.active_file) == (1_000_000, 2_000_000)
    assert s.working_set == 49_000_000
    assert s.available == 100_000_000 - 49_000_000
    # failed charges against either limit (memory, memory+swap)
    assert (s.memory_failcnt, s.kernel_memory, s.oom_kills) == (17 + 3, 372736, 2)
    # v1 swap: total_swap; the limit is memory+swap, so 50 MB of swap, 64 KiB used.
    assert (s.swap, s.swap_limit, s.swap_available) == (65536, 150_000_000,
                                                       50_000_000 - 65536)
    # processes from cgroup.procs, threads from the pids controller (it counts tasks)
    assert (s.processes, s.threads, s.threads_max) == (2, 3, None)
    assert (s.fds, s.sockets) == (4, 2)
    # bfq's file was empty, so the throttle files count; device names from sysfs
    assert [(e.device, e.op, e.value) for e in s.io_bytes if e.major == 254] == [
        ("/dev/vda", "Read", 4096), ("/dev/vda", "Write", 8388608),
        ("/dev/vda", "Sync", 8392704), ("/dev/vda", "Async", 0), ("/dev/vda", "Discard", 0),
        ("/dev/vda", "Total", 8392704)]
    assert [(e.device, e.op, e.value) for e in s.io_ops if e.major == 7] == [
        ("7:3", "Read", 1), ("7:3", "Write", 0), ("7:3", "Total", 1)]
    assert s.cpu_psi is None  # no unified directory given


def test_v1_unlimited_no_pids_controller_and_hybrid_pressure(tmp_path: Path) -> None:
    dirs = v1_tree(tmp_path, "x", cpu=1, pids=None)
    del dirs["pids"]
    write(tmp_path / "unified" / "x" / "cpu.pressure", PSI_TEXT)
    s = read_v1(dirs, unified=str(tmp_path / "unified" / "x"),
                proc=fake_proc(tmp_path / "proc", {}))
    assert s is not None
    assert s.memory_limit is None and s.available is None
    assert s.swap_limit is None and s.swap_available is None
    assert s.cpu_quota_us is None  # -1: no quota
    assert s.processes == 2  # cgroup.procs of the memory controller
    assert s.threads == 5  # lines of "tasks" when there is no pids controller
    assert (s.fds, s.sockets) == (0, 0)  # the processes are gone from /proc
    assert s.cpu_psi is not None and s.cpu_psi.some is not None
    assert s.cpu_psi.some.total_us == 123456 and s.cpu_psi.some.avg10 == 1.5
    assert s.memory_psi is None  # no such file


def test_v1_gone(tmp_path: Path) -> None:
    assert read_v1({"memory": str(tmp_path / "nope"), "cpuacct": str(tmp_path / "no")}) is None


# ---- cgroup v2 -------------------------------------------------------------------------------


def test_v2_reader(tmp_path: Path) -> None:
    v2_tree(tmp_path / "k8s.io" / "abc", maximum="67108864")
    proc = fake_proc(tmp_path / "proc", {1: ["socket:[1]", "socket:[2]", "anon_inode:[x]"],
                                         3: ["/dev/null"]})
    s = read_v2(str(tmp_path / "k8s.io" / "abc"), proc=proc,
                sysfs=fake_sysfs(tmp_path / "sys"))
    assert s is not None
    assert s.cpu_ns == 2_500_000_000
    assert s.cpu_user_ns == 2_000_000_000 and s.cpu_system_ns == 500_000_000
    assert (s.cfs_periods, s.cfs_throttled_periods, s.cfs_throttled_ns) == (
        300, 30, 1_500_000_000)
    # cpu.max "20000 100000"; weight 100 is cAdvisor's 2 + 99 * 262142 // 9999 shares
    assert (s.cpu_period_us, s.cpu_quota_us, s.cpu_shares) == (100000, 20000, 2597)
    assert s.memory_usage == 40_000_000
    assert s.memory_limit == 67108864
    assert s.rss == 30_000_000 and s.cache == 9_000_000 and s.mapped_file == 4096
    assert (s.pgfault, s.pgmajfault) == (55, 2)
    assert s.working_set == 35_000_000
    assert s.available == 67108864 - 35_000_000
    # memory.events: "max" is the failcnt, oom_kill the OOM kills
    assert (s.memory_failcnt, s.oom_kills) == (9, 1)
    assert s.kernel_memory == 700000
    # v2 swap is separate from memory: swap.max is the swap limit itself
    assert (s.swap, s.swap_limit, s.swap_available) == (4096, 1048576, 1048576 - 4096)
    assert (s.processes, s.threads, s.threads_max) == (4, 2, 100)
    assert (s.fds, s.sockets) == (4, 2)
    assert [(e.device, e.op, e.value) for e in s.io_bytes] == [
        ("/dev/vda", "Read", 4096), ("/dev/vda", "Write", 8388608)]
    assert [(e.major, e.minor, e.op, e.value) for e in s.io_ops] == [
        (254, 0, "Read", 1), (254, 0, "Write", 8)]
    for psi in (s.cpu_psi, s.memory_psi, s.io_psi):
        assert psi is not None and psi.full is not None and psi.full.total_us == 789


def test_v2_max_and_fallbacks(tmp_path: Path) -> None:
    v2_tree(tmp_path, maximum="max", pids=False, swap=False, kernel_key=False)
    write(tmp_path / "cpu.max", "max 100000\n")
    s = read_v2(str(tmp_path), proc=fake_proc(tmp_path / "proc", {}))
    assert s is not None
    assert s.memory_limit is None
    assert (s.cpu_quota_us, s.cpu_period_us) == (None, 100000)
    # no swap accounting: 0 in use (cAdvisor's reading), nothing known to be left
    assert (s.swap, s.swap_limit, s.swap_available) == (0, None, None)
    # no "kernel" key (older kernels): the parts that make it up
    assert s.kernel_memory == 100000 + 200000 + 1000 + 300000
    assert s.processes == 4
    assert s.threads == 6  # cgroup.threads without a pids controller
    assert s.threads_max is None
    assert read_v2(str(tmp_path / "gone")) is None


def test_v2_missing_files_leave_fields_unset(tmp_path: Path) -> None:
    (tmp_path / "cg").mkdir()
    s = read_v2(str(tmp_path / "cg"))
    assert s is not None
    assert s.cpu_ns is None and s.memory_usage is None and s.working_set is None
    assert s.swap is None and s.oom_kills is None and s.processes is None
    assert s.cfs_periods is None and s.cpu_shares is None and s.kernel_memory is None
    assert s.io_bytes == () and s.cpu_psi is None


def test_hierarchy_reads_v2_by_cgroups_path(tmp_path: Path) -> None:
    v2_tree(tmp_path / "k8s.io" / "cid")
    h = Hierarchy(unified=str(tmp_path))
    assert h.is_v2
    s = h.read("/k8s.io/cid")
    assert s is not None and s.cpu_ns == 2_500_000_000


def test_hierarchy_reads_v1_by_cgroups_path(tmp_path: Path) -> None:
    v1_tree(tmp_path, "kubepods/pod1/cid", cpu=42)
    write(tmp_path / "unified" / "kubepods" / "pod1" / "cid" / "io.pressure", PSI_TEXT)
    h = Hierarchy(v1={c: str(tmp_path / c) for c in ("cpuacct", "memory", "pids")},
                  unified=str(tmp_path / "unified"))
    assert not h.is_v2
    s = h.read("/kubepods/pod1/cid")
    assert s is not None and s.cpu_ns == 42
    assert s.io_psi is not None  # hybrid: pressure from the cgroup2 mount


# ---- file formats, devices, descriptors ------------------------------------------------------


def test_file_parsers() -> None:
    assert parse_cpu_max("max 100000") == (None, 100000)
    assert parse_cpu_max("50000 100000\n") == (50000, 100000)
    assert parse_cpu_max("junk") == (None, None)
    assert weight_to_shares(1) == 2 and weight_to_shares(10000) == 262144
    assert weight_to_shares(0) is None
    entries = parse_blkio(V1_BLKIO_BYTES)
    assert len(entries) == 9  # the final "Total" line is dropped
    assert entries[0] == IoEntry(254, 0, "Read", 4096)
    assert parse_blkio("Total 0\n") == []
    by_bytes, by_ops = parse_io_stat("8:16 rbytes=1 wbytes=2 rios=3 wios=4 dbytes=5 dios=6\n"
                                     "bad line\n")
    assert [(e.op, e.value) for e in by_bytes] == [("Read", 1), ("Write", 2)]
    assert [(e.op, e.value) for e in by_ops] == [("Read", 3), ("Write", 4)]
    psi = parse_psi("some avg10=0.10 avg60=0.20 avg300=0.30 total=42\n")
    assert psi is not None and psi.full is None and psi.some is not None
    assert (psi.some.avg10, psi.some.avg60, psi.some.avg300, psi.some.total_us) == (
        0.1, 0.2, 0.3, 42)
    assert parse_psi("") is None


def test_device_names(tmp_path: Path) -> None:
    sysfs = fake_sysfs(tmp_path / "sys")
    assert block_device(254, 0, sysfs) == "/dev/vda"
    assert block_device(8, 1, sysfs) == "8:1"
    mountinfo = ("22 1 254:0 / / rw - ext4 /dev/vda rw\n"
                 "30 22 0:45 / /run rw - tmpfs tmpfs rw\n")
    assert mount_source(0, 45, mountinfo) == "tmpfs"
    assert mount_source(0, 99, mountinfo) is None
    st = os.stat(tmp_path)
    info = tmp_path / "mountinfo"
    info.write_text(f"30 22 {os.major(st.st_dev)}:{os.minor(st.st_dev)} / /x rw - xfs "
                    "/dev/fake rw\n")
    # a device sysfs does not know is named by the mount table
    assert filesystem_device(str(tmp_path), sysfs=str(tmp_path / "nosys"),
                             mountinfo=str(info)) == "/dev/fake"
    assert filesystem_device(str(tmp_path / "missing")) == ""


def test_descriptor_counts(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, {5: ["socket:[1]", "/x", "pipe:[3]"], 6: ["socket:[2]"]})
    assert descriptor_counts([5, 6, 7], proc) == DescriptorCounts(fds=4, sockets=2)
    # this very process, through the real /proc
    with socket.socket() as sk:
        mine = descriptor_counts([os.getpid()])
        assert mine.sockets >= 1 and mine.fds > mine.sockets
        assert sk.fileno() >= 0


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
36 31 0:33 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
37 31 0:34 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""

PURE_V2 = """\
25 30 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw
26 30 0:23 / /proc rw - proc proc rw
"""


def test_parse_mountinfo() -> None:
    h = hierarchy_of(mountinfo.parse(HYBRID))
    assert h.v1 == {"cpu": "/sys/fs/cgroup/cpu,cpuacct", "cpuacct": "/sys/fs/cgroup/cpu,cpuacct",
                    "memory": "/sys/fs/cgroup/memory", "blkio": "/sys/fs/cgroup/blkio",
                    "pids": "/sys/fs/cgroup/pids"}
    assert not h.is_v2
    v2 = hierarchy_of(mountinfo.parse(PURE_V2))
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
    a = CgroupStats(cpu_ns=10, memory_usage=100, inactive_file=10, rss=5, processes=1,
                    threads=4, swap=3, memory_limit=1000, cpu_shares=2, oom_kills=1,
                    cpu_psi=Psi())
    b = CgroupStats(cpu_ns=20, memory_usage=50, inactive_file=0, rss=7, processes=None,
                    threads=2, swap=None)
    s = sum_cgroups([a, b])
    assert s is not None
    assert (s.cpu_ns, s.memory_usage, s.working_set, s.rss) == (30, 150, 140, 12)
    assert (s.processes, s.threads, s.swap) == (1, 6, 3)
    # limits, settings, events and pressure are not the pod's sum
    assert s.memory_limit is None and s.cpu_shares is None and s.oom_kills is None
    assert s.cpu_psi is None
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
    psi = Psi(some=PsiData(total_us=5, avg10=1.5, avg60=0.5, avg300=0.25),
              full=PsiData(total_us=2, avg10=0.0, avg60=0.0, avg300=0.0))
    cg = CgroupStats(cpu_ns=7_500_000_000, cpu_user_ns=5_000_000_000,
                     cpu_system_ns=2_500_000_000, cfs_periods=300, cfs_throttled_periods=30,
                     cfs_throttled_ns=2_900_000_000, cpu_period_us=100000, cpu_quota_us=20000,
                     cpu_shares=1024, memory_usage=50_000_000, memory_max_usage=60_000_000,
                     memory_limit=None, inactive_file=1_000_000, rss=40_000_000, pgfault=9,
                     pgmajfault=1, memory_failcnt=3, kernel_memory=4096, swap=8192,
                     swap_limit=None, oom_kills=1, processes=2, threads=7, threads_max=None,
                     fds=9, sockets=1, cpu_psi=psi, memory_psi=psi,
                     io_bytes=(IoEntry(254, 0, "Read", 4096, "/dev/vda"),
                               IoEntry(254, 0, "Write", 8192, "/dev/vda"),
                               IoEntry(254, 0, "Total", 12288, "/dev/vda")),
                     io_ops=(IoEntry(254, 0, "Read", 1, "/dev/vda"),
                             IoEntry(254, 0, "Write", 2, "/dev/vda")))
    return Sample(timestamp=123_000_000_000, mono=1, cgroup=cg,
                  layer=LayerUsage(used_bytes=5_242_880, inodes_used=4, device="/dev/vda",
                                   capacity_bytes=10**10, inodes_total=1000, inodes_free=600),
                  network=tuple(parse_net_dev(NET_DEV)))


def test_descriptors_are_unique_and_typed() -> None:
    names = [d.name for d in metrics.DESCRIPTORS]
    assert len(names) == len(set(names))
    for d in metrics.DESCRIPTORS:
        assert d.type in (metrics.COUNTER, metrics.GAUGE)
        assert d.label_keys[:6] == metrics.BASE_LABELS
        assert d.help
        # cAdvisor's exceptions to "a counter's name ends in _total"
        counter = d.name.endswith("_total") and d.name != "container_fs_inodes_total"
        assert (counter or d.name == "container_memory_failcnt") == (
            d.type == metrics.COUNTER), d.name


def test_container_metrics_shape() -> None:
    pod = metrics.PodInfo(id="p" * 64, name="web", namespace="ns")
    rec = _record()
    info = metrics.ContainerInfo(id=rec.id, name="app", image="bb", started_at=rec.started_at)
    values = metrics.container_metrics(pod, info, _sample(), now=0)
    keys = {d.name: d.label_keys for d in metrics.DESCRIPTORS}
    by = {(v.name, v.label_values[6:]): v for v in values}
    assert len(by) == len(values)  # no series twice
    for v in values:
        assert len(v.label_values) == len(keys[v.name])
        assert v.label_values[:6] == ("web", "ns", "app", rec.id, "bb", rec.id)
        assert v.timestamp == 123_000_000_000

    def val(name: str, *extra: str) -> int:
        return by[(name, extra)].value

    assert val("container_cpu_usage_seconds_total", "total") == 7
    assert by[("container_cpu_usage_seconds_total", ("total",))].type == metrics.COUNTER
    assert val("container_memory_working_set_bytes") == 49_000_000
    assert by[("container_memory_working_set_bytes", ())].type == metrics.GAUGE
    assert val("container_memory_failures_total", "pgmajfault", "container") == 1
    assert val("container_spec_memory_limit_bytes") == 0
    assert val("container_spec_memory_swap_limit_bytes") == 0
    assert val("container_start_time_seconds") == 5
    assert val("container_processes") == 2
    # the new series, each with its unit
    assert (val("container_cpu_cfs_periods_total"),
            val("container_cpu_cfs_throttled_periods_total"),
            val("container_cpu_cfs_throttled_seconds_total")) == (300, 30, 2)
    assert (val("container_spec_cpu_period"), val("container_spec_cpu_quota"),
            val("container_spec_cpu_shares")) == (100000, 20000, 1024)
    assert (val("container_memory_failcnt"), val("container_memory_kernel_usage"),
            val("container_memory_swap"), val("container_oom_events_total")) == (
        3, 4096, 8192, 1)
    assert (val("container_threads"), val("container_threads_max"),
            val("container_file_descriptors"), val("container_sockets")) == (7, 0, 9, 1)
    assert (val("container_fs_usage_bytes", "/dev/vda"),
            val("container_fs_limit_bytes", "/dev/vda"),
            val("container_fs_inodes_total", "/dev/vda"),
            val("container_fs_inodes_free", "/dev/vda")) == (5_242_880, 10**10, 1000, 600)
    assert (val("container_fs_reads_bytes_total", "/dev/vda"),
            val("container_fs_writes_bytes_total", "/dev/vda"),
            val("container_fs_reads_total", "/dev/vda"),
            val("container_fs_writes_total", "/dev/vda")) == (4096, 8192, 1, 2)
    assert val("container_blkio_device_usage_total", "/dev/vda", "254", "0", "Total") == 12288
    assert [v.label_values[6:] for v in values
            if v.name == "container_blkio_device_usage_total"] == [
        ("/dev/vda", "254", "0", "Read"), ("/dev/vda", "254", "0", "Write"),
        ("/dev/vda", "254", "0", "Total")]
    # every descriptor but the pod-level network ones has a value here
    pod_level = {d.name for d in metrics.DESCRIPTORS if "interface" in d.label_keys}
    assert {v.name for v in values} == set(keys) - pod_level
    net = metrics.network_metrics(pod, parse_net_dev(NET_DEV), 9)
    assert {m.name for m in net} == pod_level
    rx = [m for m in net if m.name == "container_network_receive_bytes_total"]
    assert [m.label_values for m in rx] == [("web", "ns", "", "p" * 64, "", "p" * 64, "eth1"),
                                            ("web", "ns", "", "p" * 64, "", "p" * 64, "eth0")]
    assert [m.value for m in rx] == [100, 2331295]


def test_cfs_series_only_with_a_quota() -> None:
    """cAdvisor reports CFS bandwidth only for containers that have a CPU quota."""
    pod = metrics.PodInfo(id="p", name="web", namespace="ns")
    info = metrics.ContainerInfo(id="c", name="app", image="bb", started_at=0)
    s = _sample()
    assert s.cgroup is not None
    free = dataclasses.replace(s, cgroup=dataclasses.replace(s.cgroup, cpu_quota_us=None))
    names = {v.name for v in metrics.container_metrics(pod, info, free, now=0)}
    assert "container_spec_cpu_period" in names
    assert not {"container_cpu_cfs_periods_total", "container_cpu_cfs_throttled_periods_total",
                "container_cpu_cfs_throttled_seconds_total", "container_spec_cpu_quota"} & names


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
    assert cs.writable_layer.inodes_used.value == 4
    assert cs.swap.timestamp == 123_000_000_000
    assert cs.swap.swap_usage_bytes.value == 8192
    assert not cs.swap.HasField("swap_available_bytes")  # no swap limit
    # pressure: CRI totals are nanoseconds, the kernel's microseconds
    assert cs.cpu.psi.Some.Total == 5000 and cs.cpu.psi.Some.Avg10 == 1.5
    assert cs.cpu.psi.Full.Total == 2000
    assert cs.memory.psi.Some.Avg300 == 0.25
    assert not cs.HasField("io")  # no io pressure in this sample
    cg = _sample().cgroup
    assert cg is not None
    limited = dataclasses.replace(_sample(), cgroup=dataclasses.replace(
        cg, swap_available=1000, io_psi=Psi(some=PsiData(7, 0.0, 0.0, 0.0))))
    cs2 = stats_pb.container_stats_pb(ContainerStatsView(rec, limited, None, "/x"))
    assert cs2.swap.swap_available_bytes.value == 1000
    assert cs2.io.psi.Some.Total == 7000 and not cs2.io.psi.HasField("Full")
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
    assert ps.linux.process.process_count.value == 4  # the processes, not the threads
    assert not ps.linux.cpu.HasField("psi")  # pressure does not add up
    assert ps.linux.network.default_interface.name == "eth0"
    assert [i.name for i in ps.linux.network.interfaces] == ["eth1", "eth0"]
    assert ps.linux.network.default_interface.rx_bytes.value == 2331295
    assert [c.attributes.id for c in ps.linux.containers] == [rec.id]

    m = stats_pb.metric_pb(metrics.MetricValue("container_cpu_usage_seconds_total",
                                               metrics.COUNTER, ("a",), 3, 9))
    assert m.metric_type == pb.COUNTER and m.value.value == 3 and m.timestamp == 9
    d = stats_pb.descriptor_pb(metrics.DESCRIPTORS[1])
    assert list(d.label_keys) == list(metrics.BASE_LABELS)
