"""NRI adjustments of the spec's cgroup resources (``linux.resources``) and of RDT."""

from __future__ import annotations

from pycrid.nri import api
from pycrid.oci.defaults import Spec
from pycrid.oci.nri_host_support import HostSupport, bad, cannot, need_runc


def adjust_resources(spec: Spec, r: api.LinuxResources, host: HostSupport) -> None:
    res = spec.setdefault("linux", {}).setdefault("resources", {})
    if r.HasField("memory"):
        _memory(res, r.memory, host)
    if r.HasField("cpu"):
        _cpu(res, r.cpu, host)
    for hp in r.hugepage_limits:
        if hp.page_size not in host.hugepage_sizes:
            raise cannot("linux.resources.hugepage_limits",
                          f"page size {hp.page_size!r} is not one of this host's "
                          f"({', '.join(sorted(host.hugepage_sizes)) or 'none'})")
        limits: list[Spec] = res.setdefault("hugepageLimits", [])
        limits[:] = [x for x in limits if x.get("pageSize") != hp.page_size]
        limits.append({"pageSize": hp.page_size, "limit": hp.limit})
    if r.unified:
        if not host.cgroup_v2:
            raise cannot("linux.resources.unified", "the host uses cgroup v1; runc "
                          "accepts unified settings only on cgroup v2")
        res.setdefault("unified", {}).update(r.unified)
    if r.HasField("pids"):
        if r.pids.limit < -1:
            raise bad("linux.resources.pids", f"limit {r.pids.limit} (use -1 for unlimited)")
        res["pids"] = {"limit": r.pids.limit}
    for rule in r.devices:
        if rule.type not in ("", "a", "b", "c") or set(rule.access) - set("rwm"):
            raise bad("linux.resources.devices",
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
            raise cannot("linux.resources.blockio_class", f"unknown block I/O class {name!r}")
        else:
            raise cannot("linux.resources.blockio_class",
                          f"class {name!r}: no block I/O class settings to apply")
    if r.HasField("rdt_class"):
        name = r.rdt_class.value
        linux = spec["linux"]
        if not name:
            linux.pop("intelRdt", None)
        elif not host.rdt:
            raise cannot("linux.resources.rdt_class", "RDT (resctrl) is not available")
        else:
            linux["intelRdt"] = {"closID": name}


def _memory(res: Spec, m: api.LinuxMemory, host: HostSupport) -> None:
    where = "linux.resources.memory"
    for name in ("kernel", "kernel_tcp", "use_hierarchy"):
        if m.HasField(name):
            raise cannot(f"{where}.{name}", "runc ignores this setting")
    if host.cgroup_v2:
        for name in ("swappiness", "disable_oom_killer"):
            if m.HasField(name):
                raise cannot(f"{where}.{name}", "runc ignores this setting on cgroup v2")
    out = res.setdefault("memory", {})
    if m.HasField("limit"):
        if m.limit.value == 0 or m.limit.value < -1:
            raise bad(f"{where}.limit", f"{m.limit.value} (use -1 for unlimited)")
        out["limit"] = out["swap"] = m.limit.value
    if m.HasField("swap"):
        out["swap"] = m.swap.value
    if m.HasField("reservation"):
        out["reservation"] = m.reservation.value
    if m.HasField("swappiness"):
        if m.swappiness.value > 100:
            raise bad(f"{where}.swappiness", f"{m.swappiness.value} is above 100")
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
                raise cannot(f"linux.resources.cpu.{nri_name}",
                              "runc ignores realtime CPU settings on cgroup v2")
            out[oci_name] = getattr(c, nri_name).value
    if c.cpus:
        out["cpus"] = c.cpus
    if c.mems:
        out["mems"] = c.mems


def adjust_rdt(spec: Spec, rdt: api.LinuxRdt, host: HostSupport) -> None:
    linux = spec.setdefault("linux", {})
    if rdt.remove:
        linux.pop("intelRdt", None)
    sets = [f for f in ("clos_id", "schemata", "enable_monitoring") if rdt.HasField(f)]
    if not sets:
        return
    if not host.rdt:
        raise cannot(f"linux.rdt.{sets[0]}", "RDT (resctrl) is not available")
    out = linux.setdefault("intelRdt", {})
    if rdt.HasField("clos_id"):
        out["closID"] = rdt.clos_id.value
    if rdt.HasField("schemata"):
        need_runc(host, "linux.rdt.schemata")
        out["schemata"] = list(rdt.schemata.value)
    if rdt.HasField("enable_monitoring"):
        if rdt.enable_monitoring.value:
            need_runc(host, "linux.rdt.enable_monitoring")
            out["enableMonitoring"] = True
        else:
            out.pop("enableMonitoring", None)

