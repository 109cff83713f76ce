"""Combining the replies of several NRI plugins into one answer.

The runtime asks plugins one after the other. Each reply is folded into a
running result here, with containerd/nri's rules about who may change what:

* Every change is *claimed* by the plugin that makes it, per container. A plain
  field (args, cgroups path, the memory limit, ...) has one owner; a field that
  holds entries (annotations, mounts, env, sysctls, ...) has one owner per key.
  A second plugin claiming the same thing is an :class:`AdjustmentConflict`.
* Removing an entry (the key prefixed with ``-``) is not checked against the
  current owner: it takes the entry over and records the remover as
  ``"-<plugin>"``. The remover may then set the entry itself (remove + add in
  one reply is how a plugin deliberately overrides an earlier one); anyone
  else who sets it afterwards conflicts with the remover.
* Hooks accumulate; their owner record lists every contributor, comma-separated.
* Args whose first element is ``""`` take over the args of an earlier plugin.
* For creation, each plugin sees the container as changed by the plugins
  before it (:attr:`CreateMerger.container`).

Decisions where this module knowingly differs from upstream's ``result.go``
(each is noted at the code that implements it as well):

* A removal always records ``"-<plugin>"`` as owner, drops the key from the
  working container and keeps a removal marker in the merged adjustment, for
  every removable field. Upstream only does parts of that, depending on the
  field (a lone annotation/sysctl/net-device removal records no owner and
  leaves the working container alone; env and device removals of entries no
  plugin added are dropped from the merged adjustment; namespace removals are
  claimed like ordinary sets).
* Entries keyed by something (hugepage limits, rlimits, namespaces, ...)
  replace an existing entry with the same key in the working container instead
  of being appended next to it, and the merged adjustment keeps one entry per
  key. Upstream appends (and rebuilds namespaces in map order).
* The working container's ``linux.rdt`` follows RDT adjustments; upstream
  leaves it alone. An empty ``linux.rdt`` is not invented for replies that do
  not touch RDT.
* An update whose failure is ignored (``ignore_failure``) leaves no ownership
  claims behind; upstream keeps the claims made before the failure. An
  update's pids limit is taken from the update (upstream reads it from the
  merged copy instead).
* Evictions are collected (one per container, first reason wins); upstream
  only counts them. Evicting the container being created is rejected.

Upstream behaviour kept on purpose, though it may surprise:

* Claiming something a plugin already owns conflicts even when it is the same
  plugin (e.g. one reply adding two mounts at the same destination); only the
  ``"-<plugin>"`` removal record lets a plugin claim again.
* The conflict message of a plain field ends in a space (``... tried to set
  Args ``): upstream always joins the field name and its (empty) key with one.
* A map entry removed and set again in one reply keeps both the removal marker
  and the new value in the merged adjustment; appliers handle removals first.
* CDI device references are claimed per name but not added to the working
  container; the memory policy is not reflected there either (no such field).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer
from google.protobuf.message import Message

from pycrid.errors import InvalidArgument
from pycrid.nri import api
from pycrid.nri.adaptation.owners import AdjustmentConflict, OwnerTable, go_quote

__all__ = [
    "AdjustmentConflict",
    "CreateMerger",
    "CreateResult",
    "OwnerTable",
    "UpdateMerger",
]

_M = TypeVar("_M", bound=Message)

_F = api.Field

_MEMORY_FIELDS: tuple[tuple[str, int], ...] = (
    ("limit", _F.MemLimit),
    ("reservation", _F.MemReservation),
    ("swap", _F.MemSwapLimit),
    ("kernel", _F.MemKernelLimit),
    ("kernel_tcp", _F.MemTCPLimit),
    ("swappiness", _F.MemSwappiness),
    ("disable_oom_killer", _F.MemDisableOomKiller),
    ("use_hierarchy", _F.MemUseHierarchy),
)
_CPU_FIELDS: tuple[tuple[str, int], ...] = (
    ("shares", _F.CPUShares),
    ("quota", _F.CPUQuota),
    ("period", _F.CPUPeriod),
    ("realtime_runtime", _F.CPURealtimeRuntime),
    ("realtime_period", _F.CPURealtimePeriod),
)
_CPUSET_FIELDS: tuple[tuple[str, int], ...] = (
    ("cpus", _F.CPUSetCPUs),
    ("mems", _F.CPUSetMems),
)
_RDT_FIELDS: tuple[tuple[str, int], ...] = (
    ("clos_id", _F.RdtClosID),
    ("schemata", _F.RdtSchemata),
    ("enable_monitoring", _F.RdtEnableMonitoring),
)
_HOOK_KINDS = (
    "prestart",
    "create_runtime",
    "create_container",
    "start_container",
    "poststart",
    "poststop",
)


def _clone(message: _M) -> _M:
    copy = type(message)()
    copy.CopyFrom(message)
    return copy


# ---------------------------------------------------------------- shared pieces


def _unmarked(key: str) -> str:
    return api.clear_removal_marker(key) if api.is_marked_for_removal(key) else key


def _drop_keys(
    entries: RepeatedCompositeFieldContainer[_M], key_of: Callable[[_M], str], keys: set[str]
) -> None:
    """Remove the entries (values or removal markers) whose key is in ``keys``."""
    if not keys:
        return
    kept = [_clone(e) for e in entries if _unmarked(key_of(e)) not in keys]
    del entries[:]
    entries.extend(kept)


def _put_keyed(
    entries: RepeatedCompositeFieldContainer[_M], key_of: Callable[[_M], str], entry: _M
) -> None:
    """Add ``entry``, replacing any entry with the same key."""
    _drop_keys(entries, key_of, {key_of(entry)})
    entries.append(entry)


def _page_size(limit: api.HugepageLimit) -> str:
    return limit.page_size


def _merge_resources(
    owners: OwnerTable,
    container_id: str,
    plugin: str,
    change: api.LinuxResources,
    targets: Sequence[api.LinuxResources],
    *,
    device_rules: bool,
) -> None:
    """Claim and copy every resource ``change`` sets into each of ``targets``.

    Memory and CPU settings are owned one by one; hugepage limits per page
    size and unified entries per key. Device cgroup rules (creation only, as
    upstream) are appended and owned by nobody.
    """
    if change.HasField("memory"):
        for name, field in _MEMORY_FIELDS:
            if change.memory.HasField(name):
                owners.claim(container_id, field, plugin)
                for t in targets:
                    getattr(t.memory, name).CopyFrom(getattr(change.memory, name))
    if change.HasField("cpu"):
        for name, field in _CPU_FIELDS:
            if change.cpu.HasField(name):
                owners.claim(container_id, field, plugin)
                for t in targets:
                    getattr(t.cpu, name).CopyFrom(getattr(change.cpu, name))
        for name, field in _CPUSET_FIELDS:
            if value := getattr(change.cpu, name):
                owners.claim(container_id, field, plugin)
                for t in targets:
                    setattr(t.cpu, name, value)
    for limit in change.hugepage_limits:
        owners.claim(container_id, _F.HugepageLimits, plugin, limit.page_size)
        for t in targets:
            _put_keyed(t.hugepage_limits, _page_size, _clone(limit))
    for key in sorted(change.unified):
        owners.claim(container_id, _F.CgroupsUnified, plugin, key)
        for t in targets:
            t.unified[key] = change.unified[key]
    for name, field in (("blockio_class", _F.BlockioClass), ("rdt_class", _F.RdtClass)):
        if change.HasField(name):
            owners.claim(container_id, field, plugin)
            for t in targets:
                getattr(t, name).CopyFrom(getattr(change, name))
    if change.HasField("pids"):
        owners.claim(container_id, _F.PidsLimit, plugin)
        for t in targets:
            t.pids.CopyFrom(change.pids)
    if device_rules:
        for t in targets:
            t.devices.extend(change.devices)


def _merge_evictions(
    collected: list[api.ContainerEviction],
    plugin: str,
    evictions: Iterable[api.ContainerEviction],
    created_id: str | None,
) -> None:
    seen = {e.container_id for e in collected}
    for eviction in evictions:
        if created_id is not None and eviction.container_id == created_id:
            raise InvalidArgument(
                f"plugin {go_quote(plugin)} asked eviction of "
                f"{go_quote(created_id)} during creation"
            )
        if eviction.container_id not in seen:
            seen.add(eviction.container_id)
            collected.append(_clone(eviction))


class _Updates:
    """Updates of existing containers, merged per container ID."""

    def __init__(
        self,
        owners: OwnerTable,
        *,
        created_id: str | None = None,
        target_id: str | None = None,
        requested: api.LinuxResources | None = None,
    ) -> None:
        self._owners = owners
        self._created_id = created_id
        self._target_id = target_id
        self._requested = requested
        self._by_id: dict[str, api.ContainerUpdate] = {}

    def _entry(self, plugin: str, update: api.ContainerUpdate) -> api.ContainerUpdate:
        cid = update.container_id
        if self._created_id is not None and cid == self._created_id:
            # upstream's wording for the same mistake
            raise InvalidArgument(
                f"plugin {go_quote(plugin)} asked update of {go_quote(cid)} during creation"
            )
        merged = self._by_id.get(cid)
        if merged is None:
            merged = api.ContainerUpdate(container_id=cid, ignore_failure=update.ignore_failure)
            merged.linux.resources.SetInParent()
            if cid == self._target_id and self._requested is not None:
                merged.linux.resources.CopyFrom(self._requested)
            self._by_id[cid] = merged
        else:
            merged.ignore_failure = merged.ignore_failure and update.ignore_failure
        return merged

    def apply(self, plugin: str, updates: Iterable[api.ContainerUpdate]) -> None:
        for update in updates:
            merged = self._entry(plugin, update)
            if not (update.HasField("linux") and update.linux.HasField("resources")):
                continue
            cid = update.container_id
            saved = self._owners.snapshot(cid)
            work = _clone(merged.linux.resources)
            try:
                _merge_resources(
                    self._owners, cid, plugin, update.linux.resources, [work], device_rules=False
                )
            except AdjustmentConflict:
                # all or nothing per update: drop its claims along with its changes
                self._owners.restore(cid, saved)
                if update.ignore_failure:
                    continue
                raise
            merged.linux.resources.CopyFrom(work)

    def result(self) -> list[api.ContainerUpdate]:
        others = [_clone(u) for cid, u in self._by_id.items() if cid != self._target_id]
        target = self._by_id.get(self._target_id) if self._target_id is not None else None
        return others if target is None else [*others, _clone(target)]


# ---------------------------------------------------------------- creation


@dataclass
class CreateResult:
    """The merged outcome of CreateContainer."""

    adjust: api.ContainerAdjustment
    """What to apply to the OCI spec; removals appear as ``-key`` markers."""
    updates: list[api.ContainerUpdate]
    """Merged updates of other containers, in the order first asked for."""
    evictions: list[api.ContainerEviction]
    owners: api.OwningPlugins
    """For ``ValidateContainerAdjustmentRequest.owners``."""


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


class CreateMerger:
    """Folds the CreateContainer replies of all plugins into one result.

    Call :meth:`apply` once per plugin in invocation order, handing the next
    plugin :attr:`container`; then :meth:`result`. After an error the merger
    is in an undefined state: the creation is to be failed.
    """

    def __init__(self, pod: api.PodSandbox, container: api.Container) -> None:
        self.pod = _clone(pod)
        self.pristine = _clone(container)
        """The container as the runtime first described it."""
        self.container = _clone(container)
        """The container with every adjustment so far applied."""
        self._id = container.id
        self._adjust = api.ContainerAdjustment()
        self._owners = OwnerTable()
        self._updates = _Updates(self._owners, created_id=container.id)
        self._evictions: list[api.ContainerEviction] = []

    @property
    def owners(self) -> OwnerTable:
        return self._owners

    def apply(self, plugin: str, reply: api.CreateContainerResponse) -> None:
        """Merge one plugin's reply; ``plugin`` is its full ``NN-name``."""
        if reply.HasField("adjust"):
            self._apply_adjustment(plugin, reply.adjust)
        self._updates.apply(plugin, reply.update)
        _merge_evictions(self._evictions, plugin, reply.evict, self._id)

    def result(self) -> CreateResult:
        return CreateResult(
            adjust=_clone(self._adjust),
            updates=self._updates.result(),
            evictions=[_clone(e) for e in self._evictions],
            owners=_clone(self._owners.message),
        )

    # ------------------------------------------------------------ per field

    def _apply_adjustment(self, plugin: str, adj: api.ContainerAdjustment) -> None:
        # the order of upstream's result.adjust, which decides which conflict
        # is reported when a reply has several
        self._annotations(plugin, adj)
        self._mounts(plugin, adj)
        self._env(plugin, adj)
        self._args(plugin, adj)
        self._hooks(plugin, adj)
        if adj.HasField("linux"):
            self._linux(plugin, adj.linux)
        self._rlimits(plugin, adj)
        self._cdi_devices(plugin, adj)

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

    def _annotations(self, plugin: str, adj: api.ContainerAdjustment) -> None:
        self._string_map(plugin, _F.Annotations, adj.annotations, self._adjust.annotations,
                         self.container.annotations)

    def _sysctl(self, plugin: str, lin: api.LinuxContainerAdjustment) -> None:
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

    def _net_devices(self, plugin: str, lin: api.LinuxContainerAdjustment) -> None:
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
            _drop_keys(merged, key_of, {key})
            if key not in readded:
                merged.append(marker(key))
        drop_working(set(removed) | readded)
        for entry in added:
            self._owners.claim(self._id, field, plugin, key_of(entry))
            _put_keyed(merged, key_of, _clone(entry))
            add_working(entry)

    def _mounts(self, plugin: str, adj: api.ContainerAdjustment) -> None:
        working = self.container.mounts
        self._keyed_list(
            plugin,
            _F.Mounts,
            adj.mounts,
            _mount_key,
            self._adjust.mounts,
            marker=lambda key: api.Mount(destination=api.mark_for_removal(key)),
            drop_working=lambda keys: _drop_keys(working, _mount_key, keys),
            add_working=working.append,
        )

    def _env(self, plugin: str, adj: api.ContainerAdjustment) -> None:
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

    def _devices(self, plugin: str, lin: api.LinuxContainerAdjustment) -> None:
        working = self.container.linux.devices
        self._keyed_list(
            plugin,
            _F.Devices,
            lin.devices,
            _device_key,
            self._adjust.linux.devices,
            marker=lambda key: api.LinuxDevice(path=api.mark_for_removal(key)),
            drop_working=lambda keys: _drop_keys(working, _device_key, keys),
            add_working=working.append,
        )

    def _namespaces(self, plugin: str, lin: api.LinuxContainerAdjustment) -> None:
        working = self.container.linux.namespaces
        self._keyed_list(
            plugin,
            _F.Namespace,
            lin.namespaces,
            _namespace_key,
            self._adjust.linux.namespaces,
            marker=lambda key: api.LinuxNamespace(type=api.mark_for_removal(key)),
            drop_working=lambda keys: _drop_keys(working, _namespace_key, keys),
            add_working=working.append,
        )

    def _args(self, plugin: str, adj: api.ContainerAdjustment) -> None:
        args = list(adj.args)
        if not args:
            return
        if args[0] == "":
            # upstream's UpdateArgs: take the args over from whoever set them
            self._owners.clear(self._id, _F.Args, plugin)
            args = args[1:]
        self._owners.claim(self._id, _F.Args, plugin)
        for target in (self._adjust.args, self.container.args):
            del target[:]
            target.extend(args)

    def _hooks(self, plugin: str, adj: api.ContainerAdjustment) -> None:
        if not adj.HasField("hooks"):
            return
        contributed = False
        for kind in _HOOK_KINDS:
            hooks = getattr(adj.hooks, kind)
            if hooks:
                getattr(self._adjust.hooks, kind).extend(hooks)
                getattr(self.container.hooks, kind).extend(hooks)
                contributed = True
        if contributed:
            self._owners.accumulate(self._id, _F.OciHooks, plugin)

    def _linux(self, plugin: str, lin: api.LinuxContainerAdjustment) -> None:
        self._devices(plugin, lin)
        if lin.HasField("resources"):
            _merge_resources(
                self._owners,
                self._id,
                plugin,
                lin.resources,
                [self._adjust.linux.resources, self.container.linux.resources],
                device_rules=True,
            )
        if lin.cgroups_path:
            self._owners.claim(self._id, _F.CgroupsPath, plugin)
            self._adjust.linux.cgroups_path = lin.cgroups_path
            self.container.linux.cgroups_path = lin.cgroups_path
        for name, field in (
            ("oom_score_adj", _F.OomScoreAdj),
            ("io_priority", _F.IoPriority),
            ("seccomp_policy", _F.SeccompPolicy),
        ):
            if lin.HasField(name):
                self._owners.claim(self._id, field, plugin)
                getattr(self._adjust.linux, name).CopyFrom(getattr(lin, name))
                getattr(self.container.linux, name).CopyFrom(getattr(lin, name))
        self._namespaces(plugin, lin)
        self._sysctl(plugin, lin)
        self._net_devices(plugin, lin)
        if lin.HasField("scheduler"):
            self._owners.claim(self._id, _F.LinuxSched, plugin)
            self._adjust.linux.scheduler.CopyFrom(lin.scheduler)
            self.container.linux.scheduler.CopyFrom(lin.scheduler)
        if lin.HasField("rdt"):
            self._rdt(plugin, lin.rdt)
        if lin.HasField("memory_policy"):
            self._owners.claim(self._id, _F.MemoryPolicy, plugin)
            self._adjust.linux.memory_policy.CopyFrom(lin.memory_policy)

    def _rdt(self, plugin: str, rdt: api.LinuxRdt) -> None:
        """``remove`` hands all three RDT settings to ``-plugin`` and discards
        what earlier plugins set; fields set alongside cancel the removal."""
        merged = self._adjust.linux.rdt
        if rdt.remove:
            for _, field in _RDT_FIELDS:
                self._owners.clear(self._id, field, plugin)
            merged.CopyFrom(api.LinuxRdt(remove=True))
            self.container.linux.ClearField("rdt")
        for name, field in _RDT_FIELDS:
            if rdt.HasField(name):
                self._owners.claim(self._id, field, plugin)
                getattr(merged, name).CopyFrom(getattr(rdt, name))
                merged.remove = False
                getattr(self.container.linux.rdt, name).CopyFrom(getattr(rdt, name))

    def _rlimits(self, plugin: str, adj: api.ContainerAdjustment) -> None:
        for rlimit in adj.rlimits:
            self._owners.claim(self._id, _F.Rlimits, plugin, rlimit.type)
            _put_keyed(self._adjust.rlimits, _rlimit_key, _clone(rlimit))
            _put_keyed(self.container.rlimits, _rlimit_key, _clone(rlimit))

    def _cdi_devices(self, plugin: str, adj: api.ContainerAdjustment) -> None:
        # add-only references resolved later by the runtime; like upstream they
        # are not copied into the working container
        for device in adj.CDI_devices:
            self._owners.claim(self._id, _F.CdiDevices, plugin, device.name)
            self._adjust.CDI_devices.append(device)


# ---------------------------------------------------------------- update / stop


class UpdateMerger:
    """Folds the UpdateContainer or StopContainer replies of all plugins.

    ``target_id`` is the container whose update the runtime asked about (None
    for StopContainer): its merged update comes last in :meth:`result`, as
    upstream returns it, so the runtime can take it as the new resources.
    With ``requested`` (the resources the CRI asked for) the target's merged
    update starts from those, as upstream's does. The target's update appears
    only when some plugin updated it.
    """

    def __init__(
        self, target_id: str | None = None, *, requested: api.LinuxResources | None = None
    ) -> None:
        self._owners = OwnerTable()
        self._updates = _Updates(self._owners, target_id=target_id, requested=requested)
        self._evictions: list[api.ContainerEviction] = []

    @property
    def owners(self) -> OwnerTable:
        return self._owners

    def apply(
        self,
        plugin: str,
        updates: Sequence[api.ContainerUpdate],
        evictions: Sequence[api.ContainerEviction] = (),
    ) -> None:
        """Merge one plugin's updates; a conflicting update whose
        ``ignore_failure`` is set is dropped instead of raising."""
        self._updates.apply(plugin, updates)
        _merge_evictions(self._evictions, plugin, evictions, None)

    def result(self) -> tuple[list[api.ContainerUpdate], list[api.ContainerEviction]]:
        """``ignore_failure`` of a merged update is the AND of its parts'."""
        return self._updates.result(), [_clone(e) for e in self._evictions]
