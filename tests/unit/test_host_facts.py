"""host.mountinfo (the one mountinfo parser) and host.facts (what is probed once)."""

from __future__ import annotations

from pycrid.host import facts, mountinfo

TABLE = (
    "22 1 0:21 / /sys rw,nosuid shared:7 - sysfs sysfs rw\n"
    "30 22 0:26 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755\n"
    "31 30 0:27 / /sys/fs/cgroup/unified rw shared:10 - cgroup2 cgroup2 rw,nsdelegate\n"
    "35 30 0:31 / /sys/fs/cgroup/cpu,cpuacct rw shared:14 - cgroup cgroup rw,cpu,cpuacct\n"
    "40 1 8:1 /data /mnt/with\\040space rw master:3 - ext4 /dev/sda1 rw\n"
    "41 40 8:1 /x /mnt/with\\040space/in rw - ext4 /dev/sda1 rw\n"
    "garbage line\n"
)


def test_parse_reads_every_field_and_unescapes() -> None:
    entries = list(mountinfo.parse(TABLE))
    assert [e.mount_id for e in entries] == [22, 30, 31, 35, 40, 41]
    spaced = entries[4]
    assert spaced.mount_point == "/mnt/with space" and spaced.root == "/data"
    assert spaced.device == "8:1" and spaced.fstype == "ext4" and spaced.source == "/dev/sda1"
    assert spaced.optional == ("master:3",) and spaced.propagation == "rslave"
    assert entries[2].propagation == "rshared" and entries[5].propagation == ""
    assert entries[3].super_options == ("rw", "cpu", "cpuacct")


def test_holder_of_is_the_deepest_mount_above_a_path() -> None:
    entries = list(mountinfo.parse(TABLE))
    held = mountinfo.holder_of("/mnt/with space/in/file", entries)
    assert held is not None and held.mount_id == 41
    outer = mountinfo.holder_of("/mnt/with space/other", entries)
    assert outer is not None and outer.mount_id == 40
    assert mountinfo.holder_of("/mnt/with spaces", entries) is None


def test_capabilities_from_capeff() -> None:
    names = ("CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH")
    assert facts.own_capabilities("Name:\tx\nCapEff:\t0000000000000005\n", names) == (
        "CAP_CHOWN", "CAP_DAC_READ_SEARCH")
    assert facts.own_capabilities("Name:\tx\n", names) == names


def test_runc_version_text() -> None:
    text = "runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1\nspec: 1.0.2-dev\n"
    assert facts.parse_runc_version(text) == (1, 1, 5)
    assert facts.parse_runc_version("crun version 1.8") == (0, 0, 0)


async def test_probe_on_this_host() -> None:
    host = await facts.probe("runc", ("CAP_CHOWN",))
    assert host.runc_version >= (1, 0, 0)
    assert host.security.seccomp
    assert {m.fstype for m in host.cgroup_mounts} <= {"cgroup", "cgroup2"}
    assert host.cgroup_mounts, "this machine mounts cgroups"
    assert host.rlimit_hard["RLIMIT_NOFILE"] > 0
    assert host.oom_score_adj >= -1000
