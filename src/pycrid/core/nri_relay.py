"""The CRI side of NRI: tells plugins about pods and containers, applies what they answer.

containerd splits this between ``internal/nri`` (a per-object state machine so
Stop and Remove go out once) and the CRI domain; here it is one object the
pod and container managers call at the points containerd does. It keeps what
plugins have been told about each object (the NRI view), which is also what a
newly registered plugin is synchronised with, under the write side of the
plugin-sync lock whose read side every CRI operation holds: an object is seen
by a new plugin either in its sync or as a later event, never both, never neither.

With NRI disabled every hook returns at once and no lock is taken.

Everything the relay needs comes at construction: what it reads about pods and
containers (``RelaySources``), what it asks of the container manager
(``ContainerActions``), what the host can honour (``HostSupport``, probed by the
caller) and the plugins' metrics and tracing (``PluginInstruments``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pycrid import release
from pycrid.config.schema import NRIConfig
from pycrid.core.nri_objects import (
    container_object,
    oci_resource_update,
    pod_object,
    set_status,
)
from pycrid.core.registrar import RWLock
from pycrid.errors import NotFound
from pycrid.nri import api
from pycrid.nri.adaptation.adaptation import Adaptation, SyncFn
from pycrid.nri.adaptation.call_accounting import PluginInstruments
from pycrid.oci.cdi import CdiRegistry
from pycrid.oci.nri_apply import apply_adjustment
from pycrid.oci.nri_host_support import HostSupport
from pycrid.oci.nri_sandboxed import refuse_unhonoured
from pycrid.oci.spec import Namespaces
from pycrid.store.records import ContainerRecord, RecordStore, SandboxRecord
from pycrid.tasks import Owner

log = logging.getLogger(__name__)

RUNTIME_NAME = "pycrid"

#: How the core applies resources to one container and stops one.
ApplyResources = Callable[[str, dict[str, Any]], Awaitable[None]]
Evict = Callable[[str, str], Coroutine[Any, Any, None]]


@dataclass(frozen=True)
class RelaySources:
    """What the relay reads to describe pods and containers to plugins."""

    sandboxes: RecordStore[SandboxRecord]
    containers: RecordStore[ContainerRecord]
    pod_cgroups_path: Callable[[SandboxRecord], str]
    pod_namespaces: Callable[[SandboxRecord], Namespaces | None]
    #: A container's spec as its bundle holds it (ContainerBundles.read_spec).
    read_spec: Callable[[str], dict[str, Any]]
    #: gVisor handlers by name ("" names the default), each with whether it applies OCI
    #: seccomp policies: adjustments their containers cannot have are refused.
    sandboxed: Mapping[str, bool] = field(default_factory=dict)


@dataclass(frozen=True)
class ContainerActions:
    """What plugins may ask of containers through the relay: new resources, eviction."""

    apply_resources: ApplyResources
    evict: Evict


class NRI:
    def __init__(self, config: NRIConfig, *, sources: RelaySources, actions: ContainerActions,
                 host: HostSupport, instruments: PluginInstruments | None = None,
                 owner: Owner, cdi: CdiRegistry | None = None) -> None:
        self.config = config
        self.sandboxes = sources.sandboxes
        self.containers = sources.containers
        self._pod_cgroups_path = sources.pod_cgroups_path
        self._pod_namespaces = sources.pod_namespaces
        self._read_spec = sources.read_spec
        self._sandboxed = dict(sources.sandboxed)
        self.actions = actions
        self.host = host
        self.cdi = cdi or CdiRegistry()
        self._owner = owner
        self._evictions = self._owner.child("evictions")
        self.adaptation = (None if config.disable else
                           Adaptation(config, runtime_name=RUNTIME_NAME,
                                      runtime_version=release.runtime_version(), domain=self,
                                      owner=self._owner.child("plugins"),
                                      instruments=instruments))
        self.sync_lock = RWLock()
        #: What plugins have been told, by object id.
        self._pods: dict[str, api.PodSandbox] = {}
        self._pods_stopped: set[str] = set()
        self._ctrs: dict[str, api.Container] = {}
        self._stops: dict[str, asyncio.Future[None]] = {}

    @property
    def enabled(self) -> bool:
        return self.adaptation is not None

    # ---- lifetime -----------------------------------------------------------------------

    def recovered(self) -> None:
        """After start-up recovery: every pod and container record becomes the NRI view
        (exits found during recovery are part of it, so plugins see them at sync)."""
        if self.adaptation is None:
            return
        for rec in self.sandboxes.all():
            self._pods[rec.id] = self._pod(rec)
            if not rec.ready:
                self._pods_stopped.add(rec.id)
        for c in self.containers.all():
            try:
                spec = self._read_spec(c.id)
            except NotFound:
                spec = {}
            self._ctrs[c.id] = container_object(c, spec)

    async def start(self) -> None:
        if self.adaptation is not None:
            await self.adaptation.start()

    async def stop(self) -> None:
        """Evictions in flight first, then the plugins (Shutdown, close)."""
        await self._evictions.aclose()
        if self.adaptation is not None:
            await self.adaptation.stop()
        await self._owner.aclose()

    @contextlib.asynccontextmanager
    async def blocking_sync(self) -> AsyncIterator[None]:
        """The read side of the plugin-sync lock: held by every CRI operation (top level
        only: it is not re-entrant once a registration waits)."""
        if self.adaptation is None:
            yield
            return
        async with self.sync_lock.read():
            yield

    # ---- domain (what the adaptation calls) ---------------------------------------------

    async def synchronize(self, sync: SyncFn) -> None:
        async with self.sync_lock.write():
            updates = await sync(list(self._pods.values()), list(self._ctrs.values()))
            failed = await self.update_containers(updates)
            for u in failed:
                log.warning("NRI: update of container %s from synchronization failed",
                            u.container_id)

    async def update_containers(
            self, updates: Sequence[api.ContainerUpdate]) -> list[api.ContainerUpdate]:
        """Apply plugin updates to containers' resources; unknown ids are skipped (upstream)."""
        failed: list[api.ContainerUpdate] = []
        for u in updates:
            rec = self.containers.get(u.container_id)
            if rec is None:
                continue
            resources = oci_resource_update(u.linux.resources)
            if not resources:
                continue
            try:
                await self.actions.apply_resources(rec.id, resources)
            except Exception as e:
                log.warning("NRI: updating container %s failed: %s", rec.id, e)
                if not u.ignore_failure:
                    failed.append(u)
        return failed

    def evict(self, evictions: Sequence[api.ContainerEviction]) -> None:
        for ev in evictions:
            if self.containers.get(ev.container_id) is None:
                continue
            if self._evictions.closed:
                log.warning("NRI: eviction of container %s ignored: NRI is stopping",
                            ev.container_id)
                continue
            log.warning("NRI: evicting container %s: %s", ev.container_id, ev.reason)
            self._evictions.spawn(
                self.actions.evict(ev.container_id, ev.reason or "evicted by an NRI plugin"),
                f"evict {ev.container_id[:12]}")

    # ---- pods ---------------------------------------------------------------------------

    async def run_pod(self, rec: SandboxRecord) -> None:
        """RunPodSandbox hook; a refusal fails the call (the caller undoes the pod)."""
        if self.adaptation is None:
            return
        pod = self._pods[rec.id] = self._pod(rec)
        await self.adaptation.run_pod_sandbox(pod)

    async def stop_pod(self, sid: str) -> None:
        """StopPodSandbox hook, once per pod (after all its containers stopped)."""
        if self.adaptation is None or sid not in self._pods or sid in self._pods_stopped:
            return
        self._pods_stopped.add(sid)
        await self.adaptation.stop_pod_sandbox(self._pods[sid])

    async def remove_pod(self, sid: str) -> None:
        if self.adaptation is None or sid not in self._pods:
            return
        await self.stop_pod(sid)
        pod = self._pods.pop(sid)
        self._pods_stopped.discard(sid)
        await self.adaptation.remove_pod_sandbox(pod)

    async def update_pod(self, rec: SandboxRecord, overhead: api.LinuxResources,
                         resources: api.LinuxResources) -> None:
        if self.adaptation is None or rec.id not in self._pods:
            return
        await self.adaptation.update_pod_sandbox(self._pods[rec.id], overhead, resources)

    async def post_update_pod(self, rec: SandboxRecord) -> None:
        if self.adaptation is None or rec.id not in self._pods:
            return
        pod = self._pods[rec.id] = self._pod(rec)
        await self.adaptation.post_update_pod_sandbox(pod)

    def _pod(self, rec: SandboxRecord) -> api.PodSandbox:
        return pod_object(rec, self._pod_cgroups_path(rec), self._pod_namespaces(rec))

    def _pod_of(self, sid: str) -> api.PodSandbox:
        pod = self._pods.get(sid)
        if pod is None:
            rec = self.sandboxes.get(sid)
            pod = (self._pod(rec) if rec is not None
                   else api.PodSandbox(id=sid))
        return pod

    # ---- containers ---------------------------------------------------------------------

    async def create_container(self, rec: ContainerRecord, spec: dict[str, Any]) -> None:
        """CreateContainer hook on the generated spec: plugins' adjustments are merged,
        validated and applied to ``spec`` in place; their updates and evictions of other
        containers are carried out. Any refusal raises (the caller undoes the create,
        which sends Stop and Remove through ``undo_container``)."""
        if self.adaptation is None:
            return
        ctr = self._ctrs[rec.id] = container_object(rec, spec)
        result = await self.adaptation.create_container(self._pod_of(rec.sandbox_id), ctr)
        if result is None:
            return
        pod = self.sandboxes.get(rec.sandbox_id)
        seccomp = self._sandboxed.get(pod.runtime_handler) if pod is not None else None
        if seccomp is not None:
            refuse_unhonoured(result.adjust, seccomp=seccomp)
        apply_adjustment(spec, result.adjust, self.host, self.cdi)
        self._ctrs[rec.id] = container_object(rec, spec)
        failed = await self.update_containers(result.updates)
        for u in failed:
            log.warning("NRI: update of container %s requested at the creation of %s failed",
                        u.container_id, rec.id)
        self.evict(result.evictions)

    async def undo_container(self, cid: str) -> None:
        """A create that failed after its CreateContainer event: Stop and Remove follow."""
        if self.adaptation is not None and cid in self._ctrs:
            await self.remove_container(cid)

    async def post_create(self, rec: ContainerRecord) -> None:
        ctr = self._told(rec)
        if ctr is not None and self.adaptation is not None:
            await self.adaptation.post_create_container(self._pod_of(rec.sandbox_id), ctr)

    async def start_container(self, rec: ContainerRecord) -> None:
        """StartContainer hook, before the process starts; a refusal fails the start."""
        ctr = self._told(rec)
        if ctr is not None and self.adaptation is not None:
            await self.adaptation.start_container(self._pod_of(rec.sandbox_id), ctr)

    async def post_start(self, rec: ContainerRecord) -> None:
        ctr = self._told(rec)
        if ctr is not None and self.adaptation is not None:
            await self.adaptation.post_start_container(self._pod_of(rec.sandbox_id), ctr)

    async def update_container(self, rec: ContainerRecord, requested: api.LinuxResources
                               ) -> api.LinuxResources:
        """UpdateContainer hook: the resources to apply (a plugin's update of this container
        replaces the request, as in containerd); other containers' updates and evictions are
        carried out."""
        ctr = self._told(rec)
        if ctr is None or self.adaptation is None:
            return requested
        updates, evictions = await self.adaptation.update_container(
            self._pod_of(rec.sandbox_id), ctr, requested)
        final = requested
        if updates and updates[-1].container_id == rec.id:
            final = updates.pop().linux.resources
        failed = await self.update_containers(updates)
        for u in failed:
            log.warning("NRI: update of container %s failed", u.container_id)
        self.evict(evictions)
        return final

    async def post_update(self, rec: ContainerRecord, resources: api.LinuxResources) -> None:
        ctr = self._told(rec)
        if ctr is not None and self.adaptation is not None:
            ctr.linux.resources.MergeFrom(resources)
            await self.adaptation.post_update_container(self._pod_of(rec.sandbox_id), ctr)

    async def stop_container(self, cid: str) -> None:
        """StopContainer hook: exactly once per container, whoever asks first (StopContainer,
        a pod stop, a removal or the exit watcher); later callers wait for that one."""
        if self.adaptation is None:
            return
        pending = self._stops.get(cid)
        if pending is not None:
            await asyncio.shield(pending)
            return
        ctr = self._ctrs.get(cid)
        if ctr is None:
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._stops[cid] = done
        try:
            rec = self.containers.get(cid)
            if rec is not None:
                set_status(ctr, rec)
            updates = await self.adaptation.stop_container(self._pod_of(ctr.pod_sandbox_id), ctr)
            failed = await self.update_containers(updates)
            for u in failed:
                log.warning("NRI: update of container %s at the stop of %s failed",
                            u.container_id, cid)
        finally:
            done.set_result(None)

    async def container_exited(self, cid: str) -> None:
        """From the exit monitor: the StopContainer event, as its own top-level operation
        (it takes the read side of the plugin-sync lock)."""
        if self.adaptation is None or cid not in self._ctrs:
            return
        async with self.sync_lock.read():
            await self.stop_container(cid)

    async def remove_container(self, cid: str) -> None:
        if self.adaptation is None or cid not in self._ctrs:
            return
        await self.stop_container(cid)
        ctr = self._ctrs.pop(cid)
        self._stops.pop(cid, None)
        await self.adaptation.remove_container(self._pod_of(ctr.pod_sandbox_id), ctr)

    def _told(self, rec: ContainerRecord) -> api.Container | None:
        """The container as plugins know it, its status refreshed from ``rec``."""
        ctr = self._ctrs.get(rec.id)
        if ctr is not None:
            set_status(ctr, rec)
        return ctr
