"""The sandbox controller interface, in containerd's shape (core/sandbox/controller.go).

A controller owns what makes a pod a pod at the runtime level: for the pause
controller, the pause container and the files and mounts it shares with the
pod's containers. Networking is not the controller's: the core creates the
network namespace (and, later, runs CNI) and hands its path in.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cri_api.v1 import api_pb2 as pb

from pycrid.oci.spec import Namespaces
from pycrid.oci.spec_mounts import SandboxFiles
from pycrid.runtime.exits import Exit
from pycrid.runtime.interface import RuncState
from pycrid.store.records import SandboxRecord


@dataclass(frozen=True)
class SandboxRequest:
    """What the core hands the controller to create a pod's sandbox."""

    id: str
    config: pb.PodSandboxConfig
    #: The sandbox image: its reference, its config (the OCI image config JSON) and
    #: the chain id of its top layer (none for a pod without a pause process).
    image_name: str = ""
    image_config: dict[str, Any] = field(default_factory=dict)
    image_chain_top: str = ""
    #: The network namespace to join ("" for the host's).
    netns: str = ""
    #: The runtime handler (RuntimeClass) that runs it ("": the default).
    runtime_handler: str = ""


class SandboxState(enum.Enum):
    """Whether what stands for a pod (its pause process, or its pinned namespaces) lives."""

    RUNNING = "running"
    STOPPED = "stopped"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class SandboxStatus:
    id: str
    pid: int
    state: SandboxState
    exit: Exit | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SandboxAnchor:
    """What stands for a pod on the node, for whoever observes pods from outside (stats,
    NRI, the kubelet's cAdvisor through the containerd API).

    With a pause process these are the pause's. A pod without one has no process and no
    cgroup of its own: its controller answers with what it has (a running container's
    pid, the pod's cgroup), which is why nobody else works these out."""

    #: OCI ``linux.cgroupsPath`` of the cgroup that represents the sandbox ("": none).
    cgroups_path: str
    #: A live process in the pod's namespaces, its network namespace included (0: none).
    pid: int
    #: An OCI config.json describing that process ("": none).
    spec: str


class SandboxController(abc.ABC):
    @abc.abstractmethod
    async def create(self, req: SandboxRequest) -> None:
        """Prepare everything the sandbox needs; nothing runs yet."""

    @abc.abstractmethod
    async def start(self, sandbox_id: str) -> int:
        """Run the sandbox; returns the pid whose namespaces the containers join."""

    @abc.abstractmethod
    async def stop(self, sandbox_id: str, grace: float = 0) -> None:
        """Stop the sandbox's process and release its runtime resources (idempotent)."""

    @abc.abstractmethod
    async def status(self, sandbox_id: str, verbose: bool = False) -> SandboxStatus: ...

    @abc.abstractmethod
    def recovered_status(self, sandbox_id: str,
                         runtime_states: dict[str, RuncState]) -> SandboxStatus:
        """At start-up: the sandbox's status from the runtime's view of every container
        (one ``runc list``) and its recorded exit, without a runtime call of its own."""

    @abc.abstractmethod
    async def shutdown(self, sandbox_id: str) -> Sequence[str]:
        """Delete every trace of the sandbox (idempotent; also undoes a partial create).
        Returns the parents of the snapshots removed: chains that may now be collected
        (a pause image's chowned copy for a pod in a user namespace)."""

    @abc.abstractmethod
    def files(self, sandbox_id: str) -> SandboxFiles:
        """The per-pod files the pod's containers mount (hostname, hosts, resolv.conf, shm)."""

    @abc.abstractmethod
    def exited(self, sandbox_id: str, exit_: Exit) -> None:
        """The exit watcher saw the sandbox's process end."""

    @abc.abstractmethod
    async def watch(self, sandbox_id: str, lost: Callable[[str], None]) -> Exit | None:
        """Watch what stands for the pod (once it is ready; again after a restart). A
        pause that dies reaches the core as an exit (conmon's, or one recorded for a
        dead conmon); pins that disappear call ``lost(sandbox_id)`` once. An exit
        returned here was found now: the pause's conmon died while nobody watched."""

    @abc.abstractmethod
    def namespaces(self, rec: SandboxRecord) -> Namespaces:
        """The namespaces the pod's containers join."""

    @abc.abstractmethod
    def stand_in(self, sandbox: SandboxRecord, pid: int) -> None:
        """The pod's running container that stands for it changed (``pid``; 0: none runs).
        Only a controller without a process of its own cares (see PinnedController)."""

    @abc.abstractmethod
    def anchor(self, sandbox: SandboxRecord) -> SandboxAnchor:
        """Which cgroup and which process of its own stand for this pod (see
        SandboxAnchor; pid 0 when it has none: the core then names a running container).
        Called from memory-only paths: no runtime calls; at most a small file read."""
