"""Apply a merged NRI ``ContainerAdjustment`` to an OCI spec dict (config.json shape).

The effect of each field follows containerd/nri's runtime-tools generator
(NRI-PROTOCOL.md §c), with one rule on top: a field is either applied or
refused with an error naming the NRI field. runc 1.1 ignores spec fields it
does not know, so fields that need a newer runc are refused by version
(``MIN_RUNC_FOR``), and settings the host cannot honour are refused through
``HostSupport``. The spec is changed all-or-nothing: the work happens on a
copy that replaces the caller's dict contents only when every field passed.

Deliberate differences from upstream's generator:

* rlimits: replaced per type (one entry per type) instead of appended.
* memory: besides ``limit`` (which also sets ``swap`` to the limit, as upstream
  does unless the adjustment sets ``swap`` itself), ``reservation``, ``swap``,
  ``swappiness`` and ``disable_oom_killer`` are applied; upstream drops them.
  ``kernel``, ``kernel_tcp`` and ``use_hierarchy`` are refused: runc ignores them.
* seccomp: ``default_errno`` becomes ``defaultErrnoRet`` (upstream drops it).
* env entries without ``=`` already in the spec are kept (upstream drops them).
* mounts: destinations are compared after path cleaning.
"""

from __future__ import annotations

import copy
import os
import posixpath
import re
import resource
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pycrid.errors import FailedPrecondition, InvalidArgument
from pycrid.nri import api
from pycrid.oci.mounts import clean

Spec = dict[str, Any]
Version = tuple[int, int, int]

# The runc release that first reads each spec field; older runc ignores the
# field without a word. Checked against runc's CHANGELOG.md and
# libcontainer/specconv/spec_linux.go at tags v1.1.5, v1.2.0, v1.3.0, v1.4.0.
MIN_RUNC_FOR: dict[str, Version] = {
    "linux.io_priority": (1, 2, 0),            # process.ioPriority
    "linux.scheduler": (1, 2, 0),              # process.scheduler
    "linux.seccomp_policy.flags": (1, 2, 0),   # 1.1 rejects any seccomp flag
    "linux.namespaces[time]": (1, 2, 0),       # time namespace
    "linux.net_devices": (1, 4, 0),            # linux.netDevices
    "linux.memory_policy": (1, 4, 0),          # linux.memoryPolicy
    "linux.rdt.schemata": (1, 4, 0),           # linux.intelRdt.schemata
    "linux.rdt.enable_monitoring": (1, 4, 0),  # linux.intelRdt.enableMonitoring
}

# runc's rlimit table (rlimit_linux.go); it fails on any other name.
RLIMIT_NAMES: tuple[str, ...] = (
    "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_DATA", "RLIMIT_STACK", "RLIMIT_CORE",
    "RLIMIT_RSS", "RLIMIT_NPROC", "RLIMIT_NOFILE", "RLIMIT_MEMLOCK", "RLIMIT_AS",
    "RLIMIT_LOCKS", "RLIMIT_SIGPENDING", "RLIMIT_MSGQUEUE", "RLIMIT_NICE",
    "RLIMIT_RTPRIO", "RLIMIT_RTTIME",
)
RLIM_INFINITY = 2**64 - 1
NAMESPACE_TYPES = frozenset({"pid", "network", "mount", "ipc", "uts", "user", "cgroup", "time"})
# NRI hook list → OCI hook list.
HOOK_LISTS = {"prestart": "prestart", "create_runtime": "createRuntime",
              "create_container": "createContainer", "start_container": "startContainer",
              "poststart": "poststart", "poststop": "poststop"}
_PROPAGATIONS = ("rprivate", "rshared", "rslave")


def _propagation_of(path: str) -> str:
    """"rshared", "rslave" or "" for the host mount that holds ``path``."""
    target = posixpath.normpath(os.path.realpath(path))
    best, best_len = "", -1
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split()
            point = re.sub(r"\\([0-7]{3})", lambda o: chr(int(o[1], 8)), fields[4])
            inside = target == point or target.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= best_len:
                optional = fields[6:fields.index("-")]
                best_len = len(point)
                best = ("rshared" if any(o.startswith("shared:") for o in optional)
                        else "rslave" if any(o.startswith("master:") for o in optional)
                        else "")
    return best


def _page_name(kb: int) -> str:
    for unit, size in (("GB", 1 << 20), ("MB", 1 << 10)):
        if kb % size == 0:
            return f"{kb // size}{unit}"
    return f"{kb}KB"


@dataclass(frozen=True)
class HostSupport:
    """What this host and its runc can honour; the runtime fills it in once at start."""

    runc_version: Version
    cgroup_v2: bool
    hugepage_sizes: frozenset[str]
    """As NRI and runc name them: "2MB", "1GB" (from /sys/kernel/mm/hugepages)."""
    rdt: bool
    """resctrl is mounted (Intel RDT / AMD PQoS usable)."""
    blockio_classes: frozenset[str] = frozenset()
    """pycrid has no class → blockIO table yet, so every class is refused."""
    min_oom_score_adj: int = 0
    """The daemon's own oom_score_adj; lower values are clamped up to it."""
    rlimit_hard: Mapping[str, int] = field(default_factory=dict)
    """The daemon's hard limits by OCI name; a higher hard limit is refused."""
    source_propagation: Callable[[str], str] | None = None
    """Propagation ("rshared", "rslave", "") of the host mount holding a path;
    None refuses rshared/rslave mounts, which need the check."""

    @classmethod
    def probe(cls, runc_version: Version, min_oom_score_adj: int) -> HostSupport:
        """Read /sys and the daemon's rlimits; the only impure part of this module."""
        sizes: set[str] = set()
        base = "/sys/kernel/mm/hugepages"
        if os.path.isdir(base):
            for name in os.listdir(base):
                if name.startswith("hugepages-") and name.endswith("kB"):
                    sizes.add(_page_name(int(name[len("hugepages-"):-2])))
        hard: dict[str, int] = {}
        for name in RLIMIT_NAMES:
            number = getattr(resource, name, None)
            if number is not None:
                limit = resource.getrlimit(number)[1]
                hard[name] = RLIM_INFINITY if limit == resource.RLIM_INFINITY else limit
        return cls(
            runc_version=runc_version,
            cgroup_v2=os.path.exists("/sys/fs/cgroup/cgroup.controllers"),
            hugepage_sizes=frozenset(sizes),
            rdt=os.path.exists("/sys/fs/resctrl/schemata"),
            min_oom_score_adj=min_oom_score_adj,
            rlimit_hard=hard,
            source_propagation=_propagation_of,
        )


class CdiInjector(Protocol):
    def inject(self, spec: dict[str, Any], devices: Sequence[str]) -> None:
        """Resolve fully qualified CDI names into ``spec``; InvalidArgument if unresolvable."""


def _need_runc(host: HostSupport, what: str) -> None:
    need = MIN_RUNC_FOR[what]
    if host.runc_version < need:
        have = ".".join(map(str, host.runc_version))
        raise FailedPrecondition(
            f"NRI adjustment {what} needs runc >= {'.'.join(map(str, need))}; "
            f"this host has runc {have}")


def _bad(what: str, why: str) -> InvalidArgument:
    return InvalidArgument(f"NRI adjustment {what}: {why}")


def _cannot(what: str, why: str) -> FailedPrecondition:
    return FailedPrecondition(f"NRI adjustment {what}: {why}")


def apply_adjustment(spec: dict[str, Any], adjust: api.ContainerAdjustment, host: HostSupport,
                     cdi: CdiInjector | None = None) -> None:
    """Apply ``adjust`` to ``spec`` in place, all or nothing.

    Raises InvalidArgument for bad values and FailedPrecondition for what the
    host or its runc cannot honour; each message names the NRI field.
    """
    work = copy.deepcopy(spec)
    linux = adjust.linux
    _annotations(work, adjust.annotations)
    _env(work, adjust.env)
    _args(work, adjust.args)
    if adjust.HasField("hooks"):
        _hooks(work, adjust.hooks)
    if adjust.CDI_devices:
        if cdi is None:
            raise _cannot("CDI_devices", "this runtime has no CDI support configured")
        cdi.inject(work, [d.name for d in adjust.CDI_devices])
    _devices(work, linux.devices)
    if linux.cgroups_path:
        work.setdefault("linux", {})["cgroupsPath"] = linux.cgroups_path
    if linux.HasField("oom_score_adj"):
        value = linux.oom_score_adj.value
        if not -1000 <= value <= 1000:
            raise _bad("linux.oom_score_adj", f"{value} is outside -1000..1000")
        work.setdefault("process", {})["oomScoreAdj"] = max(value, host.min_oom_score_adj)
    if linux.HasField("io_priority"):
        _io_priority(work, linux.io_priority, host)
    if linux.HasField("scheduler"):
        _scheduler(work, linux.scheduler, host)
    if linux.HasField("seccomp_policy"):
        _seccomp(work, linux.seccomp_policy, host)
    _namespaces(work, linux.namespaces, host)
    _sysctl(work, linux.sysctl)
    _net_devices(work, linux.net_devices, host)
    if linux.HasField("memory_policy"):
        _need_runc(host, "linux.memory_policy")
        mp = linux.memory_policy
        policy: Spec = {"mode": api.MpolMode.Name(mp.mode), "nodes": mp.nodes}
        if mp.flags:
            policy["flags"] = [api.MpolFlag.Name(f) for f in mp.flags]
        work.setdefault("linux", {})["memoryPolicy"] = policy
    if linux.HasField("resources"):
        _resources(work, linux.resources, host)
    if linux.HasField("rdt"):
        _rdt(work, linux.rdt, host)
    _mounts(work, adjust.mounts, host)
    _rlimits(work, adjust.rlimits, host)
    spec.clear()
    spec.update(work)


# ---------------------------------------------------------------- process


def _removals_first(entries: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Map entries with removals before sets: a merged adjustment may hold both ``-k``
    and ``k`` when one plugin replaced another's entry."""
    return sorted(entries.items(), key=lambda kv: (not api.is_marked_for_removal(kv[0]), kv[0]))


def _annotations(spec: Spec, annotations: Mapping[str, str]) -> None:
    if not annotations:
        return
    out = spec.setdefault("annotations", {})
    for key, value in _removals_first(annotations):
        if api.is_marked_for_removal(key):
            out.pop(api.clear_removal_marker(key), None)
        else:
            out[key] = value


def _env(spec: Spec, env: Sequence[api.KeyValue]) -> None:
    if not env:
        return
    current: list[str] = spec.setdefault("process", {}).setdefault("env", [])
    for kv in env:
        name = api.clear_removal_marker(kv.key)
        if not name or "=" in name:
            raise _bad("env", f"invalid variable name {kv.key!r}")
        at = [i for i, e in enumerate(current) if e.split("=", 1)[0] == name]
        if api.is_marked_for_removal(kv.key):
            current[:] = [e for i, e in enumerate(current) if i not in at]
        elif at:
            current[at[0]] = f"{name}={kv.value}"
            current[:] = [e for i, e in enumerate(current) if i not in at[1:]]
        else:
            current.append(f"{name}={kv.value}")


def _args(spec: Spec, args: Sequence[str]) -> None:
    if not args:
        return
    # A leading "" is the merge-time "override earlier plugins" marker.
    new = list(args[1:] if args[0] == "" else args)
    if not new:
        raise _bad("args", "no arguments left after the override marker")
    spec.setdefault("process", {})["args"] = new


def _hooks(spec: Spec, hooks: api.Hooks) -> None:
    for nri_name, oci_name in HOOK_LISTS.items():
        entries = getattr(hooks, nri_name)
        if not entries:
            continue
        target = spec.setdefault("hooks", {}).setdefault(oci_name, [])
        for h in entries:
            if not h.path.startswith("/"):
                raise _bad(f"hooks.{nri_name}", f"hook path {h.path!r} is not absolute")
            hook: Spec = {"path": h.path}
            if h.args:
                hook["args"] = list(h.args)
            if h.env:
                hook["env"] = list(h.env)
            if h.HasField("timeout"):
                if h.timeout.value <= 0:
                    raise _bad(f"hooks.{nri_name}", f"timeout {h.timeout.value} is not > 0")
                hook["timeout"] = h.timeout.value
            target.append(hook)


def _rlimits(spec: Spec, rlimits: Sequence[api.POSIXRlimit], host: HostSupport) -> None:
    for rl in rlimits:
        if rl.type not in RLIMIT_NAMES:
            raise _bad("rlimits", f"unknown rlimit type {rl.type!r}")
        if rl.soft > rl.hard:
            raise _bad("rlimits", f"{rl.type}: soft limit {rl.soft} exceeds hard {rl.hard}")
        ceiling = host.rlimit_hard.get(rl.type)
        if ceiling is not None and rl.hard > ceiling:
            raise _cannot("rlimits", f"{rl.type}: hard limit {rl.hard} exceeds the runtime's "
                          f"own hard limit {ceiling} (raising it needs CAP_SYS_RESOURCE)")
        entry = {"type": rl.type, "hard": rl.hard, "soft": rl.soft}
        current: list[Spec] = spec.setdefault("process", {}).setdefault("rlimits", [])
        for i, old in enumerate(current):
            if old.get("type") == rl.type:
                current[i] = entry
                break
        else:
            current.append(entry)


def _io_priority(spec: Spec, prio: api.LinuxIOPriority, host: HostSupport) -> None:
    proc = spec.setdefault("process", {})
    klass = getattr(prio, "class")
    if klass == api.IOPRIO_CLASS_NONE:
        proc.pop("ioPriority", None)
        return
    _need_runc(host, "linux.io_priority")
    if not 0 <= prio.priority <= 7:
        raise _bad("linux.io_priority", f"priority {prio.priority} is outside 0..7")
    proc["ioPriority"] = {"class": api.IOPrioClass.Name(klass), "priority": prio.priority}


def _scheduler(spec: Spec, sch: api.LinuxScheduler, host: HostSupport) -> None:
    proc = spec.setdefault("process", {})
    if sch.policy == api.SCHED_NONE:
        proc.pop("scheduler", None)
        return
    _need_runc(host, "linux.scheduler")
    out: Spec = {"policy": api.LinuxSchedulerPolicy.Name(sch.policy)}
    for key in ("nice", "priority", "runtime", "deadline", "period"):
        if value := getattr(sch, key):
            out[key] = value
    if sch.flags:
        out["flags"] = [api.LinuxSchedulerFlag.Name(f) for f in sch.flags]
    proc["scheduler"] = out


# ---------------------------------------------------------------- linux


def _seccomp(spec: Spec, policy: api.LinuxSeccomp, host: HostSupport) -> None:
    if policy.flags:
        _need_runc(host, "linux.seccomp_policy.flags")
    out: Spec = {"defaultAction": policy.default_action}
    if policy.HasField("default_errno"):
        out["defaultErrnoRet"] = policy.default_errno.value
    if policy.architectures:
        out["architectures"] = list(policy.architectures)
    if policy.flags:
        out["flags"] = list(policy.flags)
    if policy.listener_path:
        out["listenerPath"] = policy.listener_path
    if policy.listener_metadata:
        out["listenerMetadata"] = policy.listener_metadata
    syscalls = []
    for call in policy.syscalls:
        entry: Spec = {"names": list(call.names), "action": call.action}
        if call.HasField("errno_ret"):
            entry["errnoRet"] = call.errno_ret.value
        if call.args:
            entry["args"] = [{"index": a.index, "value": a.value, "valueTwo": a.value_two,
                              "op": a.op} for a in call.args]
        syscalls.append(entry)
    if syscalls:
        out["syscalls"] = syscalls
    spec.setdefault("linux", {})["seccomp"] = out


def _namespaces(spec: Spec, namespaces: Sequence[api.LinuxNamespace],
                host: HostSupport) -> None:
    for ns in namespaces:
        kind = api.clear_removal_marker(ns.type)
        if kind not in NAMESPACE_TYPES:
            raise _bad("linux.namespaces", f"unknown namespace type {ns.type!r}")
        current: list[Spec] = spec.setdefault("linux", {}).setdefault("namespaces", [])
        if api.is_marked_for_removal(ns.type):
            current[:] = [n for n in current if n.get("type") != kind]
            continue
        if kind == "time":
            _need_runc(host, "linux.namespaces[time]")
        entry: Spec = {"type": kind, **({"path": ns.path} if ns.path else {})}
        for i, old in enumerate(current):
            if old.get("type") == kind:
                current[i] = entry
                break
        else:
            current.append(entry)


def _sysctl(spec: Spec, sysctl: Mapping[str, str]) -> None:
    if not sysctl:
        return
    out = spec.setdefault("linux", {}).setdefault("sysctl", {})
    for key, value in _removals_first(sysctl):
        if api.is_marked_for_removal(key):
            out.pop(api.clear_removal_marker(key), None)
        else:
            out[key] = value


def _net_devices(spec: Spec, devices: Mapping[str, api.LinuxNetDevice],
                 host: HostSupport) -> None:
    for host_if, dev in _removals_first(devices):
        linux = spec.setdefault("linux", {})
        if api.is_marked_for_removal(host_if):
            linux.get("netDevices", {}).pop(api.clear_removal_marker(host_if), None)
            continue
        _need_runc(host, "linux.net_devices")
        linux.setdefault("netDevices", {})[host_if] = {"name": dev.name} if dev.name else {}


def _devices(spec: Spec, devices: Sequence[api.LinuxDevice]) -> None:
    for d in devices:
        path = api.clear_removal_marker(d.path)
        linux = spec.setdefault("linux", {})
        current: list[Spec] = linux.setdefault("devices", [])
        current[:] = [x for x in current if x.get("path") != path]
        if api.is_marked_for_removal(d.path):
            continue
        if not path.startswith("/dev/"):
            raise _bad("linux.devices", f"device path {path!r} is not under /dev")
        if d.type not in ("b", "c", "u", "p"):
            raise _bad("linux.devices", f"{path}: unknown device type {d.type!r}")
        node: Spec = {"path": path, "type": d.type, "major": d.major, "minor": d.minor}
        if d.HasField("file_mode"):
            node["fileMode"] = d.file_mode.value
        if d.HasField("uid"):
            node["uid"] = d.uid.value
        if d.HasField("gid"):
            node["gid"] = d.gid.value
        current.append(node)
        if d.type == "p":
            continue  # fifos are not under the device cgroup
        # Upstream's access string: read and write, plus mknod for block devices.
        rule = {"allow": True, "type": "b" if d.type == "b" else "c", "major": d.major,
                "minor": d.minor, "access": "rwm" if d.type == "b" else "rw"}
        linux.setdefault("resources", {}).setdefault("devices", []).append(rule)


# ---------------------------------------------------------------- resources


def _resources(spec: Spec, r: api.LinuxResources, host: HostSupport) -> None:
    res = spec.setdefault("linux", {}).setdefault("resources", {})
    if r.HasField("memory"):
        _memory(res, r.memory, host)
    if r.HasField("cpu"):
        _cpu(res, r.cpu, host)
    for hp in r.hugepage_limits:
        if hp.page_size not in host.hugepage_sizes:
            raise _cannot("linux.resources.hugepage_limits",
                          f"page size {hp.page_size!r} is not one of this host's "
                          f"({', '.join(sorted(host.hugepage_sizes)) or 'none'})")
        limits: list[Spec] = res.setdefault("hugepageLimits", [])
        limits[:] = [x for x in limits if x.get("pageSize") != hp.page_size]
        limits.append({"pageSize": hp.page_size, "limit": hp.limit})
    if r.unified:
        if not host.cgroup_v2:
            raise _cannot("linux.resources.unified", "the host uses cgroup v1; runc "
                          "accepts unified settings only on cgroup v2")
        res.setdefault("unified", {}).update(r.unified)
    if r.HasField("pids"):
        if r.pids.limit < -1:
            raise _bad("linux.resources.pids", f"limit {r.pids.limit} (use -1 for unlimited)")
        res["pids"] = {"limit": r.pids.limit}
    for rule in r.devices:
        if rule.type not in ("", "a", "b", "c") or set(rule.access) - set("rwm"):
            raise _bad("linux.resources.devices",
                       f"bad rule type {rule.type!r} or access {rule.access!r}")
        out: Spec = {"allow": rule.allow}
        if rule.type:
            out["type"] = rule.type
        if rule.HasField("major"):
            out["major"] = rule.major.value
        if rule.HasField("minor"):
            out["minor"] = rule.minor.value
        if rule.access:
            out["access"] = rule.access
        res.setdefault("devices", []).append(out)
    if r.HasField("blockio_class"):
        name = r.blockio_class.value
        if not name:
            res.pop("blockIO", None)
        elif name not in host.blockio_classes:
            raise _cannot("linux.resources.blockio_class", f"unknown block I/O class {name!r}")
        else:
            raise _cannot("linux.resources.blockio_class",
                          f"class {name!r}: no block I/O class settings to apply")
    if r.HasField("rdt_class"):
        name = r.rdt_class.value
        linux = spec["linux"]
        if not name:
            linux.pop("intelRdt", None)
        elif not host.rdt:
            raise _cannot("linux.resources.rdt_class", "RDT (resctrl) is not available")
        else:
            linux["intelRdt"] = {"closID": name}


def _memory(res: Spec, m: api.LinuxMemory, host: HostSupport) -> None:
    where = "linux.resources.memory"
    for name in ("kernel", "kernel_tcp", "use_hierarchy"):
        if m.HasField(name):
            raise _cannot(f"{where}.{name}", "runc ignores this setting")
    if host.cgroup_v2:
        for name in ("swappiness", "disable_oom_killer"):
            if m.HasField(name):
                raise _cannot(f"{where}.{name}", "runc ignores this setting on cgroup v2")
    out = res.setdefault("memory", {})
    if m.HasField("limit"):
        if m.limit.value == 0 or m.limit.value < -1:
            raise _bad(f"{where}.limit", f"{m.limit.value} (use -1 for unlimited)")
        out["limit"] = out["swap"] = m.limit.value
    if m.HasField("swap"):
        out["swap"] = m.swap.value
    if m.HasField("reservation"):
        out["reservation"] = m.reservation.value
    if m.HasField("swappiness"):
        if m.swappiness.value > 100:
            raise _bad(f"{where}.swappiness", f"{m.swappiness.value} is above 100")
        out["swappiness"] = m.swappiness.value
    if m.HasField("disable_oom_killer"):
        out["disableOOMKiller"] = m.disable_oom_killer.value


def _cpu(res: Spec, c: api.LinuxCPU, host: HostSupport) -> None:
    out = res.setdefault("cpu", {})
    for nri_name, oci_name in (("shares", "shares"), ("quota", "quota"), ("period", "period"),
                               ("realtime_runtime", "realtimeRuntime"),
                               ("realtime_period", "realtimePeriod")):
        if c.HasField(nri_name):
            if host.cgroup_v2 and nri_name.startswith("realtime"):
                raise _cannot(f"linux.resources.cpu.{nri_name}",
                              "runc ignores realtime CPU settings on cgroup v2")
            out[oci_name] = getattr(c, nri_name).value
    if c.cpus:
        out["cpus"] = c.cpus
    if c.mems:
        out["mems"] = c.mems


def _rdt(spec: Spec, rdt: api.LinuxRdt, host: HostSupport) -> None:
    linux = spec.setdefault("linux", {})
    if rdt.remove:
        linux.pop("intelRdt", None)
    sets = [f for f in ("clos_id", "schemata", "enable_monitoring") if rdt.HasField(f)]
    if not sets:
        return
    if not host.rdt:
        raise _cannot(f"linux.rdt.{sets[0]}", "RDT (resctrl) is not available")
    out = linux.setdefault("intelRdt", {})
    if rdt.HasField("clos_id"):
        out["closID"] = rdt.clos_id.value
    if rdt.HasField("schemata"):
        _need_runc(host, "linux.rdt.schemata")
        out["schemata"] = list(rdt.schemata.value)
    if rdt.HasField("enable_monitoring"):
        if rdt.enable_monitoring.value:
            _need_runc(host, "linux.rdt.enable_monitoring")
            out["enableMonitoring"] = True
        else:
            out.pop("enableMonitoring", None)


# ---------------------------------------------------------------- mounts


def _mounts(spec: Spec, mounts: Sequence[api.Mount], host: HostSupport) -> None:
    if not mounts:
        return
    current: list[Spec] = spec.setdefault("mounts", [])
    linux = spec.setdefault("linux", {})
    for m in mounts:
        dest = clean(api.clear_removal_marker(m.destination))
        current[:] = [x for x in current if clean(x.get("destination", "")) != dest]
        if api.is_marked_for_removal(m.destination):
            continue
        props = [o for o in m.options if o in _PROPAGATIONS]
        prop = props[-1] if props else ""
        if prop in ("rshared", "rslave"):
            accepted = ("rshared",) if prop == "rshared" else ("rshared", "rslave")
            if host.source_propagation is None:
                raise _cannot("mounts", f"{m.destination}: cannot check the propagation "
                              f"of source {m.source!r} needed by {prop}")
            have = host.source_propagation(m.source)
            if have not in accepted:
                raise _cannot("mounts", f"{m.destination}: {prop} needs source {m.source!r} "
                              f"on a {' or '.join(accepted)} mount, it is {have or 'private'}")
            root = linux.get("rootfsPropagation")
            if prop == "rshared":
                linux["rootfsPropagation"] = "rshared"
            elif root not in ("rshared", "rslave"):
                linux["rootfsPropagation"] = "rslave"
        entry: Spec = {"destination": m.destination}
        if m.type:
            entry["type"] = m.type
        if m.source:
            entry["source"] = m.source
        if m.options:
            entry["options"] = list(m.options)
        current.append(entry)
    # Parents before children: by depth, then by destination, as upstream sorts.
    current.sort(key=lambda x: (clean(x["destination"]).count("/"), x["destination"]))
