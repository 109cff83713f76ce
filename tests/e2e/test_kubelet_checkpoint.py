"""Forensic container checkpointing (KEP-2008) through the real kubelet (v1.36,
../shared/interop): ``POST /checkpoint/{namespace}/{pod}/{container}`` on its port makes
it call CheckpointContainer with an archive under ``<root-dir>/checkpoints``; the
container runs on. The archive restores in a new pod and counts on from where it was:
over CRI with its path as the image, and through the kubelet itself, made into a
checkpoint image that a pod names (KEP-2008's restore: the kubelet pulls it, pycrid sees
the checkpoint annotation and restores instead of starting).

The ContainerCheckpoint feature gate has been on by default since Kubernetes 1.30 (beta);
this kubelet gets no gate set. Skipped with the reason where the kubelet or the interop
CRIU is not there.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from tests.e2e.test_kubelet import remove_pods
from tests.support import interop
from tests.support.checkpoints import checkpoint_image, count, member, member_names
from tests.support.daemon import Daemon, running_daemon
from tests.support.images import TestImages
from tests.support.kubelet import running_kubelet
from tests.support.pods import Pods, daemon_config, wait_for
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e

NODE = "pycrid-test-node"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, registry: LocalRegistry,
           test_images: TestImages) -> Iterator[Daemon]:
    kubelet = interop.require("kubelet")
    criu = interop.require("criu")
    base = tmp_path_factory.mktemp("kubelet-checkpoint")
    config = daemon_config(registry, test_images, base) + (
        f'[plugins."pycrid.cri.v1.runtime"]\ncriu_path = "{criu}"\n')
    with running_daemon(str(base), config) as d:
        d.extra["base"] = str(base)
        d.extra["kubelet"] = str(kubelet)
        yield d


#: Counts in memory, writes a file once.
SCRIPT = ("echo kept > /kept; i=0; "
          "while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done")


def _manifest(image: str, name: str = "counter") -> str:
    return f"""apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: counter
    image: {image}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "{SCRIPT}"]
"""


def _counter(d: Daemon) -> Any | None:
    for c in d.client.runtime.ListContainers(pb.ListContainersRequest(), timeout=30).containers:
        if c.metadata.name == "counter" and c.state == pb.CONTAINER_RUNNING:
            return c
    return None


def test_kubelet_checkpoint_endpoint(daemon: Daemon, test_images: TestImages,
                                     registry: LocalRegistry) -> None:
    base = Path(daemon.extra["base"])
    busybox = test_images.busybox.ref(registry)
    daemon.client.pull(busybox)
    pods = Pods(daemon.client)
    with running_kubelet(daemon.extra["kubelet"], str(base / "kubelet"),
                         runtime_socket=daemon.address,
                         manifests={"counter.yaml": _manifest(busybox)},
                         cleanup=remove_pods(daemon)) as k:
        running = wait_for(lambda: _counter(daemon), 120, "the kubelet to run the counter")
        wait_for(lambda: count(pods, running.id) >= 3, 30, "the counter to count")
        # The archive's /tmp/count may be empty (frozen between the shell's truncation
        # and its write, which the restored shell then makes): this is the lower bound.
        before = count(pods, running.id)
        answer = json.loads(k.post(f"/checkpoint/default/counter-{NODE}/counter?timeout=60"))
        [written] = answer["items"]
        archive = Path(written)
        assert archive.parent == base / "kubelet" / "root" / "checkpoints"
        assert archive.name.startswith(f"checkpoint-counter-{NODE}_default-counter-")
        # The container runs on; the kubelet saw nothing to restart.
        assert _counter(daemon) is not None and _counter(daemon).id == running.id
        kept = base / "kubelet.tar"
        shutil.copyfile(archive, kept)
    spec = json.loads(member(kept, "spec.dump"))
    assert {"checkpoint", "checkpoint/inventory.img", "config.dump", "spec.dump",
            "status.dump", "rootfs-diff.tar"} <= member_names(kept)
    assert spec["annotations"]["io.kubernetes.cri.sandbox-name"] == f"counter-{NODE}"
    assert spec["annotations"]["io.kubernetes.cri.sandbox-namespace"] == "default"

    # The kubelet is gone (and its pods with it): restore the archive in a pod of our own.
    pod = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(
        name="restored", namespace="default", uid="uid-restored"))
    pod.linux.security_context.namespace_options.pid = pb.CONTAINER
    try:
        sid = pods.run(pod)
        cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="counter"),
                                 image=pb.ImageSpec(image=str(kept)))
        cfg.linux.security_context.namespace_options.pid = pb.CONTAINER
        with pytest.raises(grpc.RpcError) as e:
            pods.create(sid, cfg, pod)
        # The kubelet's termination-log bind mount: CRIU needs a source for it again.
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details().endswith("which this request lacks: /dev/termination-log")
        log = base / "termination-log"
        log.touch()
        cfg.mounts.add(container_path="/dev/termination-log", host_path=str(log))
        rid = pods.create(sid, cfg, pod)
        pods.start(rid)
        first = count(pods, rid)
        assert first >= before >= 3  # counting on, not from 1 again
        wait_for(lambda: count(pods, rid) > first, 10, "the restored container to count on")
        assert pods.exec(rid, ["cat", "/kept"]).stdout == b"kept\n"
    finally:
        pods.cleanup()

    # The kubelet's own restore: a static pod whose image is the archive made an image.
    image = checkpoint_image(registry, kept, "checkpoints/kubelet-counter")
    with running_kubelet(daemon.extra["kubelet"], str(base / "kubelet-restore"),
                         runtime_socket=daemon.address,
                         manifests={"restored.yaml": _manifest(image, "restored")},
                         cleanup=remove_pods(daemon)):
        restored = wait_for(lambda: _counter(daemon), 120,
                            "the kubelet to run the restored counter")
        status = pods.status(restored.id).status
        assert status.annotations["restored"] == "true"
        assert status.image.image.endswith("/busybox:latest")  # the base image, not the
        first = count(pods, restored.id)                      # checkpoint image
        assert first >= before
        wait_for(lambda: count(pods, restored.id) > first, 10,
                 "the restored container to count on")
        assert pods.exec(restored.id, ["cat", "/kept"]).stdout == b"kept\n"
