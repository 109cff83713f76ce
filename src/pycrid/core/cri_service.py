"""CRIService: the core that the CRI servicers call (wired by ``pycrid.core_wiring``).

It holds the parts (images, pods, containers, pod networks, NRI), owns the
exit watcher and the exit monitor that feed exits to pods and containers and
the CRI container event stream, runs start-up recovery (DESIGN.md's order),
and answers the runtime-wide questions: version, readiness conditions,
runtime config.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pycrid import release
from pycrid.config.schema import Config, NRIConfig, RuntimeConfig
from pycrid.core import orphans
from pycrid.core.anchors import PodAnchors
from pycrid.core.containers import ContainerParts
from pycrid.core.containers.exited import handle_exit
from pycrid.core.containers.recover import recover_containers
from pycrid.core.containers.remove import cleanup
from pycrid.core.events import ContainerEvents
from pycrid.core.nri_relay import NRI
from pycrid.core.pods import pause_exit
from pycrid.core.pods.pod_parts import PodParts
from pycrid.core.pods.recover import check_networks, recover_pods
from pycrid.core.stats_queries import StatsService
from pycrid.core.status_info import (
    CheckpointInfo,
    DaemonInfo,
    HandlerInfo,
    ImageInfo,
    NRIInfo,
    StatusInfo,
)
from pycrid.events.monitor import ExitMonitor
from pycrid.host.facts import HostFacts
from pycrid.images.image_service import ImageService
from pycrid.runtime.exits import Exit, ExitWatcher
from pycrid.runtime.handlers import HandlerFeatures, HandlerSpec
from pycrid.runtime.interface import ContainerRuntime
from pycrid.tasks import Owner

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


#: CRI state names (``pycrid status``, the metrics): every one is reported, 0 included.
POD_STATES = ("SANDBOX_READY", "SANDBOX_NOTREADY")
CONTAINER_STATES = ("CONTAINER_CREATED", "CONTAINER_RUNNING", "CONTAINER_EXITED",
                    "CONTAINER_UNKNOWN")
_CONTAINER_STATE_NAMES = dict(enumerate(CONTAINER_STATES))


@dataclass(frozen=True)
class CoreConfig:
    """What the daemon was configured with, as the core needs it."""

    config: Config
    runtime: RuntimeConfig
    nri: NRIConfig
    #: Warnings of the config load, reported by Status (`pycrid status`).
    warnings: Sequence[str] = ()
    #: The config file read ("": the embedded defaults).
    source: str = ""


@dataclass(frozen=True)
class CoreParts:
    """What ``build_core`` wired, held by the core."""

    images: ImageService
    pods: PodParts
    containers: ContainerParts
    runtime: ContainerRuntime
    nri: NRI
    events: ContainerEvents
    #: Container and pod stats: owns the one sampling loop (started in start()).
    stats: StatsService
    #: Which cgroup and process stand for each pod (stats, NRI, containerd's API).
    anchors: PodAnchors
    handlers: Mapping[str, HandlerSpec]
    host: HostFacts


class CRIService:
    def __init__(self, parts: CoreParts, settings: CoreConfig, *, layout: orphans.Layout,
                 owner: Owner) -> None:
        self.images = parts.images
        self.network = parts.pods.network
        self.nri = parts.nri
        self.pods = parts.pods
        self.containers = parts.containers
        self.runtime = parts.runtime
        self.events = parts.events
        self.stats = parts.stats
        self.anchors = parts.anchors
        self.handlers = dict(parts.handlers)
        self.host = parts.host
        self.runtime_config = settings.runtime
        self.config = settings.config
        self.warnings = list(settings.warnings)
        #: For `pycrid status`: when this daemon started, and the config file it read.
        self.config_source = settings.source
        self.layout = layout
        self.started_at = time.time()
        self._started = time.monotonic()
        #: Sockets other plugins serve for this core, by name (`pycrid status`).
        self.sockets: dict[str, str] = {}
        self.owner = owner
        self.exits = ExitWatcher(parts.runtime.exit_dir, self._exit_file)
        self.monitor = ExitMonitor(self._handle_exit, owner=owner.child("exit monitor"))
        #: The CNI CHECKs after a restart: stopped first at shutdown, before what they use.
        self._checks = owner.child("CNI CHECK")
        #: How long start-up recovery of pods and containers took (the metrics gauge).
        self.recovery_seconds: float | None = None

    async def start(self) -> None:
        """Start-up (DESIGN.md): watch exit files first (so none is missed; they queue in
        the monitor), load the CNI config (recovery may DEL), recover images, pods and
        containers, sweep orphans; then NRI, synchronised with the recovered state; then
        the monitor handles the queued exits (those found by recovery included) as fresh
        ones, so plugins and event subscribers hear of them, before the gate opens."""
        self.exits.start()
        await self.network.start()
        await self.images.recover()
        started = time.monotonic()
        states = await self.runtime.states()
        recorded = set(self.pods.store.ids()) | set(self.containers.store.ids())
        to_check = await recover_pods(self.pods, states, self.monitor.submit)
        await recover_containers(self.containers, states, self.monitor.submit)
        # runc's view is from before recovery: the containers of records recovery rolled
        # back or removed are in it, gone by now, and no orphans.
        await self._sweep_orphans(set(states) - recorded)
        self.recovery_seconds = time.monotonic() - started
        log.info("recovered %d pods and %d containers in %.1f ms", len(self.pods.store.ids()),
                 len(self.containers.store.ids()), self.recovery_seconds * 1000)
        self._say_unknown_fields()
        self.nri.recovered()
        await self.nri.start()
        self.warnings.extend(self.nri.adaptation.warnings if self.nri.adaptation else ())
        self.monitor.start()
        await self.monitor.idle()
        for pod in self.pods.store.visible():
            self.anchors.refresh(pod.id)  # what stands for each pod, known again
        # The CNI CHECKs of pods that survived the restart (after the gate opened).
        self._checks.spawn(self._check_networks(to_check), "after restart")
        self.stats.start()

    async def _check_networks(self, ids: Sequence[str]) -> None:
        started = time.monotonic()
        await check_networks(self.pods, ids)
        log.info("checked the networks of %d pods in %.1f ms", len(ids),
                 (time.monotonic() - started) * 1000)

    async def _sweep_orphans(self, runtime_ids: set[str]) -> None:
        pods, ctrs = set(self.pods.store.ids()), set(self.containers.store.ids())
        removed = await orphans.sweep(
            layout=self.layout, recorded=orphans.Recorded(
                pods=pods, containers=ctrs,
                netns={r.netns for r in self.pods.store.all() if r.netns}),
            runtime_ids=runtime_ids, snapshotter=self.images.snapshotter,
            network=self.pods.network, remove_sandbox=self.pods.controller.shutdown,
            remove_container=functools.partial(cleanup, self.containers))
        for what in removed:
            log.warning("removed orphaned %s (no record owns it)", what)

    def _say_unknown_fields(self) -> None:
        """Records a newer pycrid wrote carry fields this one keeps without knowing them
        (after a rollback): worth a line, not a warning."""
        seen: dict[str, int] = {}
        for store in (self.pods.store, self.containers.store):
            for oid in store.ids():
                for name in store.unknown_fields(oid):
                    seen[name] = seen.get(name, 0) + 1
        if seen:
            log.info("records carry fields a newer pycrid wrote, kept as they are: %s",
                     ", ".join(f"{name} ({n})" for name, n in sorted(seen.items())))

    async def aclose(self) -> None:
        """Containers keep running under conmon; let the calls under way end (those whose
        client went away undo themselves at their next step), stop watching, end event
        streams, shut NRI plugins down."""
        await self.containers.operations.aclose()
        self.exits.close()
        await self.stats.aclose()
        await self._checks.aclose()
        await self.monitor.aclose()
        self.events.broadcast.close()
        await self.network.aclose()
        await self.nri.stop()
        await self.owner.aclose()

    def _exit_file(self, exit_: Exit) -> None:
        """From the watcher: wake waiters now, queue the rest for the monitor."""
        pause_exit.notify_exit(self.pods, exit_)
        self.containers.waiters.notify(exit_)
        self.monitor.submit(exit_)

    async def _handle_exit(self, exit_: Exit) -> None:
        if self.pods.store.get(exit_.id) is not None:
            await pause_exit.handle_exit(self.pods, exit_)
        else:
            await handle_exit(self.containers, exit_)

    def version(self) -> tuple[str, str, str]:
        """(runtime name, runtime version, CRI API version)."""
        return RUNTIME_NAME, release.runtime_version(), CRI_API_VERSION

    async def conditions(self) -> list[Condition]:
        network = Condition("NetworkReady", True)
        if (why := await self.network.not_ready_reason()) is not None:
            # containerd's reason and message prefix, so node tooling reads it the same way.
            network = Condition("NetworkReady", False, "NetworkPluginNotReady",
                                f"Network plugin returns error: {why}")
        return [Condition("RuntimeReady", True), network]

    def status_info(self) -> StatusInfo:
        """What the daemon says about itself (``pycrid status``, Status verbose info): the
        effective config, the CNI networks in use, the start-up warnings and more; the
        CRI edge turns it into JSON."""
        return StatusInfo(
            config=self.config, cni=self.network.describe(), warnings=tuple(self.warnings),
            # AppArmor and SELinux requests are refused or ignored on a host without them.
            host_security=self.host.security,
            # Counts by CRI state and the NRI plugins, for `pycrid status` / `nri plugins`.
            pods=self.pod_counts(), containers=self.container_counts(),
            nri=self._nri_info(), daemon=self._daemon_info(), images=self._image_info(),
            checkpoint=self._checkpoint_info(), handlers=self._handler_info())

    def _checkpoint_info(self) -> CheckpointInfo:
        criu = self.host.criu
        return CheckpointInfo(
            criu=criu.path, criu_version=criu.version, criu_error=criu.error,
            handlers={name: self.runtime.checkpoint_refusal(name) or ""
                      for name in sorted(self.handlers)})

    def _handler_info(self) -> tuple[HandlerInfo, ...]:
        default, pods = self.runtime_config.default_runtime_name, self.pods.handlers
        return tuple(HandlerInfo(
            name=name, runtime_type=h.runtime_type, binary=h.runc_binary, root=h.runc_root,
            default=name == default, sandboxed=h.sandboxed,
            pod_sandbox="pause" if name in pods.podsandbox or not pods.drop_infra
            else "drop_infra_ctr",
            recursive_read_only_mounts=h.features.recursive_read_only_mounts,
            user_namespaces=h.features.user_namespaces,
            update_resources=h.features.update_resources, version=h.version,
            flags=tuple(h.runsc.args("%ID%")) if h.runsc is not None else (),
            config_path=h.runsc.config_path if h.runsc is not None else "")
            for name, h in sorted(self.handlers.items()))

    def _daemon_info(self) -> DaemonInfo:
        cfg = self.config
        nri = self.nri.adaptation
        return DaemonInfo(
            version=release.VERSION, commit=release.commit(), pid=os.getpid(),
            started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started_at)),
            uptime_seconds=round(time.monotonic() - self._started, 1),
            config_file=self.config_source, root=cfg.root, state=cfg.state,
            sockets={
                "cri": cfg.grpc.address.removeprefix("unix://"),
                "nri": "" if nri is None or nri.config.disable_connections
                else nri.config.socket_path,
                "metrics": cfg.metrics.address,
                **self.sockets,
            })

    def _image_info(self) -> ImageInfo:
        images = self.images.store.list()
        return ImageInfo(count=len(images), bytes=sum(i.size for i in images),
                         sandbox_image=self.images.config.sandbox_image,
                         signature_policy=self.images.policy_info())

    def pod_counts(self) -> dict[str, int]:
        """Visible pods by CRI state name (every state, 0 included), from memory."""
        counts = dict.fromkeys(POD_STATES, 0)
        for rec in self.pods.store.visible():
            counts["SANDBOX_READY" if rec.ready else "SANDBOX_NOTREADY"] += 1
        return counts

    def container_counts(self) -> dict[str, int]:
        """Visible containers by CRI state name (every state, 0 included), from memory."""
        counts = dict.fromkeys(CONTAINER_STATES, 0)
        for rec in self.containers.store.visible():
            counts[_CONTAINER_STATE_NAMES.get(int(rec.state), "CONTAINER_UNKNOWN")] += 1
        return counts

    def _nri_info(self) -> NRIInfo:
        adaptation = self.nri.adaptation
        if adaptation is None:
            return NRIInfo(enabled=False, socket="", plugins=())
        cfg = adaptation.config
        return NRIInfo(enabled=True,
                       socket="" if cfg.disable_connections else cfg.socket_path,
                       plugins=tuple(p.describe() for p in adaptation.plugins if not p.closed))

    async def update_runtime_config(self, pod_cidr: str) -> None:
        await self.network.update_pod_cidr(pod_cidr)

    def runtime_handlers(self) -> list[tuple[str, HandlerFeatures]]:
        """Status's runtime handlers, by name, with the default also under "" (as
        containerd reports it)."""
        out = [(name, h.features) for name, h in sorted(self.handlers.items())]
        default = self.handlers.get(self.runtime_config.default_runtime_name)
        if default is not None:
            out.insert(0, ("", default.features))
        return out

    def cgroup_driver(self) -> str:
        return self.runtime_config.cgroup_driver
