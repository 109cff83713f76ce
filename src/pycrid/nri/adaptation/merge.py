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

from dataclasses import dataclass

from pycrid.nri import api
from pycrid.nri.adaptation.keyed_entries import clone
from pycrid.nri.adaptation.merge_keyed import KeyedFieldMerger
from pycrid.nri.adaptation.merge_resources import merge_resources
from pycrid.nri.adaptation.merge_updates import ContainerUpdates, UpdateMerger, merge_evictions
from pycrid.nri.adaptation.owners import AdjustmentConflict, OwnerTable

__all__ = [
    "AdjustmentConflict",
    "CreateMerger",
    "CreateResult",
    "OwnerTable",
    "UpdateMerger",
]

_F = api.Field

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


class CreateMerger:
    """Folds the CreateContainer replies of all plugins into one result.

    Call :meth:`apply` once per plugin in invocation order, handing the next
    plugin :attr:`container`; then :meth:`result`. After an error the merger
    is in an undefined state: the creation is to be failed.
    """

    def __init__(self, pod: api.PodSandbox, container: api.Container) -> None:
        self.pod = clone(pod)
        self.pristine = clone(container)
        """The container as the runtime first described it."""
        self.container = clone(container)
        """The container with every adjustment so far applied."""
        self._id = container.id
        self._adjust = api.ContainerAdjustment()
        self._owners = OwnerTable()
        self._updates = ContainerUpdates(self._owners, created_id=container.id)
        self._evictions: list[api.ContainerEviction] = []
        self._keyed = KeyedFieldMerger(self._id, self._owners, self._adjust, self.container)

    @property
    def owners(self) -> OwnerTable:
        return self._owners

    def apply(self, plugin: str, reply: api.CreateContainerResponse) -> None:
        """Merge one plugin's reply; ``plugin`` is its full ``NN-name``."""
        if reply.HasField("adjust"):
            self._apply_adjustment(plugin, reply.adjust)
        self._updates.apply(plugin, reply.update)
        merge_evictions(self._evictions, plugin, reply.evict, self._id)

    def result(self) -> CreateResult:
        return CreateResult(
            adjust=clone(self._adjust),
            updates=self._updates.result(),
            evictions=[clone(e) for e in self._evictions],
            owners=clone(self._owners.message),
        )

    # ------------------------------------------------------------ per field

    def _apply_adjustment(self, plugin: str, adj: api.ContainerAdjustment) -> None:
        # the order of upstream's result.adjust, which decides which conflict
        # is reported when a reply has several
        self._keyed.annotations(plugin, adj)
        self._keyed.mounts(plugin, adj)
        self._keyed.env(plugin, adj)
        self._args(plugin, adj)
        self._hooks(plugin, adj)
        if adj.HasField("linux"):
            self._linux(plugin, adj.linux)
        self._keyed.rlimits(plugin, adj)
        self._keyed.cdi_devices(plugin, adj)

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
        self._keyed.devices(plugin, lin)
        if lin.HasField("resources"):
            merge_resources(
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
        self._keyed.namespaces(plugin, lin)
        self._keyed.sysctl(plugin, lin)
        self._keyed.net_devices(plugin, lin)
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

