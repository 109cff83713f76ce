"""Per-process counts from /proc for a cgroup's processes: open descriptors and sockets.

The kernel keeps no per-cgroup descriptor count, so, as cAdvisor does, the
descriptors of every process the cgroup lists are counted one by one. A process
that exits mid-count is skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class DescriptorCounts:
    fds: int
    sockets: int


def descriptor_counts(pids: Iterable[int], proc: str = "/proc") -> DescriptorCounts:
    """Open file descriptors of ``pids``, and how many of them are sockets (links
    that read "socket:[inode]")."""
    fds = sockets = 0
    for pid in pids:
        fd_dir = f"{proc}/{pid}/fd"
        try:
            names = os.listdir(fd_dir)
        except OSError:  # gone, or not ours to read
            continue
        fds += len(names)
        for name in names:
            try:
                if os.readlink(f"{fd_dir}/{name}").startswith("socket:"):
                    sockets += 1
            except OSError:  # closed meanwhile
                continue
    return DescriptorCounts(fds=fds, sockets=sockets)


__all__ = ["DescriptorCounts", "descriptor_counts"]
