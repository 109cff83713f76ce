"""Merging plugins' resource changes (``LinuxResources``) with field ownership: memory and
CPU settings owned one by one, hugepage limits per page size, unified entries per key."""

from __future__ import annotations

from collections.abc import Sequence

from pycrid.nri import api
from pycrid.nri.adaptation.keyed_entries import clone, put_keyed
from pycrid.nri.adaptation.owners import OwnerTable

_F = api.Field

_MEMORY_FIELDS: tuple[tuple[str, int], ...] = (
    ("limit", _F.MemLimit),
    ("reservation", _F.MemReservation),
    ("swap", _F.MemSwapLimit),
    ("kernel", _F.MemKernelLimit),
    ("kernel_tcp", _F.MemTCPLimit),
    ("swappiness", _F.MemSwappiness),
    ("disable_oom_killer", _F.MemDisableOomKiller),
    ("use_hierarchy", _F.MemUseHierarchy),
)
_CPU_FIELDS: tuple[tuple[str, int], ...] = (
    ("shares", _F.CPUShares),
    ("quota", _F.CPUQuota),
    ("period", _F.CPUPeriod),
    ("realtime_runtime", _F.CPURealtimeRuntime),
    ("realtime_period", _F.CPURealtimePeriod),
)
_CPUSET_FIELDS: tuple[tuple[str, int], ...] = (
    ("cpus", _F.CPUSetCPUs),
    ("mems", _F.CPUSetMems),
)


def _page_size(limit: api.HugepageLimit) -> str:
    return limit.page_size


def merge_resources(
    owners: OwnerTable,
    container_id: str,
    plugin: str,
    change: api.LinuxResources,
    targets: Sequence[api.LinuxResources],
    *,
    device_rules: bool,
) -> None:
    """Claim and copy every resource ``change`` sets into each of ``targets``.

    Memory and CPU settings are owned one by one; hugepage limits per page
    size and unified entries per key. Device cgroup rules (creation only, as
    upstream) are appended and owned by nobody.
    """
    if change.HasField("memory"):
        for name, field in _MEMORY_FIELDS:
            if change.memory.HasField(name):
                owners.claim(container_id, field, plugin)
                for t in targets:
                    getattr(t.memory, name).CopyFrom(getattr(change.memory, name))
    if change.HasField("cpu"):
        for name, field in _CPU_FIELDS:
            if change.cpu.HasField(name):
                owners.claim(container_id, field, plugin)
                for t in targets:
                    getattr(t.cpu, name).CopyFrom(getattr(change.cpu, name))
        for name, field in _CPUSET_FIELDS:
            if value := getattr(change.cpu, name):
                owners.claim(container_id, field, plugin)
                for t in targets:
                    setattr(t.cpu, name, value)
    for limit in change.hugepage_limits:
        owners.claim(container_id, _F.HugepageLimits, plugin, limit.page_size)
        for t in targets:
            put_keyed(t.hugepage_limits, _page_size, clone(limit))
    for key in sorted(change.unified):
        owners.claim(container_id, _F.CgroupsUnified, plugin, key)
        for t in targets:
            t.unified[key] = change.unified[key]
    for name, field in (("blockio_class", _F.BlockioClass), ("rdt_class", _F.RdtClass)):
        if change.HasField(name):
            owners.claim(container_id, field, plugin)
            for t in targets:
                getattr(t, name).CopyFrom(getattr(change, name))
    if change.HasField("pids"):
        owners.claim(container_id, _F.PidsLimit, plugin)
        for t in targets:
            t.pids.CopyFrom(change.pids)
    if device_rules:
        for t in targets:
            t.devices.extend(change.devices)
