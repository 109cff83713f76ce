"""Applying merged NRI adjustments to OCI spec dicts (pycrid.oci.nri_apply)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from pycrid.errors import FailedPrecondition, InvalidArgument
from pycrid.host.facts import read_facts
from pycrid.nri import api
from pycrid.nri.replies import Adjustment
from pycrid.oci.defaults import default_spec
from pycrid.oci.nri_apply import apply_adjustment
from pycrid.oci.nri_host_support import MIN_RUNC_FOR, HostSupport

OLD = HostSupport(runc_version=(1, 1, 5), cgroup_v2=False,
                  hugepage_sizes=frozenset({"2MB", "1GB"}), rdt=False,
                  min_oom_score_adj=-500, rlimit_hard={"RLIMIT_NOFILE": 1048576},
                  source_propagation=lambda src: {"/shared": "rshared",
                                                  "/slave": "rslave"}.get(src, ""))
NEW = dataclasses.replace(OLD, runc_version=(1, 4, 0), cgroup_v2=True, rdt=True)


def run(adj: Adjustment | api.ContainerAdjustment, host: HostSupport = OLD,
        spec: dict[str, Any] | None = None, cdi: Any = None) -> dict[str, Any]:
    spec = default_spec() if spec is None else spec
    msg = adj.message if isinstance(adj, Adjustment) else adj
    apply_adjustment(spec, msg, host, cdi)
    return spec


def refused(adj: Adjustment, kind: type[Exception], field: str,
            host: HostSupport = OLD) -> str:
    spec = default_spec()
    before = repr(spec)
    with pytest.raises(kind) as err:
        run(adj, host, spec)
    assert field in str(err.value)
    assert repr(spec) == before, "a refused adjustment must leave the spec untouched"
    return str(err.value)


def test_empty_adjustment_changes_nothing() -> None:
    assert run(Adjustment()) == default_spec()


# ---------------------------------------------------------------- process fields


def test_annotations_set_and_remove() -> None:
    spec = default_spec()
    spec["annotations"] = {"a": "1", "b": "2"}
    run(Adjustment().add_annotation("c", "3").add_annotation("a", "x").remove_annotation("b"),
        spec=spec)
    assert spec["annotations"] == {"a": "x", "c": "3"}


def test_env_replaced_in_place_appended_and_removed() -> None:
    spec = default_spec()
    spec["process"]["env"] = ["PATH=/bin", "A=1", "B=2", "NOEQ"]
    run(Adjustment().add_env("A", "new").add_env("C", "3").remove_env("B"), spec=spec)
    assert spec["process"]["env"] == ["PATH=/bin", "A=new", "NOEQ", "C=3"]


@pytest.mark.parametrize("key", ["", "-", "A=B"])
def test_env_bad_name_refused(key: str) -> None:
    adj = Adjustment()
    adj.message.env.add(key=key, value="v")
    refused(adj, InvalidArgument, "env")


def test_args_replaced_and_override_marker_stripped() -> None:
    assert run(Adjustment().set_args(["/bin/sh", "-c", "x"]))["process"]["args"] == \
        ["/bin/sh", "-c", "x"]
    assert run(Adjustment().update_args(["/app"]))["process"]["args"] == ["/app"]
    refused(Adjustment().update_args([]), InvalidArgument, "args")


def test_hooks_appended_to_each_list() -> None:
    spec = default_spec()
    spec["hooks"] = {"prestart": [{"path": "/old"}]}
    hooks = api.Hooks()
    hooks.prestart.add(path="/bin/pre", args=["pre", "1"], env=["X=1"])
    hooks.create_runtime.add(path="/bin/cr").timeout.value = 5
    hooks.create_container.add(path="/bin/cc")
    hooks.start_container.add(path="/bin/sc")
    hooks.poststart.add(path="/bin/ps")
    hooks.poststop.add(path="/bin/stop")
    run(Adjustment().add_hooks(hooks), spec=spec)
    assert spec["hooks"] == {
        "prestart": [{"path": "/old"},
                     {"path": "/bin/pre", "args": ["pre", "1"], "env": ["X=1"]}],
        "createRuntime": [{"path": "/bin/cr", "timeout": 5}],
        "createContainer": [{"path": "/bin/cc"}],
        "startContainer": [{"path": "/bin/sc"}],
        "poststart": [{"path": "/bin/ps"}],
        "poststop": [{"path": "/bin/stop"}],
    }


def test_hook_bad_path_or_timeout_refused() -> None:
    hooks = api.Hooks()
    hooks.poststop.add(path="relative")
    refused(Adjustment().add_hooks(hooks), InvalidArgument, "hooks.poststop")
    hooks = api.Hooks()
    hooks.prestart.add(path="/x").timeout.value = 0
    refused(Adjustment().add_hooks(hooks), InvalidArgument, "hooks.prestart")


def test_rlimits_one_entry_per_type() -> None:
    spec = default_spec()
    spec["process"]["rlimits"] = [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}]
    run(Adjustment().add_rlimit("RLIMIT_NOFILE", 4096, 2048)
        .add_rlimit("RLIMIT_CORE", 0, 0).add_rlimit("RLIMIT_NOFILE", 8192, 8192), spec=spec)
    assert spec["process"]["rlimits"] == [
        {"type": "RLIMIT_NOFILE", "hard": 8192, "soft": 8192},
        {"type": "RLIMIT_CORE", "hard": 0, "soft": 0},
    ]


def test_rlimit_refusals() -> None:
    refused(Adjustment().add_rlimit("RLIMIT_BOGUS", 1, 1), InvalidArgument, "rlimits")
    refused(Adjustment().add_rlimit("RLIMIT_CORE", 1, 2), InvalidArgument, "rlimits")
    msg = refused(Adjustment().add_rlimit("RLIMIT_NOFILE", 2**21, 1024),
                  FailedPrecondition, "rlimits")
    assert "CAP_SYS_RESOURCE" in msg


class FakeCdi:
    def __init__(self) -> None:
        self.got: list[str] = []

    def inject(self, spec: dict[str, Any], devices: Sequence[str]) -> None:
        self.got = list(devices)
        spec["linux"].setdefault("devices", []).append({"path": "/dev/gpu0"})


def test_cdi_devices_delegated_or_refused() -> None:
    cdi = FakeCdi()
    spec = run(Adjustment().add_cdi_device("vendor.com/gpu=0"), cdi=cdi)
    assert cdi.got == ["vendor.com/gpu=0"]
    assert spec["linux"]["devices"] == [{"path": "/dev/gpu0"}]
    refused(Adjustment().add_cdi_device("vendor.com/gpu=0"), FailedPrecondition, "CDI_devices")


def test_cdi_error_leaves_spec_untouched() -> None:
    class Failing:
        def inject(self, spec: dict[str, Any], devices: Sequence[str]) -> None:
            spec["mutated"] = True
            raise InvalidArgument("unresolvable CDI device")

    spec = default_spec()
    with pytest.raises(InvalidArgument):
        run(Adjustment().add_cdi_device("x.com/y=z"), spec=spec, cdi=Failing())
    assert spec == default_spec()


# ---------------------------------------------------------------- linux fields


def dev(path: str, type: str = "c", major: int = 10, minor: int = 200,
        **opt: int) -> api.LinuxDevice:
    d = api.LinuxDevice(path=path, type=type, major=major, minor=minor)
    for name, value in opt.items():
        getattr(d, name).value = value
    return d


def test_devices_added_with_cgroup_rule() -> None:
    spec = run(Adjustment().add_device(dev("/dev/net/tun", file_mode=0o666, uid=0, gid=5))
               .add_device(dev("/dev/sdb", "b", 8, 16)))
    assert spec["linux"]["devices"] == [
        {"path": "/dev/net/tun", "type": "c", "major": 10, "minor": 200,
         "fileMode": 0o666, "uid": 0, "gid": 5},
        {"path": "/dev/sdb", "type": "b", "major": 8, "minor": 16},
    ]
    assert spec["linux"]["resources"]["devices"][1:] == [
        {"allow": True, "type": "c", "major": 10, "minor": 200, "access": "rw"},
        {"allow": True, "type": "b", "major": 8, "minor": 16, "access": "rwm"},
    ]


def test_devices_replaced_and_removed_by_path() -> None:
    spec = default_spec()
    spec["linux"]["devices"] = [{"path": "/dev/a", "type": "c", "major": 1, "minor": 1},
                                {"path": "/dev/b", "type": "c", "major": 1, "minor": 2}]
    run(Adjustment().add_device(dev("/dev/a", minor=9)).remove_device("/dev/b"), spec=spec)
    assert spec["linux"]["devices"] == [{"path": "/dev/a", "type": "c", "major": 10,
                                         "minor": 9}]


def test_device_bad_type_or_path_refused() -> None:
    refused(Adjustment().add_device(dev("/dev/x", "z")), InvalidArgument, "linux.devices")
    refused(Adjustment().add_device(dev("/etc/x")), InvalidArgument, "linux.devices")


def test_cgroups_path() -> None:
    assert run(Adjustment().set_cgroups_path("/custom/x"))["linux"]["cgroupsPath"] == \
        "/custom/x"


def test_oom_score_adj_optional_and_clamped() -> None:
    assert "oomScoreAdj" not in run(Adjustment().set_oom_score_adj(None))["process"]
    assert run(Adjustment().set_oom_score_adj(0))["process"]["oomScoreAdj"] == 0
    assert run(Adjustment().set_oom_score_adj(-900))["process"]["oomScoreAdj"] == -500
    refused(Adjustment().set_oom_score_adj(1001), InvalidArgument, "linux.oom_score_adj")


def test_io_priority() -> None:
    adj = Adjustment().set_io_priority(api.IOPRIO_CLASS_RT, 3)
    msg = refused(adj, FailedPrecondition, "linux.io_priority")
    assert "1.2.0" in msg
    host = dataclasses.replace(OLD, runc_version=(1, 2, 0))
    assert run(adj, host)["process"]["ioPriority"] == {"class": "IOPRIO_CLASS_RT",
                                                       "priority": 3}
    refused(Adjustment().set_io_priority(api.IOPRIO_CLASS_BE, 9), InvalidArgument,
            "linux.io_priority", host)
    spec = default_spec()
    spec["process"]["ioPriority"] = {"class": "IOPRIO_CLASS_BE", "priority": 1}
    run(Adjustment().set_io_priority(api.IOPRIO_CLASS_NONE, 0), spec=spec)
    assert "ioPriority" not in spec["process"]


def test_scheduler() -> None:
    sch = api.LinuxScheduler(policy=api.SCHED_DEADLINE, runtime=10, deadline=20, period=30,
                             flags=[api.SCHED_FLAG_RESET_ON_FORK])
    refused(Adjustment().set_scheduler(sch), FailedPrecondition, "linux.scheduler")
    spec = run(Adjustment().set_scheduler(sch), NEW)
    assert spec["process"]["scheduler"] == {
        "policy": "SCHED_DEADLINE", "runtime": 10, "deadline": 20, "period": 30,
        "flags": ["SCHED_FLAG_RESET_ON_FORK"]}
    spec = run(Adjustment().set_scheduler(api.LinuxScheduler(policy=api.SCHED_NONE)),
               spec=spec)
    assert "scheduler" not in spec["process"]


def test_seccomp_policy_converted_to_oci_names() -> None:
    pol = api.LinuxSeccomp(default_action="SCMP_ACT_ERRNO", architectures=["SCMP_ARCH_X86_64"],
                           listener_path="/run/agent.sock", listener_metadata="meta")
    pol.default_errno.value = 1
    call = pol.syscalls.add(names=["mkdir", "rmdir"], action="SCMP_ACT_ALLOW")
    call.errno_ret.value = 38
    call.args.add(index=1, value=2, value_two=3, op="SCMP_CMP_EQ")
    pol.syscalls.add(names=["read"], action="SCMP_ACT_ALLOW")
    spec = default_spec()
    spec["linux"]["seccomp"] = {"defaultAction": "SCMP_ACT_KILL"}
    run(Adjustment().set_seccomp_policy(pol), spec=spec)
    assert spec["linux"]["seccomp"] == {
        "defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 1,
        "architectures": ["SCMP_ARCH_X86_64"], "listenerPath": "/run/agent.sock",
        "listenerMetadata": "meta",
        "syscalls": [
            {"names": ["mkdir", "rmdir"], "action": "SCMP_ACT_ALLOW", "errnoRet": 38,
             "args": [{"index": 1, "value": 2, "valueTwo": 3, "op": "SCMP_CMP_EQ"}]},
            {"names": ["read"], "action": "SCMP_ACT_ALLOW"},
        ]}


def test_seccomp_flags_need_runc_1_2() -> None:
    pol = api.LinuxSeccomp(default_action="SCMP_ACT_ALLOW", flags=["SECCOMP_FILTER_FLAG_LOG"])
    refused(Adjustment().set_seccomp_policy(pol), FailedPrecondition,
            "linux.seccomp_policy.flags")
    assert run(Adjustment().set_seccomp_policy(pol), NEW)["linux"]["seccomp"]["flags"] == \
        ["SECCOMP_FILTER_FLAG_LOG"]


def test_namespaces_add_replace_remove() -> None:
    spec = run(Adjustment().add_or_replace_namespace("network", "/var/run/netns/x")
               .remove_namespace("ipc").add_or_replace_namespace("cgroup"))
    assert spec["linux"]["namespaces"] == [
        {"type": "pid"}, {"type": "uts"}, {"type": "mount"},
        {"type": "network", "path": "/var/run/netns/x"}, {"type": "cgroup"}]
    refused(Adjustment().add_or_replace_namespace("bogus"), InvalidArgument,
            "linux.namespaces")
    refused(Adjustment().add_or_replace_namespace("time"), FailedPrecondition,
            "linux.namespaces[time]")


def test_sysctl_set_and_remove() -> None:
    spec = default_spec()
    spec["linux"]["sysctl"] = {"a.b": "1", "c.d": "2"}
    run(Adjustment().set_sysctl("a.b", "9").remove_sysctl("c.d").set_sysctl("e", "3"),
        spec=spec)
    assert spec["linux"]["sysctl"] == {"a.b": "9", "e": "3"}


def test_net_devices() -> None:
    refused(Adjustment().add_net_device("eth1", "net1"), FailedPrecondition,
            "linux.net_devices")
    spec = run(Adjustment().add_net_device("eth1", "net1").add_net_device("eth2", ""), NEW)
    assert spec["linux"]["netDevices"] == {"eth1": {"name": "net1"}, "eth2": {}}
    run(Adjustment().remove_net_device("eth2"), spec=spec)
    assert spec["linux"]["netDevices"] == {"eth1": {"name": "net1"}}
    run(Adjustment().remove_net_device("eth9"))  # removal needs no runc support


def test_memory_policy() -> None:
    adj = Adjustment().set_memory_policy(api.MPOL_BIND, "0-1", [api.MPOL_F_STATIC_NODES])
    msg = refused(adj, FailedPrecondition, "linux.memory_policy")
    assert "1.4.0" in msg
    assert run(adj, NEW)["linux"]["memoryPolicy"] == {
        "mode": "MPOL_BIND", "nodes": "0-1", "flags": ["MPOL_F_STATIC_NODES"]}


def test_rdt() -> None:
    refused(Adjustment().set_rdt_clos_id("gold"), FailedPrecondition, "linux.rdt.clos_id")
    rdt_old = dataclasses.replace(OLD, rdt=True)
    assert run(Adjustment().set_rdt_clos_id("gold"), rdt_old)["linux"]["intelRdt"] == \
        {"closID": "gold"}
    refused(Adjustment().set_rdt_schemata(["L3:0=f"]), FailedPrecondition,
            "linux.rdt.schemata", rdt_old)
    adj = Adjustment().set_rdt_clos_id("gold").set_rdt_schemata(["L3:0=f", "MB:0=50"])
    adj.message.linux.rdt.enable_monitoring.value = True
    assert run(adj, NEW)["linux"]["intelRdt"] == {
        "closID": "gold", "schemata": ["L3:0=f", "MB:0=50"], "enableMonitoring": True}
    spec = default_spec()
    spec["linux"]["intelRdt"] = {"closID": "old"}
    run(Adjustment().remove_rdt(), spec=spec)  # clearing needs no RDT on the host
    assert "intelRdt" not in spec["linux"]


# ---------------------------------------------------------------- resources


def test_memory_limit_sets_swap_and_other_fields_apply() -> None:
    res = run(Adjustment().set_memory_limit(1 << 30).set_memory_reservation(1 << 29)
              .set_memory_swappiness(10).set_memory_disable_oom_killer())["linux"]["resources"]
    assert res["memory"] == {"limit": 1 << 30, "swap": 1 << 30, "reservation": 1 << 29,
                             "swappiness": 10, "disableOOMKiller": True}
    res = run(Adjustment().set_memory_limit(100).set_memory_swap(300))["linux"]["resources"]
    assert res["memory"] == {"limit": 100, "swap": 300}


def test_memory_refusals() -> None:
    where = "linux.resources.memory"
    refused(Adjustment().set_memory_limit(0), InvalidArgument, f"{where}.limit")
    refused(Adjustment().set_memory_swappiness(101), InvalidArgument, f"{where}.swappiness")
    for name in ("kernel", "kernel_tcp"):
        adj = Adjustment()
        getattr(adj.message.linux.resources.memory, name).value = 1 << 20
        refused(adj, FailedPrecondition, f"{where}.{name}")
    adj = Adjustment()
    adj.message.linux.resources.memory.use_hierarchy.value = True
    refused(adj, FailedPrecondition, f"{where}.use_hierarchy")
    refused(Adjustment().set_memory_swappiness(5), FailedPrecondition,
            f"{where}.swappiness", NEW)
    refused(Adjustment().set_memory_disable_oom_killer(), FailedPrecondition,
            f"{where}.disable_oom_killer", NEW)


def test_cpu() -> None:
    adj = (Adjustment().set_cpu_shares(512).set_cpu_quota(50000).set_cpu_period(100000)
           .set_cpuset_cpus("0-3").set_cpuset_mems("0").set_cpu_realtime_runtime(950)
           .set_cpu_realtime_period(1000))
    assert run(adj)["linux"]["resources"]["cpu"] == {
        "shares": 512, "quota": 50000, "period": 100000, "realtimeRuntime": 950,
        "realtimePeriod": 1000, "cpus": "0-3", "mems": "0"}
    refused(Adjustment().set_cpu_realtime_runtime(1), FailedPrecondition,
            "linux.resources.cpu.realtime_runtime", NEW)
    # Explicit zero is still applied: the wrapper says "set".
    assert run(Adjustment().set_cpu_quota(0))["linux"]["resources"]["cpu"] == {"quota": 0}


def test_hugepages_checked_against_host_and_replaced_by_size() -> None:
    spec = default_spec()
    spec["linux"]["resources"]["hugepageLimits"] = [{"pageSize": "2MB", "limit": 1}]
    run(Adjustment().add_hugepage_limit("2MB", 4 << 20).add_hugepage_limit("1GB", 1 << 30),
        spec=spec)
    assert spec["linux"]["resources"]["hugepageLimits"] == [
        {"pageSize": "2MB", "limit": 4 << 20}, {"pageSize": "1GB", "limit": 1 << 30}]
    refused(Adjustment().add_hugepage_limit("64KB", 1), FailedPrecondition,
            "linux.resources.hugepage_limits")


def test_unified_only_on_cgroup_v2() -> None:
    adj = Adjustment().add_unified("memory.high", "1G")
    refused(adj, FailedPrecondition, "linux.resources.unified")
    assert run(adj, NEW)["linux"]["resources"]["unified"] == {"memory.high": "1G"}


def test_pids() -> None:
    assert run(Adjustment().set_pids_limit(100))["linux"]["resources"]["pids"] == \
        {"limit": 100}
    assert run(Adjustment().set_pids_limit(-1))["linux"]["resources"]["pids"] == {"limit": -1}
    refused(Adjustment().set_pids_limit(-2), InvalidArgument, "linux.resources.pids")


def test_resource_device_rules() -> None:
    adj = Adjustment()
    rule = adj.message.linux.resources.devices.add(allow=True, type="c", access="rw")
    rule.major.value = 1
    rule.minor.value = 3
    adj.message.linux.resources.devices.add(allow=False, access="m")
    assert run(adj)["linux"]["resources"]["devices"][1:] == [
        {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rw"},
        {"allow": False, "access": "m"}]
    bad = Adjustment()
    bad.message.linux.resources.devices.add(allow=True, type="c", access="rwx")
    refused(bad, InvalidArgument, "linux.resources.devices")


def test_blockio_class() -> None:
    refused(Adjustment().set_blockio_class("gold"), FailedPrecondition,
            "linux.resources.blockio_class")
    known = dataclasses.replace(OLD, blockio_classes=frozenset({"gold"}))
    refused(Adjustment().set_blockio_class("gold"), FailedPrecondition,
            "linux.resources.blockio_class", known)
    spec = default_spec()
    spec["linux"]["resources"]["blockIO"] = {"weight": 10}
    run(Adjustment().set_blockio_class(""), spec=spec)
    assert "blockIO" not in spec["linux"]["resources"]


def test_rdt_class() -> None:
    refused(Adjustment().set_rdt_class("gold"), FailedPrecondition,
            "linux.resources.rdt_class")
    assert run(Adjustment().set_rdt_class("gold"), NEW)["linux"]["intelRdt"] == \
        {"closID": "gold"}
    spec = default_spec()
    spec["linux"]["intelRdt"] = {"closID": "x"}
    run(Adjustment().set_rdt_class(""), spec=spec)
    assert "intelRdt" not in spec["linux"]


# ---------------------------------------------------------------- mounts


def test_mounts_replace_remove_and_sort() -> None:
    spec = default_spec()
    spec["mounts"].append({"destination": "/data", "type": "bind", "source": "/old",
                           "options": ["rbind"]})
    run(Adjustment().add_mount("/data/sub", "/h/sub", "bind", ["rbind", "ro"])
        .add_mount("/data/", "/h/data", "bind", ["rbind"]).remove_mount("/dev/mqueue")
        .add_mount("/a", "tmpfs", "tmpfs"), spec=spec)
    dests = [m["destination"] for m in spec["mounts"]]
    assert dests == ["/a", "/data/", "/dev", "/proc", "/sys", "/data/sub", "/dev/pts",
                     "/dev/shm"]
    assert spec["mounts"][1] == {"destination": "/data/", "type": "bind",
                                 "source": "/h/data", "options": ["rbind"]}


def test_mount_propagation() -> None:
    spec = run(Adjustment().add_mount("/s", "/slave", "bind", ["rbind", "rslave"]))
    assert spec["linux"]["rootfsPropagation"] == "rslave"
    spec = run(Adjustment().add_mount("/s", "/shared", "bind", ["rbind", "rshared"])
               .add_mount("/t", "/slave", "bind", ["rbind", "rslave"]))
    assert spec["linux"]["rootfsPropagation"] == "rshared"
    spec = run(Adjustment().add_mount("/p", "/private", "bind", ["rbind", "rprivate"]))
    assert "rootfsPropagation" not in spec["linux"]
    msg = refused(Adjustment().add_mount("/s", "/slave", "bind", ["rshared"]),
                  FailedPrecondition, "mounts")
    assert "rslave" in msg
    refused(Adjustment().add_mount("/s", "/private", "bind", ["rslave"]),
            FailedPrecondition, "mounts")
    blind = dataclasses.replace(OLD, source_propagation=None)
    refused(Adjustment().add_mount("/s", "/shared", "bind", ["rshared"]),
            FailedPrecondition, "mounts", blind)


# ---------------------------------------------------------------- host facts


def test_min_runc_table_covers_every_version_gate() -> None:
    assert MIN_RUNC_FOR["linux.io_priority"] == (1, 2, 0)
    assert MIN_RUNC_FOR["linux.net_devices"] == (1, 4, 0)
    assert MIN_RUNC_FOR["linux.memory_policy"] == (1, 4, 0)
    assert all(v > (1, 1, 5) for v in MIN_RUNC_FOR.values())


def test_probe_reads_this_host() -> None:
    facts = dataclasses.replace(read_facts((1, 1, 5), ()), oom_score_adj=-999)
    host = HostSupport.from_facts(facts)
    assert host.runc_version == (1, 1, 5)
    assert host.min_oom_score_adj == -999
    assert "RLIMIT_NOFILE" in host.rlimit_hard
    assert all(s[-2:] in ("KB", "MB", "GB") for s in host.hugepage_sizes)
    assert host.source_propagation is not None
    assert host.source_propagation("/") in ("rshared", "rslave", "")
