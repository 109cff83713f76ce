"""Failure at every step of pod and container creation leaves nothing behind; records and
running containers survive a daemon restart."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from tests.support.daemon import Daemon, running_daemon
from tests.support.images import TestImages
from tests.support.pods import (
    Pods,
    container_config,
    daemon_config,
    leftovers,
    pod_config,
    processes_mentioning,
    wait_for,
)
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e

SANDBOX_STEPS = ["sandbox.record", "sandbox.netns", "sandbox.files", "sandbox.shm",
                 "sandbox.rootfs", "sandbox.spec", "sandbox.created", "sandbox.started"]
CONTAINER_STEPS = ["container.record", "container.rootfs", "container.bundle",
                   "container.created"]


def _start(base: Path, registry: LocalRegistry, images: TestImages,
           failpoints: str = "") -> running_daemon:  # type: ignore[valid-type]
    env = {"PYCRID_FAILPOINTS": failpoints} if failpoints else None
    return running_daemon(str(base), daemon_config(registry, images, base), env=env)


def _sleeper(images: TestImages, registry: LocalRegistry, name: str = "c") -> object:
    return container_config(images.busybox.ref(registry), name, command=["sleep", "3600"])


def _pull(d: Daemon, registry: LocalRegistry, images: TestImages) -> None:
    d.client.pull(images.busybox.ref(registry))
    d.client.pull(images.pause.ref(registry))


@pytest.mark.parametrize("step", SANDBOX_STEPS)
def test_failed_run_pod_sandbox_leaves_nothing(step: str, tmp_path: Path,
                                               registry: LocalRegistry,
                                               test_images: TestImages) -> None:
    with _start(tmp_path, registry, test_images, step) as d:
        _pull(d, registry, test_images)
        pods = Pods(d.client)
        with pytest.raises(grpc.RpcError) as e:
            pods.run(pod_config(name="p"))
        assert f"failpoint {step}" in e.value.details()
        assert pods.rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=10).items == []
        assert leftovers(d.root, d.state) == []
        # The name was released: a retry is refused only by the fail point, not the name.
        with pytest.raises(grpc.RpcError) as e:
            pods.run(pod_config(name="p"))
        assert e.value.code() != grpc.StatusCode.FAILED_PRECONDITION
    assert leftovers(d.root, d.state) == []


@pytest.mark.parametrize("step", CONTAINER_STEPS)
def test_failed_create_container_leaves_nothing(step: str, tmp_path: Path,
                                                registry: LocalRegistry,
                                                test_images: TestImages) -> None:
    with _start(tmp_path, registry, test_images, step) as d:
        _pull(d, registry, test_images)
        pods = Pods(d.client)
        pod = pod_config()
        sid = pods.run(pod)
        with pytest.raises(grpc.RpcError) as e:
            pods.create(sid, _sleeper(test_images, registry), pod)
        assert f"failpoint {step}" in e.value.details()
        assert pods.rt.ListContainers(pb.ListContainersRequest(), timeout=10).containers == []
        assert not os.listdir(os.path.join(d.state, "containers"))
        pods.remove_pod(sid)
        assert leftovers(d.root, d.state) == []


def test_start_failure_is_recorded_as_start_error(tmp_path: Path, registry: LocalRegistry,
                                                  test_images: TestImages) -> None:
    with _start(tmp_path, registry, test_images, "container.start") as d:
        _pull(d, registry, test_images)
        pods = Pods(d.client)
        pod = pod_config()
        sid = pods.run(pod)
        cid = pods.create(sid, _sleeper(test_images, registry), pod)
        with pytest.raises(grpc.RpcError):
            pods.start(cid)
        st = pods.status(cid).status
        assert (st.state, st.exit_code, st.reason) == (pb.CONTAINER_EXITED, 128, "StartError")
        assert "failpoint container.start" in st.message
        pods.remove_pod(sid)
        assert leftovers(d.root, d.state) == []


@pytest.mark.parametrize("step", ["container.remove", "sandbox.remove"])
def test_interrupted_removal_is_finished_after_restart(step: str, tmp_path: Path,
                                                       registry: LocalRegistry,
                                                       test_images: TestImages) -> None:
    with _start(tmp_path, registry, test_images, step) as d:
        _pull(d, registry, test_images)
        pods = Pods(d.client)
        pod = pod_config()
        sid = pods.run(pod)
        cid = pods.run_container(sid, _sleeper(test_images, registry), pod)
        with pytest.raises(grpc.RpcError):
            if step == "container.remove":
                pods.remove(cid)
            else:
                pods.remove_pod(sid)
    with _start(tmp_path, registry, test_images) as d:
        pods = Pods(d.client)
        assert pods.rt.ListContainers(pb.ListContainersRequest(), timeout=10).containers == []
        if step == "sandbox.remove":
            assert pods.rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=10).items == []
        else:
            pods.remove_pod(sid)
        assert leftovers(d.root, d.state) == []


def test_records_and_containers_survive_a_restart(tmp_path: Path, registry: LocalRegistry,
                                                  test_images: TestImages) -> None:
    busybox = test_images.busybox.ref(registry)
    with _start(tmp_path, registry, test_images) as d:
        _pull(d, registry, test_images)
        pods = Pods(d.client)
        pod = pod_config()
        sid = pods.run(pod)
        running = pods.run_container(sid, _sleeper(test_images, registry, "running"), pod)
        doomed = pods.run_container(sid, _sleeper(test_images, registry, "doomed"), pod)
        exited = pods.run_container(sid, container_config(
            busybox, "exited", command=["sh", "-c", "exit 3"]), pod)
        created = pods.create(sid, _sleeper(test_images, registry, "created"), pod)
        pods.wait_state(exited, pb.CONTAINER_EXITED)
        doomed_pid = int(__import__("json").loads(
            pods.status(doomed, verbose=True).info["info"])["pid"])
    # The daemon is down; its containers are not.
    assert processes_mentioning(os.path.join(d.state, "containers", running))
    os.kill(doomed_pid, signal.SIGKILL)  # dies while nobody watches
    wait_for(lambda: os.path.exists(os.path.join(d.state, "exits", doomed)), 10,
             "conmon to record the exit")
    with _start(tmp_path, registry, test_images) as d:
        pods = Pods(d.client)
        assert [p.id for p in pods.rt.ListPodSandbox(pb.ListPodSandboxRequest(),
                                                     timeout=10).items] == [sid]
        assert pods.pod_status(sid).status.state == pb.SANDBOX_READY
        states = {c.id: c.state for c in pods.rt.ListContainers(pb.ListContainersRequest(),
                                                                 timeout=10).containers}
        assert states == {running: pb.CONTAINER_RUNNING, doomed: pb.CONTAINER_EXITED,
                          exited: pb.CONTAINER_EXITED, created: pb.CONTAINER_CREATED}
        assert pods.status(exited).status.exit_code == 3
        assert pods.status(doomed).status.exit_code == 137
        # Exits are watched again, and the created container can still start.
        pods.start(created)
        assert pods.exec(created, ["true"]).exit_code == 0
        pods.stop(running, timeout=10)
        assert pods.status(running).status.state == pb.CONTAINER_EXITED
        # Names are still held across the restart.
        with pytest.raises(grpc.RpcError) as e:
            pods.create(sid, _sleeper(test_images, registry, "running"), pod)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        pods.remove_pod(sid)
        assert leftovers(d.root, d.state) == []
