"""CRIService: the core that the CRI servicers call.

It holds the parts (images, pods, containers, pod networks, NRI), owns the
exit watcher that feeds exits to pods and containers, runs start-up recovery,
and answers the runtime-wide questions: version, readiness conditions,
runtime config.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from typing import Any

from pycrid import __version__
from pycrid.config.schema import Config, NRIConfig, RuntimeConfig
from pycrid.core.containers import ContainerManager, ContainerPaths
from pycrid.core.nri import NRI, runc_version
from pycrid.core.pods import PodManager
from pycrid.core.registrar import KeyedLocks
from pycrid.images.service import ImageService
from pycrid.network.service import PodNetworks
from pycrid.oci.adjust import HostSupport
from pycrid.oci.spec import CgroupDriver, cgroups_path
from pycrid.runtime.exits import Exit, ExitWatcher
from pycrid.runtime.interface import ContainerRuntime
from pycrid.sandbox.controller import SandboxController
from pycrid.sandbox.pause import own_oom_score_adj
from pycrid.store.db import Database
from pycrid.store.pods import container_store, sandbox_store

log = logging.getLogger(__name__)

RUNTIME_NAME = "pycrid"
CRI_API_VERSION = "v1"
#: VersionResponse.version: the kubelet API version, a constant in containerd and CRI-O too.
KUBE_API_VERSION = "0.1.0"


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str = ""
    message: str = ""


class CRIService:
    def __init__(
        self,
        *,
        images: ImageService,
        pods: PodManager,
        containers: ContainerManager,
        runtime: ContainerRuntime,
        runtime_config: RuntimeConfig,
        config: Config,
        warnings: list[str],
        nri: NRI,
        network: PodNetworks,
    ) -> None:
        self.images = images
        self.network = network
        self.nri = nri
        self.pods = pods
        self.containers = containers
        self.runtime = runtime
        self.runtime_config = runtime_config
        self.config = config
        self.warnings = list(warnings)
        self.exits = ExitWatcher(runtime.exit_dir, self._on_exit)

    async def start(self) -> None:
        """Start-up: watch exits first (so none is missed), load the CNI config (recovery
        may DEL), then recover images, pods, containers."""
        self.exits.start()
        await self.network.start()
        await self.images.recover()
        await self.pods.recover()
        await self.containers.recover()
        for sid, why in self.pods.store.broken + self.containers.store.broken:
            log.error("record %s could not be read and is ignored: %s", sid, why)
        # NRI after recovery (DESIGN.md): plugins are synchronised with the recovered state.
        self.nri.recovered()
        await self.nri.start()
        self.warnings.extend(self.nri.adaptation.warnings if self.nri.adaptation else ())

    async def aclose(self) -> None:
        """Containers keep running under conmon; stop watching, shut NRI plugins down."""
        self.exits.close()
        await self.network.aclose()
        await self.nri.stop()

    def _on_exit(self, exit_: Exit) -> None:
        if not self.pods.on_exit(exit_):
            self.containers.on_exit(exit_)
            self.nri.container_exited(exit_.id)

    def version(self) -> tuple[str, str, str]:
        """(runtime name, runtime version, CRI API version)."""
        return RUNTIME_NAME, __version__, CRI_API_VERSION

    async def conditions(self) -> list[Condition]:
        network = Condition("NetworkReady", True)
        if (why := await self.network.not_ready_reason()) is not None:
            # containerd's reason and message prefix, so node tooling reads it the same way.
            network = Condition("NetworkReady", False, "NetworkPluginNotReady",
                                f"Network plugin returns error: {why}")
        return [Condition("RuntimeReady", True), network]

    def status_info(self) -> dict[str, str]:
        """Status verbose info: the effective config, the CNI networks in use and the
        start-up warnings, as JSON."""
        return {
            "config": json.dumps(_jsonable(self.config), sort_keys=True),
            "cniconfig": json.dumps(self.network.describe()),
            "warnings": json.dumps(self.warnings),
        }

    async def update_runtime_config(self, pod_cidr: str) -> None:
        await self.network.update_pod_cidr(pod_cidr)

    def cgroup_driver(self) -> str:
        return self.runtime_config.cgroup_driver


def _jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    return obj


def build_core(*, db: Database, images: ImageService, runtime_config: RuntimeConfig,
               runtime: ContainerRuntime, controller: SandboxController, root: str, state: str,
               config: Config, warnings: list[str], nri_config: NRIConfig) -> CRIService:
    """Wire the core from its parts (used by the CRI plugin and by tests).

    The NRI side is built here with the stores it reports on, never on its own, so
    every exit the core sees, from start-up recovery on, can reach plugins."""
    locks = KeyedLocks()
    sandboxes = sandbox_store(db)
    ctr_store = container_store(db)
    driver: CgroupDriver = ("systemd" if runtime_config.cgroup_driver == "systemd"
                            else "cgroupfs")
    paths = ContainerPaths(state_dir=state, root_dir=root)
    runc = getattr(runtime, "runc", "runc")
    nri = NRI(nri_config, sandboxes=sandboxes, containers=ctr_store,
              pod_cgroups_path=lambda rec: cgroups_path(rec.config.linux.cgroup_parent,
                                                        rec.id, driver),
              bundle_of=paths.bundle,
              host=lambda: HostSupport.probe(runc_version(runc), own_oom_score_adj()))
    containers = ContainerManager(
        store=ctr_store, sandboxes=sandboxes, controller=controller,
        runtime=runtime, images=images, paths=paths, locks=locks, nri=nri,
        cgroup_driver=driver)
    nri.bind(apply_resources=containers.apply_resources, evict=containers.evict)
    network = PodNetworks(runtime_config.cni, runtime_config.runtimes,
                          runtime_config.default_runtime_name, os.path.join(root, "cni"))
    pods = PodManager(store=sandboxes, controller=controller, containers=containers,
                      images=images, netns_dir=os.path.join(state, "netns"), locks=locks,
                      nri=nri, network=network, handlers=runtime_config.runtimes.keys())
    return CRIService(images=images, pods=pods, containers=containers, runtime=runtime,
                      runtime_config=runtime_config, config=config, warnings=warnings, nri=nri,
                      network=network)
