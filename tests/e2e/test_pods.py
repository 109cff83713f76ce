"""Pods and containers end to end: a real pycrid running real runc containers under conmon."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from pycrid.runtime import signals
from tests.support.daemon import Daemon
from tests.support.images import TestImages
from tests.support.pods import (
    Pods,
    busybox_daemon,
    container_config,
    leftovers,
    log_text,
    pod_config,
    read_cri_log,
    wait_for,
)
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e




@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, registry: LocalRegistry,
           test_images: TestImages) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("pods")
    with busybox_daemon(base, registry, test_images) as d:
        yield d


def test_lifecycle_output_exit_code(daemon: Daemon, pods: Pods, tmp_path: Path) -> None:
    pod = pod_config(log_dir=str(tmp_path / "logs"))
    sid = pods.run(pod)
    assert pods.pod_status(sid).status.state == pb.SANDBOX_READY
    cfg = container_config(daemon.extra["busybox"], "hello",
                           command=["sh", "-c", "echo out; echo err >&2; exit 3"],
                           log_path="hello.log")
    cid = pods.run_container(sid, cfg, pod)
    st = pods.wait_state(cid, pb.CONTAINER_EXITED)
    assert st.exit_code == 3
    assert st.reason == "Error"
    assert st.started_at > 0 and st.finished_at >= st.started_at
    log = str(tmp_path / "logs" / "hello.log")
    assert st.log_path == log
    assert log_text(log, "stdout") == "out\n"
    assert log_text(log, "stderr") == "err\n"
    # runc's container is deleted once its exit is recorded (containerd deletes the task at
    # its exit): RemoveContainer has no runc left to run.
    runc_root = os.path.join(daemon.state, "runc")
    wait_for(lambda: not os.path.exists(os.path.join(runc_root, cid)), 10,
             "runc's container to be deleted after its exit")
    assert pods.status(cid).status.state == pb.CONTAINER_EXITED
    pods.remove(cid)
    with pytest.raises(grpc.RpcError) as e:
        pods.status(cid)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    pods.stop_pod(sid)
    assert pods.pod_status(sid).status.state == pb.SANDBOX_NOTREADY
    pods.remove_pod(sid)


def test_exec_sync(daemon: Daemon, pods: Pods) -> None:
    pod = pod_config()
    sid = pods.run(pod)
    # Its init is not a sleep (the check below looks for sleeps): cat on an open stdin.
    cid = pods.run_container(sid, container_config(daemon.extra["busybox"], "cat",
                                                   command=["cat"], stdin=True), pod)
    pods.wait_state(cid, pb.CONTAINER_RUNNING)
    r = pods.exec(cid, ["sh", "-c", "echo hi; echo there >&2; exit 7"])
    assert (r.exit_code, r.stdout, r.stderr) == (7, b"hi\n", b"there\n")
    # A timed-out exec is dead, with what it started, by the time the error answers
    # (critest's check, and what the kubelet's exec probes rely on): no process, no
    # zombie left for the container's init to reap.
    for cmd in (["sleep", "30"], ["sh", "-c", "sleep 31 & sleep 32; true"]):
        with pytest.raises(grpc.RpcError) as e:
            pods.exec(cid, cmd, timeout=1)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # Every process's name, zombies included (the test image has no pgrep).
        names = pods.exec(cid, ["sh", "-c", "cat /proc/[0-9]*/comm"]).stdout.split()
        assert b"sleep" not in names, (cmd, names)
    pods.stop(cid, timeout=2)
    assert pods.status(cid).status.exit_code == 137 or pods.status(cid).status.exit_code == 143


@pytest.fixture
def clean(daemon: Daemon, pods: Pods) -> Iterator[None]:
    """After the test's own cleanup, nothing of its pods may remain."""
    yield
    pods.cleanup()
    assert leftovers(daemon.root, daemon.state) == []


def _sleeper(daemon: Daemon, name: str = "sleeper", **kw: object) -> object:
    return container_config(daemon.extra["busybox"], name, command=["sleep", "3600"], **kw)


def test_env_args_workdir_user_inside(daemon: Daemon, pods: Pods, clean: None) -> None:
    pod = pod_config(hostname="podhost")
    sid = pods.run(pod)
    cfg = container_config(
        daemon.extra["busybox"], "env", command=["sleep"], args=["3600"],
        working_dir="/tmp", envs=[pb.KeyValue(key="FOO", value="bar")],
        linux=pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
            run_as_user=pb.Int64Value(value=1000), supplemental_groups=[1234],
            # Its own pid namespace (the kubelet's default): the command is pid 1.
            namespace_options=pb.NamespaceOption(pid=pb.CONTAINER))))
    cid = pods.run_container(sid, cfg, pod)
    r = pods.exec(cid, ["sh", "-c", "echo $FOO; pwd; id -u; id -G; hostname; "
                        "cat /proc/1/cmdline | tr '\\0' ' '"])
    out = r.stdout.decode().splitlines()
    assert out[0] == "bar"
    assert out[1] == "/tmp"
    assert out[2] == "1000"
    assert "1234" in out[3].split()
    assert out[4] == "podhost"
    assert out[5].strip() == "sleep 3600"
    st = pods.status(cid).status
    assert st.user.linux.uid == 1000 and 1234 in st.user.linux.supplemental_groups
    assert st.state == pb.CONTAINER_RUNNING and st.started_at > 0 and st.finished_at == 0


def test_read_only_rootfs(daemon: Daemon, pods: Pods, clean: None) -> None:
    pod = pod_config()
    sid = pods.run(pod)
    ro = _sleeper(daemon, "ro", linux=pb.LinuxContainerConfig(
        security_context=pb.LinuxContainerSecurityContext(readonly_rootfs=True)))
    rw = _sleeper(daemon, "rw")
    cid_ro = pods.run_container(sid, ro, pod)
    cid_rw = pods.run_container(sid, rw, pod)
    r = pods.exec(cid_ro, ["sh", "-c", "touch /file"])
    assert r.exit_code != 0 and b"Read-only file system" in r.stderr
    assert pods.exec(cid_ro, ["sh", "-c", "touch /dev/shm/x"]).exit_code == 0
    assert pods.exec(cid_rw, ["sh", "-c", "touch /file && ls /file"]).exit_code == 0


def test_containers_share_network_and_ipc(daemon: Daemon, pods: Pods, clean: None) -> None:
    pod = pod_config()
    sid = pods.run(pod)
    a = pods.run_container(sid, _sleeper(daemon, "a"), pod)
    b = pods.run_container(sid, _sleeper(daemon, "b"), pod)
    other_pod = pod_config()
    c = pods.run_container(pods.run(other_pod), _sleeper(daemon, "c"), other_pod)

    def ns(cid: str, kind: str) -> str:
        return pods.exec(cid, ["readlink", f"/proc/self/ns/{kind}"]).stdout.decode().strip()

    for kind in ("net", "ipc", "uts"):
        assert ns(a, kind) == ns(b, kind) != ns(c, kind), kind
    assert ns(a, "mnt") != ns(b, "mnt")
    # /dev/shm is the pod's: a file written by one container is seen by the other.
    assert pods.exec(a, ["sh", "-c", "echo shared > /dev/shm/f"]).exit_code == 0
    assert pods.exec(b, ["cat", "/dev/shm/f"]).stdout == b"shared\n"
    # Loopback, up, and the CNI interface.
    assert pods.exec(a, ["ls", "/sys/class/net"]).stdout.split() == [b"eth0", b"lo"]
    flags = int(pods.exec(a, ["cat", "/sys/class/net/lo/flags"]).stdout, 16)
    assert flags & 0x1, "lo is not up"


def test_stop_timeout_kills_a_container_that_ignores_sigterm(
        daemon: Daemon, pods: Pods, clean: None) -> None:
    pod = pod_config()
    sid = pods.run(pod)
    cfg = container_config(daemon.extra["busybox"], "stubborn", command=[
        "sh", "-c", "trap '' TERM; while true; do sleep 0.1; done"])
    cid = pods.run_container(sid, cfg, pod)
    time.sleep(0.3)  # let the shell install its trap
    started = time.monotonic()
    pods.stop(cid, timeout=2)
    took = time.monotonic() - started
    st = pods.status(cid).status
    assert st.state == pb.CONTAINER_EXITED
    assert st.exit_code == 137 and st.reason == "Error"
    assert took >= 1.5, "SIGKILL came before the stop timeout"
    pods.stop(cid, timeout=2)  # idempotent


def test_sigterm_stops_a_well_behaved_container(daemon: Daemon, pods: Pods,
                                                clean: None) -> None:
    pod = pod_config()
    sid = pods.run(pod)
    cfg = container_config(daemon.extra["busybox"], "polite", command=[
        "sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.1; done"])
    cid = pods.run_container(sid, cfg, pod)
    time.sleep(0.3)
    pods.stop(cid, timeout=30)
    st = pods.status(cid).status
    assert (st.state, st.exit_code, st.reason) == (pb.CONTAINER_EXITED, 0, "Completed")


def test_stop_signals_a_private_pid_namespace_init_directly(
        daemon: Daemon, pods: Pods, clean: None) -> None:
    """The kubelet's default (pid CONTAINER): StopContainer signals the init through a pidfd
    after checking runc's recorded start time (runtime/signals.py), and the grace period
    and the exit code are the same as through ``runc kill``."""
    pod = pod_config()
    sid = pods.run(pod)
    own_pid = pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
        namespace_options=pb.NamespaceOption(pid=pb.CONTAINER)))
    polite = pods.run_container(sid, container_config(
        daemon.extra["busybox"], "polite", linux=own_pid,
        command=["sh", "-c", "trap 'exit 3' TERM; while true; do sleep 0.1; done"]), pod)
    stubborn = pods.run_container(sid, container_config(
        daemon.extra["busybox"], "stubborn", linux=own_pid,
        command=["sh", "-c", "trap '' TERM; while true; do sleep 0.1; done"]), pod)
    time.sleep(0.3)
    for cid in (polite, stubborn):
        with open(os.path.join(daemon.state, "runc", cid, "state.json")) as f:
            state = json.load(f)
        pid = state["init_process_pid"]
        assert signals._private_pid_namespace(state)
        assert signals._start_time(pid) == state["init_process_start"]
    pods.stop(polite, timeout=30)
    st = pods.status(polite).status
    assert (st.state, st.exit_code, st.reason) == (pb.CONTAINER_EXITED, 3, "Error")
    started = time.monotonic()
    pods.stop(stubborn, timeout=1)
    assert time.monotonic() - started >= 0.8, "SIGKILL came before the stop timeout"
    st = pods.status(stubborn).status
    assert (st.state, st.exit_code) == (pb.CONTAINER_EXITED, 137)


def test_name_conflicts(daemon: Daemon, pods: Pods, clean: None) -> None:
    pod = pod_config()
    sid = pods.run(pod)
    with pytest.raises(grpc.RpcError) as e:
        pods.run(pod)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert sid in e.value.details() and pod.metadata.name in e.value.details()
    cid = pods.create(sid, _sleeper(daemon, "dup"), pod)
    with pytest.raises(grpc.RpcError) as e:
        pods.create(sid, _sleeper(daemon, "dup"), pod)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert cid in e.value.details() and "dup" in e.value.details()
    # Removing the container frees its name.
    pods.remove(cid)
    cid2 = pods.create(sid, _sleeper(daemon, "dup"), pod)
    assert cid2 != cid


def test_remove_running_pod_removes_everything(daemon: Daemon, pods: Pods,
                                               clean: None) -> None:
    pod = pod_config()
    sid = pods.run(pod)
    cids = [pods.run_container(sid, _sleeper(daemon, f"c{i}"), pod) for i in range(2)]
    pods.remove_pod(sid)
    assert pods.rt.ListContainers(pb.ListContainersRequest(), timeout=10).containers == []
    for cid in cids:
        with pytest.raises(grpc.RpcError) as e:
            pods.status(cid)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as e:
        pods.pod_status(sid)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    # Idempotent, as in containerd.
    pods.stop_pod(sid)
    pods.remove_pod(sid)


def _code(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as e:
        call()  # type: ignore[operator]
    return e.value.code()


def test_bad_requests(daemon: Daemon, pods: Pods, clean: None) -> None:
    rt = pods.rt
    missing = "f" * 64
    assert _code(lambda: rt.RunPodSandbox(pb.RunPodSandboxRequest(
        config=pb.PodSandboxConfig()), timeout=10)) == grpc.StatusCode.INVALID_ARGUMENT
    assert _code(lambda: pods.run(pod_config(), handler="kata")) == \
        grpc.StatusCode.INVALID_ARGUMENT
    pod = pod_config()
    sid = pods.run(pod)
    assert _code(lambda: pods.create(sid, pb.ContainerConfig(
        image=pb.ImageSpec(image=daemon.extra["busybox"])), pod)) == \
        grpc.StatusCode.INVALID_ARGUMENT
    assert _code(lambda: pods.create(missing, _sleeper(daemon), pod)) == \
        grpc.StatusCode.NOT_FOUND
    assert _code(lambda: pods.create(sid, container_config(
        "127.0.0.1:1/nope:latest", "x"), pod)) == grpc.StatusCode.NOT_FOUND
    assert _code(lambda: pods.status(missing)) == grpc.StatusCode.NOT_FOUND
    assert _code(lambda: pods.pod_status(missing)) == grpc.StatusCode.NOT_FOUND
    assert _code(lambda: pods.start(missing)) == grpc.StatusCode.NOT_FOUND
    assert _code(lambda: pods.exec(missing, ["true"])) == grpc.StatusCode.NOT_FOUND
    assert _code(lambda: pods.status("")) == grpc.StatusCode.INVALID_ARGUMENT
    # Stop and remove of an unknown id succeed (containerd: idempotent).
    pods.stop(missing)
    pods.remove(missing)
    pods.stop_pod(missing)
    # State errors.
    cid = pods.create(sid, container_config(daemon.extra["busybox"], "once",
                                            command=["true"]), pod)
    assert _code(lambda: pods.exec(cid, ["true"])) == grpc.StatusCode.FAILED_PRECONDITION
    pods.start(cid)
    pods.wait_state(cid, pb.CONTAINER_EXITED)
    assert _code(lambda: pods.start(cid)) == grpc.StatusCode.FAILED_PRECONDITION
    assert _code(lambda: pods.exec(cid, [])) == grpc.StatusCode.INVALID_ARGUMENT
    pods.stop_pod(sid)
    assert _code(lambda: pods.create(sid, _sleeper(daemon, "late"), pod)) == \
        grpc.StatusCode.FAILED_PRECONDITION


def test_id_prefixes_and_filters(daemon: Daemon, pods: Pods, clean: None) -> None:
    pod = pod_config(labels={"app": "web"})
    sid = pods.run(pod)
    other = pods.run(pod_config(labels={"app": "db"}))
    cid = pods.create(sid, _sleeper(daemon, "p", labels={"tier": "front"}), pod)
    assert pods.status(cid[:12]).status.id == cid
    assert pods.pod_status(sid[:8]).status.id == sid
    pods.start(cid[:10])
    pods.wait_state(cid, pb.CONTAINER_RUNNING)

    def pods_where(**kw: object) -> list[str]:
        return [p.id for p in pods.rt.ListPodSandbox(pb.ListPodSandboxRequest(
            filter=pb.PodSandboxFilter(**kw)), timeout=10).items]

    def containers_where(**kw: object) -> list[str]:
        return [c.id for c in pods.rt.ListContainers(pb.ListContainersRequest(
            filter=pb.ContainerFilter(**kw)), timeout=10).containers]

    assert pods_where(label_selector={"app": "web"}) == [sid]
    assert pods_where(id=other[:10]) == [other]
    assert set(pods_where(state=pb.PodSandboxStateValue(state=pb.SANDBOX_READY))) >= {sid, other}
    assert containers_where(pod_sandbox_id=sid[:6]) == [cid]
    assert containers_where(label_selector={"tier": "front"}) == [cid]
    assert containers_where(label_selector={"tier": "back"}) == []
    assert containers_where(state=pb.ContainerStateValue(state=pb.CONTAINER_RUNNING)) == [cid]
    assert containers_where(state=pb.ContainerStateValue(state=pb.CONTAINER_EXITED)) == []
    pods.stop_pod(other)
    assert other not in pods_where(state=pb.PodSandboxStateValue(state=pb.SANDBOX_READY))
    assert other in pods_where(state=pb.PodSandboxStateValue(state=pb.SANDBOX_NOTREADY))
    listed = pods.rt.ListContainers(pb.ListContainersRequest(), timeout=10).containers
    assert [c.pod_sandbox_id for c in listed] == [sid]
    assert listed[0].image.image == daemon.extra["busybox"]


def test_pod_files_and_dns(daemon: Daemon, pods: Pods, clean: None) -> None:
    pod = pod_config(hostname="dnspod", dns_config=pb.DNSConfig(
        servers=["10.0.0.10"], searches=["ns.svc.cluster.local", "cluster.local"],
        options=["ndots:5"]))
    sid = pods.run(pod)
    cid = pods.run_container(sid, _sleeper(daemon), pod)
    assert pods.exec(cid, ["cat", "/etc/resolv.conf"]).stdout == (
        b"search ns.svc.cluster.local cluster.local\nnameserver 10.0.0.10\noptions ndots:5\n")
    assert pods.exec(cid, ["cat", "/etc/hostname"]).stdout == b"dnspod\n"
    with open("/etc/hosts", "rb") as f:
        assert pods.exec(cid, ["cat", "/etc/hosts"]).stdout == f.read()
    shm = pods.exec(cid, ["sh", "-c", "grep ' /dev/shm ' /proc/mounts"]).stdout.decode()
    assert "tmpfs" in shm and "size=65536k" in shm
    st = pods.pod_status(sid, verbose=True)
    info = json.loads(st.info["info"])
    assert info["pid"] > 0 and info["runtimeSpec"]["hostname"] == "dnspod"
    assert [c.id for c in st.containers_statuses] == [cid]


def test_host_network_pod(daemon: Daemon, pods: Pods, clean: None) -> None:
    pod = pod_config(linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
        namespace_options=pb.NamespaceOption(network=pb.NODE))))
    sid = pods.run(pod)
    cid = pods.run_container(sid, _sleeper(daemon), pod)
    host_ns = os.readlink("/proc/self/ns/net")
    assert pods.exec(cid, ["readlink", "/proc/self/ns/net"]).stdout.decode().strip() == host_ns
    r = pods.exec(cid, ["sh", "-c", "hostname; echo $HOSTNAME"])
    assert r.stdout.decode().split() == [os.uname().nodename] * 2
    with pytest.raises(grpc.RpcError) as e:
        pods.run(pod_config(hostname="x", linux=pod.linux))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_long_lines_become_partial_records(daemon: Daemon, pods: Pods, clean: None,
                                           tmp_path: Path) -> None:
    pod = pod_config(log_dir=str(tmp_path))
    sid = pods.run(pod)
    cfg = container_config(daemon.extra["busybox"], "long", log_path="long.log", command=[
        "sh", "-c", "head -c 20000 /dev/zero | tr '\\0' x; echo; printf tail"])
    cid = pods.run_container(sid, cfg, pod)
    pods.wait_state(cid, pb.CONTAINER_EXITED)
    records = read_cri_log(str(tmp_path / "long.log"))
    assert {tag for _, tag, _ in records} == {"P", "F"}
    assert log_text(str(tmp_path / "long.log")) == "x" * 20000 + "\n" + "tail"
    assert records[-1][1] == "P"  # the unterminated last line


def test_exec_output_and_exit_codes(daemon: Daemon, pods: Pods, clean: None) -> None:
    pod = pod_config()
    sid = pods.run(pod)
    cid = pods.run_container(sid, _sleeper(daemon), pod)
    assert pods.exec(cid, ["sh", "-c", "kill -9 $$"]).exit_code == 137
    big = pods.exec(cid, ["sh", "-c", "head -c 3000000 /dev/zero"])
    assert big.exit_code == 0 and len(big.stdout) == 3_000_000
    r = pods.exec(cid, ["/does-not-exist"])
    assert r.exit_code != 0 and b"does-not-exist" in r.stderr


def test_mounts_and_devices(daemon: Daemon, pods: Pods, clean: None, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "hello").write_text("from host\n")
    missing = tmp_path / "made-for-me"
    pod = pod_config()
    sid = pods.run(pod)
    cfg = _sleeper(daemon, mounts=[
        pb.Mount(container_path="/data", host_path=str(shared), readonly=True),
        pb.Mount(container_path="/scratch", host_path=str(missing)),
    ], devices=[pb.Device(host_path="/dev/null", container_path="/dev/mynull",
                          permissions="rw")])
    cid = pods.run_container(sid, cfg, pod)
    assert pods.exec(cid, ["cat", "/data/hello"]).stdout == b"from host\n"
    assert b"Read-only" in pods.exec(cid, ["sh", "-c", "touch /data/x"]).stderr
    assert pods.exec(cid, ["sh", "-c", "echo hi > /scratch/f"]).exit_code == 0
    assert (missing / "f").read_text() == "hi\n"
    assert pods.exec(cid, ["sh", "-c", "echo x > /dev/mynull"]).exit_code == 0
    st = pods.status(cid).status
    assert [m.container_path for m in st.mounts] == ["/data", "/scratch"]
    with pytest.raises(grpc.RpcError) as e:
        pods.create(sid, _sleeper(daemon, "baddev", devices=[
            pb.Device(host_path=str(shared / "hello"), container_path="/dev/x")]), pod)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_parallel_pods_and_repeated_stops(daemon: Daemon, pods: Pods, clean: None) -> None:
    configs = [pod_config() for _ in range(4)]
    with ThreadPoolExecutor(4) as pool:
        sids = list(pool.map(pods.run, configs))
        cids = list(pool.map(lambda a: pods.run_container(a[0], _sleeper(daemon), a[1]),
                             zip(sids, configs, strict=True)))
        # Two stops of one container at once: both succeed, one signal is enough.
        list(pool.map(lambda _: pods.stop(cids[0], timeout=5), range(2)))
    assert len(set(sids)) == 4
    assert pods.status(cids[0]).status.state == pb.CONTAINER_EXITED
    for cid in cids[1:]:
        assert pods.status(cid).status.state == pb.CONTAINER_RUNNING


def test_reopen_container_log(daemon: Daemon, pods: Pods, clean: None, tmp_path: Path) -> None:
    pod = pod_config(log_dir=str(tmp_path))
    sid = pods.run(pod)
    cid = pods.run_container(sid, container_config(
        daemon.extra["busybox"], "ticker", log_path="t.log", command=[
            "sh", "-c", "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.05; done"]), pod)
    log = tmp_path / "t.log"
    wait_for(lambda: "tick 2" in log_text(str(log)), 10, "some output")
    os.rename(log, tmp_path / "t.log.1")
    pods.rt.ReopenContainerLog(pb.ReopenContainerLogRequest(container_id=cid), timeout=10)
    # The kubelet opens the path as soon as the call returns: it must be there already.
    assert log.exists()
    wait_for(lambda: "tick" in log_text(str(log)), 10, "output in the reopened log")
    old = log_text(str(tmp_path / "t.log.1")).split()
    new = log_text(str(log)).split()
    assert int(new[1]) > int(old[1])
    pods.stop(cid)
    os.rename(log, tmp_path / "t.log.2")
    with pytest.raises(grpc.RpcError) as e:
        pods.rt.ReopenContainerLog(pb.ReopenContainerLogRequest(container_id=cid), timeout=10)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not running" in str(e.value.details())
    assert not log.exists()  # refused without creating a file (containerd's choice)
