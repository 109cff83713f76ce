"""What the host's cgroups offer, probed once at daemon start.

The resource mapping (``pycrid.oci.resources``) is pure; it gets these facts as
a value, so the same rules are tested for v1, hybrid and v2 hosts on any
machine. The probes mirror what containerd and runc look at: the swap file of
the memory controller, the hugetlb controller and the kernel's page sizes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

CgroupVersion = Literal["v1", "hybrid", "v2"]
CGROUP_ROOT = "/sys/fs/cgroup"
HUGEPAGES_DIR = "/sys/kernel/mm/hugepages"


@dataclass(frozen=True)
class CgroupHost:
    """Host facts the resource rules depend on.

    ``version``: "v2" is the unified mode runc calls cgroup v2; "hybrid" (v1
    controllers plus an empty cgroup2 at ``unified``) is v1 for runc.
    ``cpus``/``mems``: online CPUs and memory nodes (None: unknown, not checked).
    """

    version: CgroupVersion = "v2"
    controllers: frozenset[str] = frozenset()
    swap: bool = False
    hugepage_sizes: tuple[str, ...] = ()
    cpus: frozenset[int] | None = None
    mems: frozenset[int] | None = None

    @property
    def unified(self) -> bool:
        return self.version == "v2"

    @property
    def hugetlb(self) -> bool:
        return "hugetlb" in self.controllers


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def page_size_name(kib: int) -> str:
    """runc's name of a huge page size ("2MB", "1GB", "64KB") from its size in KiB."""
    size, units = float(kib * 1024), ("B", "KB", "MB", "GB", "TB", "PB")
    i = 0
    while size >= 1024 and i < len(units) - 1:
        size /= 1024
        i += 1
    return f"{size:g}{units[i]}"


def hugepage_sizes(hugepages_dir: str = HUGEPAGES_DIR) -> tuple[str, ...]:
    """Page sizes the kernel offers (``hugepages-2048kB`` → "2MB"), smallest first."""
    try:
        names = os.listdir(hugepages_dir)
    except OSError:
        return ()
    kib = sorted(int(n[len("hugepages-"):-2]) for n in names
                 if n.startswith("hugepages-") and n.endswith("kB")
                 and n[len("hugepages-"):-2].isdigit())
    return tuple(page_size_name(k) for k in kib)


def parse_id_list(text: str) -> frozenset[int]:
    """A kernel list such as ``0-3,5`` (also the cpuset syntax) as a set; ValueError if bad."""
    out: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad list element {part!r}")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise ValueError(f"bad range {part!r}")
        out.update(range(first, last + 1))
    return frozenset(out)


def _online(path: str) -> frozenset[int] | None:
    text = _read(path).strip()
    try:
        return parse_id_list(text) if text else None
    except ValueError:
        return None


def _own_v2_cgroup(proc_self_cgroup: str) -> str:
    for line in _read(proc_self_cgroup).splitlines():
        if line.startswith("0::"):
            return line[3:]
    return "/"


def _v2_swap(root: str, own: str) -> bool:
    """containerd's check: ``memory.swap.max`` in our own cgroup, or (when we sit at the
    root, which has none) in any child cgroup."""
    here = os.path.join(root, own.lstrip("/"))
    if own not in ("", "/"):
        return os.path.exists(os.path.join(here, "memory.swap.max"))
    try:
        children = [e.path for e in os.scandir(root) if e.is_dir()]
    except OSError:
        return False
    return any(os.path.exists(os.path.join(c, "memory.swap.max")) for c in children)


def probe(root: str = CGROUP_ROOT, *, proc: str = "/proc", sys: str = "/sys") -> CgroupHost:
    """The facts of this host (the paths are parameters for tests)."""
    cpus = _online(os.path.join(sys, "devices/system/cpu/online"))
    mems = _online(os.path.join(sys, "devices/system/node/online"))
    sizes = hugepage_sizes(os.path.join(sys, "kernel/mm/hugepages"))
    if os.path.exists(os.path.join(root, "cgroup.controllers")):
        controllers = frozenset(_read(os.path.join(root, "cgroup.controllers")).split())
        own = _own_v2_cgroup(os.path.join(proc, "self/cgroup"))
        return CgroupHost("v2", controllers, _v2_swap(root, own), sizes, cpus, mems)
    mounted: set[str] = set()
    for line in _read(os.path.join(proc, "cgroups")).splitlines()[1:]:
        fields = line.split()
        # name, hierarchy, num_cgroups, enabled: hierarchy 0 means not mounted as v1.
        if len(fields) == 4 and fields[1] != "0" and fields[3] == "1":
            mounted.add(fields[0])
    version: CgroupVersion = ("hybrid" if os.path.exists(
        os.path.join(root, "unified", "cgroup.controllers")) else "v1")
    swap = os.path.exists(os.path.join(root, "memory", "memory.memsw.limit_in_bytes"))
    return CgroupHost(version, frozenset(mounted), swap, sizes, cpus, mems)
