"""Start-up checks of the host, so a first-day mistake stops the daemon with what to do
instead of failing at the first pod."""

from __future__ import annotations

import os

from pycrid.config.decode import ConfigError
from pycrid.errors import FailedPrecondition
from pycrid.host.mountinfo import read

CGROUP_DRIVER_KEY = 'plugins."pycrid.cri.v1.runtime".cgroup_driver'
#: sd_booted(3): this directory exists exactly when systemd is PID 1.
SYSTEMD_RUN_DIR = "/run/systemd/system"
CGROUP_ROOT = "/sys/fs/cgroup"
#: Without these v1 controllers runc cannot apply pod limits (cgroup v2 brings them all).
V1_NEEDED = ("cpu", "memory", "pids")


def require_root() -> None:
    if os.geteuid() != 0:
        raise FailedPrecondition(
            "pycrid must run as root (it mounts, creates network namespaces and cgroups); "
            f"running as uid {os.geteuid()}: start it with sudo or as a system service "
            "(pycrid install-service)")


def check_cgroup_driver(driver: str, systemd_dir: str = SYSTEMD_RUN_DIR) -> None:
    if driver == "systemd" and not os.path.isdir(systemd_dir):
        raise ConfigError(
            CGROUP_DRIVER_KEY,
            f'is "systemd" but systemd is not running on this host ({systemd_dir} is '
            'missing); set cgroup_driver = "cgroupfs" (and the kubelet\'s cgroupDriver to match)')


def cgroup_mounts(mountinfo: str = "/proc/self/mountinfo") -> dict[str, set[str]]:
    """Mount point -> what it provides: ``{"cgroup2"}`` or the v1 controller names."""
    found: dict[str, set[str]] = {}
    for m in read(mountinfo):
        if m.fstype == "cgroup2":
            found[m.mount_point] = {"cgroup2"}
        elif m.fstype == "cgroup":
            found[m.mount_point] = {o for o in m.super_options if o not in ("rw", "ro")}
    return found


def check_cgroups(mountinfo: str = "/proc/self/mountinfo") -> None:
    """runc's rule: cgroup2 at /sys/fs/cgroup is the unified mode; otherwise the v1
    controllers must be mounted (hybrid hosts also have cgroup2 at .../unified)."""
    mounts = cgroup_mounts(mountinfo)
    if mounts.get(CGROUP_ROOT) == {"cgroup2"}:
        return
    have = set().union(*(v for v in mounts.values() if "cgroup2" not in v))
    missing = [c for c in V1_NEEDED if c not in have]
    if not missing:
        return
    seen = ", ".join(f"{p} ({' '.join(sorted(v))})" for p, v in sorted(mounts.items()))
    raise FailedPrecondition(
        f"no usable cgroup hierarchy: cgroup2 is not mounted at {CGROUP_ROOT} and the v1 "
        f"controllers {', '.join(missing)} are not mounted (found: {seen or 'no cgroup mounts'}); "
        "boot with cgroups enabled or mount them (e.g. mount -t cgroup2 none /sys/fs/cgroup)")
