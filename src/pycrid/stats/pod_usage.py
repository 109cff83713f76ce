"""A pod's usage as the sum of its members' (the pause container and its containers).

Why a sum rather than reading the pod's ``cgroup_parent``: pods started without a
cgroup_parent (critest, crictl) put every container in its own ``/k8s.io/<id>``
cgroup, so there is no pod cgroup to read; and a cgroup_parent the kubelet passes
may hold more than the pod (a QoS-level parent). Summing the samples the loop
already has works the same everywhere and costs no extra reads. The price: the
cumulative CPU of a removed container leaves the pod's total (a rate computed from
it could dip), so the pod's rate is the sum of the members' own rates instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from pycrid.stats.cgroup_stats import CgroupStats


def _sum(values: Sequence[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def sum_cgroups(members: Sequence[CgroupStats]) -> CgroupStats | None:
    """Field-wise sum of what adds up; a field none of the members reports stays unset.
    Limits, settings and pressure do not add up, so the pod's are left unset."""
    if not members:
        return None
    return CgroupStats(
        cpu_ns=_sum([m.cpu_ns for m in members]),
        cpu_user_ns=_sum([m.cpu_user_ns for m in members]),
        cpu_system_ns=_sum([m.cpu_system_ns for m in members]),
        memory_usage=_sum([m.memory_usage for m in members]),
        inactive_file=sum(m.inactive_file for m in members),
        active_file=sum(m.active_file for m in members),
        rss=sum(m.rss for m in members),
        cache=sum(m.cache for m in members),
        mapped_file=sum(m.mapped_file for m in members),
        pgfault=sum(m.pgfault for m in members),
        pgmajfault=sum(m.pgmajfault for m in members),
        swap=_sum([m.swap for m in members]),
        processes=_sum([m.processes for m in members]),
        threads=_sum([m.threads for m in members]),
    )


def sum_rates(rates: Sequence[int | None]) -> int | None:
    """The pod's CPU rate: the members' rates added (unset if none is known yet)."""
    return _sum(rates)


__all__ = ["sum_cgroups", "sum_rates"]
