"""Container Device Interface: inject CDI devices into an OCI spec.

A CDI spec file (JSON or YAML) describes devices of one *kind*
(``vendor.com/class``); each device is asked for by its fully-qualified name
``vendor.com/class=name``. The file carries edits for the OCI spec: one set
that applies once whenever any of its devices is injected, and one per device.

What is followed, from the CDI specification and its reference library:

* Spec directories are read in order; a later directory has the higher
  priority, so its device of the same qualified name wins. Two files of the
  same directory defining the same device conflict: the device is dropped
  (unless a later directory defines it) and the conflict logged.
* A file that cannot be read or fails validation is skipped with a warning;
  the other files still count.
* The edits of all requested devices are gathered first (a spec's own edits
  once, before the first of its devices' edits) and applied together:

  - ``env``: ``NAME=value`` replaces a variable of the same name, else appends;
  - ``deviceNodes``: ``hostPath`` defaults to ``path``; type, major and minor
    come from the host node when not given (a node given with its type and a
    major, or as a fifo, needs no host node), ``fileMode`` likewise; uid/gid
    default to the process user when that is not root. Each node replaces one
    of the same path in ``linux.devices``; block and char nodes also get an
    allow rule, ``permissions`` defaulting to ``rwm`` and ``none`` meaning
    no access;
  - ``mounts``: replace a mount of the same destination, then all mounts are
    ordered (stably) by the depth of their destination; with a user namespace,
    bind mounts get ``idmap``/``ridmap``;
  - ``hooks``: appended to the OCI hook list named by ``hookName``;
  - ``additionalGids``: added to the process user unless already there; 0 is
    ignored.

* ``intelRdt`` and ``netDevices`` edits are accepted in files but not applied.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from pycrid.errors import FailedPrecondition, InvalidArgument

log = logging.getLogger(__name__)

DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
SPEC_EXTENSIONS = (".json", ".yaml", ".yml")

HOOK_NAMES = ("prestart", "createRuntime", "createContainer", "startContainer",
              "poststart", "poststop")
"""CDI hook names; each is also the key of its list in the OCI spec's ``hooks``."""

_NODE_TYPES = frozenset({"", "b", "c", "u", "p"})
_NO_PERMISSIONS = "none"

# Vendor and class: a letter first, a letter or digit last, "_-." between.
_VENDOR_OR_CLASS = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
# Device name: a letter or digit at both ends, "_-.:" between.
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


class _InvalidSpec(ValueError):
    """A CDI spec file that is not usable; the file is skipped."""


@dataclass
class _Edits:
    env: list[str] = field(default_factory=list)
    device_nodes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    hooks: list[dict[str, Any]] = field(default_factory=list)
    additional_gids: list[int] = field(default_factory=list)

    def empty(self) -> bool:
        return not (self.env or self.device_nodes or self.mounts or self.hooks
                    or self.additional_gids)

    def extend(self, other: _Edits) -> None:
        self.env += other.env
        self.device_nodes += other.device_nodes
        self.mounts += other.mounts
        self.hooks += other.hooks
        self.additional_gids += other.additional_gids


@dataclass
class _SpecFile:
    path: str
    priority: int
    kind: str
    edits: _Edits
    devices: dict[str, _Edits]


# ---------------------------------------------------------------- validation


def _opt_str(obj: dict[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _InvalidSpec(f"{where}: {key} must be a string")
    return value


def _req_str(obj: dict[str, Any], key: str, where: str) -> str:
    value = _opt_str(obj, key, where)
    if not value:
        raise _InvalidSpec(f"{where}: {key} is required")
    return value


def _opt_int(obj: dict[str, Any], key: str, where: str, *, lo: int = 0,
             hi: int = 2**63 - 1) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _InvalidSpec(f"{where}: {key} must be an integer in [{lo}, {hi}]")
    return value


def _str_list(obj: dict[str, Any], key: str, where: str) -> list[str]:
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _InvalidSpec(f"{where}: {key} must be a list of strings")
    return list(value)


def _dict_list(obj: dict[str, Any], key: str, where: str) -> list[dict[str, Any]]:
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise _InvalidSpec(f"{where}: {key} must be a list of objects")
    return value


def _env(values: list[str], where: str) -> list[str]:
    for v in values:
        if v.find("=") <= 0:
            raise _InvalidSpec(f"{where}: invalid environment variable {v!r}")
    return values


def _device_node(raw: dict[str, Any], where: str) -> dict[str, Any]:
    path = _req_str(raw, "path", f"{where}: device node")
    where = f"{where}: device node {path!r}"
    node_type = _opt_str(raw, "type", where)
    if node_type not in _NODE_TYPES:
        raise _InvalidSpec(f"{where}: invalid type {node_type!r}")
    perms = _opt_str(raw, "permissions", where)
    if perms != _NO_PERMISSIONS and perms.strip("rwm"):
        raise _InvalidSpec(f"{where}: invalid permissions {perms!r}")
    return {
        "path": path,
        "hostPath": _opt_str(raw, "hostPath", where) or path,
        "type": node_type,
        "major": _opt_int(raw, "major", where, lo=-(2**63)) or 0,
        "minor": _opt_int(raw, "minor", where, lo=-(2**63)) or 0,
        "fileMode": _opt_int(raw, "fileMode", where, hi=2**32 - 1),
        "permissions": perms,
        "uid": _opt_int(raw, "uid", where, hi=2**32 - 1),
        "gid": _opt_int(raw, "gid", where, hi=2**32 - 1),
    }


def _mount(raw: dict[str, Any], where: str) -> dict[str, Any]:
    where = f"{where}: mount"
    mount: dict[str, Any] = {
        "destination": _req_str(raw, "containerPath", where),
        "source": _req_str(raw, "hostPath", where),
    }
    if mount_type := _opt_str(raw, "type", where):
        mount["type"] = mount_type
    if options := _str_list(raw, "options", where):
        mount["options"] = options
    return mount


def _hook(raw: dict[str, Any], where: str) -> dict[str, Any]:
    name = _opt_str(raw, "hookName", f"{where}: hook")
    if name not in HOOK_NAMES:
        raise _InvalidSpec(f"{where}: invalid hook name {name!r}")
    where = f"{where}: hook {name!r}"
    hook: dict[str, Any] = {"hookName": name, "path": _req_str(raw, "path", where)}
    if args := _str_list(raw, "args", where):
        hook["args"] = args
    if env := _env(_str_list(raw, "env", where), where):
        hook["env"] = env
    timeout = _opt_int(raw, "timeout", where, lo=1)
    if timeout is not None:
        hook["timeout"] = timeout
    return hook


def _edits(raw: Any, where: str) -> _Edits:
    if raw is None:
        return _Edits()
    if not isinstance(raw, dict):
        raise _InvalidSpec(f"{where}: containerEdits must be an object")
    gids = raw.get("additionalGids", raw.get("additionalGIDs")) or []
    if not isinstance(gids, list) or not all(
            isinstance(g, int) and not isinstance(g, bool) and 0 <= g < 2**32 for g in gids):
        raise _InvalidSpec(f"{where}: additionalGids must be a list of uint32")
    return _Edits(
        env=_env(_str_list(raw, "env", where), where),
        device_nodes=[_device_node(d, where) for d in _dict_list(raw, "deviceNodes", where)],
        mounts=[_mount(m, where) for m in _dict_list(raw, "mounts", where)],
        hooks=[_hook(h, where) for h in _dict_list(raw, "hooks", where)],
        additional_gids=list(gids),
    )


def _parse(data: Any, path: str, priority: int) -> _SpecFile:
    if not isinstance(data, dict):
        raise _InvalidSpec("not a CDI spec object")
    version = data.get("cdiVersion")
    if not isinstance(version, str) or not version:
        raise _InvalidSpec("cdiVersion is required")
    kind = _req_str(data, "kind", "spec")
    vendor, sep, cls = kind.partition("/")
    if not sep or not _VENDOR_OR_CLASS.match(vendor) or not _VENDOR_OR_CLASS.match(cls):
        raise _InvalidSpec(f"invalid kind {kind!r}")
    spec = _SpecFile(path=path, priority=priority, kind=kind,
                     edits=_edits(data.get("containerEdits"), "containerEdits"), devices={})
    for raw in _dict_list(data, "devices", "spec"):
        name = _opt_str(raw, "name", "device")
        if not _DEVICE_NAME.match(name):
            raise _InvalidSpec(f"invalid device name {name!r}")
        if name in spec.devices:
            raise _InvalidSpec(f"multiple devices named {name!r}")
        edits = _edits(raw.get("containerEdits"), f"device {name!r}")
        if edits.empty():
            raise _InvalidSpec(f"device {name!r} has no container edits")
        spec.devices[name] = edits
    if not spec.devices:
        raise _InvalidSpec("no devices")
    return spec


def _read(path: str, priority: int) -> _SpecFile:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise _InvalidSpec(f"cannot parse: {e}") from e
    return _parse(data, path, priority)


# ---------------------------------------------------------------- host devices


def _host_node(node: dict[str, Any], uid: int, gid: int) -> dict[str, Any]:
    """The OCI ``linux.devices`` entry for a CDI device node, completed from the host."""
    path, host_path = node["path"], node["hostPath"]
    node_type, major, minor = node["type"], node["major"], node["minor"]
    file_mode = node["fileMode"]
    minimal = node_type != "" and (major != 0 or node_type == "p")
    try:
        st = os.lstat(host_path)
        if stat.S_ISBLK(st.st_mode):
            host_type = "b"
        elif stat.S_ISCHR(st.st_mode):
            host_type = "c"
        elif stat.S_ISFIFO(st.st_mode):
            host_type = "p"
        else:
            raise OSError(f"{host_path}: not a device node")
    except OSError as e:
        if not minimal:
            raise FailedPrecondition(f"failed to stat CDI host device {host_path!r}: {e}") from e
    else:
        if file_mode is None:
            file_mode = stat.S_IMODE(st.st_mode)
        if not minimal:
            node_type = node_type or host_type
            if node_type != host_type:
                raise FailedPrecondition(
                    f"CDI device ({path!r}, {host_path!r}), host type mismatch "
                    f"({node_type}, {host_type})")
            if node_type != "p" and major == 0:
                major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
    dev: dict[str, Any] = {"path": path, "type": node_type, "major": major, "minor": minor}
    if file_mode is not None:
        dev["fileMode"] = file_mode
    dev_uid = node["uid"] if node["uid"] is not None else (uid if uid > 0 else None)
    dev_gid = node["gid"] if node["gid"] is not None else (gid if gid > 0 else None)
    if dev_uid is not None:
        dev["uid"] = dev_uid
    if dev_gid is not None:
        dev["gid"] = dev_gid
    return dev


# ---------------------------------------------------------------- applying


def _mount_depth(mount: dict[str, Any]) -> int:
    return posixpath.normpath(str(mount.get("destination", ""))).count("/")


def _idmapped(mount: dict[str, Any]) -> dict[str, Any]:
    """A bind mount in a user-namespaced container gets an id-mapping option."""
    options: list[str] = list(mount.get("options", []))
    option = "idmap" if mount.get("type") == "bind" else ""
    for o in options:
        if o in ("idmap", "ridmap"):
            return mount
        if o == "bind":
            option = "idmap"
        elif o == "rbind":
            option = "ridmap"
    if option:
        mount = {**mount, "options": [*options, option]}
    return mount


def _apply(spec: dict[str, Any], edits: _Edits) -> None:
    process = spec.setdefault("process", {})
    user = process.setdefault("user", {})
    # Resolve every device node before touching the spec, so a failure leaves it as it was.
    devices = [_host_node(n, int(user.get("uid", 0)), int(user.get("gid", 0)))
               for n in edits.device_nodes]

    if edits.env:
        env: list[str] = process.setdefault("env", [])
        index = {e.partition("=")[0]: i for i, e in enumerate(env)}
        for entry in edits.env:
            name = entry.partition("=")[0]
            if name in index:
                env[index[name]] = entry
            else:
                index[name] = len(env)
                env.append(entry)

    if devices:
        linux = spec.setdefault("linux", {})
        linux_devices: list[dict[str, Any]] = linux.setdefault("devices", [])
        rules: list[dict[str, Any]] = linux.setdefault("resources", {}).setdefault("devices", [])
        for node, dev in zip(edits.device_nodes, devices, strict=True):
            for i, old in enumerate(linux_devices):
                if old.get("path") == dev["path"]:
                    linux_devices[i] = dev
                    break
            else:
                linux_devices.append(dev)
            if dev["type"] in ("b", "c"):
                access = node["permissions"]
                access = {"": "rwm", _NO_PERMISSIONS: ""}.get(access, access)
                rules.append({"allow": True, "type": dev["type"], "major": dev["major"],
                              "minor": dev["minor"], "access": access})

    if edits.mounts:
        userns = any(ns.get("type") == "user"
                     for ns in spec.get("linux", {}).get("namespaces", []))
        mounts: list[dict[str, Any]] = list(spec.get("mounts", []))
        for m in edits.mounts:
            for i, old in enumerate(mounts):
                if old.get("destination") == m["destination"]:
                    del mounts[i]
                    break
            mounts.append(_idmapped(m) if userns else dict(m))
        spec["mounts"] = sorted(mounts, key=_mount_depth)

    for h in edits.hooks:
        hook = {k: (list(v) if isinstance(v, list) else v)
                for k, v in h.items() if k != "hookName"}
        spec.setdefault("hooks", {}).setdefault(h["hookName"], []).append(hook)

    for gid in edits.additional_gids:
        gids: list[int] = user.setdefault("additionalGids", [])
        if gid != 0 and gid not in gids:
            gids.append(gid)


# ---------------------------------------------------------------- registry


class CdiRegistry:
    """CDI devices found in ``spec_dirs`` (read afresh on every injection)."""

    def __init__(self, spec_dirs: Sequence[str] = DEFAULT_SPEC_DIRS) -> None:
        self.spec_dirs = tuple(spec_dirs)

    def _scan(self) -> dict[str, tuple[_SpecFile, _Edits]]:
        """Qualified device name -> (its spec file, its edits), by priority."""
        devices: dict[str, tuple[_SpecFile, _Edits]] = {}
        conflicts: set[str] = set()
        for priority, directory in enumerate(self.spec_dirs):
            try:
                names = sorted(os.listdir(directory))
            except FileNotFoundError:
                continue
            except OSError as e:
                log.warning("cannot read CDI spec directory %s: %s", directory, e)
                continue
            for name in names:
                path = os.path.join(directory, name)
                if not name.endswith(SPEC_EXTENSIONS) or os.path.isdir(path):
                    continue
                try:
                    spec = _read(path, priority)
                except (OSError, UnicodeDecodeError, _InvalidSpec) as e:
                    log.warning("skipping CDI spec %s: %s", path, e)
                    continue
                for dev_name, edits in spec.devices.items():
                    qualified = f"{spec.kind}={dev_name}"
                    old = devices.get(qualified)
                    if old is not None and old[0].priority == priority:
                        log.warning("conflicting CDI device %s (specs %s, %s)",
                                    qualified, path, old[0].path)
                        conflicts.add(qualified)
                        continue
                    # A later directory overrides, and settles an earlier conflict.
                    devices[qualified] = (spec, edits)
                    conflicts.discard(qualified)
        for qualified in conflicts:
            devices.pop(qualified, None)
        return devices

    def inject(self, spec: dict[str, Any], devices: Sequence[str]) -> None:
        """Apply the edits of ``devices`` (fully-qualified CDI names) to ``spec``."""
        if not devices:
            return
        known = self._scan()
        unresolved = [d for d in devices if d not in known]
        if unresolved:
            raise InvalidArgument(f"unresolvable CDI devices {', '.join(unresolved)}")
        edits = _Edits()
        seen: set[int] = set()
        for d in devices:
            spec_file, device_edits = known[d]
            if id(spec_file) not in seen:
                seen.add(id(spec_file))
                edits.extend(spec_file.edits)
            edits.extend(device_edits)
        _apply(spec, edits)
