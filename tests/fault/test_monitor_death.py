"""The crash matrix's other half: the monitor dies, not the daemon.

conmon (or a pod's pins) can die on their own: the OOM killer, an operator's ``pkill``
or ``umount``. Killed at rest, while the daemon is down, during an exec and during an
attach, the container must be reported EXITED (255, as containerd reports a container
whose shim died) within seconds, the stop must reach event subscribers and NRI plugins,
what is left of the container must be killed (one copy of it, ever), and stopping and
removing the pod must leave nothing: no process, mount, conmon socket or record.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from tests.e2e.test_nri_go_plugins import GoPlugin, dumped, go_plugin, wait_connected
from tests.e2e.test_recovery import STOPPED, Subscriber
from tests.fault.test_crash_matrix import strays
from tests.support import interop, network
from tests.support.daemon import Daemon, nri_paths, running_daemon
from tests.support.images import TestImages
from tests.support.pods import (
    Pods,
    busybox_daemon,
    command_lines,
    container_config,
    daemon_config,
    leftovers,
    log_text,
    pod_config,
    wait_for,
)
from tests.support.registry import LocalRegistry
from tests.support.streams import SpdyCommand

pytestmark = pytest.mark.e2e

#: The issue's bound: the exit is reported within this many seconds.
REPORTED_WITHIN = 10.0


@dataclass
class Env:
    daemon: Daemon
    busybox: str
    base: Path
    #: The Go nri-logger, when interop has it.
    logger: GoPlugin | None


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, registry: LocalRegistry,
        test_images: TestImages) -> Iterator[Env]:
    base = tmp_path_factory.mktemp("monitors")
    with busybox_daemon(base, registry, test_images) as d, contextlib.ExitStack() as stack:
        logger = None
        if interop.binary("nri-logger") is not None:
            logger = stack.enter_context(go_plugin(
                "nri-logger", nri_paths(str(base))["socket_path"], base / "logger.log",
                "-idx", "10"))
            wait_connected(d, {"10-nri-logger"}, [logger])
        yield Env(d, d.extra["busybox"], base, logger)
    network.release(str(base))


@pytest.fixture
def pods(env: Env) -> Iterator[Pods]:
    p = Pods(env.daemon.client)
    try:
        yield p
    finally:
        p.cleanup()
    d = env.daemon
    assert leftovers(d.root, d.state) == []
    assert strays(d, set(), set()) == []


def conmon_pid(d: Daemon, oid: str, kind: str = "containers") -> int:
    with open(os.path.join(d.state, kind, oid, "conmon.pid")) as f:
        return int(f.read())


def init_pid(pods: Pods, cid: str) -> int:
    return int(json.loads(pods.status(cid, verbose=True).info["info"])["pid"])


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def assert_lost(pods: Pods, cid: str, started: float, reason: str = "Error") -> Any:
    st = pods.wait_state(cid, pb.CONTAINER_EXITED, REPORTED_WITHIN)
    assert time.monotonic() - started < REPORTED_WITHIN
    assert (st.exit_code, st.reason) == (255, reason), st
    assert "conmon" in st.message, st.message
    return st


def sleeper(image: str, name: str, **kw: Any) -> Any:
    return container_config(image, name, command=["sleep", "3600"], **kw)


def test_conmon_killed_at_rest(env: Env, pods: Pods) -> None:
    """A logging container, a silent one and a created one lose their conmons: each is
    EXITED 255 (reason Error, containerd's for a dead shim) within seconds, the stop is
    an event (and an NRI StopContainer), what ran is killed, and the kubelet's next
    attempt runs."""
    d, bb = env.daemon, env.busybox
    sub = Subscriber(d.client)
    logs = env.base / "logs-rest"
    pod = pod_config(log_dir=str(logs))
    try:
        sid = pods.run(pod)
        ticker = pods.run_container(sid, container_config(
            bb, "ticker", log_path="ticker.log",
            command=["sh", "-c", "while true; do echo tick; sleep 0.5; done"]), pod)
        silent = pods.run_container(sid, sleeper(bb, "silent"), pod)
        created = pods.create(sid, sleeper(bb, "created"), pod)
        wait_for(lambda: "tick" in log_text(str(logs / "ticker.log")), 10, "a tick")
        pids = {c: init_pid(pods, c) for c in (ticker, silent)}
        logger_start = len(env.logger.raw()) if env.logger else 0
        started = time.monotonic()
        for cid in (ticker, silent, created):
            os.kill(conmon_pid(d, cid), signal.SIGKILL)
        for cid in (ticker, silent, created):
            assert_lost(pods, cid, started)
            sub.wait((cid, STOPPED), REPORTED_WITHIN)
        assert all(gone(p) for p in pids.values()), "what was left still runs"
        assert not any(os.path.exists(os.path.join(d.state, "containers", c, "attach"))
                       for c in (ticker, silent, created))
        if env.logger is not None:
            wait_for(lambda: {c for e, _, c in dumped(env.logger.lines(logger_start))
                              if e == "StopContainer"} >= {ticker, silent, created},
                     REPORTED_WITHIN, "nri-logger to log StopContainer of each")
        # What the kubelet does next: stop (no error), then a new attempt, which runs.
        pods.stop(silent)
        retry = sleeper(bb, "silent")
        retry.metadata.attempt = 1
        again = pods.run_container(sid, retry, pod)
        assert pods.status(again).status.state == pb.CONTAINER_RUNNING
        with pytest.raises(grpc.RpcError) as e:
            pods.rt.ReopenContainerLog(pb.ReopenContainerLogRequest(container_id=ticker),
                                       timeout=10)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        pods.stop_pod(sid)
        pods.remove_pod(sid)
        sub.wait((sid, pb.CONTAINER_DELETED_EVENT))
        # Each stop was told once, by the exit handling, not again by the stop or removal.
        for cid in (ticker, silent, created):
            assert sub.seen().count((cid, STOPPED)) == 1
        if env.logger is not None:
            stops = [c for e, _, c in dumped(env.logger.lines(logger_start))
                     if e == "StopContainer"]
            assert all(stops.count(c) == 1 for c in (ticker, silent, created)), stops
    finally:
        sub.close()


def test_pause_conmon_killed(env: Env, pods: Pods) -> None:
    """The pause's conmon dies: the pause is killed and the pod is NOTREADY (a STOPPED
    event), as containerd marks a sandbox whose shim died; its containers shared the
    pause's PID namespace, so they end with it."""
    d, bb = env.daemon, env.busybox
    sub = Subscriber(d.client)
    pod = pod_config()
    pod.linux.security_context.namespace_options.pid = pb.POD
    shared = pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
        namespace_options=pb.NamespaceOption(pid=pb.POD)))
    try:
        sid = pods.run(pod)
        cid = pods.run_container(sid, sleeper(bb, "c", linux=shared), pod)
        pause = int(json.loads(pods.pod_status(sid, verbose=True).info["info"])["pid"])
        started = time.monotonic()
        os.kill(conmon_pid(d, sid, "sandboxes"), signal.SIGKILL)
        wait_for(lambda: pods.pod_status(sid).status.state == pb.SANDBOX_NOTREADY,
                 REPORTED_WITHIN, "the pod to be NOTREADY")
        assert time.monotonic() - started < REPORTED_WITHIN
        sub.wait((sid, STOPPED), REPORTED_WITHIN)
        assert gone(pause)
        pods.wait_state(cid, pb.CONTAINER_EXITED, REPORTED_WITHIN)
        pods.stop_pod(sid)
        pods.remove_pod(sid)
    finally:
        sub.close()


def test_pin_removed(env: Env, pods: Pods) -> None:
    """A pod without a pause loses a pinned namespace (someone unmounted it): NOTREADY
    with a STOPPED event; its removal still takes everything down."""
    d, bb = env.daemon, env.busybox
    sub = Subscriber(d.client)
    pod = pod_config(hostname="pinned")
    pod.linux.security_context.namespace_options.pid = pb.CONTAINER  # no pause: pinned
    try:
        sid = pods.run(pod)
        own = pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
            namespace_options=pb.NamespaceOption(pid=pb.CONTAINER)))
        pods.run_container(sid, sleeper(bb, "c", linux=own), pod)
        started = time.monotonic()
        subprocess.run(["umount", os.path.join(d.state, "sandboxes", sid, "ns", "uts")],
                       check=True)
        wait_for(lambda: pods.pod_status(sid).status.state == pb.SANDBOX_NOTREADY,
                 REPORTED_WITHIN, "the pod to be NOTREADY")
        assert time.monotonic() - started < REPORTED_WITHIN
        sub.wait((sid, STOPPED), REPORTED_WITHIN)
        pods.remove_pod(sid)
    finally:
        sub.close()


def test_conmon_killed_during_exec(env: Env, pods: Pods) -> None:
    """An ExecSync under way when conmon dies ends with the container, at once."""
    d, bb = env.daemon, env.busybox
    pod = pod_config()
    sid = pods.run(pod)
    cid = pods.run_container(sid, sleeper(bb, "c"), pod)
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(pods.exec(cid, ["sleep", "77"], timeout=120))
        except grpc.RpcError as e:
            outcome.append(e)

    t = threading.Thread(target=run)
    t.start()
    wait_for(lambda: any(cmd == "sleep 77" for _, cmd in command_lines()), 10, "the exec")
    started = time.monotonic()
    os.kill(conmon_pid(d, cid), signal.SIGKILL)
    assert_lost(pods, cid, started)
    t.join(REPORTED_WITHIN)
    assert not t.is_alive(), "the exec outlived its container"
    assert outcome and (isinstance(outcome[0], grpc.RpcError) or outcome[0].exit_code != 0)
    assert not any(cmd == "sleep 77" for _, cmd in command_lines())
    pods.remove_pod(sid)


async def test_conmon_killed_during_attach(env: Env, pods: Pods) -> None:
    """An attach joined to conmon's socket ends when conmon dies; the container is
    EXITED 255 and its socket is gone."""
    d, bb = env.daemon, env.busybox
    pod = pod_config()
    sid = pods.run(pod)
    cid = pods.run_container(sid, container_config(
        bb, "attached", command=["sh", "-c", "while read l; do echo got:$l; done"],
        stdin=True, stdin_once=False), pod)
    url = str(d.client.runtime.Attach(pb.AttachRequest(
        container_id=cid, stdin=True, stdout=True, stderr=True), timeout=30).url)
    session = await SpdyCommand.start(url, stdin=True)
    try:
        await session.write_stdin(b"one\n")
        await session.wait_output(lambda b: b"got:one\n" in b)
        started = time.monotonic()
        os.kill(conmon_pid(d, cid), signal.SIGKILL)
        await session.wait(REPORTED_WITHIN)  # ends; does not hang
        await asyncio.to_thread(assert_lost, pods, cid, started)
        assert not Path(d.state, "containers", cid, "attach").exists()  # noqa: ASYNC240
    finally:
        await session.close()
    pods.remove_pod(sid)


def test_conmon_killed_while_the_daemon_is_down(tmp_path: Path, registry: LocalRegistry,
                                                test_images: TestImages) -> None:
    """conmons killed while nobody watched: after the restart the container is EXITED
    255, reason Unknown (containerd's for a running container whose task is gone after a
    restart), and killed; the pause's pod is NOTREADY; subscribers hear of both."""
    bb = test_images.busybox.ref(registry)
    config = daemon_config(registry, test_images, tmp_path)
    with running_daemon(str(tmp_path), config) as d:
        d.client.pull(bb)
        pods = Pods(d.client)
        pod = pod_config()
        sid = pods.run(pod)
        cid = pods.run_container(sid, sleeper(bb, "c"), pod)
        kept = pods.run_container(sid, sleeper(bb, "kept"), pod)
        paused = pod_config()
        paused.linux.security_context.namespace_options.pid = pb.POD
        psid = pods.run(paused)
        pid = init_pid(pods, cid)
    for oid, kind in ((cid, "containers"), (psid, "sandboxes")):
        os.kill(conmon_pid(d, oid, kind), signal.SIGKILL)
    time.sleep(0.5)
    assert not gone(pid), "the container went with its conmon; nothing left to test"
    with running_daemon(str(tmp_path), config) as d:
        pods = Pods(d.client)
        sub = Subscriber(d.client)
        try:
            st = pods.status(cid).status
            assert (st.state, st.exit_code, st.reason) == (pb.CONTAINER_EXITED, 255, "Unknown")
            assert "conmon" in st.message
            assert gone(pid)
            assert pods.status(kept).status.state == pb.CONTAINER_RUNNING
            assert pods.pod_status(psid).status.state == pb.SANDBOX_NOTREADY
            sub.wait((cid, STOPPED))
            sub.wait((psid, STOPPED))
            for p in (sid, psid):
                pods.remove_pod(p)
        finally:
            sub.close()
        assert leftovers(d.root, d.state) == []
        assert strays(d, set(), set()) == []
