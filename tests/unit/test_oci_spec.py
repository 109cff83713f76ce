"""OCI spec builder: one test per rule of CRI-TO-OCI.md (section in each name/docstring)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb

from pycrid.errors import InvalidArgument
from pycrid.oci.container_spec import ContainerSpecRequest, container_spec
from pycrid.oci.defaults import ALL_CAPABILITIES, DEFAULT_CAPABILITIES, default_spec
from pycrid.oci.sandbox_spec import SandboxSpecRequest, sandbox_spec
from pycrid.oci.spec import DeviceNode, Namespaces, cgroups_path
from pycrid.oci.spec_mounts import SandboxFiles, image_volumes
from tests.support.spec_args import spec_inputs

SID = "s" * 64
CID = "c" * 64
ROOT = "/var/lib/pycrid/sandboxes/" + SID
STATE = "/run/pycrid/sandboxes/" + SID
FILES = SandboxFiles(hostname=ROOT + "/hostname", hosts=ROOT + "/hosts",
                     resolv_conf=ROOT + "/resolv.conf", shm=STATE + "/shm")
PAUSE = {"config": {"Entrypoint": ["/pause"], "User": "65535:65535"}}
PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PASSWD = "root:x:0:0:root:/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\n"
GROUP = "root:x:0:\nalice:x:1000:\nextra:x:50000:alice\nwheel:x:10:root,alice\n"

#: The namespaces of a pod whose pause process is pid 42.
PAUSE_42 = Namespaces(*(f"/proc/42/ns/{k}" for k in ("net", "ipc", "uts", "pid", "user")))


def pod(**linux_sc: Any) -> pb.PodSandboxConfig:
    cfg = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name="web", namespace="ns", uid="u1", attempt=0),
        hostname="web-host", log_directory="/var/log/pods/x",
    )
    cfg.linux.security_context.CopyFrom(pb.LinuxSandboxSecurityContext(**linux_sc))
    return cfg


def sbx(cfg: pb.PodSandboxConfig | None = None, image: dict[str, Any] | None = None,
        **kw: Any) -> dict[str, Any]:
    inputs, groups = spec_inputs(image or PAUSE, kw)
    return sandbox_spec(SandboxSpecRequest(cfg or pod(), SID,
                                           pause_image="registry.k8s.io/pause:3.10.2",
                                           files=FILES, netns_path="/var/run/netns/cni-1",
                                           **kw), inputs, **groups)


def ctr(cfg: pb.ContainerConfig | None = None, sandbox: pb.PodSandboxConfig | None = None,
        image: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    kw.setdefault("etc_passwd", PASSWD)
    kw.setdefault("etc_group", GROUP)
    kw.setdefault("files", FILES)
    kw.setdefault("node_hostname", "node1")
    inputs, groups = spec_inputs({"config": {"Cmd": ["sh"]}} if image is None else image, kw)
    return container_spec(ContainerSpecRequest(
        cfg or cc(), sandbox or pod(), container_id=CID, sandbox_id=SID, namespaces=PAUSE_42,
        image_name="docker.io/library/x:1",
        volumes_dir="/var/lib/pycrid/containers/" + CID + "/volumes", **kw), inputs, **groups)


def cc(**kw: Any) -> pb.ContainerConfig:
    linux = kw.pop("sc", None)
    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="app"), **kw)
    if linux is not None:
        cfg.linux.security_context.CopyFrom(linux)
    return cfg


def sc(**kw: Any) -> pb.LinuxContainerSecurityContext:
    return pb.LinuxContainerSecurityContext(**kw)


def dests(spec: dict[str, Any]) -> list[str]:
    return [m["destination"] for m in spec["mounts"]]


def mount(spec: dict[str, Any], dest: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [m for m in spec["mounts"] if m["destination"] == dest]
    assert len(found) == 1
    return found[0]


# §1.2 base spec

def test_default_spec_fields() -> None:
    s = default_spec()
    assert s["root"] == {"path": "rootfs"}
    assert s["process"]["cwd"] == "/"
    assert s["process"]["user"] == {"uid": 0, "gid": 0}
    assert s["process"]["noNewPrivileges"] is True
    assert "rlimits" not in s["process"]
    assert s["linux"]["resources"]["devices"] == [{"allow": False, "access": "rwm"}]
    assert [n["type"] for n in s["linux"]["namespaces"]] == \
        ["pid", "ipc", "uts", "mount", "network"]
    assert all("path" not in n for n in s["linux"]["namespaces"])
    json.dumps(s)


def test_default_mounts_in_order_without_run() -> None:
    m = default_spec()["mounts"]
    assert [(x["destination"], x["type"], x["source"], x["options"]) for x in m] == [
        ("/proc", "proc", "proc", ["nosuid", "noexec", "nodev"]),
        ("/dev", "tmpfs", "tmpfs", ["nosuid", "strictatime", "mode=755", "size=65536k"]),
        ("/dev/pts", "devpts", "devpts",
         ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]),
        ("/dev/shm", "tmpfs", "shm",
         ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]),
        ("/dev/mqueue", "mqueue", "mqueue", ["nosuid", "noexec", "nodev"]),
        ("/sys", "sysfs", "sysfs", ["nosuid", "noexec", "nodev", "ro"]),
    ]


def test_default_masked_and_readonly_paths() -> None:
    linux = default_spec()["linux"]
    assert linux["maskedPaths"] == [
        "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
        "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware",
        "/sys/devices/virtual/powercap", "/proc/scsi"]
    assert linux["readonlyPaths"] == [
        "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]


def test_default_capabilities_14_in_order() -> None:
    caps = default_spec()["process"]["capabilities"]
    want = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
            "CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
            "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"]
    assert caps == {"bounding": want, "effective": want, "permitted": want}


def test_default_spec_is_a_fresh_copy() -> None:
    a = default_spec()
    a["mounts"][0]["options"].append("x")
    assert default_spec()["mounts"][0]["options"] == ["nosuid", "noexec", "nodev"]


# §1.3 pause process

def test_sandbox_process_from_pause_image() -> None:
    s = sbx()
    p = s["process"]
    assert p["args"] == ["/pause"]
    assert p["env"] == []
    assert p["cwd"] == "/"
    assert p["terminal"] is False
    assert p["user"] == {"uid": 65535, "gid": 65535, "additionalGids": [65535]}
    assert p["noNewPrivileges"] is True
    assert p["oomScoreAdj"] == -998
    assert s["hostname"] == "web-host"
    assert s["root"] == {"path": "rootfs", "readonly": True}
    assert p["capabilities"]["bounding"] == list(DEFAULT_CAPABILITIES)
    json.dumps(s)


def test_sandbox_args_entrypoint_then_cmd_env_cwd() -> None:
    image = {"config": {"Entrypoint": ["/a"], "Cmd": ["-b"], "Env": ["X=1"],
                        "WorkingDir": "/w"}}
    p = sbx(image=image)["process"]
    assert (p["args"], p["env"], p["cwd"]) == (["/a", "-b"], ["X=1"], "/w")
    assert p["user"] == {"uid": 0, "gid": 0}


def test_sandbox_without_args_is_an_error() -> None:
    with pytest.raises(InvalidArgument):
        sbx(image={"config": {}})


def test_sandbox_user_from_security_context_overrides_image() -> None:
    cfg = pod(run_as_user=pb.Int64Value(value=1000), run_as_group=pb.Int64Value(value=7),
              supplemental_groups=[5, 6])
    assert sbx(cfg, etc_passwd=PASSWD)["process"]["user"] == \
        {"uid": 1000, "gid": 7, "additionalGids": [7]}


def test_sandbox_group_without_user_is_an_error() -> None:
    with pytest.raises(InvalidArgument, match='user group "7" is specified without user'):
        sbx(pod(run_as_group=pb.Int64Value(value=7)))


def test_sandbox_privileged_only_makes_sysfs_rw() -> None:
    s = sbx(pod(privileged=True))
    assert mount(s, "/sys")["options"] == ["nosuid", "noexec", "nodev", "rw"]
    assert s["process"]["capabilities"]["bounding"] == list(DEFAULT_CAPABILITIES)
    assert len(s["linux"]["maskedPaths"]) == 11


def test_sandbox_oom_score_adj_clamped() -> None:
    assert sbx(min_oom_score_adj=0)["process"]["oomScoreAdj"] == 0
    assert sbx(min_oom_score_adj=-1000)["process"]["oomScoreAdj"] == -998


# §1.4 sandbox namespaces

def test_sandbox_namespaces_pod_network() -> None:
    assert sbx()["linux"]["namespaces"] == [
        {"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
        {"type": "network", "path": "/var/run/netns/cni-1"}]


def test_sandbox_host_namespaces_removed() -> None:
    opts = pb.NamespaceOption(network=pb.NODE, pid=pb.NODE, ipc=pb.NODE)
    assert sbx(pod(namespace_options=opts))["linux"]["namespaces"] == [{"type": "mount"}]


def test_sandbox_userns_pod() -> None:
    userns = pb.UserNamespace(mode=pb.POD,
                              uids=[pb.IDMapping(host_id=100000, container_id=0, length=65536)],
                              gids=[pb.IDMapping(host_id=200000, container_id=0, length=65536)])
    s = sbx(pod(namespace_options=pb.NamespaceOption(userns_options=userns)),
            userns_path=STATE + "/pinned-namespaces/user")
    assert s["linux"]["namespaces"][-1] == {"type": "user",
                                            "path": STATE + "/pinned-namespaces/user"}
    assert "uidMappings" not in s["linux"]  # runc reads them from the pinned namespace
    assert "net.ipv4.ping_group_range" not in s["linux"]["sysctl"]
    # Without a pinned namespace runc makes one, with the pod's maps.
    s = sbx(pod(namespace_options=pb.NamespaceOption(userns_options=userns)))
    assert {"type": "user"} in s["linux"]["namespaces"]
    assert s["linux"]["uidMappings"] == [{"containerID": 0, "hostID": 100000, "size": 65536}]
    assert s["linux"]["gidMappings"] == [{"containerID": 0, "hostID": 200000, "size": 65536}]


def test_sandbox_userns_hostnet_binds_sys() -> None:
    userns = pb.UserNamespace(mode=pb.POD, uids=[pb.IDMapping(length=1)],
                              gids=[pb.IDMapping(length=1)])
    s = sbx(pod(namespace_options=pb.NamespaceOption(network=pb.NODE, userns_options=userns)))
    assert {"type": "user"} in s["linux"]["namespaces"]
    assert mount(s, "/sys") == {"destination": "/sys", "type": "bind", "source": "/sys",
                                "options": ["rbind", "rro", "nosuid", "nodev", "noexec"]}


@pytest.mark.parametrize("userns", [
    pb.UserNamespace(mode=pb.CONTAINER),
    pb.UserNamespace(mode=pb.POD),
    pb.UserNamespace(mode=pb.NODE, uids=[pb.IDMapping(length=1)]),
])
def test_sandbox_bad_userns(userns: pb.UserNamespace) -> None:
    with pytest.raises(InvalidArgument):
        sbx(pod(namespace_options=pb.NamespaceOption(userns_options=userns)))


# §1.6 sandbox mounts

def test_sandbox_mounts_order() -> None:
    s = sbx()
    assert dests(s) == ["/proc", "/dev", "/dev/pts", "/dev/mqueue", "/sys",
                        "/dev/shm", "/etc/resolv.conf"]
    opts = ["rbind", "ro", "nosuid", "nodev", "noexec"]
    assert mount(s, "/dev/shm") == {"destination": "/dev/shm", "type": "bind",
                                    "source": STATE + "/shm", "options": opts}
    assert mount(s, "/etc/resolv.conf") == {"destination": "/etc/resolv.conf", "type": "bind",
                                            "source": ROOT + "/resolv.conf", "options": opts}


def test_sandbox_host_ipc_uses_host_shm() -> None:
    s = sbx(pod(namespace_options=pb.NamespaceOption(ipc=pb.NODE)))
    assert mount(s, "/dev/shm")["source"] == "/dev/shm"


# §1.7 sysctls

def test_sandbox_sysctl_defaults() -> None:
    assert sbx()["linux"]["sysctl"] == {"net.ipv4.ip_unprivileged_port_start": "0",
                                        "net.ipv4.ping_group_range": "0 2147483647"}


def test_sandbox_sysctls_given_win_and_host_network_skips_defaults() -> None:
    cfg = pod()
    cfg.linux.sysctls["net.ipv4.ip_unprivileged_port_start"] = "80"
    cfg.linux.sysctls["kernel.shm_rmid_forced"] = "1"
    assert sbx(cfg)["linux"]["sysctl"] == {
        "net.ipv4.ip_unprivileged_port_start": "80", "kernel.shm_rmid_forced": "1",
        "net.ipv4.ping_group_range": "0 2147483647"}
    host = pod(namespace_options=pb.NamespaceOption(network=pb.NODE))
    assert "sysctl" not in sbx(host)["linux"]


# §1.8 cgroupsPath

@pytest.mark.parametrize("parent, want", [
    ("", "/k8s.io/X"),
    ("kubepods-burstable-pod1.slice", "kubepods-burstable-pod1.slice:cri-containerd:X"),
    ("/kubepods.slice/kubepods-pod1.slice", "kubepods-pod1.slice:cri-containerd:X"),
    ("/kubepods/burstable/pod1", "/kubepods/burstable/pod1/X"),
    ("/kubepods//pod1/", "/kubepods/pod1/X"),
])
def test_cgroups_path(parent: str, want: str) -> None:
    assert cgroups_path(parent, "X") == want


def test_cgroups_path_driver_mismatch() -> None:
    with pytest.raises(InvalidArgument):
        cgroups_path("/kubepods/pod1", "X", "systemd")
    with pytest.raises(InvalidArgument):
        cgroups_path("a.slice", "X", "cgroupfs")
    assert cgroups_path("a.slice", "X", "systemd") == "a.slice:cri-containerd:X"


def test_sandbox_and_container_cgroups_path_use_pod_parent() -> None:
    cfg = pod()
    cfg.linux.cgroup_parent = "/kubepods/pod1"
    assert sbx(cfg)["linux"]["cgroupsPath"] == "/kubepods/pod1/" + SID
    assert ctr(sandbox=cfg)["linux"]["cgroupsPath"] == "/kubepods/pod1/" + CID


# §1.9 sandbox annotations

def test_sandbox_annotations() -> None:
    cfg = pod()
    cfg.annotations["keep.me/a"] = "1"
    cfg.annotations["other"] = "2"
    cfg.linux.resources.CopyFrom(pb.LinuxContainerResources(
        cpu_period=100000, cpu_quota=50000, cpu_shares=512, memory_limit_in_bytes=1 << 20))
    assert sbx(cfg, pod_annotation_globs=["keep.me/*"])["annotations"] == {
        "keep.me/a": "1",
        "io.kubernetes.cri.container-type": "sandbox",
        "io.kubernetes.cri.sandbox-id": SID,
        "io.kubernetes.cri.sandbox-name": "web",
        "io.kubernetes.cri.sandbox-namespace": "ns",
        "io.kubernetes.cri.sandbox-uid": "u1",
        "io.kubernetes.cri.sandbox-log-directory": "/var/log/pods/x",
        "io.kubernetes.cri.podsandbox.image-name": "registry.k8s.io/pause:3.10.2",
        "io.kubernetes.cri.sandbox-cpu-period": "100000",
        "io.kubernetes.cri.sandbox-cpu-quota": "50000",
        "io.kubernetes.cri.sandbox-cpu-shares": "512",
        "io.kubernetes.cri.sandbox-memory": "1048576",
    }


def test_sandbox_annotations_without_resources() -> None:
    assert "io.kubernetes.cri.sandbox-memory" not in sbx()["annotations"]


# §2.2 args

@pytest.mark.parametrize("command, args, want", [
    ([], [], ["/ep", "cmd"]),
    (["/c"], [], ["/c"]),
    ([], ["a1"], ["/ep", "a1"]),
    (["/c"], ["a1"], ["/c", "a1"]),
])
def test_args_combinations(command: list[str], args: list[str], want: list[str]) -> None:
    image = {"config": {"Entrypoint": ["/ep"], "Cmd": ["cmd"]}}
    assert ctr(cc(command=command, args=args), image=image)["process"]["args"] == want


def test_args_empty_string_entrypoint_is_none() -> None:
    image = {"config": {"Entrypoint": [""], "Cmd": ["sh"]}}
    assert ctr(image=image)["process"]["args"] == ["sh"]


def test_args_none_is_an_error() -> None:
    with pytest.raises(InvalidArgument, match="no command specified"):
        ctr(image={"config": {"Entrypoint": [""]}})


# §2.3 env

def test_env_default_order() -> None:
    assert ctr()["process"]["env"] == [PATH, "HOSTNAME=web-host"]


def test_env_tty_and_node_hostname() -> None:
    cfg = pod()
    cfg.hostname = ""
    spec = ctr(cc(tty=True), sandbox=cfg)
    assert spec["process"]["env"] == [PATH, "TERM=xterm", "HOSTNAME=node1"]
    assert spec["process"]["terminal"] is True


def test_env_image_replaces_in_place_and_appends_without_dedupe() -> None:
    image = {"config": {"Cmd": ["sh"], "Env": ["PATH=/img", "FOO=1", "HOSTNAME=h"]}}
    cfg = cc(envs=[pb.KeyValue(key="FOO", value="2"), pb.KeyValue(key="EMPTY", value="")])
    assert ctr(cfg, image=image)["process"]["env"] == \
        ["PATH=/img", "HOSTNAME=h", "FOO=1", "FOO=2", "EMPTY="]


def test_env_entry_without_equals_deletes_default() -> None:
    image = {"config": {"Cmd": ["sh"], "Env": ["HOSTNAME", "LONELY"]}}
    assert ctr(image=image)["process"]["env"] == [PATH]


# §2.4 cwd

@pytest.mark.parametrize("working_dir, image_wd, want", [
    ("/cri", "/img", "/cri"), ("", "/img", "/img"), ("", "", "/")])
def test_cwd(working_dir: str, image_wd: str, want: str) -> None:
    image = {"config": {"Cmd": ["sh"], "WorkingDir": image_wd}}
    spec = ctr(cc(working_dir=working_dir), image=image)
    assert spec["process"]["cwd"] == want
    assert "hostname" not in spec
    assert "terminal" not in spec["process"]


# §2.5 user and groups

def user_of(security: pb.LinuxContainerSecurityContext | None = None, image_user: str = "",
            **kw: Any) -> dict[str, Any]:
    image = {"config": {"Cmd": ["sh"], "User": image_user}}
    spec = ctr(cc(sc=security) if security else cc(), image=image, **kw)
    user: dict[str, Any] = spec["process"]["user"]
    return user


def test_user_none_is_root() -> None:
    assert user_of() == {"uid": 0, "gid": 0, "additionalGids": [0, 10]}


def test_user_numeric_found_in_passwd() -> None:
    assert user_of(image_user="1000") == {"uid": 1000, "gid": 1000,
                                          "additionalGids": [10, 1000, 50000]}


def test_user_numeric_not_in_passwd_gid_zero() -> None:
    assert user_of(image_user="4242", etc_passwd=None) == \
        {"uid": 4242, "gid": 0, "additionalGids": [0]}


def test_user_name() -> None:
    assert user_of(image_user="alice")["uid"] == 1000


def test_user_unknown_name_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match="'bob' not found"):
        user_of(image_user="bob")


def test_user_and_group_names() -> None:
    assert user_of(image_user="alice:wheel")["gid"] == 10
    with pytest.raises(InvalidArgument, match="'nogroup'"):
        user_of(image_user="alice:nogroup")


def test_user_both_numeric_needs_no_files() -> None:
    assert user_of(image_user="7:8", etc_passwd=None, etc_group=None) == \
        {"uid": 7, "gid": 8, "additionalGids": [8]}


def test_user_out_of_range() -> None:
    with pytest.raises(InvalidArgument):
        user_of(image_user="2147483648")


def test_user_precedence_username_then_uid_then_image() -> None:
    assert user_of(sc(run_as_username="alice", run_as_user=pb.Int64Value(value=5)),
                   image_user="0")["uid"] == 1000
    assert user_of(sc(run_as_user=pb.Int64Value(value=5)), image_user="alice")["uid"] == 5


def test_user_run_as_group_appended() -> None:
    u = user_of(sc(run_as_user=pb.Int64Value(value=1000), run_as_group=pb.Int64Value(value=3)))
    assert (u["uid"], u["gid"]) == (1000, 3)


def test_user_group_without_user_is_an_error() -> None:
    with pytest.raises(InvalidArgument, match='user group "3" is specified without user'):
        user_of(sc(run_as_group=pb.Int64Value(value=3)), image_user="alice")


def test_supplemental_groups_merge_critest_example() -> None:
    u = user_of(sc(run_as_user=pb.Int64Value(value=1000), supplemental_groups=[1234]))
    assert u["additionalGids"] == [10, 1000, 1234, 50000]
    group = "alice:x:1000:\nextra:x:50000:alice\n"
    u = user_of(sc(run_as_user=pb.Int64Value(value=1000), supplemental_groups=[1234]),
                etc_group=group)
    assert u["additionalGids"] == [1000, 1234, 50000]


def test_supplemental_groups_strict() -> None:
    u = user_of(sc(run_as_user=pb.Int64Value(value=1000), supplemental_groups=[1234],
                   supplemental_groups_policy=pb.Strict))
    assert u["additionalGids"] == [1000, 1234]


def test_supplemental_groups_skip_group_named_like_user() -> None:
    group = "alice:x:1000:alice\n"
    assert user_of(image_user="alice", etc_group=group)["additionalGids"] == [1000]


def test_supplemental_groups_unknown_policy() -> None:
    with pytest.raises(InvalidArgument, match="not implemented"):
        user_of(sc(supplemental_groups_policy=7))


# §2.6 mounts

CG = {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
      "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]}


def test_container_mounts_default_order() -> None:
    spec = ctr()
    assert dests(spec) == ["/proc", "/dev", "/dev/pts", "/dev/mqueue", "/sys",
                           "/sys/fs/cgroup", "/etc/hostname", "/etc/hosts",
                           "/etc/resolv.conf", "/dev/shm"]
    assert mount(spec, "/sys/fs/cgroup") == CG
    assert mount(spec, "/etc/hosts") == {"destination": "/etc/hosts", "type": "bind",
                                         "source": ROOT + "/hosts",
                                         "options": ["rbind", "rprivate", "rw"]}
    assert mount(spec, "/dev/shm") == {"destination": "/dev/shm", "type": "bind",
                                       "source": STATE + "/shm",
                                       "options": ["rbind", "rprivate", "rw"]}


def test_container_extras_only_when_files_exist() -> None:
    spec = ctr(files=SandboxFiles(shm=STATE + "/shm"))
    assert "/etc/hosts" not in dests(spec)


def test_readonly_rootfs_makes_etc_files_ro_but_not_shm() -> None:
    spec = ctr(cc(sc=sc(readonly_rootfs=True)))
    assert spec["root"]["readonly"] is True
    for d in ("/etc/hostname", "/etc/hosts", "/etc/resolv.conf"):
        assert mount(spec, d)["options"] == ["rbind", "rprivate", "ro"]
    assert mount(spec, "/dev/shm")["options"] == ["rbind", "rprivate", "rw"]


def test_cri_mount_wins_over_extra_and_base() -> None:
    cfg = cc(mounts=[pb.Mount(container_path="/etc/hosts", host_path="/k/hosts"),
                     pb.Mount(container_path="/proc/", host_path="/p")])
    spec = ctr(cfg)
    assert mount(spec, "/etc/hosts")["source"] == "/k/hosts"
    assert [m["source"] for m in spec["mounts"] if m["destination"].rstrip("/") == "/proc"] \
        == ["/p"]


def test_dev_mount_removes_everything_under_dev() -> None:
    spec = ctr(cc(mounts=[pb.Mount(container_path="/dev", host_path="/dev")]),
               files=SandboxFiles())
    assert dests(spec) == ["/proc", "/sys", "/sys/fs/cgroup", "/dev"]


def test_supplied_mounts_sorted_by_depth_stably() -> None:
    cfg = cc(mounts=[pb.Mount(container_path="/a/b/c", host_path="/1"),
                     pb.Mount(container_path="/x", host_path="/2"),
                     pb.Mount(container_path="/a/b", host_path="/3"),
                     pb.Mount(container_path="/y", host_path="/4")])
    spec = ctr(cfg, files=SandboxFiles())
    assert dests(spec)[-4:] == ["/x", "/y", "/a/b", "/a/b/c"]


@pytest.mark.parametrize("prop, option, rootfs", [
    (pb.PROPAGATION_PRIVATE, "rprivate", None),
    (pb.PROPAGATION_HOST_TO_CONTAINER, "rslave", "rslave"),
    (pb.PROPAGATION_BIDIRECTIONAL, "rshared", "rshared"),
])
def test_mount_propagation(prop: int, option: str, rootfs: str | None) -> None:
    cfg = cc(mounts=[pb.Mount(container_path="/m", host_path="/h", readonly=True,
                              propagation=prop)])  # type: ignore[arg-type]
    spec = ctr(cfg)
    assert mount(spec, "/m") == {"destination": "/m", "type": "bind", "source": "/h",
                                 "options": ["rbind", option, "ro"]}
    assert spec["linux"].get("rootfsPropagation") == rootfs


def test_rshared_beats_rslave_for_rootfs() -> None:
    cfg = cc(mounts=[
        pb.Mount(container_path="/a", host_path="/a", propagation=pb.PROPAGATION_BIDIRECTIONAL),
        pb.Mount(container_path="/b", host_path="/b",
                 propagation=pb.PROPAGATION_HOST_TO_CONTAINER)])
    assert ctr(cfg)["linux"]["rootfsPropagation"] == "rshared"


def test_recursive_read_only() -> None:
    ok = pb.Mount(container_path="/m", host_path="/h", readonly=True, recursive_read_only=True)
    assert mount(ctr(cc(mounts=[ok]), rro_supported=True), "/m")["options"] == \
        ["rbind", "rprivate", "rro"]
    with pytest.raises(InvalidArgument):
        ctr(cc(mounts=[ok]))
    bad = pb.Mount(container_path="/m", host_path="/h", recursive_read_only=True)
    with pytest.raises(InvalidArgument, match="needs readonly"):
        ctr(cc(mounts=[bad]), rro_supported=True)


def test_mount_id_mappings() -> None:
    m = pb.Mount(container_path="/m", host_path="/h",
                 uidMappings=[pb.IDMapping(host_id=1, container_id=2, length=3)],
                 gidMappings=[pb.IDMapping(host_id=4, container_id=5, length=6)])
    got = mount(ctr(cc(mounts=[m])), "/m")
    assert got["uidMappings"] == [{"containerID": 2, "hostID": 1, "size": 3}]
    assert got["gidMappings"] == [{"containerID": 5, "hostID": 4, "size": 6}]


def test_container_host_ipc_uses_host_shm() -> None:
    cfg = cc(sc=sc(namespace_options=pb.NamespaceOption(ipc=pb.NODE)))
    assert mount(ctr(cfg), "/dev/shm")["source"] == "/dev/shm"


def test_cgroup_mount_writable_and_host_options() -> None:
    spec = ctr(cgroup_writable=True, cgroup_v2=False,
               host_cgroup_options=["rw", "nsdelegate", "memory_recursiveprot"])
    assert mount(spec, "/sys/fs/cgroup")["options"] == \
        ["nosuid", "noexec", "nodev", "relatime", "rw", "nsdelegate", "memory_recursiveprot"]
    assert mount(ctr(host_cgroup_options=["nsdelegate"]), "/sys/fs/cgroup") == CG


# §2.7 image volumes

def test_image_volumes_become_rw_binds() -> None:
    image = {"config": {"Cmd": ["sh"], "Volumes": {"/data": {}, "rel/dir": {}, "/cri": {}}}}
    cfg = cc(mounts=[pb.Mount(container_path="/cri", host_path="/h")])
    vols = image_volumes(cfg, image, container_id=CID, volumes_dir="/v")
    assert [v.destination for v in vols] == ["/data", "/rel/dir"]
    assert all(v.source.startswith("/v/") and len(v.source) == 3 + 64 for v in vols)
    spec = ctr(cfg, image=image)
    for v in vols:
        assert mount(spec, v.destination)["options"] == ["rbind", "rprivate", "rw"]
    assert mount(spec, "/cri")["source"] == "/h"


def test_image_volumes_ignored() -> None:
    image = {"config": {"Cmd": ["sh"], "Volumes": {"/data": {}}}}
    assert "/data" not in dests(ctr(image=image, ignore_image_defined_volumes=True))


# §2.8 devices

def test_cri_devices_added_with_rules() -> None:
    dev = DeviceNode(path="/dev/fuse", type="c", major=10, minor=229, permissions="rw")
    linux = ctr(devices=[dev])["linux"]
    assert linux["devices"] == [{"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229,
                                 "fileMode": 0o666, "uid": 0, "gid": 0}]
    assert linux["resources"]["devices"] == [
        {"allow": False, "access": "rwm"},
        {"allow": True, "type": "c", "major": 10, "minor": 229, "access": "rw"}]


# §2.9 capabilities

def caps_of(add: list[str], drop: list[str]) -> dict[str, Any]:
    cap = pb.Capability(add_capabilities=add, drop_capabilities=drop)
    result: dict[str, Any] = ctr(cc(sc=sc(capabilities=cap)),
                                 host_capabilities=["CAP_CHOWN", "CAP_SYS_ADMIN", "CAP_KILL"]
                                 )["process"]["capabilities"]
    return result


def test_caps_default_without_field() -> None:
    assert ctr()["process"]["capabilities"]["effective"] == list(DEFAULT_CAPABILITIES)


def test_caps_add_and_drop() -> None:
    c = caps_of(["sys_admin", "CHOWN"], ["kill", "NET_RAW"])
    want = [x for x in DEFAULT_CAPABILITIES if x not in ("CAP_KILL", "CAP_NET_RAW")]
    assert c == {"bounding": [*want, "CAP_SYS_ADMIN"], "effective": [*want, "CAP_SYS_ADMIN"],
                 "permitted": [*want, "CAP_SYS_ADMIN"]}


def test_caps_add_all_minus_chown() -> None:
    c = caps_of(["all"], ["CHOWN"])
    assert c["bounding"] == c["effective"] == c["permitted"] == ["CAP_SYS_ADMIN", "CAP_KILL"]


def test_caps_drop_all_plus_one() -> None:
    c = caps_of(["NET_ADMIN"], ["ALL"])
    assert c == {"bounding": ["CAP_NET_ADMIN"], "effective": ["CAP_NET_ADMIN"],
                 "permitted": ["CAP_NET_ADMIN"]}


def test_caps_add_all_and_drop_all_is_empty() -> None:
    assert caps_of(["ALL"], ["all"]) == {"bounding": [], "effective": [], "permitted": []}


def test_caps_never_ambient_or_inheritable() -> None:
    cap = pb.Capability(add_ambient_capabilities=["NET_ADMIN"])
    c = ctr(cc(sc=sc(capabilities=cap)))["process"]["capabilities"]
    assert set(c) == {"bounding", "effective", "permitted"}


# §2.10 privileged

def test_privileged_needs_privileged_sandbox() -> None:
    with pytest.raises(InvalidArgument, match="no privileged container allowed in sandbox"):
        ctr(cc(sc=sc(privileged=True)))


def test_privileged_container() -> None:
    node = DeviceNode(path="/dev/sda", type="b", major=8, minor=0, file_mode=0o660, gid=6)
    cfg = cc(sc=sc(privileged=True, masked_paths=["/proc/kcore"],
                   capabilities=pb.Capability(drop_capabilities=["ALL"])))
    spec = ctr(cfg, sandbox=pod(privileged=True), host_devices=[node])
    linux = spec["linux"]
    caps = spec["process"]["capabilities"]
    assert caps["bounding"] == caps["effective"] == caps["permitted"] == list(ALL_CAPABILITIES)
    assert "maskedPaths" not in linux and "readonlyPaths" not in linux
    assert mount(spec, "/sys")["options"] == ["nosuid", "noexec", "nodev", "rw"]
    assert mount(spec, "/sys/fs/cgroup")["options"][-1] == "rw"
    assert linux["devices"] == [{"path": "/dev/sda", "type": "b", "major": 8, "minor": 0,
                                 "fileMode": 0o660, "uid": 0, "gid": 6}]
    assert linux["resources"]["devices"] == [{"allow": True, "access": "rwm"}]
    assert "cgroup" not in [n["type"] for n in linux["namespaces"]]


def test_privileged_without_host_devices() -> None:
    spec = ctr(cc(sc=sc(privileged=True)), sandbox=pod(privileged=True),
               host_devices=[DeviceNode(path="/dev/sda", type="b", major=8, minor=0)],
               privileged_without_host_devices=True)
    assert "devices" not in spec["linux"]
    assert spec["linux"]["resources"]["devices"] == [{"allow": False, "access": "rwm"}]


# §2.11 no_new_privs, readonly rootfs, masked/readonly paths

def test_no_new_privs_default_false_and_set() -> None:
    assert ctr()["process"]["noNewPrivileges"] is False
    assert ctr(cc(sc=sc(no_new_privs=True)))["process"]["noNewPrivileges"] is True


def test_rootfs_writable_by_default() -> None:
    assert "readonly" not in ctr()["root"]


def test_masked_paths_from_cri() -> None:
    linux = ctr(cc(sc=sc(masked_paths=["/proc/kcore"], readonly_paths=["/proc/sys"])))["linux"]
    assert (linux["maskedPaths"], linux["readonlyPaths"]) == (["/proc/kcore"], ["/proc/sys"])


def test_masked_paths_unmasked_is_empty() -> None:
    linux = ctr()["linux"]
    assert (linux["maskedPaths"], linux["readonlyPaths"]) == ([], [])


def test_masked_paths_disable_proc_mount_keeps_defaults() -> None:
    linux = ctr(cc(sc=sc(masked_paths=["/x"])), disable_proc_mount=True)["linux"]
    assert len(linux["maskedPaths"]) == 11 and len(linux["readonlyPaths"]) == 5


# oom_score_adj

def test_container_oom_score_adj() -> None:
    cfg = cc()
    assert "oomScoreAdj" not in ctr(cfg)["process"]
    cfg.linux.resources.oom_score_adj = -997
    assert ctr(cfg)["process"]["oomScoreAdj"] == -997
    assert ctr(cfg, min_oom_score_adj=0)["process"]["oomScoreAdj"] == 0
    cfg.linux.resources.oom_score_adj = 0
    assert ctr(cfg)["process"]["oomScoreAdj"] == 0


# §2.14 namespaces

def test_container_namespaces_join_pause() -> None:
    assert ctr()["linux"]["namespaces"] == [
        {"type": "pid", "path": "/proc/42/ns/pid"},
        {"type": "ipc", "path": "/proc/42/ns/ipc"},
        {"type": "uts", "path": "/proc/42/ns/uts"},
        {"type": "mount"},
        {"type": "network", "path": "/proc/42/ns/net"},
        {"type": "cgroup"},
    ]


def test_container_pid_modes() -> None:
    def pid_ns(opts: pb.NamespaceOption, **kw: Any) -> dict[str, Any]:
        ns: dict[str, Any] = ctr(cc(sc=sc(namespace_options=opts)), **kw)["linux"][
            "namespaces"][0]
        return ns
    assert pid_ns(pb.NamespaceOption(pid=pb.CONTAINER)) == {"type": "pid"}
    assert pid_ns(pb.NamespaceOption(pid=pb.NODE)) == {"type": "pid", "path": "/proc/42/ns/pid"}
    assert pid_ns(pb.NamespaceOption(pid=pb.TARGET, target_id="t"), target_pid=77) == \
        {"type": "pid", "path": "/proc/77/ns/pid"}
    with pytest.raises(InvalidArgument):
        pid_ns(pb.NamespaceOption(pid=pb.TARGET, target_id="t"))


def test_container_ipc_always_pods_and_no_cgroupns_on_v1() -> None:
    cfg = cc(sc=sc(namespace_options=pb.NamespaceOption(ipc=pb.NODE)))
    ns = ctr(cfg, cgroup_v2=False)["linux"]["namespaces"]
    assert ns[1] == {"type": "ipc", "path": "/proc/42/ns/ipc"}
    assert [n["type"] for n in ns] == ["pid", "ipc", "uts", "mount", "network"]


def test_container_userns_pod() -> None:
    userns = pb.UserNamespace(mode=pb.POD,
                              uids=[pb.IDMapping(host_id=100000, container_id=0, length=65536)],
                              gids=[pb.IDMapping(host_id=100000, container_id=0, length=65536)])
    opts = pb.NamespaceOption(userns_options=userns)
    spec = ctr(cc(sc=sc(namespace_options=opts)), sandbox=pod(namespace_options=opts))
    assert spec["linux"]["namespaces"][-1] == {"type": "user", "path": "/proc/42/ns/user"}
    # Joined by path: runc reads the maps from the namespace (and warns at a repeat).
    assert "uidMappings" not in spec["linux"] and "gidMappings" not in spec["linux"]
    # The pod files are idmapped with the pod's maps (containerd's linuxContainerMounts);
    # /dev/shm, a tmpfs of mode 1777, is not.
    want = [{"containerID": 0, "hostID": 100000, "size": 65536}]
    by_dest = {m["destination"]: m for m in spec["mounts"]}
    for dest in ("/etc/hostname", "/etc/hosts", "/etc/resolv.conf"):
        assert by_dest[dest]["uidMappings"] == by_dest[dest]["gidMappings"] == want, dest
    assert "uidMappings" not in by_dest["/dev/shm"]
    # So are the copies of the image's VOLUMEs (containerd's volumeMounts).
    spec = ctr(cc(sc=sc(namespace_options=opts)), sandbox=pod(namespace_options=opts),
               image={"config": {"Cmd": ["sh"], "Volumes": {"/data": {}}}})
    (data,) = [m for m in spec["mounts"] if m["destination"] == "/data"]
    assert data["uidMappings"] == data["gidMappings"] == want
    with pytest.raises(InvalidArgument, match="differ"):
        ctr(cc(), sandbox=pod(namespace_options=opts))


# §2.15 annotations

def test_container_annotations() -> None:
    sandbox = pod()
    sandbox.annotations["pod.io/a"] = "1"
    cfg = cc(annotations={"ctr.io/b": "2", "drop": "3"},
             image=pb.ImageSpec(image="sha256:abc", user_specified_image="busybox"))
    assert ctr(cfg, sandbox=sandbox, pod_annotation_globs=["pod.io/*"],
               container_annotation_globs=["ctr.io/*"])["annotations"] == {
        "pod.io/a": "1",
        "ctr.io/b": "2",
        "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.sandbox-id": SID,
        "io.kubernetes.cri.sandbox-namespace": "ns",
        "io.kubernetes.cri.sandbox-uid": "u1",
        "io.kubernetes.cri.sandbox-name": "web",
        "io.kubernetes.cri.container-name": "app",
        "io.kubernetes.cri.image-name": "busybox",
    }


def test_container_annotation_image_name_falls_back_to_reference() -> None:
    assert ctr()["annotations"]["io.kubernetes.cri.image-name"] == "docker.io/library/x:1"


def test_container_spec_is_json() -> None:
    json.dumps(ctr(cc(tty=True, mounts=[pb.Mount(container_path="/m", host_path="/h")])))


def test_image_volume_is_a_read_only_bind_of_its_mounted_image() -> None:
    """The core mounts the image and sets host_path; the spec binds it like any mount,
    and an image VOLUME at the same path gives way to it."""
    m = pb.Mount(container_path="/data", host_path="/run/pycrid/containers/c/image-volumes/0",
                 readonly=True, image=pb.ImageSpec(image="busybox"))
    spec = ctr(cc(mounts=[m]), image={"config": {"Cmd": ["sh"], "Volumes": {"/data": {}}}})
    assert [x for x in spec["mounts"] if x["destination"] == "/data"] == [
        {"destination": "/data", "type": "bind", "source": m.host_path,
         "options": ["rbind", "rprivate", "ro"]}]


def test_image_volume_not_mounted_is_refused() -> None:
    from pycrid.oci.spec_mounts import cri_mount

    m = pb.Mount(container_path="/data", readonly=True, image=pb.ImageSpec(image="busybox"))
    with pytest.raises(InvalidArgument,
                       match=r"^ImageVolumeMountFailed: mount '/data': image 'busybox' has not "
                             r"been mounted$"):
        cri_mount(m)


@pytest.mark.parametrize(("kw", "why"), [
    ({"readonly": False}, "an image volume must be read-only"),
    ({"readonly": True, "host_path": "/h"}, "an image volume takes no host_path"),
])
def test_image_mount_rules(kw: dict[str, Any], why: str) -> None:
    from pycrid.oci.spec_mounts import check_image_mount, is_image_mount

    m = pb.Mount(container_path="/data", image=pb.ImageSpec(image="busybox"), **kw)
    assert is_image_mount(m)
    with pytest.raises(InvalidArgument,
                       match=rf"^ImageVolumeMountFailed: mount '/data' of image 'busybox': {why}"):
        check_image_mount(m)
    check_image_mount(pb.Mount(container_path="/data", readonly=True,
                               image=pb.ImageSpec(image="busybox")))
    assert not is_image_mount(pb.Mount(container_path="/d", host_path="/h",
                                       image=pb.ImageSpec()))
