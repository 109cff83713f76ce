"""Container resources end to end: CRI limits seen in the host's cgroup files (v1 paths
here), in /proc, and in ContainerStatus.resources; live updates; an OOM kill; bad
requests; pod overhead and resources in the verbose pod status."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from pycrid.host.cgroups import probe
from tests.support.daemon import Daemon
from tests.support.images import TestImages
from tests.support.pods import Pods, busybox_daemon, container_config, daemon_config, pod_config
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e

HOST = probe()
PIDS_LIMIT = 77
MiB = 1 << 20
CG = "/sys/fs/cgroup"

needs_v1 = pytest.mark.skipif(HOST.unified, reason="checks cgroup v1 file paths")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, registry: LocalRegistry,
           test_images: TestImages) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("resources")
    config = daemon_config(registry, test_images, base) + (
        '[plugins."pycrid.cri.v1.runtime"]\n'
        f"pids_limit = {PIDS_LIMIT}\n")
    with busybox_daemon(base, registry, test_images, config) as d:
        yield d


def sleeper(daemon: Daemon, name: str = "c", **resources: Any) -> Any:
    cfg = container_config(daemon.extra["busybox"], name, command=["sleep", "3600"])
    if resources:
        cfg.linux.resources.CopyFrom(pb.LinuxContainerResources(**resources))
    return cfg


def info(pods: Pods, cid: str) -> dict[str, Any]:
    return dict(json.loads(pods.status(cid, verbose=True).info["info"]))


def cgroup_file(controller: str, cgroups_path: str, name: str) -> str:
    with open(os.path.join(CG, controller, cgroups_path.lstrip("/"), name)) as f:
        return f.read().strip()


def update(pods: Pods, cid: str, **resources: Any) -> None:
    pods.rt.UpdateContainerResources(pb.UpdateContainerResourcesRequest(
        container_id=cid, linux=pb.LinuxContainerResources(**resources)), timeout=30)


def proc_cgroup(pid: int, controller: str) -> str:
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, names, path = line.rstrip("\n").split(":", 2)
            if controller in names.split(","):
                return path
    raise AssertionError(f"{controller} not in /proc/{pid}/cgroup")


@needs_v1
def test_create_time_limits_in_cgroup_files_and_status(daemon: Daemon, pods: Pods) -> None:
    pod = pod_config()
    sid = pods.run(pod)
    cid = pods.run_container(sid, sleeper(
        daemon, cpu_shares=512, cpu_period=100000, cpu_quota=50000, cpuset_cpus="0",
        cpuset_mems="0", memory_limit_in_bytes=64 * MiB,
        memory_swap_limit_in_bytes=96 * MiB, oom_score_adj=500), pod)
    details = info(pods, cid)
    path, pid = details["runtimeSpec"]["linux"]["cgroupsPath"], details["pid"]
    assert path == f"/k8s.io/{cid}"
    assert proc_cgroup(pid, "memory") == path  # the process really is in it
    assert cgroup_file("cpu", path, "cpu.shares") == "512"
    assert cgroup_file("cpu", path, "cpu.cfs_period_us") == "100000"
    assert cgroup_file("cpu", path, "cpu.cfs_quota_us") == "50000"
    assert cgroup_file("cpuset", path, "cpuset.cpus") == "0"
    assert cgroup_file("cpuset", path, "cpuset.mems") == "0"
    assert cgroup_file("memory", path, "memory.limit_in_bytes") == str(64 * MiB)
    assert cgroup_file("memory", path, "memory.memsw.limit_in_bytes") == str(96 * MiB)
    assert cgroup_file("pids", path, "pids.max") == str(PIDS_LIMIT)  # from the config key
    with open(f"/proc/{pid}/oom_score_adj") as f:
        assert f.read().strip() == "500"
    assert pods.exec(cid, ["sh", "-c", "cat /proc/$(pidof sleep)/oom_score_adj"]
                     ).stdout == b"500\n"
    res = pods.status(cid).status.resources.linux
    assert res == pb.LinuxContainerResources(
        cpu_shares=512, cpu_period=100000, cpu_quota=50000, cpuset_cpus="0", cpuset_mems="0",
        memory_limit_in_bytes=64 * MiB, memory_swap_limit_in_bytes=96 * MiB,
        oom_score_adj=500)
    # the pause container: cpu shares 2, as containerd's
    assert cgroup_file("cpu", f"/k8s.io/{sid}", "cpu.shares") == "2"


@needs_v1
def test_memory_limit_alone_means_no_swap(daemon: Daemon, pods: Pods) -> None:
    pod = pod_config()
    sid = pods.run(pod)
    cid = pods.run_container(sid, sleeper(daemon, memory_limit_in_bytes=48 * MiB), pod)
    path = info(pods, cid)["runtimeSpec"]["linux"]["cgroupsPath"]
    assert cgroup_file("memory", path, "memory.limit_in_bytes") == str(48 * MiB)
    if HOST.swap:
        assert cgroup_file("memory", path, "memory.memsw.limit_in_bytes") == str(48 * MiB)
        assert pods.status(cid).status.resources.linux.memory_swap_limit_in_bytes == 48 * MiB


def test_negative_oom_score_adj_clamped_to_the_daemons(daemon: Daemon, pods: Pods) -> None:
    with open(f"/proc/{daemon.proc.pid}/oom_score_adj") as f:
        own = int(f.read())
    pod = pod_config()
    sid = pods.run(pod)
    cid = pods.run_container(sid, sleeper(daemon, oom_score_adj=-999), pod)
    with open(f"/proc/{info(pods, cid)['pid']}/oom_score_adj") as f:
        assert int(f.read()) == own
    assert pods.status(cid).status.resources.linux.oom_score_adj == own


@needs_v1
def test_custom_cgroup_parent(daemon: Daemon, pods: Pods) -> None:
    parent = "/pycrid-res-" + secrets.token_hex(4)
    try:
        pod = pod_config()
        pod.linux.cgroup_parent = parent
        sid = pods.run(pod)
        cid = pods.run_container(sid, sleeper(daemon, memory_limit_in_bytes=40 * MiB), pod)
        details = info(pods, cid)
        assert details["runtimeSpec"]["linux"]["cgroupsPath"] == f"{parent}/{cid}"
        assert proc_cgroup(details["pid"], "memory") == f"{parent}/{cid}"
        assert cgroup_file("memory", f"{parent}/{cid}", "memory.limit_in_bytes") == \
            str(40 * MiB)
        pause_pid = json.loads(pods.pod_status(sid, verbose=True).info["info"])["pid"]
        assert proc_cgroup(pause_pid, "cpu") == f"{parent}/{sid}"
        pods.remove_pod(sid)
        assert not os.path.exists(os.path.join(CG, "memory", parent.lstrip("/"), cid))
    finally:
        pods.cleanup()
        for controller in os.listdir(CG):
            d = os.path.join(CG, controller, parent.lstrip("/"))
            if os.path.isdir(d):
                os.rmdir(d)


@needs_v1
def test_live_update_raises_and_lowers(daemon: Daemon, pods: Pods) -> None:
    pod = pod_config()
    sid = pods.run(pod)
    cid = pods.run_container(sid, sleeper(daemon, cpu_period=100000, cpu_quota=20000,
                                          memory_limit_in_bytes=64 * MiB), pod)
    path = info(pods, cid)["runtimeSpec"]["linux"]["cgroupsPath"]

    def seen() -> tuple[str, str, str, Any]:
        return (cgroup_file("cpu", path, "cpu.cfs_quota_us"),
                cgroup_file("memory", path, "memory.limit_in_bytes"),
                cgroup_file("memory", path, "memory.memsw.limit_in_bytes"),
                pods.status(cid).status.resources.linux)

    update(pods, cid, cpu_quota=150000, memory_limit_in_bytes=256 * MiB)  # raise
    quota, mem, memsw, res = seen()
    assert (quota, mem, memsw) == ("150000", str(256 * MiB), str(256 * MiB))
    assert (res.cpu_quota, res.cpu_period, res.memory_limit_in_bytes,
            res.memory_swap_limit_in_bytes) == (150000, 100000, 256 * MiB, 256 * MiB)
    update(pods, cid, cpu_quota=10000, memory_limit_in_bytes=24 * MiB)  # lower
    quota, mem, memsw, res = seen()
    assert (quota, mem, memsw) == ("10000", str(24 * MiB), str(24 * MiB))
    assert (res.cpu_quota, res.memory_limit_in_bytes) == (10000, 24 * MiB)
    # the bundle's spec follows too (restarts and NRI read it)
    spec_res = info(pods, cid)["runtimeSpec"]["linux"]["resources"]
    assert spec_res["memory"] == {"limit": 24 * MiB, "swap": 24 * MiB}
    assert spec_res["pids"] == {"limit": PIDS_LIMIT}


@needs_v1
def test_update_of_created_container_applies_at_start(daemon: Daemon, pods: Pods) -> None:
    pod = pod_config()
    sid = pods.run(pod)
    cid = pods.create(sid, sleeper(daemon, cpu_shares=256), pod)
    update(pods, cid, cpu_shares=768)
    pods.start(cid)
    path = info(pods, cid)["runtimeSpec"]["linux"]["cgroupsPath"]
    assert cgroup_file("cpu", path, "cpu.shares") == "768"
    assert pods.status(cid).status.resources.linux.cpu_shares == 768


def test_oom_killed(daemon: Daemon, pods: Pods) -> None:
    pod = pod_config()
    sid = pods.run(pod)
    cfg = container_config(daemon.extra["busybox"], "hog",
                           command=["/bin/busybox", "dd", "if=/dev/zero", "of=/dev/null",
                                    "bs=64M", "count=1"])
    cfg.linux.resources.memory_limit_in_bytes = 16 * MiB
    cid = pods.run_container(sid, cfg, pod)
    st = pods.wait_state(cid, pb.CONTAINER_EXITED)
    assert (st.exit_code, st.reason) == (137, "OOMKilled")


def test_oom_killed_is_certain(daemon: Daemon, pods: Pods) -> None:
    """critest's OOM container (memory = memory+swap = 15 MiB, dd with a 20 MiB block),
    several at once: every one must end OOMKilled. conmon writes its ``oom`` file when its
    main loop gets to the OOM event, which may be after it wrote the exit file; the
    cgroup's own OOM-kill counter settles it."""
    pod = pod_config()
    sid = pods.run(pod)
    cids = []
    for i in range(6):
        cfg = container_config(daemon.extra["busybox"], f"hog{i}",
                               command=["sh", "-c", "dd if=/dev/zero of=/dev/null bs=20M"])
        cfg.linux.resources.memory_limit_in_bytes = 15 * MiB
        cfg.linux.resources.memory_swap_limit_in_bytes = 15 * MiB
        cids.append(pods.create(sid, cfg, pod))
    for cid in cids:
        pods.start(cid)
    got = [pods.wait_state(cid, pb.CONTAINER_EXITED) for cid in cids]
    assert [(st.exit_code, st.reason) for st in got] == [(137, "OOMKilled")] * len(cids)


def code_of(call: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code()  # type: ignore[no-any-return]


def test_bad_requests(daemon: Daemon, pods: Pods) -> None:
    pod = pod_config()
    sid = pods.run(pod)
    bad: list[dict[str, Any]] = [
        {"cpuset_cpus": "0-x"}, {"cpu_shares": -1},
        {"memory_limit_in_bytes": 64 * MiB, "memory_swap_limit_in_bytes": 32 * MiB}]
    if not HOST.unified:
        bad.append({"unified": {"memory.high": "1000"}})
    for i, resources in enumerate(bad):
        with pytest.raises(grpc.RpcError) as e:
            pods.create(sid, sleeper(daemon, f"bad{i}", **resources), pod)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, resources
        field = next(iter(resources)) if len(resources) == 1 else "memory_swap_limit_in_bytes"
        assert field in (e.value.details() or "")
    listed = pods.rt.ListContainers(pb.ListContainersRequest(), timeout=30).containers
    assert not [c for c in listed if c.pod_sandbox_id == sid]

    cid = pods.run_container(sid, sleeper(daemon, "ok", cpu_shares=300), pod)
    for resources in bad:
        with pytest.raises(grpc.RpcError) as e:
            update(pods, cid, **resources)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert pods.status(cid).status.resources.linux.cpu_shares == 300  # untouched
    assert code_of(lambda: update(pods, "f" * 64, cpu_shares=2)) == grpc.StatusCode.NOT_FOUND
    pods.stop(cid)
    assert code_of(lambda: update(pods, cid, cpu_shares=2)) == \
        grpc.StatusCode.FAILED_PRECONDITION


def test_pod_overhead_and_resources_in_verbose_status(daemon: Daemon, pods: Pods) -> None:
    pod = pod_config()
    pod.linux.overhead.CopyFrom(pb.LinuxContainerResources(cpu_shares=10,
                                                           memory_limit_in_bytes=5 * MiB))
    pod.linux.resources.CopyFrom(pb.LinuxContainerResources(cpu_period=100000,
                                                            cpu_quota=40000))
    sid = pods.run(pod)

    def verbose() -> dict[str, Any]:
        return dict(json.loads(pods.pod_status(sid, verbose=True).info["info"]))

    got = verbose()
    assert got["overhead"] == {"linux": {"cpu_shares": 10, "memory_limit_in_bytes": 5 * MiB}}
    assert got["resources"] == {"linux": {"cpu_period": 100000, "cpu_quota": 40000}}
    pods.rt.UpdatePodSandboxResources(pb.UpdatePodSandboxResourcesRequest(
        pod_sandbox_id=sid,
        overhead=pb.LinuxContainerResources(cpu_shares=20),
        resources=pb.LinuxContainerResources(cpu_period=100000, cpu_quota=80000,
                                             memory_limit_in_bytes=128 * MiB)), timeout=30)
    got = verbose()
    assert got["overhead"] == {"linux": {"cpu_shares": 20}}
    assert got["resources"] == {"linux": {"cpu_period": 100000, "cpu_quota": 80000,
                                          "memory_limit_in_bytes": 128 * MiB}}
