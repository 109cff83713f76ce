"""Stats: CRI ids, prefixes and filters mapped onto the sampler's samples.

The sampler (stats/sampler.py) watches what ``targets`` lists: every running
container (its cgroup and writable layer) and every ready pod (its pause
container's cgroup and, unless it uses the host network, its network counters).
The calls here answer from those samples; a running container that has none yet
is sampled once on demand. A pod's usage is the sum of its members (see
stats/pod_usage.py for why).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cri_api.v1 import api_pb2 as pb

from pycrid.core.containers import ContainerParts
from pycrid.core.containers.status import list_containers
from pycrid.core.pods.pod_parts import PodParts
from pycrid.core.pods.status import list_pods
from pycrid.errors import Unavailable
from pycrid.images.snapshots import Snapshotter
from pycrid.oci.spec import CgroupDriver, cgroups_path
from pycrid.sandbox.controller import SandboxAnchor
from pycrid.stats import metrics
from pycrid.stats.cgroup_hierarchy import Hierarchy
from pycrid.stats.cgroup_stats import CgroupStats
from pycrid.stats.device_names import filesystem_device
from pycrid.stats.netdev import InterfaceCounters
from pycrid.stats.pod_usage import sum_cgroups, sum_rates
from pycrid.stats.sampler import LayerUsage, Sample, Sampler, Target
from pycrid.store.records import ContainerRecord, SandboxRecord
from pycrid.tasks import Owner

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ContainerStatsView:
    record: ContainerRecord
    #: None for a container that is not running (nothing to sample).
    sample: Sample | None
    nano_cores: int | None
    #: The filesystem the writable layer is on (ImageFsInfo's mountpoint).
    fs_mountpoint: str


@dataclass(frozen=True)
class PodStatsView:
    record: SandboxRecord
    timestamp: int
    #: Pause plus the running containers, summed; None before any sample.
    usage: CgroupStats | None
    nano_cores: int | None
    network: tuple[InterfaceCounters, ...] | None
    containers: list[ContainerStatsView]


class StatsService:
    def __init__(self, *, pods: PodParts, containers: ContainerParts,
                 snapshotter: Snapshotter, period: float, cgroup_driver: CgroupDriver,
                 anchor: Callable[[SandboxRecord], SandboxAnchor],
                 hierarchy: Hierarchy, owner: Owner) -> None:
        self.pods = pods
        self.containers = containers
        #: Which cgroup and process stand for a pod (PodAnchors.of).
        self.anchor = anchor
        self.snapshotter = snapshotter
        self.cgroup_driver = cgroup_driver
        #: The device under the snapshotter's root (metrics' "device" label), found once.
        self._fs_device: str | None = None
        self.sampler = Sampler(period=period, targets=self._targets, hierarchy=hierarchy,
                               layer_usage=self._layer_usage, owner=owner)

    def start(self) -> None:
        self.sampler.start()

    async def aclose(self) -> None:
        await self.sampler.aclose()

    # ---- what to sample ---------------------------------------------------------------------

    def _layer_usage(self, key: str) -> LayerUsage:
        """Worker thread: the layer's own usage, and the filesystem under the snapshotter
        (the container's filesystem in cAdvisor's terms: its limit and inodes)."""
        u = self.snapshotter.usage(key)
        if self._fs_device is None:
            self._fs_device = filesystem_device(self.snapshotter.root)
        try:
            st = os.statvfs(self.snapshotter.root)
        except OSError:
            return LayerUsage(used_bytes=u.size, inodes_used=u.inodes, device=self._fs_device)
        return LayerUsage(used_bytes=u.size, inodes_used=u.inodes, device=self._fs_device,
                          capacity_bytes=st.f_blocks * st.f_frsize, inodes_total=st.f_files,
                          inodes_free=st.f_ffree)

    def _container_target(self, rec: ContainerRecord) -> Target:
        pod = self.pods.store.get(rec.sandbox_id)
        reader = self.containers.runtime.own_stats(rec.id)
        if reader is not None:  # inside a gVisor sandbox: the runtime measures it
            sandbox = self.anchor(pod).cgroups_path if pod is not None else ""
            return Target(id=rec.id, cgroups_path=sandbox, layer_key=rec.id, reader=reader)
        parent = pod.config.linux.cgroup_parent if pod is not None else ""
        try:
            fallback = cgroups_path(parent, rec.id, self.cgroup_driver)
        except Exception:  # a parent that no longer fits the driver: trust the spec only
            fallback = ""
        return Target(id=rec.id, cgroups_path=fallback, layer_key=rec.id,
                      spec=os.path.join(self.containers.paths.bundle(rec.id), "config.json"))

    def _pod_target(self, rec: SandboxRecord) -> Target:
        """The pod's anchor (core/anchors.py): its sandbox cgroup, and a process in its
        network namespace (the pause, or a running container for a pod without one)."""
        anchor = self.anchor(rec)
        # A host-network pod has no netns of its own: its process sees the host's interfaces.
        return Target(id=rec.id, cgroups_path=anchor.cgroups_path,
                      net_pid=anchor.pid if rec.netns else 0)

    def _targets(self) -> list[Target]:
        out = [self._pod_target(p) for p in self.pods.store.visible() if p.ready]
        out += [self._container_target(c) for c in self.containers.store.visible()
                if c.state == pb.CONTAINER_RUNNING]
        return out

    # ---- containers -------------------------------------------------------------------------

    def _view(self, rec: ContainerRecord) -> ContainerStatsView:
        running = rec.state == pb.CONTAINER_RUNNING
        return ContainerStatsView(
            record=rec, sample=self.sampler.latest(rec.id) if running else None,
            nano_cores=self.sampler.nano_cores(rec.id) if running else None,
            fs_mountpoint=self.snapshotter.root)

    async def _views(self, recs: Sequence[ContainerRecord]) -> list[ContainerStatsView]:
        await self.sampler.ensure([self._container_target(r) for r in recs
                                   if r.state == pb.CONTAINER_RUNNING])
        return [self._view(r) for r in recs]

    async def container(self, prefix: str) -> ContainerStatsView:
        """ContainerStats: NotFound for an unknown id."""
        rec = self.containers.find(prefix, visible=True)
        return (await self._views([rec]))[0]

    async def list_containers(self, flt: pb.ContainerStatsFilter | None
                              ) -> list[ContainerStatsView]:
        """ListContainerStats: every visible container the filter lets through (id and pod
        id by prefix, labels exactly); those not running carry attributes only."""
        cflt = None
        if flt is not None:
            cflt = pb.ContainerFilter(id=flt.id, pod_sandbox_id=flt.pod_sandbox_id,
                                      label_selector=flt.label_selector)
        return await self._views(list_containers(self.containers, cflt))

    # ---- pods -------------------------------------------------------------------------------

    async def _pod_view(self, rec: SandboxRecord) -> PodStatsView:
        await self.sampler.ensure([self._pod_target(rec)])
        ctrs = await self._views(self.containers.of_sandbox(rec.id))
        ctrs = [c for c in ctrs if not c.record.creating]
        pause = self.sampler.latest(rec.id)
        # A gVisor pod's pause cgroup runs its whole sandbox: it is the pod's usage.
        whole = self.pods.handlers.is_sandboxed(rec.runtime_handler)
        members = [s for s in [pause, *([] if whole else (c.sample for c in ctrs))]
                   if s is not None]
        usage = sum_cgroups([s.cgroup for s in members if s.cgroup is not None])
        rates = [self.sampler.nano_cores(rec.id),
                 *([] if whole else (c.nano_cores for c in ctrs))]
        return PodStatsView(
            record=rec, timestamp=max((s.timestamp for s in members), default=time.time_ns()),
            usage=usage, nano_cores=sum_rates(rates),
            network=pause.network if pause is not None else None, containers=ctrs)

    async def pod(self, prefix: str) -> PodStatsView:
        """PodSandboxStats: NotFound for an unknown id, Unavailable unless ready (as
        containerd: a pod that is not running has no cgroup to read)."""
        rec = self.pods.find(prefix, visible=True)
        if not rec.ready:
            raise Unavailable(f"pod sandbox {rec.id} is not ready: no stats")
        return await self._pod_view(rec)

    async def list_pods(self, flt: pb.PodSandboxStatsFilter | None) -> list[PodStatsView]:
        """ListPodSandboxStats: the ready pods the filter lets through."""
        pflt = pb.PodSandboxFilter(state=pb.PodSandboxStateValue(state=pb.SANDBOX_READY))
        if flt is not None:
            pflt.id = flt.id
            pflt.label_selector.update(flt.label_selector)
        return [await self._pod_view(r) for r in list_pods(self.pods, pflt)]

    # ---- metrics ----------------------------------------------------------------------------

    def descriptors(self) -> tuple[metrics.Descriptor, ...]:
        return metrics.DESCRIPTORS

    async def pod_metrics(self) -> list[tuple[str, list[metrics.MetricValue],
                                              list[tuple[str, list[metrics.MetricValue]]]]]:
        """ListPodSandboxMetrics: per ready pod, (pod id, pod-level series, per-container
        series); containers that are not running are left out (nothing measured)."""
        now = time.time_ns()
        out = []
        for rec in list_pods(self.pods, pb.PodSandboxFilter(
                state=pb.PodSandboxStateValue(state=pb.SANDBOX_READY))):
            view = await self._pod_view(rec)
            md = rec.config.metadata
            pod = metrics.PodInfo(id=rec.id, name=md.name, namespace=md.namespace)
            pause = self.sampler.latest(rec.id)
            pod_series = (metrics.network_metrics(pod, pause.network, pause.timestamp)
                          if pause is not None and pause.network is not None else [])
            per_ctr = []
            for c in view.containers:
                if c.sample is None:
                    continue
                image = (c.record.config.image.user_specified_image
                         or c.record.config.image.image)
                info = metrics.ContainerInfo(id=c.record.id, name=c.record.config.metadata.name,
                                             image=image, started_at=c.record.started_at)
                per_ctr.append((c.record.id, metrics.container_metrics(pod, info, c.sample, now)))
            out.append((rec.id, pod_series, per_ctr))
        return out


__all__ = ["ContainerStatsView", "PodStatsView", "StatsService"]
