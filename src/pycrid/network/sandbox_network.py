"""What the core needs of a pod's network, as one interface (the network's side of the
sandbox, as sandbox/controller.py is the runtime's side).

The core never calls netns or CNI functions itself: it asks this interface for a netns
path (recorded before anything is made, so a crash leaves a record that names it),
makes and pins the netns, sets the pod's network up and tears it down, reads its state
back, and dials a port inside it for port-forward. ``NetnsCNI`` (network/netns_cni.py)
implements it with pinned netns files and CNI.
"""

from __future__ import annotations

import abc
import socket
from typing import Any

from cri_api.v1 import api_pb2 as pb

from pycrid.host.idmap import IDMap


class SandboxNetwork(abc.ABC):
    # ---- the network's own life and state ----------------------------------------------

    @abc.abstractmethod
    async def start(self) -> None:
        """Load the network configuration and watch it (before recovery: it may DEL)."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Stop watching the configuration."""

    @abc.abstractmethod
    async def not_ready_reason(self) -> str | None:
        """Why pods cannot get a network now (the NetworkReady condition), or None."""

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """The networks in use, for the status output."""

    @abc.abstractmethod
    async def update_pod_cidr(self, pod_cidr: str) -> None:
        """The node's pod CIDRs, as the kubelet gives them (UpdateRuntimeConfig)."""

    @abc.abstractmethod
    def validate(self, config: pb.PodSandboxConfig) -> None:
        """Refuse a config the network could not honour (unreadable bandwidth limits),
        before any side effect."""

    # ---- the network namespace ---------------------------------------------------------

    @abc.abstractmethod
    def new_netns_path(self) -> str:
        """Where a new pod's netns will be pinned (nothing is made yet)."""

    @abc.abstractmethod
    async def create_netns(self, path: str, idmap: IDMap | None = None) -> None:
        """Create a network namespace pinned at ``path``, loopback up; with ``idmap``
        (a pod in a user namespace), owned by a new user namespace with those maps."""

    @abc.abstractmethod
    async def remove_netns(self, path: str) -> None:
        """Unpin and delete it (nothing to do if it is gone)."""

    @abc.abstractmethod
    def netns_pinned(self, path: str) -> bool:
        """Whether the file at ``path`` still holds its namespace."""

    # ---- the pod network (CNI) ---------------------------------------------------------

    @abc.abstractmethod
    async def set_up(self, sandbox_id: str, netns: str, config: pb.PodSandboxConfig,
                     handler: str) -> list[str]:
        """Attach the pod to its network; its IPs. A failed or cancelled set-up undoes
        itself."""

    @abc.abstractmethod
    async def tear_down(self, sandbox_id: str, netns: str, config: pb.PodSandboxConfig,
                        handler: str) -> None:
        """Detach the pod, if anything is attached (idempotent)."""

    @abc.abstractmethod
    async def check(self, sandbox_id: str, netns: str, handler: str) -> str | None:
        """None if the pod's network is fine, else what is wrong."""

    @abc.abstractmethod
    def results(self, sandbox_id: str) -> dict[str, Any]:
        """What set-up reported, by interface name (PodSandboxStatus verbose info)."""

    # ---- port-forward and start-up -----------------------------------------------------

    @abc.abstractmethod
    async def dial(self, netns: str, port: int) -> socket.socket:
        """A connection to ``localhost:port`` inside ``netns`` ("": the host network)."""

    @abc.abstractmethod
    async def sweep(self, pods: set[str], netns_in_use: set[str]) -> list[str]:
        """At start-up: remove every netns and attachment no known pod owns; returns what
        was removed (for the log)."""
