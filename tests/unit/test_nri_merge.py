"""Merging of NRI plugin replies: field ownership, removals, updates."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pycrid.errors import FailedPrecondition, InvalidArgument
from pycrid.nri import Adjustment, Update, api
from pycrid.nri.adaptation.merge import AdjustmentConflict, CreateMerger, UpdateMerger

F = api.Field


def make_merger() -> CreateMerger:
    ctr = api.Container(
        id="ctr0",
        pod_sandbox_id="pod0",
        name="ctr0",
        args=["echo", "hello"],
        env=["PATH=/bin", "KEEP=1"],
        annotations={"orig": "1"},
        mounts=[api.Mount(destination="/orig", source="/src")],
    )
    ctr.linux.namespaces.add(type="network", path="/proc/1/ns/net")
    return CreateMerger(api.PodSandbox(id="pod0", name="pod0"), ctr)


def reply(adj: Adjustment, *updates: Update) -> api.CreateContainerResponse:
    return api.CreateContainerResponse(adjust=adj.message, update=[u.message for u in updates])


def apply(m: CreateMerger, plugin: str, build: Callable[[Adjustment], object]) -> None:
    adj = Adjustment()
    build(adj)
    m.apply(plugin, reply(adj))


def conflict_message(field: str, key: str = "", first: str = "10-a", second: str = "20-b") -> str:
    return f'plugins "{second}" and "{first}" both tried to set {field} {key}'


# ------------------------------------------------------------ keyed fields

# name -> (Field name, builder setting entry `key` with a plugin-specific value)
KEYED: dict[str, tuple[str, Callable[[Adjustment, str, str], object]]] = {
    "annotation": ("Annotations", lambda a, k, v: a.add_annotation(k, v)),
    "mount": ("Mounts", lambda a, k, v: a.add_mount("/" + k, source="/" + v)),
    "env": ("Env", lambda a, k, v: a.add_env(k, v)),
    "device": ("Devices", lambda a, k, v: a.add_device(api.LinuxDevice(path="/" + k, type="c"))),
    "hugepage": ("HugepageLimits", lambda a, k, v: a.add_hugepage_limit(k, 1 << 21)),
    "unified": ("CgroupsUnified", lambda a, k, v: a.add_unified(k, v)),
    "namespace": ("Namespace", lambda a, k, v: a.add_or_replace_namespace(k, "/" + v)),
    "sysctl": ("Sysctl", lambda a, k, v: a.set_sysctl(k, v)),
    "net_device": ("LinuxNetDevices", lambda a, k, v: a.add_net_device(k, v)),
    "rlimit": ("Rlimits", lambda a, k, v: a.add_rlimit(k, 10, 5)),
    "cdi": ("CdiDevices", lambda a, k, v: a.add_cdi_device(k)),
}
KEY_PREFIX = {"mount": "/", "device": "/"}


@pytest.mark.parametrize("name", sorted(KEYED))
def test_keyed_field_different_keys_merge(name: str) -> None:
    _, build = KEYED[name]
    m = make_merger()
    apply(m, "10-a", lambda a: build(a, "k1", "a"))
    apply(m, "20-b", lambda a: build(a, "k2", "b"))
    owners = m.result().owners.owners["ctr0"]
    field = getattr(F, KEYED[name][0])
    p = KEY_PREFIX.get(name, "")
    assert dict(owners.compound[field].owners) == {p + "k1": "10-a", p + "k2": "20-b"}


@pytest.mark.parametrize("name", sorted(KEYED))
def test_keyed_field_same_key_conflicts(name: str) -> None:
    field, build = KEYED[name]
    m = make_merger()
    apply(m, "10-a", lambda a: build(a, "k1", "a"))
    with pytest.raises(AdjustmentConflict) as exc:
        apply(m, "20-b", lambda a: build(a, "k1", "b"))
    assert str(exc.value) == conflict_message(field, KEY_PREFIX.get(name, "") + "k1")
    assert isinstance(exc.value, FailedPrecondition)
    assert (exc.value.plugin, exc.value.other) == ("20-b", "10-a")


# name -> (Field name, remover of entry `key`)
REMOVABLE: dict[str, Callable[[Adjustment, str], object]] = {
    "annotation": lambda a, k: a.remove_annotation(k),
    "mount": lambda a, k: a.remove_mount("/" + k),
    "env": lambda a, k: a.remove_env(k),
    "device": lambda a, k: a.remove_device("/" + k),
    "namespace": lambda a, k: a.remove_namespace(k),
    "sysctl": lambda a, k: a.remove_sysctl(k),
    "net_device": lambda a, k: a.remove_net_device(k),
}


@pytest.mark.parametrize("name", sorted(REMOVABLE))
def test_removal_records_remover_and_same_plugin_may_set_again(name: str) -> None:
    field, build = KEYED[name]
    key = KEY_PREFIX.get(name, "") + "k"
    m = make_merger()
    apply(m, "10-a", lambda a: build(a, "k", "a"))
    apply(m, "20-b", lambda a: REMOVABLE[name](a, "k"))  # taking over needs no claim
    owners = m.result().owners.owners["ctr0"].compound[getattr(F, field)].owners
    assert owners[key] == "-20-b"
    apply(m, "20-b", lambda a: build(a, "k", "b"))
    assert m.result().owners.owners["ctr0"].compound[getattr(F, field)].owners[key] == "20-b"


@pytest.mark.parametrize("name", sorted(REMOVABLE))
def test_removal_then_set_by_other_plugin_conflicts(name: str) -> None:
    field, build = KEYED[name]
    m = make_merger()
    apply(m, "10-a", lambda a: REMOVABLE[name](a, "k"))
    with pytest.raises(AdjustmentConflict) as exc:
        apply(m, "20-b", lambda a: build(a, "k", "b"))
    assert str(exc.value) == conflict_message(field, KEY_PREFIX.get(name, "") + "k")


@pytest.mark.parametrize("name", sorted(REMOVABLE))
def test_remove_and_add_in_one_reply_overrides_earlier_owner(name: str) -> None:
    _, build = KEYED[name]
    m = make_merger()
    apply(m, "10-a", lambda a: build(a, "k", "a"))
    apply(m, "20-b", lambda a: (REMOVABLE[name](a, "k"), build(a, "k", "b")))
    with pytest.raises(AdjustmentConflict):
        apply(m, "30-c", lambda a: build(a, "k", "c"))


def test_removal_markers_in_merged_adjustment() -> None:
    m = make_merger()
    apply(m, "10-a", lambda a: a.add_annotation("x", "1").add_env("E", "1").add_mount("/m"))
    apply(m, "20-b", lambda a: a.remove_annotation("x").remove_env("E").remove_mount("/m")
          .remove_env("KEEP").remove_namespace("network").remove_sysctl("s"))
    adj = m.result().adjust
    assert dict(adj.annotations) == {"-x": ""}
    assert [(e.key, e.value) for e in adj.env] == [("-E", ""), ("-KEEP", "")]
    assert [mt.destination for mt in adj.mounts] == ["-/m"]
    assert [n.type for n in adj.linux.namespaces] == ["-network"]
    assert dict(adj.linux.sysctl) == {"-s": ""}
    ctr = m.container
    assert "x" not in ctr.annotations and list(ctr.env) == ["PATH=/bin"]
    assert [mt.destination for mt in ctr.mounts] == ["/orig"] and not ctr.linux.namespaces


def test_remove_and_set_same_reply_keeps_marker_for_maps_only() -> None:
    m = make_merger()
    apply(m, "10-a", lambda a: a.remove_annotation("orig").add_annotation("orig", "2")
          .remove_mount("/orig").add_mount("/orig", source="/new"))
    adj = m.result().adjust
    assert dict(adj.annotations) == {"-orig": "", "orig": "2"}
    assert [(mt.destination, mt.source) for mt in adj.mounts] == [("/orig", "/new")]
    assert [(mt.destination, mt.source) for mt in m.container.mounts] == [("/orig", "/new")]


def test_same_plugin_duplicate_key_in_one_reply_conflicts_like_upstream() -> None:
    m = make_merger()
    with pytest.raises(AdjustmentConflict, match='"10-a" and "10-a"'):
        apply(m, "10-a", lambda a: a.add_mount("/x").add_mount("/x"))


# ------------------------------------------------------------ simple fields


def _set_kernel(a: Adjustment) -> None:
    a.message.linux.resources.memory.kernel.value = 1


SIMPLE: dict[str, Callable[[Adjustment], object]] = {
    "Args": lambda a: a.set_args(["sh"]),
    "MemLimit": lambda a: a.set_memory_limit(1 << 20),
    "MemReservation": lambda a: a.set_memory_reservation(1),
    "MemSwapLimit": lambda a: a.set_memory_swap(1),
    "MemKernelLimit": _set_kernel,
    "MemTCPLimit": lambda a: a.message.linux.resources.memory.kernel_tcp.SetInParent(),
    "MemSwappiness": lambda a: a.set_memory_swappiness(10),
    "MemDisableOomKiller": lambda a: a.set_memory_disable_oom_killer(),
    "MemUseHierarchy": lambda a: a.message.linux.resources.memory.use_hierarchy.SetInParent(),
    "CPUShares": lambda a: a.set_cpu_shares(2),
    "CPUQuota": lambda a: a.set_cpu_quota(1000),
    "CPUPeriod": lambda a: a.set_cpu_period(100000),
    "CPURealtimeRuntime": lambda a: a.set_cpu_realtime_runtime(1),
    "CPURealtimePeriod": lambda a: a.set_cpu_realtime_period(1),
    "CPUSetCPUs": lambda a: a.set_cpuset_cpus("0-1"),
    "CPUSetMems": lambda a: a.set_cpuset_mems("0"),
    "PidsLimit": lambda a: a.set_pids_limit(100),
    "BlockioClass": lambda a: a.set_blockio_class("slow"),
    "RdtClass": lambda a: a.set_rdt_class("gold"),
    "CgroupsPath": lambda a: a.set_cgroups_path("/kubepods/x"),
    "OomScoreAdj": lambda a: a.set_oom_score_adj(500),
    "IoPriority": lambda a: a.set_io_priority(api.IOPRIO_CLASS_BE, 4),
    "SeccompPolicy": lambda a: a.set_seccomp_policy(api.LinuxSeccomp(default_action="X")),
    "LinuxSched": lambda a: a.set_scheduler(api.LinuxScheduler(nice=5)),
    "MemoryPolicy": lambda a: a.set_memory_policy(api.MPOL_BIND, "0"),
    "RdtClosID": lambda a: a.set_rdt_clos_id("c1"),
    "RdtSchemata": lambda a: a.set_rdt_schemata(["L3:0=ff"]),
    "RdtEnableMonitoring": lambda a: a.message.linux.rdt.enable_monitoring.SetInParent(),
}


@pytest.mark.parametrize("field", sorted(SIMPLE))
def test_simple_field_conflicts_with_upstream_message(field: str) -> None:
    m = make_merger()
    apply(m, "10-a", SIMPLE[field])
    assert m.result().owners.owners["ctr0"].simple[getattr(F, field)] == "10-a"
    with pytest.raises(AdjustmentConflict) as exc:
        apply(m, "20-b", SIMPLE[field])
    # upstream joins field and (empty) key with a space, so the message ends in one
    assert str(exc.value) == conflict_message(field)


def test_different_simple_fields_merge() -> None:
    m = make_merger()
    apply(m, "10-a", lambda a: a.set_memory_limit(100).set_cpuset_cpus("1"))
    apply(m, "20-b", lambda a: a.set_cpu_shares(7).set_cpu_quota(9).add_unified("a", "1"))
    res = m.result().adjust.linux.resources
    assert (res.memory.limit.value, res.cpu.cpus, res.cpu.shares.value) == (100, "1", 7)
    assert res.cpu.quota.value == 9 and dict(res.unified) == {"a": "1"}
    simple = m.result().owners.owners["ctr0"].simple
    assert simple[F.MemLimit] == "10-a" and simple[F.CPUShares] == "20-b"


def test_args_leading_empty_overrides() -> None:
    m = make_merger()
    apply(m, "10-a", lambda a: a.set_args(["sh", "-c", "x"]))
    apply(m, "20-b", lambda a: a.update_args([*m.container.args, "y"]))
    assert list(m.result().adjust.args) == ["sh", "-c", "x", "y"]
    assert list(m.container.args) == ["sh", "-c", "x", "y"]
    assert list(m.pristine.args) == ["echo", "hello"]
    assert m.result().owners.owners["ctr0"].simple[F.Args] == "20-b"
    with pytest.raises(AdjustmentConflict):
        apply(m, "30-c", lambda a: a.set_args(["z"]))


def test_rdt_remove_takes_over_and_cancels_with_fields() -> None:
    m = make_merger()
    apply(m, "10-a", lambda a: a.set_rdt_clos_id("c1"))
    assert m.container.linux.rdt.clos_id.value == "c1"
    apply(m, "20-b", lambda a: a.remove_rdt())
    assert m.result().adjust.linux.rdt == api.LinuxRdt(remove=True)
    assert not m.container.linux.HasField("rdt")
    with pytest.raises(AdjustmentConflict, match="RdtSchemata"):
        apply(m, "30-c", lambda a: a.set_rdt_schemata(["x"]))
    m2 = make_merger()
    apply(m2, "10-a", lambda a: a.remove_rdt().set_rdt_clos_id("c2"))
    rdt = m2.result().adjust.linux.rdt
    assert not rdt.remove and rdt.clos_id.value == "c2"


def test_reply_without_rdt_adds_no_rdt() -> None:
    m = make_merger()
    apply(m, "10-a", lambda a: a.set_cgroups_path("/x"))
    assert not m.result().adjust.linux.HasField("rdt")


# ------------------------------------------------------------ hooks, visibility


def test_hooks_accumulate() -> None:
    m = make_merger()
    apply(m, "10-a", lambda a: a.add_hooks(api.Hooks(prestart=[api.Hook(path="/a")])))
    apply(m, "20-b", lambda a: a.add_hooks(api.Hooks(prestart=[api.Hook(path="/b")],
                                                     poststop=[api.Hook(path="/c")])))
    adj = m.result().adjust
    assert [h.path for h in adj.hooks.prestart] == ["/a", "/b"]
    assert [h.path for h in adj.hooks.poststop] == ["/c"]
    assert [h.path for h in m.container.hooks.prestart] == ["/a", "/b"]
    assert m.result().owners.owners["ctr0"].simple[F.OciHooks] == "10-a,20-b"


def test_later_plugin_sees_earlier_changes() -> None:
    m = make_merger()
    apply(m, "10-a", lambda a: a.add_annotation("a", "1").add_env("PATH", "/usr/bin")
          .add_mount("/data").set_memory_limit(42).add_rlimit("nofile", 9, 8)
          .set_sysctl("net.x", "1").add_or_replace_namespace("network", "/new"))
    ctr = m.container
    assert ctr.annotations["a"] == "1"
    assert list(ctr.env) == ["KEEP=1", "PATH=/usr/bin"]
    assert [mt.destination for mt in ctr.mounts] == ["/orig", "/data"]
    assert ctr.linux.resources.memory.limit.value == 42
    assert [(r.type, r.hard) for r in ctr.rlimits] == [("nofile", 9)]
    assert ctr.linux.sysctl["net.x"] == "1"
    assert [(n.type, n.path) for n in ctr.linux.namespaces] == [("network", "/new")]
    assert m.pristine.annotations == {"orig": "1"}
    assert list(m.pristine.env) == ["PATH=/bin", "KEEP=1"]


def test_cdi_devices_not_put_into_container() -> None:
    m = make_merger()
    apply(m, "10-a", lambda a: a.add_cdi_device("vendor.com/gpu=0"))
    assert [d.name for d in m.result().adjust.CDI_devices] == ["vendor.com/gpu=0"]
    assert not m.container.CDI_devices


def test_result_is_a_snapshot_and_reply_is_not_mutated() -> None:
    m = make_merger()
    adj = Adjustment().add_annotation("a", "1").remove_annotation("b")
    before = adj.message.SerializeToString()
    m.apply("10-a", reply(adj))
    first = m.result()
    apply(m, "20-b", lambda a: a.add_annotation("c", "2"))
    assert adj.message.SerializeToString() == before
    assert dict(first.adjust.annotations) == {"a": "1", "-b": ""}


# ------------------------------------------------------------ updates in creation


def test_update_of_created_container_rejected() -> None:
    m = make_merger()
    msg = 'plugin "10-a" asked update of "ctr0" during creation'
    with pytest.raises(InvalidArgument, match=msg):
        m.apply("10-a", reply(Adjustment(), Update("ctr0").set_cpu_shares(1)))


def test_creation_updates_and_evictions_merge() -> None:
    m = make_merger()
    m.apply("10-a", reply(Adjustment(), Update("other").set_cpu_shares(5)))
    m.apply("20-b", api.CreateContainerResponse(
        update=[Update("other").set_memory_limit(9).message],
        evict=[api.ContainerEviction(container_id="x", reason="r1")]))
    m.apply("30-c", api.CreateContainerResponse(
        evict=[api.ContainerEviction(container_id="x", reason="r2")]))
    res = m.result()
    [u] = res.updates
    assert (u.container_id, u.linux.resources.cpu.shares.value) == ("other", 5)
    assert u.linux.resources.memory.limit.value == 9
    assert [(e.container_id, e.reason) for e in res.evictions] == [("x", "r1")]
    assert res.owners.owners["other"].simple[F.CPUShares] == "10-a"
    with pytest.raises(AdjustmentConflict, match="CPUShares"):
        m.apply("40-d", reply(Adjustment(), Update("other").set_cpu_shares(6)))
    with pytest.raises(InvalidArgument, match="eviction"):
        evict = api.ContainerEviction(container_id="ctr0")
        m.apply("50-e", api.CreateContainerResponse(evict=[evict]))


# ------------------------------------------------------------ UpdateMerger


def test_update_merger_puts_target_last_and_ands_ignore_failure() -> None:
    m = UpdateMerger("target")
    m.apply("10-a", [Update("target", ignore_failure=True).set_cpu_shares(3).message,
                     Update("x").set_memory_limit(1).message])
    m.apply("20-b", [Update("y", ignore_failure=True).set_cpu_quota(2).message,
                     Update("target", ignore_failure=False).set_memory_limit(7).message], [])
    m.apply("30-c", [Update("y", ignore_failure=True).set_cpu_period(4).message])
    updates, evictions = m.result()
    assert [u.container_id for u in updates] == ["x", "y", "target"]
    assert [u.ignore_failure for u in updates] == [False, True, False]
    target = updates[-1].linux.resources
    assert (target.cpu.shares.value, target.memory.limit.value) == (3, 7)
    assert evictions == []


def test_update_merger_requested_base_and_hugepages_replace() -> None:
    base = api.LinuxResources(hugepage_limits=[api.HugepageLimit(page_size="2MB", limit=1)])
    base.memory.limit.value = 100
    m = UpdateMerger("t", requested=base)
    m.apply("10-a", [Update("t").add_hugepage_limit("2MB", 5).message], ())
    [u] = m.result()[0]
    assert u.linux.resources.memory.limit.value == 100
    assert [(h.page_size, h.limit) for h in u.linux.resources.hugepage_limits] == [("2MB", 5)]


def test_update_merger_without_target_update_omits_it() -> None:
    m = UpdateMerger("t")
    m.apply("10-a", [Update("x").set_cpu_shares(1).message],
            [api.ContainerEviction(container_id="z", reason="oom")])
    updates, evictions = m.result()
    assert [u.container_id for u in updates] == ["x"]
    assert [e.container_id for e in evictions] == ["z"]


def test_update_conflict_raises_unless_ignored() -> None:
    m = UpdateMerger()
    m.apply("10-a", [Update("x").set_cpu_shares(1).message])
    with pytest.raises(AdjustmentConflict) as exc:
        m.apply("20-b", [Update("x").set_cpu_shares(2).message])
    assert str(exc.value) == conflict_message("CPUShares")
    # an ignored failure drops the whole update, including claims it made first
    ignored = Update("x", ignore_failure=True).set_memory_limit(5).set_cpu_shares(3)
    m.apply("30-c", [ignored.message])
    assert m.owners.owner("x", F.MemLimit) is None
    m.apply("40-d", [Update("x").set_memory_limit(6).message])
    [u] = m.result()[0]
    assert (u.linux.resources.cpu.shares.value, u.linux.resources.memory.limit.value) == (1, 6)
    assert not u.ignore_failure


# ------------------------------------------------------------ model-based


OPS = st.sampled_from(["set", "remove", "replace"])
PLAN = st.lists(
    st.dictionaries(st.sampled_from(["orig", "PATH", "k1", "k2"]), OPS, max_size=3),
    min_size=1, max_size=4,
)
INITIAL = {"annotation": {"orig": "1"}, "env": {"PATH": "/bin", "KEEP": "1"}}


def _model(
    plan: list[dict[str, str]], initial: dict[str, str]
) -> tuple[int | None, dict[str, str], dict[str, str]]:
    """Expected (index of failing plugin, values, owners) for a plan."""
    values, owners = dict(initial), {}
    for i, ops in enumerate(plan):
        me = f"{i}0-p"
        for key, op in ops.items():
            if op in ("remove", "replace"):
                owners[key] = "-" + me
                values.pop(key, None)
        for key, op in ops.items():
            if op in ("set", "replace"):
                if owners.get(key, "-" + me) != "-" + me:
                    return i, values, owners
                owners[key], values[key] = me, me
    return None, values, owners


def _build(kind: str, ops: dict[str, str], value: str) -> Adjustment:
    adj = Adjustment()
    for key, op in ops.items():
        if op != "set":
            if kind == "annotation":
                adj.remove_annotation(key)
            else:
                adj.remove_env(key)
        if op != "remove":
            if kind == "annotation":
                adj.add_annotation(key, value)
            else:
                adj.add_env(key, value)
    return adj


@given(PLAN, st.sampled_from(["annotation", "env"]))
def test_ownership_matches_model(plan: list[dict[str, str]], kind: str) -> None:
    m = make_merger()
    failed: int | None = None
    for i, ops in enumerate(plan):
        try:
            m.apply(f"{i}0-p", reply(_build(kind, ops, f"{i}0-p")))
        except AdjustmentConflict:
            failed = i
            break
    want_failed, want_values, want_owners = _model(plan, INITIAL[kind])
    assert failed == want_failed
    if failed is not None:
        return
    result = m.result()
    field = F.Annotations if kind == "annotation" else F.Env
    owners = result.owners.owners["ctr0"].compound[field].owners if want_owners else {}
    assert dict(owners) == want_owners
    if kind == "env":
        assert dict(e.split("=", 1) for e in m.container.env) == want_values
        return
    assert dict(m.container.annotations) == want_values
    # the merged adjustment, applied to the pristine container, gives the working copy
    applied = dict(m.pristine.annotations)
    merged = result.adjust.annotations
    for k in merged:
        if api.is_marked_for_removal(k):
            applied.pop(api.clear_removal_marker(k), None)
    applied.update({k: v for k, v in merged.items() if not api.is_marked_for_removal(k)})
    assert applied == want_values
