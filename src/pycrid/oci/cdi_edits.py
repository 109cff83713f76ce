"""Applying CDI container edits to an OCI spec, as the CDI reference library does:

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

``intelRdt`` and ``netDevices`` edits are not applied.
"""

from __future__ import annotations

import os
import posixpath
import stat
from typing import Any

from pycrid.errors import FailedPrecondition
from pycrid.oci.cdi_specs import NO_PERMISSIONS, ContainerEdits


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


def apply_edits(spec: dict[str, Any], edits: ContainerEdits) -> None:
    """Apply ``edits`` to the OCI ``spec`` in place; a device node the host lacks raises
    FailedPrecondition before anything is changed."""
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
                access = {"": "rwm", NO_PERMISSIONS: ""}.get(access, access)
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
