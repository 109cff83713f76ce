"""A client that goes away at every step of RunPodSandbox and CreateContainer.

Each case starts a daemon with ``PYCRID_FAILPOINTS=<step>:stall`` (the call waits at
that step until its client has gone), calls with a short deadline (the kubelet's
runtime request timeout, in miniature), and checks that the call stopped at exactly that
step and undid itself: after every listed pod is removed, no netns mount, veth, pod IP,
pin, mount, cgroup, process, CNI cache entry or record is left. The kubelet's pattern of
very short deadlines, each call retried until it succeeds, is checked the same way.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from tests.fault.test_crash_matrix import MATRIX, PINNED, strays
from tests.support import network
from tests.support.daemon import Daemon, running_daemon
from tests.support.images import TestImages
from tests.support.pods import (
    Pods,
    container_config,
    daemon_config,
    leftovers,
    pod_config,
    wait_for,
)
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e

OPS = ("RunPodSandbox", "CreateContainer")
CASES = ([(op, point, False) for op in OPS for point in MATRIX[op]]
         + [(op, point, True) for op in OPS for point in PINNED[op]])
#: The client's deadline: long enough to reach any step, short beside the stall.
DEADLINE = 3.0


def _pod(pinned: bool) -> Any:
    cfg = pod_config()
    if pinned:
        cfg.linux.security_context.namespace_options.pid = pb.CONTAINER
    return cfg


def _container(image: str, pinned: bool) -> Any:
    cfg = container_config(image, "c", command=["sleep", "3600"], mounts=[
        pb.Mount(container_path="/vol", readonly=True, image=pb.ImageSpec(image=image))])
    if pinned:
        cfg.linux.security_context.namespace_options.pid = pb.CONTAINER
    return cfg


def _left(d: Daemon) -> list[str]:
    left = leftovers(d.root, d.state)
    left += [f"veth {v}" for v in network.veths({network.bridge_of(os.path.dirname(d.root))})]
    return left + strays(d, set(), set())


def _remove_everything(d: Daemon) -> None:
    """Remove every listed pod, as the kubelet would, until nothing is left (a call
    whose client went away may still be finishing its undo in the background)."""
    pods = Pods(d.client)

    def clean() -> bool:
        for p in pods.rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=30).items:
            pods.remove_pod(p.id)
        return not _left(d)

    try:
        wait_for(clean, 30, "nothing to be left")
    except AssertionError:
        assert _left(d) == []


@pytest.mark.parametrize(("op", "point", "pinned"), CASES,
                         ids=[f"{o}-{p}" + ("-pinned" if n else "") for o, p, n in CASES])
def test_cancel_at_every_step(op: str, point: str, pinned: bool, tmp_path: Path,
                              registry: LocalRegistry, test_images: TestImages) -> None:
    busybox = test_images.busybox.ref(registry)
    with running_daemon(str(tmp_path), daemon_config(registry, test_images, tmp_path),
                        env={"PYCRID_FAILPOINTS": f"{point}:stall"}) as d:
        pods = Pods(d.client)
        d.client.pull(test_images.pause.ref(registry))
        d.client.pull(busybox)
        pod = _pod(pinned)
        if op == "RunPodSandbox":
            request: Any = pb.RunPodSandboxRequest(config=pod)
            call = pods.rt.RunPodSandbox
        else:
            sid = pods.run(pod)
            request = pb.CreateContainerRequest(pod_sandbox_id=sid,
                                                config=_container(busybox, pinned),
                                                sandbox_config=pod)
            call = pods.rt.CreateContainer
        with pytest.raises(grpc.RpcError) as e:
            call(request, timeout=DEADLINE)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        wait_for(lambda: f"stopped at step {point} and undone" in d.log(), 30,
                 f"{op} to stop at {point} and undo itself")
        listed = pods.rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=30).items
        containers = pods.rt.ListContainers(pb.ListContainersRequest(), timeout=30).containers
        if op == "RunPodSandbox":
            assert list(listed) == []  # undone: never seen
        else:
            assert [c.id for c in containers] == []
        _remove_everything(d)


def _listed(pods: Pods, name: str) -> bool:
    return any(p.metadata.name == name and p.state == pb.SANDBOX_READY
               for p in pods.rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=30).items)


def test_short_deadlines_retried_leave_nothing(tmp_path: Path, registry: LocalRegistry,
                                               test_images: TestImages) -> None:
    """The issue's reproduction: pods run with deadlines of 2, 5, 10 and 20 ms, each
    retried (as the kubelet retries) until it succeeds; then every listed pod is removed.
    A call cut short either completed (and its pod is listed, so removed) or was undone;
    nothing is left either way."""
    with running_daemon(str(tmp_path), daemon_config(registry, test_images, tmp_path)) as d:
        pods = Pods(d.client)
        d.client.pull(test_images.pause.ref(registry))
        for round_ in range(3):
            for i, ms in enumerate((2, 5, 10, 20)):
                cfg = _pod(pinned=i % 2 == 1)
                deadline = ms / 1000
                for _ in range(200):
                    try:
                        pods.rt.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg),
                                              timeout=deadline)
                        break
                    except grpc.RpcError as e:
                        # Cut short, or its name held by the call before: still being
                        # undone, or completed after all (then it is listed, and the
                        # kubelet takes that pod).
                        assert e.code() in (grpc.StatusCode.DEADLINE_EXCEEDED,
                                            grpc.StatusCode.FAILED_PRECONDITION), e
                        if _listed(pods, cfg.metadata.name):
                            break
                        deadline = min(deadline * 4, 60)
                        time.sleep(0.05)
                else:
                    raise AssertionError(f"round {round_}: pod {i} never ran")
        _remove_everything(d)
