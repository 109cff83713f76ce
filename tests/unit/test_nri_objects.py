"""Records, OCI specs and CRI resources as NRI sees them (core/nri_objects.py)."""

from __future__ import annotations

from cri_api.v1 import api_pb2 as pb

from pycrid.core.nri_objects import (
    container_object,
    oci_resource_update,
    pod_object,
    resources_from_cri,
    resources_from_oci,
)
from pycrid.nri import api
from pycrid.store.records import ContainerRecord, SandboxRecord


def _pod(**linux: object) -> SandboxRecord:
    cfg = pb.PodSandboxConfig(metadata=pb.PodSandboxMetadata(name="web", namespace="ns",
                                                             uid="u1"),
                              labels={"app": "web"}, annotations={"a": "1"})
    cfg.linux.cgroup_parent = "/kubepods/pod1"
    if "host_pid" in linux:
        cfg.linux.security_context.namespace_options.pid = pb.NODE
    return SandboxRecord(id="s1", name="web_ns_u1_0", config=cfg, runtime_handler="runc",
                         created_at=1, phase="ready", pid=42, netns="/run/netns/cni-1")


def test_pod_identity_namespaces_and_resources() -> None:
    rec = _pod()
    rec.config.linux.resources.CopyFrom(pb.LinuxContainerResources(cpu_shares=256))
    pod = pod_object(rec, "/kubepods/pod1/s1")
    assert (pod.id, pod.name, pod.namespace, pod.uid, pod.pid) == ("s1", "web", "ns", "u1", 42)
    assert dict(pod.labels) == {"app": "web"} and pod.runtime_handler == "runc"
    assert pod.linux.cgroups_path == "/kubepods/pod1/s1"
    assert {(n.type, n.path) for n in pod.linux.namespaces} == {
        ("pid", ""), ("ipc", ""), ("uts", ""), ("mount", ""), ("network", "/run/netns/cni-1")}
    assert pod.linux.pod_resources.cpu.shares.value == 256
    host = pod_object(_pod(host_pid=True), "")
    assert "pid" not in {n.type for n in host.linux.namespaces}


SPEC = {
    "process": {"args": ["sh"], "env": ["PATH=/bin"], "oomScoreAdj": 5,
                "user": {"uid": 1, "gid": 2, "additionalGids": [3]},
                "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 10, "soft": 5}]},
    "mounts": [{"destination": "/data", "type": "bind", "source": "/h", "options": ["ro"]}],
    "hooks": {"prestart": [{"path": "/bin/hook", "args": ["hook"], "timeout": 3}]},
    "annotations": {"io.kubernetes.cri.container-name": "c"},
    "linux": {"cgroupsPath": "/k8s.io/c1", "sysctl": {"net.ipv4.ip_forward": "0"},
              "namespaces": [{"type": "pid", "path": "/proc/42/ns/pid"}],
              "devices": [{"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229,
                           "fileMode": 438}],
              "resources": {"memory": {"limit": 1 << 20}, "cpu": {"shares": 2, "cpus": "0"},
                            "pids": {"limit": 9},
                            "devices": [{"allow": False, "access": "rwm"}]}},
}


def test_container_from_record_and_spec() -> None:
    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="c"), labels={"l": "1"},
                             annotations={"cri": "yes"})
    cfg.linux.security_context.seccomp.profile_type = pb.SecurityProfile.Unconfined
    rec = ContainerRecord(id="c1", sandbox_id="s1", name="n", config=cfg, created_at=7,
                          phase="created", started_at=8, finished_at=9, exit_code=3,
                          reason="Error", pid=0, image_name="busybox:latest", image_id="sha256:x")
    ctr = container_object(rec, SPEC)
    assert (ctr.id, ctr.pod_sandbox_id, ctr.name) == ("c1", "s1", "c")
    assert ctr.state == api.CONTAINER_STOPPED
    assert (ctr.created_at, ctr.started_at, ctr.finished_at, ctr.exit_code) == (7, 8, 9, 3)
    assert ctr.status_reason == "Error"
    assert dict(ctr.annotations) == {"io.kubernetes.cri.container-name": "c", "cri": "yes"}
    assert list(ctr.args) == ["sh"] and list(ctr.env) == ["PATH=/bin"]
    assert [(m.destination, list(m.options)) for m in ctr.mounts] == [("/data", ["ro"])]
    assert ctr.hooks.prestart[0].timeout.value == 3
    assert [(r.type, r.hard, r.soft) for r in ctr.rlimits] == [("RLIMIT_NOFILE", 10, 5)]
    assert (ctr.user.uid, ctr.user.gid, list(ctr.user.additional_gids)) == (1, 2, [3])
    linux = ctr.linux
    assert linux.oom_score_adj.value == 5 and linux.cgroups_path == "/k8s.io/c1"
    assert linux.devices[0].file_mode.value == 438
    assert linux.resources.memory.limit.value == 1 << 20
    assert linux.resources.pids.limit == 9
    assert linux.seccomp_profile.profile_type == api.SecurityProfile.UNCONFINED
    assert ctr.image.name == "busybox:latest" and ctr.image.config_digest == "sha256:x"


def test_resources_round_trip_to_runc_update() -> None:
    cri = pb.LinuxContainerResources(memory_limit_in_bytes=100, cpu_shares=2, cpu_quota=5000,
                                     cpu_period=100000, cpuset_cpus="0-1",
                                     hugepage_limits=[pb.HugepageLimit(page_size="2MB",
                                                                       limit=4)])
    nri = resources_from_cri(cri)
    assert not nri.memory.HasField("swap")  # zero is "not set" in CRI
    assert oci_resource_update(nri) == {
        "memory": {"limit": 100},
        "cpu": {"shares": 2, "quota": 5000, "period": 100000, "cpus": "0-1"},
        "hugepageLimits": [{"pageSize": "2MB", "limit": 4}]}
    assert oci_resource_update(api.LinuxResources()) == {}
    back = resources_from_oci(SPEC["linux"]["resources"])  # type: ignore[index]
    assert back.cpu.cpus == "0" and back.devices[0].access == "rwm"
