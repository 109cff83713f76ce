"""One background loop that samples every running container and ready pod.

Every ``period`` the sampler asks its owner for the objects to watch, reads their
cgroups, writable layers and pod network counters in ONE worker-thread pass, and
keeps the last two samples of each: the stats and metrics calls answer from
memory (CPU rate included, from the two samples), so a kubelet listing stats every
few seconds costs no file reads at all. An object that has no sample yet (just
started) can be sampled once on demand through ``ensure``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from pycrid.stats.cgroup_hierarchy import Hierarchy
from pycrid.stats.cgroup_stats import CgroupStats, nano_cores
from pycrid.stats.netdev import InterfaceCounters, read_net_dev
from pycrid.tasks import Owner

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Target:
    """What to sample for one object (a container, or a pod's pause container)."""

    id: str
    #: The OCI ``linux.cgroupsPath`` it runs under ("" to skip the cgroup).
    cgroups_path: str
    #: An OCI config.json whose ``linux.cgroupsPath`` wins over ``cgroups_path`` (it has
    #: every adjustment, NRI's included); read once, in the worker thread.
    spec: str = ""
    #: Snapshot key of its writable layer (None to skip).
    layer_key: str | None = None
    #: A process in the pod's network namespace (0: no network counters).
    net_pid: int = 0
    #: The runtime's own reading of an object the host has no cgroup of its own for (a
    #: gVisor sub-container): its CPU, memory and tasks replace the cgroup's figures,
    #: ``cgroups_path`` then being the cgroup that runs it (its pod's sandbox).
    reader: Callable[[], CgroupStats | None] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class LayerUsage:
    """A writable layer's usage, and the filesystem it is on (cAdvisor's container
    filesystem: its device, size and inodes)."""

    used_bytes: int
    inodes_used: int
    device: str = ""
    capacity_bytes: int | None = None
    inodes_total: int | None = None
    inodes_free: int | None = None


@dataclass(frozen=True)
class Sample:
    #: Wall clock (ns since the epoch), what CRI timestamps carry.
    timestamp: int
    #: Monotonic clock (ns), what rates are computed from.
    mono: int
    cgroup: CgroupStats | None = None
    layer: LayerUsage | None = None
    network: tuple[InterfaceCounters, ...] | None = None


class Sampler:
    def __init__(self, *, period: float, targets: Callable[[], Sequence[Target]],
                 hierarchy: Hierarchy,
                 layer_usage: Callable[[str], LayerUsage] | None = None,
                 proc: str = "/proc", owner: Owner | None = None) -> None:
        self.period = period
        self._targets = targets
        #: Where the host mounts its cgroups (from the host facts, probed once).
        self.hierarchy = hierarchy
        self._layer_usage = layer_usage
        self._proc = proc
        #: id -> (previous, latest)
        self._samples: dict[str, tuple[Sample | None, Sample]] = {}
        #: id -> cgroupsPath read from its spec (written from the worker thread only).
        self._paths: dict[str, str] = {}
        #: Owns the sampling loop (made here unless the caller gives one).
        self._owner = owner if owner is not None else Owner("stats sampler")
        self._task: asyncio.Task[None] | None = None
        #: Completed full passes (tests and logs).
        self.passes = 0

    # ---- lifetime ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = self._owner.spawn(self._run(), "sample")

    async def aclose(self) -> None:
        await self._owner.aclose()

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.collect()
            except Exception:  # one bad pass must not end sampling for good
                log.exception("stats pass failed")
            elapsed = time.monotonic() - started
            if elapsed > self.period:
                log.warning("a stats pass took %.1fs, longer than stats_collect_period (%.1fs)",
                            elapsed, self.period)
            await asyncio.sleep(max(self.period - elapsed, 0.0))

    # ---- sampling ---------------------------------------------------------------------------

    async def collect(self, targets: Sequence[Target] | None = None) -> None:
        """Sample ``targets`` (default: a full pass over everything the owner lists, which
        also forgets objects no longer listed)."""
        full = targets is None
        todo = list(self._targets()) if targets is None else list(targets)
        results = await asyncio.to_thread(self._read_all, todo)
        if full:
            keep = {t.id for t in todo}
            for oid in [k for k in self._samples if k not in keep]:
                del self._samples[oid]
            for oid in list(self._paths):  # list(): a worker thread may add meanwhile
                if oid not in keep:
                    self._paths.pop(oid, None)
            self.passes += 1
        for oid, sample in results:
            self._store(oid, sample)

    async def ensure(self, targets: Sequence[Target]) -> None:
        """Sample, once, those of ``targets`` that have no sample yet."""
        missing = [t for t in targets if t.id not in self._samples]
        if missing:
            await self.collect(missing)

    def _store(self, oid: str, sample: Sample) -> None:
        old = self._samples.get(oid)
        if old is None:
            self._samples[oid] = (None, sample)
        elif sample.mono > old[1].mono:  # an on-demand read may finish after a newer pass
            self._samples[oid] = (old[1], sample)

    def _read_all(self, targets: list[Target]) -> list[tuple[str, Sample]]:
        """Worker thread: one read per target; one that vanished mid-pass is skipped."""
        out = []
        for t in targets:
            try:
                out.append((t.id, self.read(t)))
            except Exception as e:  # a vanished object, a racing removal: skip it
                log.debug("stats of %s skipped: %s", t.id, e)
        return out

    def read(self, t: Target) -> Sample:
        path = self._cgroups_path(t)
        mono, wall = time.monotonic_ns(), time.time_ns()
        cgroup = self.hierarchy.read(path, self._proc) if path else None
        if t.reader is not None:
            cgroup = _overlay(cgroup, t.reader())
        layer = None
        if t.layer_key is not None and self._layer_usage is not None:
            try:
                layer = self._layer_usage(t.layer_key)
            except Exception as e:  # snapshot removed under us
                log.debug("writable layer of %s not measured: %s", t.id, e)
        network = None
        if t.net_pid > 0:
            ifaces = read_net_dev(t.net_pid, self._proc)
            network = tuple(ifaces) if ifaces is not None else None
        return Sample(timestamp=wall, mono=mono, cgroup=cgroup, layer=layer, network=network)

    def _cgroups_path(self, t: Target) -> str:
        if not t.spec:
            return t.cgroups_path
        if (known := self._paths.get(t.id)) is not None:
            return known
        try:
            with open(t.spec) as f:
                path = str(json.load(f).get("linux", {}).get("cgroupsPath") or t.cgroups_path)
        except (OSError, ValueError, AttributeError):
            return t.cgroups_path  # not cached: the bundle may be mid-write
        self._paths[t.id] = path
        return path

    # ---- answers ----------------------------------------------------------------------------

    def latest(self, oid: str) -> Sample | None:
        pair = self._samples.get(oid)
        return pair[1] if pair is not None else None

    def nano_cores(self, oid: str) -> int | None:
        """CPU use between the last two samples, in billionths of a core."""
        pair = self._samples.get(oid)
        if pair is None:
            return None
        prev, cur = pair
        if prev is None:
            return None
        if (prev.cgroup is None or cur.cgroup is None or prev.cgroup.cpu_ns is None
                or cur.cgroup.cpu_ns is None):
            return None
        return nano_cores(prev.cgroup.cpu_ns, prev.mono, cur.cgroup.cpu_ns, cur.mono)


def _overlay(host: CgroupStats | None, own: CgroupStats | None) -> CgroupStats | None:
    """The runtime's figures of a container over those of the cgroup that runs it: what
    the runtime measures per container (CPU time, memory in use, tasks) replaces the
    cgroup's; the rest (CPU throttling, I/O, pressure, descriptors, limits) is that
    cgroup's, the sandbox's, which its containers share. CPU time the runtime does not
    split into user and system is split as the cgroup's is."""
    if own is None:
        return None
    if host is None:
        return own
    changes: dict[str, object] = {}
    if own.cpu_ns is not None:
        changes["cpu_ns"] = own.cpu_ns
        for name in ("cpu_user_ns", "cpu_system_ns"):
            mine, theirs = getattr(own, name), getattr(host, name)
            if mine is None and theirs is not None and host.cpu_ns:
                mine = theirs * own.cpu_ns // host.cpu_ns
            changes[name] = mine
    if own.memory_usage is not None:
        changes.update(memory_usage=own.memory_usage, inactive_file=0, active_file=0,
                       rss=own.memory_usage, cache=0, mapped_file=0)
        if own.memory_max_usage is not None:
            changes["memory_max_usage"] = own.memory_max_usage
    if own.processes is not None:
        changes["processes"] = own.processes
    return replace(host, **changes)  # type: ignore[arg-type]


__all__ = ["LayerUsage", "Sample", "Sampler", "Target"]
