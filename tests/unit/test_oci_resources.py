"""CRI LinuxContainerResources ⇄ OCI linux.resources (CRI-TO-OCI.md §2.13, §3) and the
host cgroup probe, over fake host facts and fake /sys trees."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb

from pycrid.errors import InvalidArgument
from pycrid.host.cgroups import CgroupHost, page_size_name, parse_id_list, probe
from pycrid.nri import api
from pycrid.oci.resources import (
    ResourcePolicy,
    apply,
    cri_from_nri,
    cri_resources,
    record_of,
    resources_json,
    swap_follows_limit,
    update_payload,
    validate,
    with_resources,
    with_sandbox_shares,
)
from pycrid.store.db import Database
from pycrid.store.records import ContainerRecord, container_store

V1 = CgroupHost("v1", frozenset({"cpu", "cpuset", "memory", "pids"}), swap=True,
                hugepage_sizes=("2MB", "1GB"), cpus=frozenset({0, 1}), mems=frozenset({0}))
V1_NOSWAP = CgroupHost("v1", frozenset({"cpu", "memory"}), swap=False)
HYBRID = CgroupHost("hybrid", frozenset({"cpu", "memory"}), swap=True)
V2 = CgroupHost("v2", frozenset({"cpu", "memory", "hugetlb", "pids"}), swap=True,
                hugepage_sizes=("2MB",))


def res(**kw: Any) -> pb.LinuxContainerResources:
    return pb.LinuxContainerResources(**kw)


def pol(host: CgroupHost = V1, **kw: Any) -> ResourcePolicy:
    return ResourcePolicy(host, **kw)


# ---- mapping table --------------------------------------------------------------------


def test_mapping_table() -> None:
    out = apply({"devices": [{"allow": False, "access": "rwm"}]}, res(
        cpu_period=100000, cpu_quota=50000, cpu_shares=512, cpuset_cpus="0-1",
        cpuset_mems="0", memory_limit_in_bytes=64 << 20,
        memory_swap_limit_in_bytes=128 << 20), pol())
    assert out == {
        "devices": [{"allow": False, "access": "rwm"}],
        "cpu": {"period": 100000, "quota": 50000, "shares": 512, "cpus": "0-1", "mems": "0"},
        "memory": {"limit": 64 << 20, "swap": 128 << 20},
    }


def test_zero_values_are_not_set_but_objects_exist() -> None:
    assert apply({}, res(), pol()) == {"cpu": {}, "memory": {}}


def test_apply_does_not_touch_its_input() -> None:
    current = {"cpu": {"shares": 2}}
    out = apply(current, res(cpu_shares=1024), pol())
    assert current == {"cpu": {"shares": 2}} and out["cpu"]["shares"] == 1024


def test_update_overlays_only_set_fields() -> None:
    current = apply({}, res(cpu_quota=20000, cpu_period=100000,
                            memory_limit_in_bytes=32 << 20), pol())
    out = apply(current, res(cpu_quota=50000), pol())
    assert out["cpu"] == {"quota": 50000, "period": 100000}
    assert out["memory"] == {"limit": 32 << 20, "swap": 32 << 20}


# ---- swap rule ------------------------------------------------------------------------


def test_memory_limit_alone_means_no_swap_with_swap_accounting() -> None:
    assert apply({}, res(memory_limit_in_bytes=1000), pol())["memory"] == {
        "limit": 1000, "swap": 1000}


def test_memory_limit_alone_without_swap_accounting() -> None:
    assert apply({}, res(memory_limit_in_bytes=1000), pol(V1_NOSWAP))["memory"] == {
        "limit": 1000}


def test_swap_limit_dropped_without_swap_accounting() -> None:
    out = apply({}, res(memory_limit_in_bytes=1000, memory_swap_limit_in_bytes=3000),
                pol(V1_NOSWAP))
    assert out["memory"] == {"limit": 1000}


def test_swap_limit_kept_with_swap_accounting() -> None:
    out = apply({}, res(memory_limit_in_bytes=1000, memory_swap_limit_in_bytes=3000), pol(V2))
    assert out["memory"] == {"limit": 1000, "swap": 3000}


def test_unlimited_swap() -> None:
    out = apply({}, res(memory_limit_in_bytes=1000, memory_swap_limit_in_bytes=-1), pol())
    assert out["memory"] == {"limit": 1000, "swap": -1}


def test_swap_below_memory_limit_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"memory_swap_limit_in_bytes .*below "
                                              "memory_limit_in_bytes"):
        apply({}, res(memory_limit_in_bytes=2000, memory_swap_limit_in_bytes=1000), pol())


# ---- hugetlb --------------------------------------------------------------------------

HP = [pb.HugepageLimit(page_size="2MB", limit=4 << 20)]


def test_hugepages_dropped_when_disabled_by_default() -> None:
    assert "hugepageLimits" not in apply({}, res(hugepage_limits=HP), pol(V2))
    # disabled: not even validated (as containerd)
    validate(res(hugepage_limits=[pb.HugepageLimit(page_size="3MB", limit=1)]), pol(V1))


def test_hugepages_applied_when_enabled_and_present() -> None:
    out = apply({}, res(hugepage_limits=HP), pol(V2, disable_hugetlb_controller=False))
    assert out["hugepageLimits"] == [{"pageSize": "2MB", "limit": 4 << 20}]


def test_hugepages_missing_controller_tolerated() -> None:
    out = apply({}, res(hugepage_limits=HP), pol(V1, disable_hugetlb_controller=False))
    assert "hugepageLimits" not in out


def test_hugepages_missing_controller_refused() -> None:
    p = pol(V1, disable_hugetlb_controller=False, tolerate_missing_hugetlb_controller=False)
    with pytest.raises(InvalidArgument, match="no hugetlb cgroup controller"):
        apply({}, res(hugepage_limits=HP), p)
    apply({}, res(), p)  # nothing asked: nothing refused


def test_hugepage_size_not_offered_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"page size '1GB' is not offered.*2MB"):
        apply({}, res(hugepage_limits=[pb.HugepageLimit(page_size="1GB", limit=1 << 30)]),
              pol(V2, disable_hugetlb_controller=False))


# ---- unified --------------------------------------------------------------------------


@pytest.mark.parametrize("host", [V1, HYBRID])
def test_unified_refused_on_cgroup_v1(host: CgroupHost) -> None:
    with pytest.raises(InvalidArgument, match=r"unified \(memory.high\).*cgroup "
                                              f"{host.version}.*runc refuses"):
        apply({}, res(unified={"memory.high": "1000"}), pol(host))


def test_unified_copied_on_v2() -> None:
    out = apply({"unified": {"pids.max": "5"}}, res(unified={"memory.high": "1000"}), pol(V2))
    assert out["unified"] == {"pids.max": "5", "memory.high": "1000"}


# ---- validation -----------------------------------------------------------------------


@pytest.mark.parametrize("field,value", [
    ("cpu_period", -1), ("cpu_shares", -2), ("cpu_quota", -2),
    ("memory_limit_in_bytes", -5), ("memory_swap_limit_in_bytes", -2)])
def test_negative_values_refused(field: str, value: int) -> None:
    with pytest.raises(InvalidArgument, match=field):
        validate(res(**{field: value}), pol())


def test_minus_one_is_unlimited() -> None:
    out = apply({}, res(cpu_quota=-1, memory_limit_in_bytes=-1), pol())
    assert out["cpu"]["quota"] == -1 and out["memory"] == {"limit": -1, "swap": -1}


def test_oom_score_adj_range() -> None:
    with pytest.raises(InvalidArgument, match="oom_score_adj"):
        validate(res(oom_score_adj=1001), pol())


@pytest.mark.parametrize("field", ["cpuset_cpus", "cpuset_mems"])
@pytest.mark.parametrize("value", ["a", "1-", "3-1", "0,,1", "-1", " 0"])
def test_malformed_cpuset_refused(field: str, value: str) -> None:
    with pytest.raises(InvalidArgument, match=f"{field} .*cpuset list"):
        validate(res(**{field: value}), pol())


def test_cpuset_not_online_refused() -> None:
    with pytest.raises(InvalidArgument, match="cpuset_cpus '0-3' names 2,3, not online"):
        validate(res(cpuset_cpus="0-3"), pol())
    with pytest.raises(InvalidArgument, match="cpuset_mems '1' names 1"):
        validate(res(cpuset_mems="1"), pol())
    validate(res(cpuset_cpus="0-3"), pol(V2))  # unknown online set: not checked


def test_parse_id_list() -> None:
    assert parse_id_list("0-2,5") == {0, 1, 2, 5}
    assert parse_id_list("7") == {7}


# ---- spec hooks -----------------------------------------------------------------------


def spec() -> dict[str, Any]:
    return {"process": {}, "linux": {"resources": {"devices": [{"allow": False,
                                                                "access": "rwm"}]}}}


def test_with_resources_sets_oom_and_keeps_devices() -> None:
    s = spec()
    with_resources(s, res(oom_score_adj=500, cpu_shares=100), pol(), -1000)
    assert s["process"]["oomScoreAdj"] == 500
    assert s["linux"]["resources"]["devices"] == [{"allow": False, "access": "rwm"}]
    assert s["linux"]["resources"]["cpu"] == {"shares": 100}


def test_with_resources_clamps_oom_to_the_daemons() -> None:
    s = spec()
    with_resources(s, res(oom_score_adj=-900), pol(), -500)
    assert s["process"]["oomScoreAdj"] == -500


def test_without_resources_nothing_but_pids_limit() -> None:
    s = spec()
    with_resources(s, None, pol(), 0)
    assert s == spec()
    with_resources(s, None, pol(pids_limit=42), 0)
    assert s["linux"]["resources"]["pids"] == {"limit": 42}
    assert "oomScoreAdj" not in s["process"]


def test_sandbox_shares() -> None:
    s = spec()
    with_sandbox_shares(s)
    assert s["linux"]["resources"]["cpu"] == {"shares": 2}


# ---- reverse mapping ------------------------------------------------------------------


def test_reverse_mapping_round_trip() -> None:
    s = spec()
    req = res(cpu_period=100000, cpu_quota=50000, cpu_shares=512, cpuset_cpus="0",
              cpuset_mems="0", memory_limit_in_bytes=1 << 24, oom_score_adj=300,
              unified={"memory.high": "123"},
              hugepage_limits=[pb.HugepageLimit(page_size="2MB", limit=1 << 21)])
    with_resources(s, req, pol(V2, disable_hugetlb_controller=False, pids_limit=9), 0)
    recorded = record_of(s)
    assert "devices" not in recorded and recorded["oomScoreAdj"] == 300
    assert recorded["pids"] == {"limit": 9}
    back = cri_resources(recorded)
    expected = pb.LinuxContainerResources()
    expected.CopyFrom(req)
    expected.memory_swap_limit_in_bytes = 1 << 24  # the swap rule shows
    assert back == expected


def test_reverse_of_nothing() -> None:
    assert cri_resources({}) == pb.LinuxContainerResources()


def test_update_payload_drops_devices() -> None:
    assert update_payload({"devices": [], "cpu": {"shares": 2}}) == {"cpu": {"shares": 2}}


def test_cri_from_nri() -> None:
    n = api.LinuxResources()
    n.memory.limit.value = 1000
    n.cpu.quota.value = 5
    n.cpu.cpus = "1"
    n.unified["a.b"] = "c"
    assert cri_from_nri(n) == res(memory_limit_in_bytes=1000, cpu_quota=5, cpuset_cpus="1",
                                  unified={"a.b": "c"})


def test_resources_json_is_gos() -> None:
    assert resources_json(res(cpu_period=100000, memory_limit_in_bytes=5,
                              hugepage_limits=HP)) == {
        "cpu_period": 100000, "memory_limit_in_bytes": 5,
        "hugepage_limits": [{"page_size": "2MB", "limit": 4 << 20}]}


# ---- host probe -----------------------------------------------------------------------


def _w(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_page_size_names() -> None:
    assert [page_size_name(k) for k in (64, 2048, 32768, 1048576)] == [
        "64KB", "2MB", "32MB", "1GB"]


def test_probe_hybrid_v1(tmp_path: Path) -> None:
    root, proc, sys = tmp_path / "cg", tmp_path / "proc", tmp_path / "sys"
    _w(root / "unified" / "cgroup.controllers")
    _w(root / "memory" / "memory.memsw.limit_in_bytes", "9223372036854771712")
    _w(proc / "cgroups", "#subsys_name\thierarchy\tnum_cgroups\tenabled\n"
       "cpu\t1\t2\t1\nmemory\t4\t3\t1\nhugetlb\t0\t2\t1\npids\t8\t1\t0\n")
    _w(sys / "devices/system/cpu/online", "0-3\n")
    _w(sys / "devices/system/node/online", "0\n")
    os.makedirs(sys / "kernel/mm/hugepages/hugepages-1048576kB")
    os.makedirs(sys / "kernel/mm/hugepages/hugepages-2048kB")
    host = probe(str(root), proc=str(proc), sys=str(sys))
    assert host == CgroupHost("hybrid", frozenset({"cpu", "memory"}), True, ("2MB", "1GB"),
                              frozenset({0, 1, 2, 3}), frozenset({0}))
    assert not host.unified and not host.hugetlb


def test_probe_v1_without_swap(tmp_path: Path) -> None:
    root, proc = tmp_path / "cg", tmp_path / "proc"
    _w(root / "memory" / "memory.limit_in_bytes")
    _w(proc / "cgroups", "#h\nmemory\t4\t3\t1\n")
    host = probe(str(root), proc=str(proc), sys=str(tmp_path / "sys"))
    assert (host.version, host.swap, host.cpus) == ("v1", False, None)


def test_probe_v2(tmp_path: Path) -> None:
    root, proc = tmp_path / "cg", tmp_path / "proc"
    _w(root / "cgroup.controllers", "cpuset cpu memory hugetlb pids\n")
    _w(proc / "self" / "cgroup", "0::/\n")
    host = probe(str(root), proc=str(proc), sys=str(tmp_path / "sys"))
    assert host.unified and host.hugetlb and not host.swap
    _w(root / "system.slice" / "memory.swap.max", "max\n")  # a child has swap
    assert probe(str(root), proc=str(proc), sys=str(tmp_path / "sys")).swap
    _w(proc / "self" / "cgroup", "0::/mine\n")  # our own cgroup decides
    (root / "mine").mkdir()
    assert not probe(str(root), proc=str(proc), sys=str(tmp_path / "sys")).swap


# ---- container records ----------------------------------------------------------------


def test_record_keeps_resources_and_old_rows_load(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "m.db"))
    store = container_store(db)
    recorded = {"cpu": {"shares": 512}, "memory": {"limit": 1 << 24, "swap": 1 << 24},
                "oomScoreAdj": 300}
    store.put(ContainerRecord(id="new", sandbox_id="s", name="n", config=pb.ContainerConfig(),
                              created_at=1, resources=recorded))
    store.put(ContainerRecord(id="old", sandbox_id="s", name="o", config=pb.ContainerConfig(),
                              created_at=1))
    with db.transaction() as c:  # a row written before the field existed
        row = json.loads(c.execute("SELECT record FROM containers WHERE id = 'old'")
                         .fetchone()[0])
        del row["resources"]
        c.execute("UPDATE containers SET record = ? WHERE id = 'old'", (json.dumps(row),))
    db.close()
    again = container_store(Database(str(tmp_path / "m.db")))
    new, old = again.get("new"), again.get("old")
    assert new is not None and old is not None
    assert new.resources == recorded
    assert cri_resources(new.resources).cpu_shares == 512
    assert old.resources == {}
    assert cri_resources(old.resources) == pb.LinuxContainerResources()


M = 1024 * 1024


@pytest.mark.parametrize(("memory", "update", "swap"), [
    ({"limit": 32 * M, "swap": 32 * M}, {"limit": 128 * M}, 128 * M),  # no swap stays no swap
    ({"limit": 32 * M, "swap": 32 * M}, {"limit": 16 * M}, 16 * M),
    ({"limit": 32 * M, "swap": 32 * M}, {"limit": -1}, -1),
    ({"limit": 32 * M, "swap": 64 * M}, {"limit": 128 * M}, 128 * M),  # raised to be valid
    ({"limit": 32 * M, "swap": 64 * M}, {"limit": 48 * M}, None),  # still valid: untouched
    ({"limit": 32 * M, "swap": -1}, {"limit": 128 * M}, None),  # unlimited swap stays
    ({"limit": 32 * M}, {"limit": 128 * M}, None),  # no swap accounting
    ({"limit": 32 * M, "swap": 32 * M}, {"limit": 128 * M, "swap": 256 * M}, 256 * M),
])
def test_swap_follows_a_plugins_new_memory_limit(memory: dict[str, Any],
                                                 update: dict[str, Any],
                                                 swap: int | None) -> None:
    got = swap_follows_limit(memory, {"memory": update, "cpu": {"shares": 2}})
    assert got["cpu"] == {"shares": 2}
    assert got["memory"].get("swap") == swap
    assert got["memory"]["limit"] == update["limit"]
