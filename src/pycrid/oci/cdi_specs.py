"""CDI spec files: reading and validating them into the edits they carry.

A CDI spec file (JSON or YAML) describes devices of one *kind*
(``vendor.com/class``); each device is asked for by its fully-qualified name
``vendor.com/class=name``. The file carries edits for the OCI spec: one set
that applies once whenever any of its devices is injected, and one per device.
Validation follows the CDI specification and its reference library; a file that
fails it raises ``InvalidSpec`` and is skipped by the caller. ``intelRdt`` and
``netDevices`` edits are accepted in files but not read.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

HOOK_NAMES = ("prestart", "createRuntime", "createContainer", "startContainer",
              "poststart", "poststop")
"""CDI hook names; each is also the key of its list in the OCI spec's ``hooks``."""

#: A device node's ``permissions`` that means no access at all.
NO_PERMISSIONS = "none"
_NODE_TYPES = frozenset({"", "b", "c", "u", "p"})

# Vendor and class: a letter first, a letter or digit last, "_-." between.
_VENDOR_OR_CLASS = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
# Device name: a letter or digit at both ends, "_-.:" between.
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


class InvalidSpec(ValueError):
    """A CDI spec file that is not usable; the file is skipped."""


@dataclass
class ContainerEdits:
    """The edits of a spec or of one device, validated; device nodes and mounts are in
    the shape the applying code expects (a node's ``hostPath`` already defaulted)."""

    env: list[str] = field(default_factory=list)
    device_nodes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    hooks: list[dict[str, Any]] = field(default_factory=list)
    additional_gids: list[int] = field(default_factory=list)

    def empty(self) -> bool:
        return not (self.env or self.device_nodes or self.mounts or self.hooks
                    or self.additional_gids)

    def extend(self, other: ContainerEdits) -> None:
        self.env += other.env
        self.device_nodes += other.device_nodes
        self.mounts += other.mounts
        self.hooks += other.hooks
        self.additional_gids += other.additional_gids


@dataclass
class SpecFile:
    """One valid spec file; ``priority`` is its directory's index (later wins)."""

    path: str
    priority: int
    kind: str
    edits: ContainerEdits
    devices: dict[str, ContainerEdits]


def _opt_str(obj: dict[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidSpec(f"{where}: {key} must be a string")
    return value


def _req_str(obj: dict[str, Any], key: str, where: str) -> str:
    value = _opt_str(obj, key, where)
    if not value:
        raise InvalidSpec(f"{where}: {key} is required")
    return value


def _opt_int(obj: dict[str, Any], key: str, where: str, *, lo: int = 0,
             hi: int = 2**63 - 1) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidSpec(f"{where}: {key} must be an integer in [{lo}, {hi}]")
    return value


def _str_list(obj: dict[str, Any], key: str, where: str) -> list[str]:
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidSpec(f"{where}: {key} must be a list of strings")
    return list(value)


def _dict_list(obj: dict[str, Any], key: str, where: str) -> list[dict[str, Any]]:
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise InvalidSpec(f"{where}: {key} must be a list of objects")
    return value


def _env(values: list[str], where: str) -> list[str]:
    for v in values:
        if v.find("=") <= 0:
            raise InvalidSpec(f"{where}: invalid environment variable {v!r}")
    return values


def _device_node(raw: dict[str, Any], where: str) -> dict[str, Any]:
    path = _req_str(raw, "path", f"{where}: device node")
    where = f"{where}: device node {path!r}"
    node_type = _opt_str(raw, "type", where)
    if node_type not in _NODE_TYPES:
        raise InvalidSpec(f"{where}: invalid type {node_type!r}")
    perms = _opt_str(raw, "permissions", where)
    if perms != NO_PERMISSIONS and perms.strip("rwm"):
        raise InvalidSpec(f"{where}: invalid permissions {perms!r}")
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
        raise InvalidSpec(f"{where}: invalid hook name {name!r}")
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


def _edits(raw: Any, where: str) -> ContainerEdits:
    if raw is None:
        return ContainerEdits()
    if not isinstance(raw, dict):
        raise InvalidSpec(f"{where}: containerEdits must be an object")
    gids = raw.get("additionalGids", raw.get("additionalGIDs")) or []
    if not isinstance(gids, list) or not all(
            isinstance(g, int) and not isinstance(g, bool) and 0 <= g < 2**32 for g in gids):
        raise InvalidSpec(f"{where}: additionalGids must be a list of uint32")
    return ContainerEdits(
        env=_env(_str_list(raw, "env", where), where),
        device_nodes=[_device_node(d, where) for d in _dict_list(raw, "deviceNodes", where)],
        mounts=[_mount(m, where) for m in _dict_list(raw, "mounts", where)],
        hooks=[_hook(h, where) for h in _dict_list(raw, "hooks", where)],
        additional_gids=list(gids),
    )


def _parse(data: Any, path: str, priority: int) -> SpecFile:
    if not isinstance(data, dict):
        raise InvalidSpec("not a CDI spec object")
    version = data.get("cdiVersion")
    if not isinstance(version, str) or not version:
        raise InvalidSpec("cdiVersion is required")
    kind = _req_str(data, "kind", "spec")
    vendor, sep, cls = kind.partition("/")
    if not sep or not _VENDOR_OR_CLASS.match(vendor) or not _VENDOR_OR_CLASS.match(cls):
        raise InvalidSpec(f"invalid kind {kind!r}")
    spec = SpecFile(path=path, priority=priority, kind=kind,
                     edits=_edits(data.get("containerEdits"), "containerEdits"), devices={})
    for raw in _dict_list(data, "devices", "spec"):
        name = _opt_str(raw, "name", "device")
        if not _DEVICE_NAME.match(name):
            raise InvalidSpec(f"invalid device name {name!r}")
        if name in spec.devices:
            raise InvalidSpec(f"multiple devices named {name!r}")
        edits = _edits(raw.get("containerEdits"), f"device {name!r}")
        if edits.empty():
            raise InvalidSpec(f"device {name!r} has no container edits")
        spec.devices[name] = edits
    if not spec.devices:
        raise InvalidSpec("no devices")
    return spec


def read_spec(path: str, priority: int) -> SpecFile:
    """Read and validate one CDI spec file (JSON by its extension, else YAML)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise InvalidSpec(f"cannot parse: {e}") from e
    return _parse(data, path, priority)
