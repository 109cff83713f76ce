"""Probe the facts ``HostSupport`` records: /sys, /proc, the daemon's rlimits and runc.

The one impure corner of applying NRI adjustments, run by the caller once at start
(the mount propagation check reads /proc/self/mountinfo at each use: mounts change).
"""

from __future__ import annotations

import os
import posixpath
import re
import resource
import subprocess

from pycrid.oci.nri_apply_process import RLIM_INFINITY, RLIMIT_NAMES
from pycrid.oci.nri_host_support import HostSupport, Version


def runc_version(runc: str) -> Version:
    """``runc --version``, (0, 0, 0) when it cannot be read; blocks (run it once, at start)."""
    try:
        out = subprocess.run([runc, "--version"], capture_output=True, text=True,
                             timeout=10, check=False).stdout
    except OSError:
        return (0, 0, 0)
    m = re.search(r"runc version (\d+)\.(\d+)\.(\d+)", out)
    return (int(m[1]), int(m[2]), int(m[3])) if m else (0, 0, 0)


def probe_host_support(runc_version: Version, min_oom_score_adj: int) -> HostSupport:
    """Read /sys and the daemon's rlimits."""
    sizes: set[str] = set()
    base = "/sys/kernel/mm/hugepages"
    if os.path.isdir(base):
        for name in os.listdir(base):
            if name.startswith("hugepages-") and name.endswith("kB"):
                sizes.add(_page_name(int(name[len("hugepages-"):-2])))
    hard: dict[str, int] = {}
    for name in RLIMIT_NAMES:
        number = getattr(resource, name, None)
        if number is not None:
            limit = resource.getrlimit(number)[1]
            hard[name] = RLIM_INFINITY if limit == resource.RLIM_INFINITY else limit
    return HostSupport(
        runc_version=runc_version,
        cgroup_v2=os.path.exists("/sys/fs/cgroup/cgroup.controllers"),
        hugepage_sizes=frozenset(sizes),
        rdt=os.path.exists("/sys/fs/resctrl/schemata"),
        min_oom_score_adj=min_oom_score_adj,
        rlimit_hard=hard,
        source_propagation=_propagation_of,
    )


def _propagation_of(path: str) -> str:
    """"rshared", "rslave" or "" for the host mount that holds ``path``."""
    target = posixpath.normpath(os.path.realpath(path))
    best, best_len = "", -1
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split()
            point = re.sub(r"\\([0-7]{3})", lambda o: chr(int(o[1], 8)), fields[4])
            inside = target == point or target.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= best_len:
                optional = fields[6:fields.index("-")]
                best_len = len(point)
                best = ("rshared" if any(o.startswith("shared:") for o in optional)
                        else "rslave" if any(o.startswith("master:") for o in optional)
                        else "")
    return best


def _page_name(kb: int) -> str:
    for unit, size in (("GB", 1 << 20), ("MB", 1 << 10)):
        if kb % size == 0:
            return f"{kb // size}{unit}"
    return f"{kb}KB"
