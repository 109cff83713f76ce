"""NRI adjustments of the spec's ``linux`` section outside resources (seccomp, namespaces,
sysctls, net devices, devices) and of its mounts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pycrid.nri import api
from pycrid.oci.defaults import Spec
from pycrid.oci.nri_apply_process import removals_first
from pycrid.oci.nri_host_support import HostSupport, bad, cannot, need_runc
from pycrid.oci.spec_mounts import clean

NAMESPACE_TYPES = frozenset({"pid", "network", "mount", "ipc", "uts", "user", "cgroup", "time"})
_PROPAGATIONS = ("rprivate", "rshared", "rslave")


def adjust_seccomp(spec: Spec, policy: api.LinuxSeccomp, host: HostSupport) -> None:
    if policy.flags:
        need_runc(host, "linux.seccomp_policy.flags")
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


def adjust_namespaces(spec: Spec, namespaces: Sequence[api.LinuxNamespace],
                host: HostSupport) -> None:
    for ns in namespaces:
        kind = api.clear_removal_marker(ns.type)
        if kind not in NAMESPACE_TYPES:
            raise bad("linux.namespaces", f"unknown namespace type {ns.type!r}")
        current: list[Spec] = spec.setdefault("linux", {}).setdefault("namespaces", [])
        if api.is_marked_for_removal(ns.type):
            current[:] = [n for n in current if n.get("type") != kind]
            continue
        if kind == "time":
            need_runc(host, "linux.namespaces[time]")
        entry: Spec = {"type": kind, **({"path": ns.path} if ns.path else {})}
        for i, old in enumerate(current):
            if old.get("type") == kind:
                current[i] = entry
                break
        else:
            current.append(entry)


def adjust_sysctl(spec: Spec, sysctl: Mapping[str, str]) -> None:
    if not sysctl:
        return
    out = spec.setdefault("linux", {}).setdefault("sysctl", {})
    for key, value in removals_first(sysctl):
        if api.is_marked_for_removal(key):
            out.pop(api.clear_removal_marker(key), None)
        else:
            out[key] = value


def adjust_net_devices(spec: Spec, devices: Mapping[str, api.LinuxNetDevice],
                 host: HostSupport) -> None:
    for host_if, dev in removals_first(devices):
        linux = spec.setdefault("linux", {})
        if api.is_marked_for_removal(host_if):
            linux.get("netDevices", {}).pop(api.clear_removal_marker(host_if), None)
            continue
        need_runc(host, "linux.net_devices")
        linux.setdefault("netDevices", {})[host_if] = {"name": dev.name} if dev.name else {}


def adjust_devices(spec: Spec, devices: Sequence[api.LinuxDevice]) -> None:
    for d in devices:
        path = api.clear_removal_marker(d.path)
        linux = spec.setdefault("linux", {})
        current: list[Spec] = linux.setdefault("devices", [])
        current[:] = [x for x in current if x.get("path") != path]
        if api.is_marked_for_removal(d.path):
            continue
        if not path.startswith("/dev/"):
            raise bad("linux.devices", f"device path {path!r} is not under /dev")
        if d.type not in ("b", "c", "u", "p"):
            raise bad("linux.devices", f"{path}: unknown device type {d.type!r}")
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


def adjust_mounts(spec: Spec, mounts: Sequence[api.Mount], host: HostSupport) -> None:
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
                raise cannot("mounts", f"{m.destination}: cannot check the propagation "
                              f"of source {m.source!r} needed by {prop}")
            have = host.source_propagation(m.source)
            if have not in accepted:
                raise cannot("mounts", f"{m.destination}: {prop} needs source {m.source!r} "
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
