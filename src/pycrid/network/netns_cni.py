"""The pod network as pycrid makes it: a netns pinned on a file under ``<state>/netns``,
wired by CNI through the handler's network (network/pod_networks.py).

This is the one implementation of ``SandboxNetwork``; it only puts the netns helpers
(network/netns.py) and the CNI networks behind that interface, so the core depends on
neither.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from typing import Any

from cri_api.v1 import api_pb2 as pb

from pycrid.host.idmap import IDMap
from pycrid.network.cni_args import bandwidth
from pycrid.network.netns import connect_in, create_netns, is_pinned, remove_netns
from pycrid.network.pod_networks import PodNetworks
from pycrid.network.sandbox_network import SandboxNetwork


class NetnsCNI(SandboxNetwork):
    def __init__(self, networks: PodNetworks, netns_dir: str) -> None:
        self.networks = networks
        self.netns_dir = netns_dir
        os.makedirs(netns_dir, mode=0o711, exist_ok=True)

    async def start(self) -> None:
        await self.networks.start()

    async def aclose(self) -> None:
        await self.networks.aclose()

    async def not_ready_reason(self) -> str | None:
        return await self.networks.not_ready_reason()

    def describe(self) -> dict[str, Any]:
        return self.networks.describe()

    async def update_pod_cidr(self, pod_cidr: str) -> None:
        await self.networks.update_pod_cidr(pod_cidr)

    def validate(self, config: pb.PodSandboxConfig) -> None:
        bandwidth(config.annotations)  # refuses unreadable limits

    def new_netns_path(self) -> str:
        return os.path.join(self.netns_dir, f"cni-{uuid.uuid4()}")

    async def create_netns(self, path: str, idmap: IDMap | None = None) -> None:
        await asyncio.to_thread(create_netns, path, idmap)

    async def remove_netns(self, path: str) -> None:
        await asyncio.to_thread(remove_netns, path)

    def netns_pinned(self, path: str) -> bool:
        return is_pinned(path)

    async def set_up(self, sandbox_id: str, netns: str, config: pb.PodSandboxConfig,
                     handler: str) -> list[str]:
        return await self.networks.attach(sandbox_id, netns, config, handler)

    async def tear_down(self, sandbox_id: str, netns: str, config: pb.PodSandboxConfig,
                        handler: str) -> None:
        """CNI DEL from a cached result (also after a restart or reboot), or from the
        current config while the netns is still pinned (a crash during ADD)."""
        await self.networks.detach(sandbox_id, netns, config, handler,
                                   netns_alive=is_pinned(netns))

    async def check(self, sandbox_id: str, netns: str, handler: str) -> str | None:
        return await self.networks.check(sandbox_id, netns, handler)

    def results(self, sandbox_id: str) -> dict[str, Any]:
        return {c.ifname: c.result for c in self.networks.cache.of(sandbox_id)}

    async def dial(self, netns: str, port: int) -> socket.socket:
        return await connect_in(netns or None, port)

    async def sweep(self, pods: set[str], netns_in_use: set[str]) -> list[str]:
        removed: list[str] = []
        try:
            names = sorted(n for n in os.listdir(self.netns_dir) if not n.startswith("."))
        except FileNotFoundError:
            names = []
        for name in names:
            path = os.path.join(self.netns_dir, name)
            if path not in netns_in_use:
                await asyncio.to_thread(remove_netns, path)
                removed.append(f"netns {path}")
        cache = self.networks.cache
        for sid in sorted(cache.owners() - pods):
            # Tear down from the cached config and result alone (no netns left to fall
            # back on).
            with contextlib.suppress(Exception):
                await self.networks.detach(sid, "", pb.PodSandboxConfig(),
                                           self.networks.default_runtime, netns_alive=False)
            cache.purge(sid)
            removed.append(f"CNI attachment of {sid}")
        return removed
