"""Start-up host checks: cgroup driver vs systemd, usable cgroup mounts."""

from __future__ import annotations

from pathlib import Path

import pytest

from pycrid.config.decode import ConfigError
from pycrid.errors import FailedPrecondition
from pycrid.preflight import cgroup_mounts, check_cgroup_driver, check_cgroups

HYBRID = """\
25 1 0:23 / /sys rw,nosuid - sysfs sysfs rw
30 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
32 30 0:28 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:9 - cgroup cgroup rw,cpu,cpuacct
33 30 0:29 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
34 30 0:30 / /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids
"""
UNIFIED = "35 25 0:31 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
NONE = "25 1 0:23 / /sys rw,nosuid - sysfs sysfs rw\n"
UNIFIED_ONLY_ELSEWHERE = "31 30 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"


def _mi(tmp_path: Path, text: str) -> str:
    p = tmp_path / "mountinfo"
    p.write_text(text)
    return str(p)


def test_mounts_parsed(tmp_path: Path) -> None:
    m = cgroup_mounts(_mi(tmp_path, HYBRID))
    assert m["/sys/fs/cgroup/cpu,cpuacct"] == {"cpu", "cpuacct"}
    assert m["/sys/fs/cgroup/unified"] == {"cgroup2"}
    assert "/sys" not in m


@pytest.mark.parametrize("text", [HYBRID, UNIFIED])
def test_usable_hosts_pass(tmp_path: Path, text: str) -> None:
    check_cgroups(_mi(tmp_path, text))


def test_this_host_passes() -> None:
    check_cgroups()


@pytest.mark.parametrize(("text", "missing"), [
    (NONE, "cpu, memory, pids"),
    (UNIFIED_ONLY_ELSEWHERE, "cpu, memory, pids"),  # a hybrid host with v1 not mounted
    (HYBRID.replace("rw,memory", "rw,blkio"), "memory"),
])
def test_unusable_hosts_are_refused(tmp_path: Path, text: str, missing: str) -> None:
    with pytest.raises(FailedPrecondition) as e:
        check_cgroups(_mi(tmp_path, text))
    msg = str(e.value)
    assert "no usable cgroup hierarchy" in msg and f"controllers {missing} are not" in msg
    assert "mount -t cgroup2" in msg


def test_systemd_driver_needs_systemd(tmp_path: Path) -> None:
    check_cgroup_driver("cgroupfs", str(tmp_path / "absent"))
    with pytest.raises(ConfigError) as e:
        check_cgroup_driver("systemd", str(tmp_path / "absent"))
    assert "cgroup_driver" in str(e.value) and "systemd is not running" in str(e.value)
    (tmp_path / "present").mkdir()
    check_cgroup_driver("systemd", str(tmp_path / "present"))


def test_runtime_binaries_not_on_the_search_path(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    from pycrid.errors import Unavailable
    from pycrid.host import binaries
    from pycrid.runtime import runc_cli as conmon

    monkeypatch.setattr(binaries, "SYSTEM_PATH", str(tmp_path / "system"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(Unavailable) as e:
        conmon.find_binary("", "conmon", "conmon_path")
    assert str(e.value) == (f"conmon binary not found in {tmp_path}:{tmp_path}/system; install "
                            "it (Debian/Ubuntu: apt-get install runc conmon) or set "
                            "conmon_path to its path")
    exe = tmp_path / "conmon"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert conmon.find_binary("", "conmon") == str(exe)
    with pytest.raises(Unavailable, match="is not executable"):
        conmon.find_binary(str(tmp_path), "conmon")  # a directory is no binary


def test_the_search_path_is_the_daemons_path_then_the_system_dirs(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """containerd and CRI-O find runc and conmon on their PATH; pycrid too, and then in
    the system directories a short PATH (systemd's, cron's) may lack."""
    from pycrid.host import binaries

    mine, system = tmp_path / "mine", tmp_path / "system"
    for d in (mine, system):
        d.mkdir()
        exe = d / "pycrid-test-runc"
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    (system / "pycrid-test-conmon").write_text("#!/bin/sh\n")
    (system / "pycrid-test-conmon").chmod(0o755)
    monkeypatch.setattr(binaries, "SYSTEM_PATH", f"/usr/bin:{system}")
    # Empty and relative entries (the working directory) are never searched.
    monkeypatch.setenv("PATH", f":.:relative:{mine}:/usr/bin")
    assert binaries.search_path() == f"{mine}:/usr/bin:{system}"
    assert binaries.which("pycrid-test-runc") == str(mine / "pycrid-test-runc")
    assert binaries.which("pycrid-test-conmon") == str(system / "pycrid-test-conmon")
    assert binaries.which("no-such-binary") == ""
    monkeypatch.delenv("PATH")
    assert binaries.search_path() == f"/usr/bin:{system}"
    assert binaries.which("pycrid-test-runc") == str(system / "pycrid-test-runc")
