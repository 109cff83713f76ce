"""A small synchronous CRI client for the benchmarks, and ``Pods``, which remembers every
pod and container it was told so a run removes, and judges, only its own."""

from __future__ import annotations

import contextlib
import secrets
import sys
import time
from typing import Any, ClassVar

import grpc
from cri_api.v1 import api_pb2 as pb
from cri_api.v1 import api_pb2_grpc as pb_grpc

NAMESPACE = "pycrid-bench"


class Client:
    """The runtime and image services at a unix socket (``unix:///path`` or a path)."""

    def __init__(self, endpoint: str) -> None:
        self.path = endpoint.removeprefix("unix://")
        self.channel = grpc.insecure_channel(f"unix://{self.path}")
        self.runtime: Any = pb_grpc.RuntimeServiceStub(self.channel)
        self.images: Any = pb_grpc.ImageServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def version(self) -> Any:
        return self.runtime.Version(pb.VersionRequest(), timeout=30)

    def has_image(self, ref: str) -> bool:
        st = self.images.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=ref)),
                                     timeout=30)
        return bool(st.image.id)

    def pull(self, ref: str, timeout: float = 600) -> str:
        req = pb.PullImageRequest(image=pb.ImageSpec(image=ref))
        return str(self.images.PullImage(req, timeout=timeout).image_ref)

    def remove_image(self, ref: str) -> None:
        self.images.RemoveImage(pb.RemoveImageRequest(image=pb.ImageSpec(image=ref)),
                                timeout=60)


def pod_config(name: str = "", *, host_network: bool = False,
               shared_pid: bool = False) -> Any:
    """A pod in the ``pycrid-bench`` namespace as the kubelet asks for one (each container
    its own PID namespace, unless ``shared_pid``: shareProcessNamespace), on the runtime's
    pod network or, with ``host_network``, the node's."""
    name = name or "bench-" + secrets.token_hex(4)
    cfg = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(
        name=name, namespace=NAMESPACE, uid="uid-" + name, attempt=0))
    opts = cfg.linux.security_context.namespace_options
    opts.pid = pb.POD if shared_pid else pb.CONTAINER
    if host_network:
        opts.network = pb.NODE
    return cfg


def container_config(image: str, name: str, command: list[str], *,
                     shared_pid: bool = False) -> Any:
    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name=name),
                             image=pb.ImageSpec(image=image), command=command)
    cfg.linux.security_context.namespace_options.pid = pb.POD if shared_pid else pb.CONTAINER
    return cfg


class Pods:
    """CRI pod and container calls that remember what they made."""

    #: Every pod and container id any ``Pods`` of this process was told: the leak checks
    #: judge only these on a node whose other pods are not the run's business.
    told: ClassVar[set[str]] = set()
    pod_ids: ClassVar[set[str]] = set()
    container_ids: ClassVar[set[str]] = set()
    #: Names of the pods asked for, and of those whose RunPodSandbox answered: a call cut
    #: short (Ctrl-C) may still make a pod whose id the run never learns.
    asked: ClassVar[set[str]] = set()
    answered: ClassVar[set[str]] = set()

    def __init__(self, runtime: Any) -> None:
        self.rt = runtime
        self.pods: list[str] = []

    def run(self, config: Any, handler: str = "") -> str:
        Pods.asked.add(config.metadata.name)
        sid = str(self.rt.RunPodSandbox(pb.RunPodSandboxRequest(config=config,
                                                                runtime_handler=handler),
                                        timeout=120).pod_sandbox_id)
        Pods.answered.add(config.metadata.name)
        self.pods.append(sid)
        Pods.told.add(sid)
        Pods.pod_ids.add(sid)
        return sid

    @classmethod
    def ours(cls, pod: Any) -> bool:
        """A listed pod (``PodSandbox``) this process made, its id known or not."""
        return bool(pod.id in cls.pod_ids or (pod.metadata.namespace == NAMESPACE
                                              and pod.metadata.name in cls.asked))

    def create(self, sid: str, config: Any, pod: Any) -> str:
        cid = str(self.rt.CreateContainer(pb.CreateContainerRequest(
            pod_sandbox_id=sid, config=config, sandbox_config=pod), timeout=60).container_id)
        Pods.told.add(cid)
        Pods.container_ids.add(cid)
        return cid

    def start(self, cid: str) -> None:
        self.rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=60)

    def run_container(self, sid: str, config: Any, pod: Any) -> str:
        cid = self.create(sid, config, pod)
        self.start(cid)
        return cid

    def status(self, cid: str, verbose: bool = False) -> Any:
        return self.rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid,
                                                                 verbose=verbose), timeout=30)

    def stop(self, cid: str, timeout: int = 0) -> None:
        self.rt.StopContainer(pb.StopContainerRequest(container_id=cid, timeout=timeout),
                              timeout=timeout + 60)

    def remove(self, cid: str) -> None:
        self.rt.RemoveContainer(pb.RemoveContainerRequest(container_id=cid), timeout=60)

    def stop_pod(self, sid: str) -> None:
        self.rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sid), timeout=120)

    def remove_pod(self, sid: str) -> None:
        self.rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sid), timeout=120)
        if sid in self.pods:
            self.pods.remove(sid)

    def discard(self, sid: str) -> None:
        """Stop and remove a pod (its containers go with it), warning instead of raising:
        cleanup goes on with the next one."""
        with contextlib.suppress(Exception):
            self.stop_pod(sid)
        try:
            self.remove_pod(sid)
        except Exception as e:
            print(f"warning: could not remove pod {sid}: {e}", file=sys.stderr)
        if sid in self.pods:
            self.pods.remove(sid)

    def wait_state(self, cid: str, state: pb.ContainerState.ValueType,
                   timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.status(cid).status.state != state:
            if time.monotonic() > deadline:
                raise RuntimeError(f"container {cid} did not reach "
                                   f"{pb.ContainerState.Name(state)} in {timeout:.0f}s")
            time.sleep(0.05)
