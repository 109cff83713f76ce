"""Where cgroups live: the host's cgroup mounts (v1 controllers or the unified v2
mount), and the directory runc makes for an OCI ``linux.cgroupsPath``.

Found once from ``/proc/self/mountinfo``; ``Hierarchy.read`` then turns a container's
cgroupsPath into one reading of the right version.
"""

from __future__ import annotations

import logging
import os
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass, field

from pycrid.host.mountinfo import MountEntry
from pycrid.stats.cgfiles import read_keyed
from pycrid.stats.cgroup_readers import read_v1, read_v2
from pycrid.stats.cgroup_stats import CgroupStats

log = logging.getLogger(__name__)

#: The v1 controllers the readers use.
V1_CONTROLLERS = ("cpu", "cpuacct", "memory", "pids", "blkio")


def _expand_slice(slice_: str) -> str:
    """systemd's slice nesting: ``a-b-c.slice`` lives at ``a.slice/a-b.slice/a-b-c.slice``."""
    if slice_ in ("", "-.slice"):
        return ""
    if not slice_.endswith(".slice") or "/" in slice_:
        raise ValueError(f"invalid slice name {slice_!r}")
    stem = slice_[: -len(".slice")]
    parts, prefix = [], ""
    for word in stem.split("-"):
        if not word:
            raise ValueError(f"invalid slice name {slice_!r}")
        prefix = f"{prefix}-{word}" if prefix else word
        parts.append(prefix + ".slice")
    return "/".join(parts)


def relative_cgroup(cgroups_path: str) -> str | None:
    """The cgroup directory (relative to a hierarchy's root) that runc makes for an OCI
    ``linux.cgroupsPath``: cgroupfs form (``/k8s.io/<id>``) or systemd form
    (``slice:prefix:name``, which runc turns into ``<slices>/<prefix>-<name>.scope``).
    None when the path cannot be understood (logged)."""
    if not cgroups_path:
        return None
    if ":" in cgroups_path:
        parts = cgroups_path.split(":")
        if len(parts) != 3:
            log.warning("cgroupsPath %r is neither cgroupfs nor slice:prefix:name; no stats",
                        cgroups_path)
            return None
        slice_, prefix, name = parts
        try:
            parent = _expand_slice(slice_ or "system.slice")
        except ValueError:
            log.warning("cgroupsPath %r: unsupported systemd slice; no stats", cgroups_path)
            return None
        unit = name if name.endswith(".slice") else (
            f"{prefix}-{name}.scope" if prefix else f"{name}.scope")
        return posixpath.join(parent, unit) if parent else unit
    return posixpath.normpath("/" + cgroups_path).lstrip("/")


@dataclass(frozen=True)
class Hierarchy:
    """Where the host mounts its cgroups: the v1 controllers' mount points, or the
    unified (v2) mount when no v1 controller we need is mounted."""

    v1: dict[str, str] = field(default_factory=dict)
    unified: str | None = None

    @property
    def is_v2(self) -> bool:
        return not self.v1 and self.unified is not None

    def read(self, cgroups_path: str, proc: str = "/proc") -> CgroupStats | None:
        rel = relative_cgroup(cgroups_path)
        if rel is None:
            return None
        if self.v1:
            # On a hybrid host runc also places the container in the cgroup2 mount,
            # which has no controllers but does have the pressure files.
            unified = os.path.join(self.unified, rel) if self.unified else None
            return read_v1({c: os.path.join(m, rel) for c, m in self.v1.items()},
                           unified=unified, proc=proc)
        if self.unified is not None:
            return read_v2(os.path.join(self.unified, rel), proc=proc)
        return None


def oom_kills(hierarchy: Hierarchy, cgroups_path: str) -> int | None:
    """How many processes the kernel's OOM killer ended in the cgroup (v1
    ``memory.oom_control``'s ``oom_kill``, v2 ``memory.events``'); None when the cgroup or
    the counter is not there."""
    rel = relative_cgroup(cgroups_path)
    if rel is None:
        return None
    if "memory" in hierarchy.v1:
        path = os.path.join(hierarchy.v1["memory"], rel, "memory.oom_control")
    elif hierarchy.unified is not None:
        path = os.path.join(hierarchy.unified, rel, "memory.events")
    else:
        return None
    return read_keyed(path).get("oom_kill")


def hierarchy_of(mounts: Iterable[MountEntry]) -> Hierarchy:
    """Where the cgroups are mounted, from the mount table. On a hybrid host the v1
    controllers win (the unified mount then has no controllers)."""
    v1: dict[str, str] = {}
    unified: str | None = None
    for m in mounts:
        if m.fstype == "cgroup2":
            unified = unified or m.mount_point
        elif m.fstype == "cgroup":
            for opt in m.super_options:
                if opt in V1_CONTROLLERS and opt not in v1:
                    v1[opt] = m.mount_point
    hierarchy = Hierarchy(v1=v1, unified=unified)
    if not v1 and unified is None:
        log.warning("no cgroup mount found: container stats will be empty")
    return hierarchy


__all__ = ["V1_CONTROLLERS", "Hierarchy", "hierarchy_of", "oom_kills",
           "relative_cgroup"]
