"""NRI adjustments of the container process: annotations, env, args, hooks, rlimits,
I/O priority and scheduler (see oci/nri_apply.py for the rules they follow)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pycrid.host.facts import RLIMIT_NAMES
from pycrid.nri import api
from pycrid.oci.defaults import Spec
from pycrid.oci.nri_host_support import HostSupport, bad, cannot, need_runc

# NRI hook list → OCI hook list.
HOOK_LISTS = {"prestart": "prestart", "create_runtime": "createRuntime",
              "create_container": "createContainer", "start_container": "startContainer",
              "poststart": "poststart", "poststop": "poststop"}


def removals_first(entries: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Map entries with removals before sets: a merged adjustment may hold both ``-k``
    and ``k`` when one plugin replaced another's entry."""
    return sorted(entries.items(), key=lambda kv: (not api.is_marked_for_removal(kv[0]), kv[0]))


def adjust_annotations(spec: Spec, annotations: Mapping[str, str]) -> None:
    if not annotations:
        return
    out = spec.setdefault("annotations", {})
    for key, value in removals_first(annotations):
        if api.is_marked_for_removal(key):
            out.pop(api.clear_removal_marker(key), None)
        else:
            out[key] = value


def adjust_env(spec: Spec, env: Sequence[api.KeyValue]) -> None:
    if not env:
        return
    current: list[str] = spec.setdefault("process", {}).setdefault("env", [])
    for kv in env:
        name = api.clear_removal_marker(kv.key)
        if not name or "=" in name:
            raise bad("env", f"invalid variable name {kv.key!r}")
        at = [i for i, e in enumerate(current) if e.split("=", 1)[0] == name]
        if api.is_marked_for_removal(kv.key):
            current[:] = [e for i, e in enumerate(current) if i not in at]
        elif at:
            current[at[0]] = f"{name}={kv.value}"
            current[:] = [e for i, e in enumerate(current) if i not in at[1:]]
        else:
            current.append(f"{name}={kv.value}")


def adjust_args(spec: Spec, args: Sequence[str]) -> None:
    if not args:
        return
    # A leading "" is the merge-time "override earlier plugins" marker.
    new = list(args[1:] if args[0] == "" else args)
    if not new:
        raise bad("args", "no arguments left after the override marker")
    spec.setdefault("process", {})["args"] = new


def adjust_hooks(spec: Spec, hooks: api.Hooks) -> None:
    for nri_name, oci_name in HOOK_LISTS.items():
        entries = getattr(hooks, nri_name)
        if not entries:
            continue
        target = spec.setdefault("hooks", {}).setdefault(oci_name, [])
        for h in entries:
            if not h.path.startswith("/"):
                raise bad(f"hooks.{nri_name}", f"hook path {h.path!r} is not absolute")
            hook: Spec = {"path": h.path}
            if h.args:
                hook["args"] = list(h.args)
            if h.env:
                hook["env"] = list(h.env)
            if h.HasField("timeout"):
                if h.timeout.value <= 0:
                    raise bad(f"hooks.{nri_name}", f"timeout {h.timeout.value} is not > 0")
                hook["timeout"] = h.timeout.value
            target.append(hook)


def adjust_rlimits(spec: Spec, rlimits: Sequence[api.POSIXRlimit], host: HostSupport) -> None:
    for rl in rlimits:
        if rl.type not in RLIMIT_NAMES:
            raise bad("rlimits", f"unknown rlimit type {rl.type!r}")
        if rl.soft > rl.hard:
            raise bad("rlimits", f"{rl.type}: soft limit {rl.soft} exceeds hard {rl.hard}")
        ceiling = host.rlimit_hard.get(rl.type)
        if ceiling is not None and rl.hard > ceiling:
            raise cannot("rlimits", f"{rl.type}: hard limit {rl.hard} exceeds the runtime's "
                          f"own hard limit {ceiling} (raising it needs CAP_SYS_RESOURCE)")
        entry = {"type": rl.type, "hard": rl.hard, "soft": rl.soft}
        current: list[Spec] = spec.setdefault("process", {}).setdefault("rlimits", [])
        for i, old in enumerate(current):
            if old.get("type") == rl.type:
                current[i] = entry
                break
        else:
            current.append(entry)


def adjust_io_priority(spec: Spec, prio: api.LinuxIOPriority, host: HostSupport) -> None:
    proc = spec.setdefault("process", {})
    klass = getattr(prio, "class")
    if klass == api.IOPRIO_CLASS_NONE:
        proc.pop("ioPriority", None)
        return
    need_runc(host, "linux.io_priority")
    if not 0 <= prio.priority <= 7:
        raise bad("linux.io_priority", f"priority {prio.priority} is outside 0..7")
    proc["ioPriority"] = {"class": api.IOPrioClass.Name(klass), "priority": prio.priority}


def adjust_scheduler(spec: Spec, sch: api.LinuxScheduler, host: HostSupport) -> None:
    proc = spec.setdefault("process", {})
    if sch.policy == api.SCHED_NONE:
        proc.pop("scheduler", None)
        return
    need_runc(host, "linux.scheduler")
    out: Spec = {"policy": api.LinuxSchedulerPolicy.Name(sch.policy)}
    for key in ("nice", "priority", "runtime", "deadline", "period"):
        if value := getattr(sch, key):
            out[key] = value
    if sch.flags:
        out["flags"] = [api.LinuxSchedulerFlag.Name(f) for f in sch.flags]
    proc["scheduler"] = out

