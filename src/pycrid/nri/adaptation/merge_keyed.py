"""Merging the CreateContainer adjustment fields that hold entries by key: annotations,
sysctls and net devices (maps), mounts, env, devices and namespaces (keyed lists),
rlimits and CDI devices. Each key is owned by the plugin that set it (see merge.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer
from google.protobuf.message import Message

from pycrid.nri import api
from pycrid.nri.adaptation.keyed_entries import clone, drop_keys, put_keyed
from pycrid.nri.adaptation.owners import OwnerTable

_M = TypeVar("_M", bound=Message)

_F = api.Field


def _mount_key(mount: api.Mount) -> str:
    return mount.destination


def _device_key(device: api.LinuxDevice) -> str:
    return device.path


def _env_key(env: api.KeyValue) -> str:
    return env.key


def _namespace_key(namespace: api.LinuxNamespace) -> str:
    return namespace.type


def _rlimit_key(rlimit: api.POSIXRlimit) -> str:
    return rlimit.type


def _env_name(entry: str) -> str:
    return entry.partition("=")[0]


class KeyedFieldMerger:
    """Folds one container's keyed adjustment fields into ``merged`` (the adjustment so far)
    and ``working`` (the container as the next plugin sees it), claiming each key."""

    def __init__(self, container_id: str, owners: OwnerTable, merged: api.ContainerAdjustment,
                 working: api.Container) -> None:
        self._id = container_id
        self._owners = owners
        self._adjust = merged
        self.container = working

    def _keyed_map(
        self,
        plugin: str,
        field: int,
        keys: Iterable[str],
        *,
        remove: Callable[[str], None],
        put: Callable[[str], None],
    ) -> None:
        """Removals first, then sets, each in key order (for stable errors)."""
        marked = sorted(k for k in keys if api.is_marked_for_removal(k))
        for raw in marked:
            key = api.clear_removal_marker(raw)
            self._owners.clear(self._id, field, plugin, key)
            remove(key)
        for key in sorted(k for k in keys if not api.is_marked_for_removal(k)):
            self._owners.claim(self._id, field, plugin, key)
            put(key)

    def annotations(self, plugin: str, adj: api.ContainerAdjustment) -> None:
        self._string_map(plugin, _F.Annotations, adj.annotations, self._adjust.annotations,
                         self.container.annotations)

    def sysctl(self, plugin: str, lin: api.LinuxContainerAdjustment) -> None:
        self._string_map(plugin, _F.Sysctl, lin.sysctl, self._adjust.linux.sysctl,
                         self.container.linux.sysctl)

    def _string_map(self, plugin: str, field: int, change: Any, merged: Any,
                    working: Any) -> None:
        """A string map owned per key (annotations, sysctls)."""
        if not change:
            return

        def remove(key: str) -> None:
            working.pop(key, None)
            merged.pop(key, None)
            merged[api.mark_for_removal(key)] = ""

        def put(key: str) -> None:
            working[key] = merged[key] = change[key]

        self._keyed_map(plugin, field, list(change), remove=remove, put=put)

    def net_devices(self, plugin: str, lin: api.LinuxContainerAdjustment) -> None:
        change = lin.net_devices
        if not change:
            return
        merged, working = self._adjust.linux.net_devices, self.container.linux.net_devices

        def remove(key: str) -> None:
            if key in working:
                del working[key]
            if key in merged:
                del merged[key]
            merged.get_or_create(api.mark_for_removal(key))

        def put(key: str) -> None:
            working[key].CopyFrom(change[key])
            merged[key].CopyFrom(change[key])

        self._keyed_map(plugin, _F.LinuxNetDevices, list(change), remove=remove, put=put)

    def _keyed_list(
        self,
        plugin: str,
        field: int,
        change: Sequence[_M],
        key_of: Callable[[_M], str],
        merged: RepeatedCompositeFieldContainer[_M],
        *,
        marker: Callable[[str], _M],
        drop_working: Callable[[set[str]], None],
        add_working: Callable[[_M], None],
    ) -> None:
        """Merge a list whose entries are identified by a key.

        Removals are handled before additions (so remove + add of one key in a
        reply replaces the entry); a removal that is not followed by an
        addition of the same key leaves a marker in the merged adjustment.
        """
        if not change:
            return
        removed: list[str] = []
        added: list[_M] = []
        for entry in change:
            raw = key_of(entry)
            if api.is_marked_for_removal(raw):
                removed.append(api.clear_removal_marker(raw))
            else:
                added.append(entry)
        readded = {key_of(e) for e in added}
        for key in dict.fromkeys(removed):
            self._owners.clear(self._id, field, plugin, key)
            drop_keys(merged, key_of, {key})
            if key not in readded:
                merged.append(marker(key))
        drop_working(set(removed) | readded)
        for entry in added:
            self._owners.claim(self._id, field, plugin, key_of(entry))
            put_keyed(merged, key_of, clone(entry))
            add_working(entry)

    def mounts(self, plugin: str, adj: api.ContainerAdjustment) -> None:
        working = self.container.mounts
        self._keyed_list(
            plugin,
            _F.Mounts,
            adj.mounts,
            _mount_key,
            self._adjust.mounts,
            marker=lambda key: api.Mount(destination=api.mark_for_removal(key)),
            drop_working=lambda keys: drop_keys(working, _mount_key, keys),
            add_working=working.append,
        )

    def env(self, plugin: str, adj: api.ContainerAdjustment) -> None:
        working = self.container.env

        def drop(keys: set[str]) -> None:
            kept = [e for e in working if _env_name(e) not in keys]
            del working[:]
            working.extend(kept)

        self._keyed_list(
            plugin,
            _F.Env,
            adj.env,
            _env_key,
            self._adjust.env,
            marker=lambda key: api.KeyValue(key=api.mark_for_removal(key)),
            drop_working=drop,
            add_working=lambda kv: working.append(f"{kv.key}={kv.value}"),
        )

    def devices(self, plugin: str, lin: api.LinuxContainerAdjustment) -> None:
        working = self.container.linux.devices
        self._keyed_list(
            plugin,
            _F.Devices,
            lin.devices,
            _device_key,
            self._adjust.linux.devices,
            marker=lambda key: api.LinuxDevice(path=api.mark_for_removal(key)),
            drop_working=lambda keys: drop_keys(working, _device_key, keys),
            add_working=working.append,
        )

    def namespaces(self, plugin: str, lin: api.LinuxContainerAdjustment) -> None:
        working = self.container.linux.namespaces
        self._keyed_list(
            plugin,
            _F.Namespace,
            lin.namespaces,
            _namespace_key,
            self._adjust.linux.namespaces,
            marker=lambda key: api.LinuxNamespace(type=api.mark_for_removal(key)),
            drop_working=lambda keys: drop_keys(working, _namespace_key, keys),
            add_working=working.append,
        )

    def rlimits(self, plugin: str, adj: api.ContainerAdjustment) -> None:
        for rlimit in adj.rlimits:
            self._owners.claim(self._id, _F.Rlimits, plugin, rlimit.type)
            put_keyed(self._adjust.rlimits, _rlimit_key, clone(rlimit))
            put_keyed(self.container.rlimits, _rlimit_key, clone(rlimit))

    def cdi_devices(self, plugin: str, adj: api.ContainerAdjustment) -> None:
        # add-only references resolved later by the runtime; like upstream they
        # are not copied into the working container
        for device in adj.CDI_devices:
            self._owners.claim(self._id, _F.CdiDevices, plugin, device.name)
            self._adjust.CDI_devices.append(device)


