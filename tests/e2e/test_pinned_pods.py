"""Pods without a pause process (drop_infra_ctr, CRI-O's default): a pod whose containers
do not share a PID namespace gets pinned network, IPC and UTS namespaces and no process
of its own; everything else is as it is for a pod with a pause container."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from tests.support.daemon import Daemon
from tests.support.images import TestImages
from tests.support.pods import (
    CGROUP_ROOT,
    Pods,
    busybox_daemon,
    container_config,
    daemon_config,
    leftovers,
    pod_config,
    processes_mentioning,
)
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e


def _config(base: Path, registry: LocalRegistry, images: TestImages) -> str:
    """The usual test daemon, plus a handler whose pods always get a pause."""
    return daemon_config(registry, images, base) + (
        '[plugins."pycrid.cri.v1.runtime".runtimes.paused]\n'
        'sandboxer = "podsandbox"\n'
        '[plugins."pycrid.cri.v1.runtime".runtimes.paused.options]\n'
        f'Root = "{base / "paused-root"}"\n')


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pinned")


@pytest.fixture(scope="module")
def daemon(base: Path, registry: LocalRegistry, test_images: TestImages) -> Iterator[Daemon]:
    with busybox_daemon(base, registry, test_images,
                        _config(base, registry, test_images)) as d:
        yield d


@pytest.fixture
def clean(daemon: Daemon, pods: Pods) -> Iterator[None]:
    yield
    pods.cleanup()
    assert leftovers(daemon.root, daemon.state) == []


def unshared_pod(**kw: object) -> pb.PodSandboxConfig:
    """A pod as the kubelet makes one without shareProcessNamespace."""
    cfg = pod_config(**kw)
    cfg.linux.security_context.namespace_options.pid = pb.CONTAINER
    return cfg


def sleeper(daemon: Daemon, name: str, pod: pb.PodSandboxConfig) -> pb.ContainerConfig:
    cfg = container_config(daemon.extra["busybox"], name, command=["sleep", "3600"])
    cfg.linux.security_context.namespace_options.CopyFrom(
        pod.linux.security_context.namespace_options)
    return cfg


def runc_ids(root: str) -> set[str]:
    out = subprocess.run(["runc", f"--root={root}", "list", "-q"], capture_output=True,
                         text=True, check=True).stdout
    return set(out.split())


def ns_link(pods: Pods, cid: str, kind: str) -> str:
    return pods.exec(cid, ["readlink", f"/proc/self/ns/{kind}"]).stdout.decode().strip()


def pin_of(daemon: Daemon, sid: str, kind: str) -> str:
    return os.path.join(daemon.state, "sandboxes", sid, "ns", kind)


def test_pod_runs_without_a_pause_process(daemon: Daemon, pods: Pods, clean: None) -> None:
    pod = unshared_pod(hostname="pinned-host")
    pod.linux.sysctls.update({"kernel.shm_rmid_forced": "1", "net.core.somaxconn": "1234"})
    sid = pods.run(pod)
    # No pause: runc knows no container of that id, no monitor names it.
    assert sid not in runc_ids(os.path.join(daemon.state, "runc"))
    assert processes_mentioning(sid) == []
    st = pods.pod_status(sid, verbose=True)
    assert st.status.state == pb.SANDBOX_READY
    info = json.loads(st.info["info"])
    assert (info["pid"], info["processStatus"]) == (0, "running")

    a = pods.run_container(sid, sleeper(daemon, "a", pod), pod)
    b = pods.run_container(sid, sleeper(daemon, "b", pod), pod)
    # Network, IPC and UTS are the pod's pinned ones, shared; PID is each container's own.
    for kind, pin in (("net", info["netns"]),
                      ("ipc", pin_of(daemon, sid, "ipc")), ("uts", pin_of(daemon, sid, "uts"))):
        assert ns_link(pods, a, kind) == ns_link(pods, b, kind) == \
            f"{kind}:[{os.stat(pin).st_ino}]", kind
    assert ns_link(pods, a, "pid") != ns_link(pods, b, "pid")
    # Hostname, sysctls (set inside the pinned namespaces), /dev/shm shared by both.
    for cid in (a, b):
        assert pods.exec(cid, ["cat", "/proc/sys/kernel/hostname"]).stdout == b"pinned-host\n"
        assert pods.exec(cid, ["cat", "/etc/hostname"]).stdout == b"pinned-host\n"
        assert pods.exec(cid, ["cat", "/proc/sys/kernel/shm_rmid_forced"]).stdout == b"1\n"
        assert pods.exec(cid, ["cat", "/proc/sys/net/core/somaxconn"]).stdout == b"1234\n"
        assert pods.exec(cid, ["cat", "/proc/sys/net/ipv4/ping_group_range"]).stdout.split() \
            == [b"0", b"2147483647"]
    assert pods.exec(a, ["sh", "-c", "echo shared > /dev/shm/x"]).exit_code == 0
    assert pods.exec(b, ["cat", "/dev/shm/x"]).stdout == b"shared\n"
    # The pod's own (empty) cgroup, where cAdvisor looks for a sandbox.
    assert os.path.isdir(os.path.join(CGROUP_ROOT, "memory", "k8s.io", sid))
    # Pod stats: the network is read through a container in the pod's netns.
    stats = pods.rt.PodSandboxStats(pb.PodSandboxStatsRequest(pod_sandbox_id=sid),
                                    timeout=30).stats
    assert stats.linux.network.default_interface.name == "eth0"
    assert {c.attributes.id for c in stats.linux.containers} == {a, b}

    pods.stop_pod(sid)
    assert pods.pod_status(sid).status.state == pb.SANDBOX_NOTREADY
    assert not os.path.exists(pin_of(daemon, sid, "ipc"))
    assert not os.path.ismount(os.path.join(daemon.state, "sandboxes", sid, "shm"))
    pods.remove_pod(sid)
    assert not os.path.isdir(os.path.join(CGROUP_ROOT, "memory", "k8s.io", sid))


def test_host_network_pod_without_pause(daemon: Daemon, pods: Pods, clean: None) -> None:
    pod = unshared_pod()
    pod.linux.security_context.namespace_options.network = pb.NODE
    sid = pods.run(pod)
    assert sid not in runc_ids(os.path.join(daemon.state, "runc"))
    cid = pods.run_container(sid, sleeper(daemon, "h", pod), pod)
    # The node's network and hostname; an IPC namespace of the pod's own.
    assert ns_link(pods, cid, "net") == os.readlink("/proc/self/ns/net")
    assert pods.exec(cid, ["cat", "/proc/sys/kernel/hostname"]).stdout.decode().strip() \
        == os.uname().nodename
    assert not os.path.exists(pin_of(daemon, sid, "uts"))
    assert ns_link(pods, cid, "ipc") == f"ipc:[{os.stat(pin_of(daemon, sid, 'ipc')).st_ino}]"


@pytest.mark.parametrize("how", ["pid=POD", "handler sandboxer=podsandbox"])
def test_pods_that_keep_their_pause(daemon: Daemon, pods: Pods, clean: None, how: str) -> None:
    if how == "pid=POD":
        pod = pod_config()
        pod.linux.security_context.namespace_options.pid = pb.POD
        sid, root = pods.run(pod), os.path.join(daemon.state, "runc")
    else:
        pod = unshared_pod()
        sid = pods.run(pod, handler="paused")
        root = os.path.join(os.path.dirname(daemon.root), "paused-root")
    assert sid in runc_ids(root)
    info = json.loads(pods.pod_status(sid, verbose=True).info["info"])
    assert info["pid"] > 0


def test_container_asking_for_the_pods_pid_namespace(daemon: Daemon, pods: Pods,
                                                       clean: None) -> None:
    pod = unshared_pod()
    sid = pods.run(pod)
    cfg = sleeper(daemon, "wants-pod-pid", pod)
    cfg.linux.security_context.namespace_options.pid = pb.POD
    with pytest.raises(grpc.RpcError) as e:
        pods.create(sid, cfg, pod)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "shares no PID namespace" in (e.value.details() or "")


def test_restart_and_kill_keep_the_pod(tmp_path: Path, registry: LocalRegistry,
                                       test_images: TestImages) -> None:
    """A clean restart and a kill -9 find the pins again; a pod whose pins vanished
    while the daemon was down is not ready; nothing is left after removal."""
    config = _config(tmp_path, registry, test_images)
    with busybox_daemon(tmp_path, registry, test_images, config) as d:
        pods = Pods(d.client)
        pod = unshared_pod(hostname="survivor")
        sid = pods.run(pod)
        cid = pods.run_container(sid, sleeper(d, "s", pod), pod)
        lost = pods.run(unshared_pod())
    with busybox_daemon(tmp_path, registry, test_images, config) as d:
        pods = Pods(d.client)
        assert pods.pod_status(sid).status.state == pb.SANDBOX_READY
        assert pods.exec(cid, ["cat", "/proc/sys/kernel/hostname"]).stdout == b"survivor\n"
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
    # While the daemon is down, one pod's IPC namespace is lost (say, an operator's umount).
    subprocess.run(["umount", "-l", pin_of(d, lost, "ipc")], check=True)
    with busybox_daemon(tmp_path, registry, test_images, config) as d:
        pods = Pods(d.client)
        assert pods.pod_status(sid).status.state == pb.SANDBOX_READY
        assert pods.status(cid).status.state == pb.CONTAINER_RUNNING
        assert pods.pod_status(lost).status.state == pb.SANDBOX_NOTREADY
        second = pods.run_container(sid, sleeper(d, "t", pod), pod)
        assert ns_link(pods, second, "uts") == ns_link(pods, cid, "uts")
        pods.remove_pod(sid)
        pods.remove_pod(lost)
        assert leftovers(d.root, d.state) == []
