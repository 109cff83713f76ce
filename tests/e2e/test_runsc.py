"""gVisor (runsc) as a runtime handler, end to end: the handler pycrid offers when runsc is
installed (no config), a pod with ``runtime_handler = "runsc"`` through its whole life,
with the real crictl where ../shared/interop has it.

What shows the container really runs on gVisor's kernel: its ``dmesg`` starts with
"Starting gVisor...", and its ``uname -r`` is the sentry's, not the host's.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from tests.e2e.test_recovery import STARTED, STOPPED, Subscriber
from tests.e2e.test_streaming import _in_terminal, _run
from tests.support import interop
from tests.support.daemon import Daemon, running_daemon
from tests.support.images import TestImages
from tests.support.pods import (
    Pods,
    busybox_daemon,
    container_cgroups,
    container_config,
    daemon_config,
    leftovers,
    log_text,
    pod_config,
    processes_mentioning,
    wait_for,
)
from tests.support.registry import LocalRegistry

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(shutil.which("runsc") is None,
                                 reason="runsc (gVisor) is not installed: apt-get install runsc "
                                        "(scripts/setup.sh installs it)")]

#: What the interop folder's static web server answers on port 80 (critest's nginx).
PAGE = "It works!"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, registry: LocalRegistry,
           test_images: TestImages) -> Iterator[Daemon]:
    """A daemon with no runtime handler configured: runsc is offered all the same."""
    base = tmp_path_factory.mktemp("runsc")
    with busybox_daemon(base, registry, test_images) as d:
        yield d


@pytest.fixture(scope="module")
def web(registry: LocalRegistry, daemon: Daemon) -> str:
    """The static web server of ../shared/interop/images (critest's nginx), pulled. busybox's
    httpd is no stand-in here: under gVisor it closes a connection whose request comes
    after the connect, which is what a port-forward does."""
    if not (interop.ROOT / "images" / "refs.txt").exists():
        pytest.skip(f"{interop.ROOT / 'images'} is not here (the interop images live in "
                    "../shared/interop beside the checkout; a user's checkout has none)")
    ref = interop.push_as(registry, "e2e-test-images/nginx:1.14-2", "runsc-test/web:1")
    daemon.client.pull(ref)
    return ref


def _runsc_pod(pods: Pods, tmp: Path, **kw: Any) -> tuple[str, Any]:
    config = pod_config(log_dir=str(tmp / "logs"), **kw)
    return pods.run(config, "runsc"), config


def _sleeper(image: str, name: str = "sleeper", **kw: Any) -> Any:
    return container_config(image, name, command=["sleep", "3600"], **kw)


def _on_gvisor(pods: Pods, cid: str) -> None:
    dmesg = pods.exec(cid, ["busybox", "dmesg"]).stdout.decode()
    assert "Starting gVisor" in dmesg, dmesg
    assert pods.exec(cid, ["busybox", "uname", "-r"]).stdout.decode().strip() != platform.release()


def test_status_offers_runsc_without_config(daemon: Daemon) -> None:
    resp = daemon.client.runtime.Status(pb.StatusRequest(verbose=True), timeout=10)
    handlers = {h.name: h.features for h in resp.runtime_handlers}
    assert "runsc" in handlers and handlers["runsc"].recursive_read_only_mounts
    assert not handlers["runsc"].user_namespaces
    listed = json.loads(resp.info["handlers"])
    runsc = listed["runsc"]
    assert (runsc["sandboxed"], runsc["runtime_type"], runsc["pod_sandbox"]) == (
        True, "io.containerd.runsc.v1", "pause")
    assert runsc["binary"] == shutil.which("runsc") and runsc["version"]
    assert "--network=host" in runsc["flags"] and "--oci-seccomp=true" in runsc["flags"]
    assert runsc["update_resources"] is False and listed["runc"]["sandboxed"] is False
    text = subprocess.run([sys.executable, "-m", "pycrid", "status", "--address",
                           daemon.address], capture_output=True, text=True, timeout=60).stdout
    assert "gVisor runsc" in text, text


def test_crictl_lifecycle(daemon: Daemon, web: str, tmp_path: Path) -> None:
    """The real crictl, as a user runs a RuntimeClass pod: runp --runtime runsc, create,
    start, logs, exec (sync and both streaming transports), stats, stop, rm."""
    crictl = interop.crictl(daemon.address, tmp_path)
    (tmp_path / "logs").mkdir()
    pod_json = tmp_path / "pod.json"
    pod_json.write_text(json.dumps({
        "metadata": {"name": "gvisor-crictl", "namespace": "default", "uid": "gvisor-crictl"},
        "log_directory": str(tmp_path / "logs"), "linux": {}}))
    web_json, shell_json = tmp_path / "web.json", tmp_path / "shell.json"
    web_json.write_text(json.dumps({"metadata": {"name": "web"}, "image": {"image": web}}))
    shell_json.write_text(json.dumps({
        "metadata": {"name": "shell"}, "image": {"image": daemon.extra["busybox"]},
        "command": ["sh", "-c", "echo hello from the sandbox; exec sleep 3600"],
        "log_path": "shell.log"}))

    def ok(*args: str) -> str:
        done = _run([*crictl, *args])
        assert done.returncode == 0, (args, done.stderr)
        return done.stdout.decode().strip()

    sid = ok("runp", "--runtime", "runsc", str(pod_json))
    try:
        ids = [ok("create", sid, str(spec), str(pod_json)) for spec in (web_json, shell_json)]
        for cid in ids:
            ok("start", cid)
        cid = ids[1]
        pod = json.loads(ok("inspectp", sid))
        assert pod["status"]["state"] == "SANDBOX_READY"
        assert pod["status"]["runtimeHandler"] == "runsc"
        # The pod answers on its IP from the node (runsc uses the pod's netns directly).
        ip = pod["status"]["network"]["ip"]
        wait_for(lambda: _serving(ip), 30, "the web server on the pod's IP")
        wait_for(lambda: "hello from the sandbox" in ok("logs", cid), 30, "the shell's line")
        assert "Starting gVisor" in ok("exec", "-s", cid, "busybox", "dmesg")
        for transport in ("spdy", "websocket"):
            done = _run([*crictl, "exec", "-i", "-r", transport, cid, "sh", "-c",
                         "cat; echo err >&2"], stdin=b"through " + transport.encode() + b"\n")
            assert (done.returncode, done.stdout, done.stderr) == (
                0, b"through " + transport.encode() + b"\n", b"err\n"), transport
        stats = json.loads(ok("stats", "-o", "json", "--id", cid))["stats"][0]
        assert int(stats["cpu"]["usageCoreNanoSeconds"]["value"]) > 0, stats
        assert int(stats["memory"]["workingSetBytes"]["value"]) > 0, stats
        pod_stats = json.loads(ok("statsp", "-o", "json", "--id", sid))["stats"][0]["linux"]
        assert int(pod_stats["cpu"]["usageCoreNanoSeconds"]["value"]) > 0, pod_stats
        assert int(pod_stats["memory"]["workingSetBytes"]["value"]) > 0, pod_stats
        info = json.loads(ok("info"))
        assert info["handlers"]["runsc"]["sandboxed"] is True, info.get("handlers")
        for cid in ids:
            ok("stop", cid)
            ok("rm", cid)
    finally:
        _run([*crictl, "stopp", sid])
        _run([*crictl, "rmp", sid])


def _serving(ip: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{ip}:80/", timeout=5) as resp:
            return PAGE in resp.read().decode()
    except OSError:
        return False


def test_port_forward_and_attach_with_crictl(daemon: Daemon, pods: Pods, tmp_path: Path) -> None:
    """Port-forward into the pod's network namespace (the one runsc's sandbox uses with
    --network=host) both ways, with both of crictl's transports; then attach.

    The server is nc, not a web server: under runsc 20221219 with the host's network a
    server that reads an accepted connection after a SO_RCVTIMEO or from a forked child
    (busybox httpd, the interop web server, nc -e) reads nothing when the request comes
    later than the connect, which a port-forward's always does (a gVisor bug)."""
    sid, config = _runsc_pod(pods, tmp_path)
    crictl = interop.crictl(daemon.address, tmp_path)
    for port, transport in ((8081, "spdy"), (8082, "websocket")):
        nc = pods.run_container(sid, container_config(
            daemon.extra["busybox"], f"nc-{transport}", log_path=f"nc-{transport}.log",
            command=["sh", "-c", f"echo banner-{port} | busybox nc -l -p {port}"]), config)
        proc = subprocess.Popen([*crictl, "port-forward", "-r", transport, sid, f"0:{port}"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None
        try:
            first = proc.stdout.readline().decode()
            assert first.startswith("Forwarding from 127.0.0.1:"), (first, proc.poll())
            local = int(first.split(":")[1].split()[0])
            with socket.create_connection(("127.0.0.1", local), timeout=30) as conn:
                got = b""
                while not got.endswith(b"\n"):
                    chunk = conn.recv(100)
                    assert chunk, got
                    got += chunk
                assert got == f"banner-{port}\n".encode()
                conn.sendall(f"ping through {transport}\n".encode())
            log, sent = str(tmp_path / "logs" / f"nc-{transport}.log"), f"ping through {transport}"
            wait_for(lambda log=log, sent=sent: sent in log_text(log), 30,  # type: ignore[misc]
                     "the pod to get the client's bytes")
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 0, transport
        pods.wait_state(nc, pb.CONTAINER_EXITED)
        cid = pods.run_container(sid, container_config(
            daemon.extra["busybox"], f"attach-{transport}", stdin=True, stdin_once=True,
            command=["sh", "-c", "read l; echo got:$l; echo err:$l >&2; exit 4"]), config)
        done = _run([*crictl, "attach", "-i", "-r", transport, cid], stdin=b"one\n")
        assert (done.returncode, done.stdout, done.stderr) == (0, b"got:one\n", b"err:one\n")
        assert pods.wait_state(cid, pb.CONTAINER_EXITED).exit_code == 4
        # exec -it: runsc exec gets our terminal and sizes the sandboxed process's.
        shell = pods.run_container(sid, _sleeper(daemon.extra["busybox"], f"tty-{transport}"),
                                   config)
        status, screen = _in_terminal([*crictl, "exec", "-it", "-r", transport, shell, "sh"],
                                      b"stty size; tty; exit 3\r", rows=33, cols=111)
        lines = screen.replace(b"\r", b"")
        assert b"\n33 111\n" in lines, screen
        assert status == 1 and b"command terminated with exit code 3" in screen, screen


def test_lifecycle_exec_stop_and_events(daemon: Daemon, pods: Pods, tmp_path: Path) -> None:
    events = Subscriber(daemon.client)
    try:
        sid, config = _runsc_pod(pods, tmp_path)
        assert pods.pod_status(sid).status.runtime_handler == "runsc"
        # Exits on its own: code and logs.
        done = pods.run_container(sid, container_config(
            daemon.extra["busybox"], "done", log_path="done.log",
            command=["sh", "-c", "echo out; echo err >&2; exit 3"]), config)
        st = pods.wait_state(done, pb.CONTAINER_EXITED)
        assert (st.exit_code, st.reason) == (3, "Error")
        log = str(tmp_path / "logs" / "done.log")
        assert (log_text(log, "stdout"), log_text(log, "stderr")) == ("out\n", "err\n")
        events.wait((done, STARTED))
        events.wait((done, STOPPED))

        # Stop with a grace period: TERM is caught, the exit code is the container's.
        polite = pods.run_container(sid, container_config(
            daemon.extra["busybox"], "polite",
            command=["sh", "-c", "trap 'exit 9' TERM; while true; do sleep 0.2; done"]),
            config)
        _on_gvisor(pods, polite)
        pods.stop(polite, timeout=30)
        st = pods.status(polite).status
        assert (st.state, st.exit_code) == (pb.CONTAINER_EXITED, 9)
        # TERM ignored: SIGKILL when the grace period ends.
        stubborn = pods.run_container(sid, container_config(
            daemon.extra["busybox"], "stubborn",
            command=["sh", "-c", "trap '' TERM; while true; do sleep 0.2; done"]), config)
        started = time.monotonic()
        pods.stop(stubborn, timeout=2)
        assert time.monotonic() - started >= 2
        assert pods.status(stubborn).status.exit_code == 137

        # ExecSync: output, exit code, and a timeout that ends the process in the sandbox.
        cid = pods.run_container(sid, _sleeper(daemon.extra["busybox"]), config)
        r = pods.exec(cid, ["sh", "-c", "echo hi; echo oops >&2; exit 5"])
        assert (r.stdout, r.stderr, r.exit_code) == (b"hi\n", b"oops\n", 5)
        with pytest.raises(grpc.RpcError) as e:
            pods.exec(cid, ["sleep", "333"], timeout=1)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        ps = pods.exec(cid, ["ps", "-o", "args"]).stdout.decode()
        assert "sleep 333" not in ps, ps
        # UpdateContainerResources: refused, saying why.
        with pytest.raises(grpc.RpcError) as e:
            pods.rt.UpdateContainerResources(pb.UpdateContainerResourcesRequest(
                container_id=cid, linux=pb.LinuxContainerResources(memory_limit_in_bytes=1 << 26)),
                timeout=30)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "runsc" in (e.value.details() or "") and "update" in (e.value.details() or "")
        # Stopping the pod stops the running container and its sandbox at once: the
        # container's runsc state and the cgroups runsc made for it go all the same.
        pods.stop_pod(sid)
        assert pods.pod_status(sid).status.state == pb.SANDBOX_NOTREADY
        assert pods.status(cid).status.state == pb.CONTAINER_EXITED
        pods.remove_pod(sid)
        ids = {sid, done, polite, stubborn, cid}
        wait_for(lambda: not container_cgroups(ids), 10, "the pod's cgroups to go")
        assert not [n for n in os.listdir(os.path.join(daemon.state, "runsc"))
                    if any(i in n for i in ids)]
    finally:
        events.close()


def test_stats_and_metrics_are_not_zero(daemon: Daemon, pods: Pods, tmp_path: Path) -> None:
    sid, config = _runsc_pod(pods, tmp_path)
    busy = pods.run_container(sid, container_config(
        daemon.extra["busybox"], "busy",
        command=["sh", "-c", "x=; while true; do x=$x.; [ ${#x} -gt 100000 ] && x=; done"]),
        config)
    idle = pods.run_container(sid, _sleeper(daemon.extra["busybox"]), config)
    time.sleep(1)
    stats = pods.rt.ContainerStats(pb.ContainerStatsRequest(container_id=busy),
                                   timeout=30).stats
    assert stats.cpu.usage_core_nano_seconds.value > 0
    assert stats.memory.working_set_bytes.value > 0
    pod = pods.rt.PodSandboxStats(pb.PodSandboxStatsRequest(pod_sandbox_id=sid),
                                  timeout=30).stats
    # The pod's figures are its sandbox cgroup's (read a moment before its containers').
    assert pod.linux.cpu.usage_core_nano_seconds.value > 0
    assert pod.linux.memory.working_set_bytes.value > 0
    assert {c.attributes.id for c in pod.linux.containers} == {busy, idle}
    metrics = pods.rt.ListPodSandboxMetrics(pb.ListPodSandboxMetricsRequest(),
                                            timeout=30).pod_metrics
    mine = next(m for m in metrics if m.pod_sandbox_id == sid)
    names = {c.container_id: {m.name for m in c.metrics} for c in mine.container_metrics}
    assert {"container_cpu_usage_seconds_total", "container_memory_working_set_bytes"} <= \
        names[busy], names
    descriptors = pods.rt.ListMetricDescriptors(pb.ListMetricDescriptorsRequest(), timeout=30)
    assert {d.name for d in descriptors.descriptors} >= names[busy]


def test_failed_start_leaves_nothing(daemon: Daemon, pods: Pods, tmp_path: Path) -> None:
    sid, config = _runsc_pod(pods, tmp_path)
    cid = pods.create(sid, container_config(daemon.extra["busybox"], "nope",
                                            command=["/no/such/program"]), config)
    with pytest.raises(grpc.RpcError) as e:
        pods.start(cid)
    assert "/no/such/program" in (e.value.details() or "")
    st = pods.status(cid).status
    assert (st.state, st.reason) == (pb.CONTAINER_EXITED, "StartError")
    # Its monitor and conmon went with it; only the pod's sandbox remains.
    bundle = os.path.join(daemon.state, "containers", cid)
    try:
        wait_for(lambda: not processes_mentioning(bundle), 10, "the container processes to go")
    except AssertionError:
        raise AssertionError(processes_mentioning(bundle)) from None
    # Deleted before it ever started: the same.
    never = pods.create(sid, _sleeper(daemon.extra["busybox"], "never"), config)
    pods.remove(never)
    wait_for(lambda: not processes_mentioning(os.path.join(daemon.state, "containers", never)),
             10, "the never-started container's processes to go")
    pods.remove(cid)
    pods.remove_pod(sid)
    assert not processes_mentioning(os.path.join(daemon.state, "sandboxes", sid))


def test_failed_run_pod_sandbox_leaves_no_monitor(tmp_path: Path, registry: LocalRegistry,
                                                  test_images: TestImages) -> None:
    """The sandbox is created and its start fails (here at a fail point): RunPodSandbox
    undoes it, and neither the sandbox nor its conmon is left running (a conmon once
    outlived the daemon this way)."""
    config = daemon_config(registry, test_images, tmp_path)
    with running_daemon(str(tmp_path), config,
                        env={"PYCRID_FAILPOINTS": "sandbox.created#1"}) as d:
        pods = Pods(d.client)
        with pytest.raises(grpc.RpcError):
            pods.run(pod_config(), "runsc")
        assert not processes_mentioning(d.state), processes_mentioning(d.state)
        # The next one works.
        sid = pods.run(pod_config(), "runsc")
        pods.remove_pod(sid)
        assert leftovers(d.root, d.state) == []


def test_oom_of_the_pod_is_oomkilled(daemon: Daemon, pods: Pods, tmp_path: Path) -> None:
    """gVisor keeps no per-container memory limit: the pod's cgroup limits the sandbox, and
    the kernel's OOM killer ends the sandbox; its containers are OOMKilled."""
    parent = f"pycrid-runsc-oom-{os.getpid()}"
    memory = Path("/sys/fs/cgroup/memory") / parent
    if not Path("/sys/fs/cgroup/memory").is_dir():
        pytest.skip("no cgroup v1 memory hierarchy here")
    memory.mkdir()
    made = [memory]  # runsc makes the parent in the other hierarchies
    try:
        (memory / "memory.limit_in_bytes").write_text(str(192 << 20))
        sid, config = _runsc_pod(pods, tmp_path, linux=pb.LinuxPodSandboxConfig(
            cgroup_parent="/" + parent))
        hog = pods.run_container(sid, container_config(
            daemon.extra["busybox"], "hog",
            command=["sh", "-c", "x=0123456789; while true; do x=$x$x; done"]), config)
        st = pods.wait_state(hog, pb.CONTAINER_EXITED, 60)
        assert (st.exit_code, st.reason) == (137, "OOMKilled"), st
        pods.remove_pod(sid)
    finally:
        made += [p for p in Path("/sys/fs/cgroup").glob(f"*/{parent}") if p != memory]
        wait_for(lambda: _rmdirs(made), 30, "the test's cgroups to go")


def _rmdirs(parents: list[Path]) -> bool:
    """Remove each parent and its child cgroups; whether all are gone."""
    for parent in parents:
        for child in parent.glob("*/"):
            with contextlib.suppress(OSError):
                child.rmdir()
        with contextlib.suppress(FileNotFoundError, OSError):
            parent.rmdir()
    return not any(p.exists() for p in parents)


def test_recovery_after_restart_and_kill9(tmp_path: Path, registry: LocalRegistry,
                                          test_images: TestImages) -> None:
    config = daemon_config(registry, test_images, tmp_path)
    busybox = test_images.busybox.ref(registry)
    with running_daemon(str(tmp_path), config) as d:
        d.client.pull(busybox)
        pods = Pods(d.client)
        sid, pod = _runsc_pod(pods, tmp_path)
        keeps = pods.run_container(sid, _sleeper(busybox, "keeps"), pod)
        later = pods.run_container(sid, container_config(
            busybox, "later", command=["sh", "-c", "sleep 4; exit 6"]), pod)
        created = pods.create(sid, _sleeper(busybox, "created"), pod)
    # Stopped cleanly: the sandbox and its containers run on; one exits meanwhile.
    time.sleep(4.5)
    with running_daemon(str(tmp_path), config) as d:
        pods = Pods(d.client)
        assert pods.pod_status(sid).status.state == pb.SANDBOX_READY
        assert pods.status(keeps).status.state == pb.CONTAINER_RUNNING
        st = pods.wait_state(later, pb.CONTAINER_EXITED)
        assert st.exit_code == 6
        assert pods.exec(keeps, ["echo", "still here"]).stdout == b"still here\n"
        # A container created before the restart starts after it.
        pods.start(created)
        assert pods.exec(created, ["echo", "late start"]).stdout == b"late start\n"
        d.proc.kill()  # kill -9
        d.proc.wait()
    with running_daemon(str(tmp_path), config) as d:
        pods = Pods(d.client)
        assert pods.status(keeps).status.state == pb.CONTAINER_RUNNING
        assert pods.status(created).status.state == pb.CONTAINER_RUNNING
        _on_gvisor(pods, keeps)
        pods.stop(keeps, timeout=5)
        assert pods.status(keeps).status.state == pb.CONTAINER_EXITED
        pods.remove_pod(sid)
        assert leftovers(d.root, d.state) == []


def test_shared_pid_namespace_is_the_sandboxes(daemon: Daemon, pods: Pods, tmp_path: Path) -> None:
    """shareProcessNamespace: the pod's containers and its pause are one PID namespace, the
    sandbox's own (the pause is its pid 1); without it each container has its own."""
    shared = pb.NamespaceOption(pid=pb.POD)
    sid, config = _runsc_pod(pods, tmp_path, linux=pb.LinuxPodSandboxConfig(
        security_context=pb.LinuxSandboxSecurityContext(namespace_options=shared)))
    first = container_config(daemon.extra["busybox"], "first", command=["sleep", "1111"])
    first.linux.security_context.namespace_options.CopyFrom(shared)
    second = _sleeper(daemon.extra["busybox"], "second")
    second.linux.security_context.namespace_options.CopyFrom(shared)
    pods.run_container(sid, first, config)
    cid = pods.run_container(sid, second, config)
    ps = pods.exec(cid, ["ps", "-o", "pid,args"]).stdout.decode()
    assert "sleep 1111" in ps and "/pause" in ps, ps
    assert pods.exec(cid, ["cat", "/proc/1/cmdline"]).stdout.startswith(b"/pause"), ps
    apart = pb.NamespaceOption(pid=pb.CONTAINER)  # the kubelet's default
    sid2, config2 = _runsc_pod(pods, tmp_path, linux=pb.LinuxPodSandboxConfig(
        security_context=pb.LinuxSandboxSecurityContext(namespace_options=apart)))
    own = _sleeper(daemon.extra["busybox"], "own")
    other = container_config(daemon.extra["busybox"], "other", command=["sleep", "2222"])
    for c in (own, other):
        c.linux.security_context.namespace_options.CopyFrom(apart)
    cid = pods.run_container(sid2, own, config2)
    pods.run_container(sid2, other, config2)
    ps = pods.exec(cid, ["ps", "-o", "pid,args"]).stdout.decode()
    assert "sleep 2222" not in ps and "/pause" not in ps, ps


def test_runsc_network_stack_on_this_kernel(tmp_path: Path, registry: LocalRegistry,
                                            test_images: TestImages) -> None:
    """A handler configured the way containerd's gVisor docs show it (runtime_type, TypeUrl,
    ConfigPath naming a runsc.toml), with runsc's own network stack. The runsc Debian ships
    refuses it on Linux 6.x (it takes the pod's namespace for the host's); then
    RunPodSandbox says how to fix it and leaves nothing behind. Where it starts, the pod
    works and goes as cleanly."""
    toml = tmp_path / "runsc.toml"
    toml.write_text('[runsc_config]\nnetwork = "sandbox"\n')
    config = daemon_config(registry, test_images, tmp_path) + (
        '[plugins."pycrid.cri.v1.runtime".runtimes.netstack]\n'
        'runtime_type = "io.containerd.runsc.v1"\n'
        '[plugins."pycrid.cri.v1.runtime".runtimes.netstack.options]\n'
        'TypeUrl = "io.containerd.runsc.v1.options"\n'
        f'ConfigPath = "{toml}"\n')
    with running_daemon(str(tmp_path / "d"), config) as d:
        pods = Pods(d.client)
        handlers = json.loads(d.client.runtime.Status(pb.StatusRequest(verbose=True),
                                                      timeout=10).info["handlers"])
        assert "--network=sandbox" in handlers["netstack"]["flags"]
        assert handlers["netstack"]["root"] == os.path.join(d.state, "runsc-netstack")
        try:
            sid = pods.run(pod_config(), "netstack")
        except grpc.RpcError as e:
            assert "cannot run with network enabled in root network namespace" in (
                e.details() or ""), e.details()
            assert 'set network = "host"' in (e.details() or "")
        else:
            assert pods.pod_status(sid).status.state == pb.SANDBOX_READY
            pods.remove_pod(sid)
        assert leftovers(d.root, d.state) == []
        assert not processes_mentioning(d.state)
