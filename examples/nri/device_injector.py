#!/usr/bin/env python3
"""NRI example plugin: inject devices, CDI devices and mounts from pod annotations.

Reads YAML lists from these annotations, looked up first for the container
(``<key>/container.<name>``), then for the whole pod (``<key>/pod``), then bare
``<key>``; the older ``*.nri.io`` keys are accepted too:

* ``devices.noderesource.dev``: ``[{path, type, major, minor, file_mode, uid, gid}]``
* ``cdi-devices.noderesource.dev``: ``[vendor.com/class=name, ...]``
* ``mounts.noderesource.dev``: ``[{source, destination, type, options}]``

Subscribes to CreateContainer only. A malformed annotation fails the
container's creation with a message quoting it. Behaves like the device and
mount part of containerd/nri's Go ``device-injector`` sample.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from pycrid.nri import Adjustment, Plugin, api, run

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _cli

log = logging.getLogger("nri-device-injector")

DEVICES = ("devices.noderesource.dev", "devices.nri.io")
CDI_DEVICES = ("cdi-devices.noderesource.dev", "cdi-devices.nri.io")
MOUNTS = ("mounts.noderesource.dev", "mounts.nri.io")


def _annotated_list(keys: tuple[str, str], container: str, annotations: Mapping[str, str],
                    what: str) -> list[Any]:
    raw = api.container_annotation(annotations, keys[0], container, old_key=keys[1])
    if not raw:
        return []
    try:
        items = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ValueError(f"invalid {what} annotation {raw!r}: {exc}") from None
    if items is None:
        return []
    if not isinstance(items, list):
        raise ValueError(f"invalid {what} annotation {raw!r}: not a YAML list")
    return items


def device(entry: Mapping[str, Any]) -> api.LinuxDevice:
    dev = api.LinuxDevice(
        path=str(entry.get("path", "")),
        type=str(entry.get("type", "")),
        major=int(entry.get("major", 0)),
        minor=int(entry.get("minor", 0)),
    )
    # Zero means "not given", as in the Go sample: the wrappers stay unset.
    if entry.get("file_mode"):
        dev.file_mode.value = int(entry["file_mode"])
    if entry.get("uid"):
        dev.uid.value = int(entry["uid"])
    if entry.get("gid"):
        dev.gid.value = int(entry["gid"])
    return dev


class DeviceInjector(Plugin):
    def create_container(self, pod: api.PodSandbox, container: api.Container) -> Adjustment:
        name, where = container.name, f"{pod.name}/{container.name}"
        adjust = Adjustment()
        for entry in _annotated_list(DEVICES, name, pod.annotations, "device"):
            if not isinstance(entry, dict):
                raise ValueError(f"invalid device entry {entry!r}")
            adjust.add_device(device(entry))
            log.info("%s: injected device %s", where, entry.get("path"))
        for cdi in _annotated_list(CDI_DEVICES, name, pod.annotations, "CDI device"):
            adjust.add_cdi_device(str(cdi))
            log.info("%s: injected CDI device %s", where, cdi)
        for entry in _annotated_list(MOUNTS, name, pod.annotations, "mount"):
            if not isinstance(entry, dict):
                raise ValueError(f"invalid mount entry {entry!r}")
            adjust.add_mount(
                destination=str(entry.get("destination", "")),
                source=str(entry.get("source", "")),
                type=str(entry.get("type", "")),
                options=[str(o) for o in entry.get("options") or []],
            )
            log.info("%s: injected mount %s -> %s", where, entry.get("source"),
                     entry.get("destination"))
        return adjust


def main(args: Sequence[str] | None = None) -> int:
    ns = _cli.parser("NRI plugin that injects devices and mounts from pod annotations").parse_args(
        _cli.argv(args)
    )
    return run(DeviceInjector(), **_cli.stub_options(ns))


if __name__ == "__main__":
    sys.exit(main())
