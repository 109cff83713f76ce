"""Apply a merged NRI ``ContainerAdjustment`` to an OCI spec dict (config.json shape).

The effect of each field follows containerd/nri's runtime-tools generator
(NRI-PROTOCOL.md §c), with one rule on top: a field is either applied or
refused with an error naming the NRI field. runc 1.1 ignores spec fields it
does not know, so fields that need a newer runc are refused by version
(``MIN_RUNC_FOR``), and settings the host cannot honour are refused through
``HostSupport``. The spec is changed all-or-nothing: the work happens on a
copy that replaces the caller's dict contents only when every field passed.

Deliberate differences from upstream's generator:

* rlimits: replaced per type (one entry per type) instead of appended.
* memory: besides ``limit`` (which also sets ``swap`` to the limit, as upstream
  does unless the adjustment sets ``swap`` itself), ``reservation``, ``swap``,
  ``swappiness`` and ``disable_oom_killer`` are applied; upstream drops them.
  ``kernel``, ``kernel_tcp`` and ``use_hierarchy`` are refused: runc ignores them.
* seccomp: ``default_errno`` becomes ``defaultErrnoRet`` (upstream drops it).
* env entries without ``=`` already in the spec are kept (upstream drops them).
* mounts: destinations are compared after path cleaning.

The facts about the host come in as a ``HostSupport`` (oci/nri_host_support.py), probed
by the caller: nothing here reads the host.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, Protocol

from pycrid.nri import api
from pycrid.oci.defaults import Spec
from pycrid.oci.nri_apply_linux import (
    adjust_devices,
    adjust_mounts,
    adjust_namespaces,
    adjust_net_devices,
    adjust_seccomp,
    adjust_sysctl,
)
from pycrid.oci.nri_apply_process import (
    adjust_annotations,
    adjust_args,
    adjust_env,
    adjust_hooks,
    adjust_io_priority,
    adjust_rlimits,
    adjust_scheduler,
)
from pycrid.oci.nri_apply_resources import adjust_rdt, adjust_resources
from pycrid.oci.nri_host_support import HostSupport, bad, cannot, need_runc


class CdiInjector(Protocol):
    def inject(self, spec: dict[str, Any], devices: Sequence[str]) -> None:
        """Resolve fully qualified CDI names into ``spec``; InvalidArgument if unresolvable."""


def apply_adjustment(spec: dict[str, Any], adjust: api.ContainerAdjustment, host: HostSupport,
                     cdi: CdiInjector | None = None) -> None:
    """Apply ``adjust`` to ``spec`` in place, all or nothing.

    Raises InvalidArgument for bad values and FailedPrecondition for what the
    host or its runc cannot honour; each message names the NRI field.
    """
    work = copy.deepcopy(spec)
    linux = adjust.linux
    adjust_annotations(work, adjust.annotations)
    adjust_env(work, adjust.env)
    adjust_args(work, adjust.args)
    if adjust.HasField("hooks"):
        adjust_hooks(work, adjust.hooks)
    if adjust.CDI_devices:
        if cdi is None:
            raise cannot("CDI_devices", "this runtime has no CDI support configured")
        cdi.inject(work, [d.name for d in adjust.CDI_devices])
    adjust_devices(work, linux.devices)
    if linux.cgroups_path:
        work.setdefault("linux", {})["cgroupsPath"] = linux.cgroups_path
    if linux.HasField("oom_score_adj"):
        value = linux.oom_score_adj.value
        if not -1000 <= value <= 1000:
            raise bad("linux.oom_score_adj", f"{value} is outside -1000..1000")
        work.setdefault("process", {})["oomScoreAdj"] = max(value, host.min_oom_score_adj)
    if linux.HasField("io_priority"):
        adjust_io_priority(work, linux.io_priority, host)
    if linux.HasField("scheduler"):
        adjust_scheduler(work, linux.scheduler, host)
    if linux.HasField("seccomp_policy"):
        adjust_seccomp(work, linux.seccomp_policy, host)
    adjust_namespaces(work, linux.namespaces, host)
    adjust_sysctl(work, linux.sysctl)
    adjust_net_devices(work, linux.net_devices, host)
    if linux.HasField("memory_policy"):
        need_runc(host, "linux.memory_policy")
        mp = linux.memory_policy
        policy: Spec = {"mode": api.MpolMode.Name(mp.mode), "nodes": mp.nodes}
        if mp.flags:
            policy["flags"] = [api.MpolFlag.Name(f) for f in mp.flags]
        work.setdefault("linux", {})["memoryPolicy"] = policy
    if linux.HasField("resources"):
        adjust_resources(work, linux.resources, host)
    if linux.HasField("rdt"):
        adjust_rdt(work, linux.rdt, host)
    adjust_mounts(work, adjust.mounts, host)
    adjust_rlimits(work, adjust.rlimits, host)
    spec.clear()
    spec.update(work)
