"""CRI LinuxContainerResources ⇄ OCI ``linux.resources`` (CRI-TO-OCI.md §2.13, §3).

Pure: the host's cgroup facts (``CgroupHost``) and the config keys come in as
values. The forward rules are containerd's ``WithResources`` (zero means "not
set"; memory limit without swap limit means no swap when swap accounting
exists; hugepage limits only with the hugetlb controller enabled in config and
present on the host; unified copied). Validation refuses up front what runc
would refuse later with an opaque error, naming the CRI field. The reverse
mapping feeds ContainerStatus.resources from what the spec holds.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cri_api.v1 import api_pb2 as pb

from pycrid.errors import InvalidArgument
from pycrid.host.cgroups import CgroupHost, parse_id_list

Spec = dict[str, Any]

#: containerd's DefaultSandboxCPUshares: the pause container barely runs.
SANDBOX_CPU_SHARES = 2
#: The -1 that cgroups and runc read as "no limit".
UNLIMITED = -1


@dataclass(frozen=True)
class ResourcePolicy:
    """The host's facts plus the config keys the rules depend on."""

    host: CgroupHost = field(default_factory=CgroupHost)
    disable_hugetlb_controller: bool = True
    tolerate_missing_hugetlb_controller: bool = True
    #: CRI-O's pids_limit: applied to every container (0: none).
    pids_limit: int = 0


# ---- validation -----------------------------------------------------------------------


def _cpuset(name: str, value: str, online: frozenset[int] | None) -> None:
    if not value:
        return
    try:
        ids = parse_id_list(value)
    except ValueError as e:
        raise InvalidArgument(f"{name} {value!r} is not a cpuset list such as "
                              f"\"0-2,4\": {e}") from None
    if online is not None and not ids <= online:
        missing = ",".join(str(i) for i in sorted(ids - online))
        raise InvalidArgument(f"{name} {value!r} names {missing}, not online on this host")


def validate(res: pb.LinuxContainerResources, policy: ResourcePolicy) -> None:
    """InvalidArgument (naming the field) for what runc or the kernel would refuse."""
    host = policy.host
    for name in ("cpu_period", "cpu_shares"):
        if getattr(res, name) < 0:
            raise InvalidArgument(f"{name} must not be negative, got {getattr(res, name)}")
    for name in ("cpu_quota", "memory_limit_in_bytes", "memory_swap_limit_in_bytes"):
        if getattr(res, name) < UNLIMITED:
            raise InvalidArgument(f"{name} must be -1 (unlimited), 0 (not set) or positive, "
                                  f"got {getattr(res, name)}")
    if not -1000 <= res.oom_score_adj <= 1000:
        raise InvalidArgument(f"oom_score_adj must be within [-1000, 1000], "
                              f"got {res.oom_score_adj}")
    limit, swap = res.memory_limit_in_bytes, res.memory_swap_limit_in_bytes
    if limit > 0 and swap > 0 and swap < limit:
        raise InvalidArgument(
            f"memory_swap_limit_in_bytes ({swap}) is memory plus swap: it must not be "
            f"below memory_limit_in_bytes ({limit})")
    _cpuset("cpuset_cpus", res.cpuset_cpus, host.cpus)
    _cpuset("cpuset_mems", res.cpuset_mems, host.mems)
    if res.unified and not host.unified:
        raise InvalidArgument(
            f"unified ({', '.join(sorted(res.unified))}) holds cgroup v2 keys; this host runs "
            f"cgroup {host.version} and runc refuses unified resources there")
    for h in res.hugepage_limits:
        if not h.page_size:
            raise InvalidArgument("hugepage_limits: page_size must not be empty")
    if not res.hugepage_limits or policy.disable_hugetlb_controller:
        return
    if not host.hugetlb:
        if not policy.tolerate_missing_hugetlb_controller:
            raise InvalidArgument(
                "hugepage_limits are set but this host has no hugetlb cgroup controller "
                "(set tolerate_missing_hugetlb_controller = true to drop them)")
        return
    for h in res.hugepage_limits:
        if h.page_size not in host.hugepage_sizes:
            raise InvalidArgument(
                f"hugepage_limits: page size {h.page_size!r} is not offered by this host "
                f"(it has {', '.join(host.hugepage_sizes) or 'none'})")


# ---- CRI → OCI ------------------------------------------------------------------------


def apply(current: Mapping[str, Any], res: pb.LinuxContainerResources,
          policy: ResourcePolicy) -> Spec:
    """``current`` (an OCI linux.resources) with the CRI request laid over it, as a new
    object: containerd's WithResources, used for create and for updates alike."""
    validate(res, policy)
    out: Spec = copy.deepcopy(dict(current))
    cpu = out.setdefault("cpu", {})
    memory = out.setdefault("memory", {})
    for name, key in (("cpu_period", "period"), ("cpu_quota", "quota"),
                      ("cpu_shares", "shares")):
        if getattr(res, name):
            cpu[key] = getattr(res, name)
    if res.cpuset_cpus:
        cpu["cpus"] = res.cpuset_cpus
    if res.cpuset_mems:
        cpu["mems"] = res.cpuset_mems
    limit, swap = res.memory_limit_in_bytes, res.memory_swap_limit_in_bytes
    if limit:
        memory["limit"] = limit
        if not swap and policy.host.swap:
            memory["swap"] = limit  # no swap unless asked for (§2.13)
    if swap and policy.host.swap:
        memory["swap"] = swap
    if res.hugepage_limits and not policy.disable_hugetlb_controller and policy.host.hugetlb:
        out["hugepageLimits"] = [*out.get("hugepageLimits", ()),
                                 *({"pageSize": h.page_size, "limit": h.limit}
                                   for h in res.hugepage_limits)]
    if res.unified:
        out["unified"] = {**out.get("unified", {}), **res.unified}
    return out


def with_resources(spec: Spec, res: pb.LinuxContainerResources | None,
                   policy: ResourcePolicy, min_oom_score_adj: int) -> None:
    """The container_spec hook: linux.resources (device rules kept) and oomScoreAdj when
    the request has resources, clamped to the daemon's own; pids_limit in any case."""
    linux = spec.setdefault("linux", {})
    if res is not None:
        linux["resources"] = apply(linux.get("resources") or {}, res, policy)
        spec["process"]["oomScoreAdj"] = max(res.oom_score_adj, min_oom_score_adj)
    if policy.pids_limit > 0:
        linux.setdefault("resources", {})["pids"] = {"limit": policy.pids_limit}


def with_sandbox_shares(spec: Spec) -> None:
    """The pause container's cpu shares (containerd's WithDefaultSandboxShares)."""
    spec.setdefault("linux", {}).setdefault("resources", {}).setdefault("cpu", {})[
        "shares"] = SANDBOX_CPU_SHARES


def update_payload(resources: Mapping[str, Any]) -> Spec:
    """What ``runc update --resources`` gets: the whole new resources, so memory and
    memsw move together (runc orders the writes), minus the device rules it ignores."""
    return {k: copy.deepcopy(v) for k, v in resources.items() if k != "devices"}


def swap_follows_limit(memory: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """A new memory limit without a swap value keeps the container's swap rule: swap equal
    to the old limit meant "no swap" (CRI-TO-OCI §2.13) and follows the new limit, and a
    swap below the new limit (which the v1 kernel refuses) is raised to it."""
    new = update.get("memory") or {}
    if "limit" not in new or "swap" in new or memory.get("swap") is None:
        return update
    swap, limit = memory["swap"], new["limit"]
    if swap == memory.get("limit") or (swap != -1 and limit != -1 and swap < limit):
        return {**update, "memory": {**new, "swap": limit}}
    return update


def merge_update(current: Mapping[str, Any], update: Mapping[str, Any]) -> Spec:
    """An NRI plugin's partial OCI resources laid over ``current``, as a new object: each
    section updated key by key, the swap rule kept (``swap_follows_limit``)."""
    out: Spec = copy.deepcopy(dict(current))
    update = swap_follows_limit(out.get("memory") or {}, dict(update))
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key].update(value)
        else:
            out[key] = value
    return out


# ---- OCI → CRI ------------------------------------------------------------------------


def record_of(spec: Mapping[str, Any]) -> Spec:
    """What a container record keeps (JSON): linux.resources minus devices, plus the
    process's oomScoreAdj."""
    out = update_payload((spec.get("linux") or {}).get("resources") or {})
    adj = (spec.get("process") or {}).get("oomScoreAdj")
    if adj is not None:
        out["oomScoreAdj"] = adj
    return out


def cri_resources(recorded: Mapping[str, Any]) -> pb.LinuxContainerResources:
    """ContainerStatus.resources.linux from a record_of() value (containerd's
    copyResourcesToStatus)."""
    out = pb.LinuxContainerResources(oom_score_adj=int(recorded.get("oomScoreAdj") or 0))
    cpu = recorded.get("cpu") or {}
    memory = recorded.get("memory") or {}
    out.cpu_period = int(cpu.get("period") or 0)
    out.cpu_quota = int(cpu.get("quota") or 0)
    out.cpu_shares = int(cpu.get("shares") or 0)
    out.cpuset_cpus = cpu.get("cpus") or ""
    out.cpuset_mems = cpu.get("mems") or ""
    out.memory_limit_in_bytes = int(memory.get("limit") or 0)
    out.memory_swap_limit_in_bytes = int(memory.get("swap") or 0)
    for h in recorded.get("hugepageLimits") or ():
        out.hugepage_limits.add(page_size=h["pageSize"], limit=int(h["limit"]))
    out.unified.update(recorded.get("unified") or {})
    return out


def cri_from_nri(res: Any) -> pb.LinuxContainerResources:
    """An NRI LinuxResources (a plugin's answer to UpdateContainer) back as the CRI request
    it replaces, as containerd does before WithResources."""
    out = pb.LinuxContainerResources()
    mem, cpu = res.memory, res.cpu
    if mem.HasField("limit"):
        out.memory_limit_in_bytes = mem.limit.value
    if mem.HasField("swap"):
        out.memory_swap_limit_in_bytes = mem.swap.value
    for name, key in (("shares", "cpu_shares"), ("quota", "cpu_quota"),
                      ("period", "cpu_period")):
        if cpu.HasField(name):
            setattr(out, key, getattr(cpu, name).value)
    out.cpuset_cpus = cpu.cpus
    out.cpuset_mems = cpu.mems
    for h in res.hugepage_limits:
        out.hugepage_limits.add(page_size=h.page_size, limit=h.limit)
    out.unified.update(res.unified)
    return out


def resources_json(res: pb.LinuxContainerResources) -> Spec:
    """A CRI LinuxContainerResources as containerd's verbose info shows it (Go's JSON of
    the message: snake_case keys, numbers as numbers, zero fields left out)."""
    out: Spec = {}
    for fd, value in res.ListFields():
        if fd.name == "hugepage_limits":
            out[fd.name] = [{k: v for k, v in (("page_size", h.page_size), ("limit", h.limit))
                             if v} for h in value]
        elif fd.name == "unified":
            out[fd.name] = dict(value)
        else:
            out[fd.name] = value
    return out
