"""Builders for what a plugin hands back: container adjustments and updates.

They fill the protobuf messages the way containerd/nri's Go helpers do, so a
Python plugin produces the same bytes as a Go plugin making the same change:
removals are requests for the key prefixed with ``-`` (the upstream removal
marker), optional scalars go into their wrapper messages, hooks and rlimits
accumulate. ``.message`` is the finished protobuf.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Self

from pycrid.nri import api


class _Resources:
    """Setters shared by adjustments and updates: both messages carry their
    resources at ``linux.resources``."""

    message: api.ContainerAdjustment | api.ContainerUpdate

    def _resources(self) -> api.LinuxResources:
        return self.message.linux.resources

    def set_memory_limit(self, value: int) -> Self:
        self._resources().memory.limit.value = value
        return self

    def set_memory_reservation(self, value: int) -> Self:
        self._resources().memory.reservation.value = value
        return self

    def set_memory_swap(self, value: int) -> Self:
        self._resources().memory.swap.value = value
        return self

    def set_memory_swappiness(self, value: int) -> Self:
        self._resources().memory.swappiness.value = value
        return self

    def set_memory_disable_oom_killer(self) -> Self:
        self._resources().memory.disable_oom_killer.value = True
        return self

    def set_cpu_shares(self, value: int) -> Self:
        self._resources().cpu.shares.value = value
        return self

    def set_cpu_quota(self, value: int) -> Self:
        self._resources().cpu.quota.value = value
        return self

    def set_cpu_period(self, value: int) -> Self:
        self._resources().cpu.period.value = value
        return self

    def set_cpu_realtime_runtime(self, value: int) -> Self:
        self._resources().cpu.realtime_runtime.value = value
        return self

    def set_cpu_realtime_period(self, value: int) -> Self:
        self._resources().cpu.realtime_period.value = value
        return self

    def set_cpuset_cpus(self, value: str) -> Self:
        self._resources().cpu.cpus = value
        return self

    def set_cpuset_mems(self, value: str) -> Self:
        self._resources().cpu.mems = value
        return self

    def set_pids_limit(self, value: int) -> Self:
        self._resources().pids.limit = value
        return self

    def add_hugepage_limit(self, page_size: str, limit: int) -> Self:
        self._resources().hugepage_limits.add(page_size=page_size, limit=limit)
        return self

    def set_blockio_class(self, value: str) -> Self:
        self._resources().blockio_class.value = value
        return self

    def set_rdt_class(self, value: str) -> Self:
        self._resources().rdt_class.value = value
        return self

    def add_unified(self, key: str, value: str) -> Self:
        self._resources().unified[key] = value
        return self


class Adjustment(_Resources):
    """Changes to a container being created (the CreateContainer answer)."""

    def __init__(self) -> None:
        self.message: api.ContainerAdjustment = api.ContainerAdjustment()

    # annotations, env, args
    def add_annotation(self, key: str, value: str) -> Self:
        self.message.annotations[key] = value
        return self

    def remove_annotation(self, key: str) -> Self:
        self.message.annotations[api.mark_for_removal(key)] = ""
        return self

    def add_env(self, key: str, value: str) -> Self:
        self.message.env.add(key=key, value=value)
        return self

    def remove_env(self, key: str) -> Self:
        self.message.env.add(key=api.mark_for_removal(key))
        return self

    def set_args(self, args: Sequence[str]) -> Self:
        """Replace the process arguments (conflicts with another plugin that sets them)."""
        del self.message.args[:]
        self.message.args.extend(args)
        return self

    def update_args(self, args: Sequence[str]) -> Self:
        """Replace the arguments even if an earlier plugin set them (leading ``""``)."""
        del self.message.args[:]
        self.message.args.extend(["", *args])
        return self

    # mounts, devices, CDI
    def add_mount(
        self,
        destination: str,
        source: str = "",
        type: str = "",
        options: Iterable[str] = (),
    ) -> Self:
        self.message.mounts.add(
            destination=destination, source=source, type=type, options=list(options)
        )
        return self

    def remove_mount(self, destination: str) -> Self:
        self.message.mounts.add(destination=api.mark_for_removal(destination))
        return self

    def add_device(self, device: api.LinuxDevice) -> Self:
        self.message.linux.devices.append(device)
        return self

    def remove_device(self, path: str) -> Self:
        self.message.linux.devices.add(path=api.mark_for_removal(path))
        return self

    def add_cdi_device(self, name: str) -> Self:
        self.message.CDI_devices.add(name=name)
        return self

    # hooks, rlimits
    def add_hooks(self, hooks: api.Hooks) -> Self:
        """Append OCI hooks; hooks from several plugins accumulate."""
        mine = self.message.hooks
        mine.SetInParent()
        for name in ("prestart", "create_runtime", "create_container", "start_container",
                     "poststart", "poststop"):
            getattr(mine, name).extend(getattr(hooks, name))
        return self

    def add_rlimit(self, type: str, hard: int, soft: int) -> Self:
        self.message.rlimits.add(type=type, hard=hard, soft=soft)
        return self

    # linux
    def set_cgroups_path(self, value: str) -> Self:
        self.message.linux.cgroups_path = value
        return self

    def set_oom_score_adj(self, value: int | None) -> Self:
        if value is None:
            self.message.linux.ClearField("oom_score_adj")
        else:
            self.message.linux.oom_score_adj.value = value
        return self

    def set_io_priority(self, klass: int, priority: int) -> Self:
        self.message.linux.io_priority.CopyFrom(
            api.LinuxIOPriority(**{"class": klass, "priority": priority})
        )
        return self

    def set_seccomp_policy(self, policy: api.LinuxSeccomp) -> Self:
        self.message.linux.seccomp_policy.CopyFrom(policy)
        return self

    def add_or_replace_namespace(self, type: str, path: str = "") -> Self:
        self.message.linux.namespaces.add(type=type, path=path)
        return self

    def remove_namespace(self, type: str) -> Self:
        self.message.linux.namespaces.add(type=api.mark_for_removal(type))
        return self

    def set_sysctl(self, key: str, value: str) -> Self:
        self.message.linux.sysctl[key] = value
        return self

    def remove_sysctl(self, key: str) -> Self:
        self.message.linux.sysctl[api.mark_for_removal(key)] = ""
        return self

    def add_net_device(self, host_if: str, name: str) -> Self:
        self.message.linux.net_devices[host_if].name = name
        return self

    def remove_net_device(self, host_if: str) -> Self:
        self.message.linux.net_devices[api.mark_for_removal(host_if)].SetInParent()
        return self

    def set_scheduler(self, scheduler: api.LinuxScheduler) -> Self:
        self.message.linux.scheduler.CopyFrom(scheduler)
        return self

    def set_memory_policy(
        self, mode: api.MpolMode, nodes: str, flags: Iterable[api.MpolFlag] = ()
    ) -> Self:
        self.message.linux.memory_policy.CopyFrom(
            api.LinuxMemoryPolicy(mode=mode, nodes=nodes, flags=list(flags))
        )
        return self

    def set_rdt_clos_id(self, value: str) -> Self:
        self.message.linux.rdt.clos_id.value = value
        return self

    def set_rdt_schemata(self, value: Iterable[str]) -> Self:
        self.message.linux.rdt.schemata.value[:] = list(value)
        return self

    def remove_rdt(self) -> Self:
        self.message.linux.rdt.remove = True
        return self


class Update(_Resources):
    """A resource change for an existing container (ContainerUpdate)."""

    def __init__(self, container_id: str, *, ignore_failure: bool = False) -> None:
        self.message: api.ContainerUpdate = api.ContainerUpdate(
            container_id=container_id, ignore_failure=ignore_failure
        )

    def set_ignore_failure(self, value: bool = True) -> Self:
        self.message.ignore_failure = value
        return self
