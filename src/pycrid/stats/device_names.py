"""Names for devices in metric labels: "/dev/vda" rather than "254:0", as cAdvisor does.

Block I/O counters name a device by major:minor; a filesystem by its st_dev. Both
are turned into the name a person knows: the kernel's device name from sysfs, or
the source column of the mount table for a filesystem without a block device
(tmpfs, overlay). When neither is known the numbers themselves are the name.
"""

from __future__ import annotations

import functools
import os

from pycrid.host.mountinfo import parse


@functools.lru_cache(maxsize=256)
def block_device(major: int, minor: int, sysfs: str = "/sys") -> str:
    """``/dev/<DEVNAME>`` of a block device, from its sysfs uevent; "major:minor" when
    sysfs does not know it."""
    try:
        with open(f"{sysfs}/dev/block/{major}:{minor}/uevent") as f:
            for line in f:
                key, _, value = line.strip().partition("=")
                if key == "DEVNAME" and value:
                    return "/dev/" + value
    except OSError:
        pass
    return f"{major}:{minor}"


def mount_source(major: int, minor: int, mountinfo: str) -> str | None:
    """The source of the first mount of device major:minor in mountinfo text."""
    want = f"{major}:{minor}"
    return next((m.source for m in parse(mountinfo) if m.device == want), None)


def filesystem_device(path: str, sysfs: str = "/sys",
                      mountinfo: str = "/proc/self/mountinfo") -> str:
    """The device holding ``path``: its block device name when it has one, else the
    mount table's source; "" when ``path`` cannot be examined."""
    try:
        dev = os.stat(path).st_dev
    except OSError:
        return ""
    major, minor = os.major(dev), os.minor(dev)
    name = block_device(major, minor, sysfs)
    if name != f"{major}:{minor}":
        return name
    try:
        with open(mountinfo) as f:
            source = mount_source(major, minor, f.read())
    except OSError:
        source = None
    return source or name


__all__ = ["block_device", "filesystem_device", "mount_source"]
