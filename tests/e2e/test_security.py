"""Security context end to end: what a process inside a real busybox container sees of
seccomp, capabilities, privileged mode, users and groups, no_new_privs, readonly rootfs,
masked paths, sysctls and shared pid namespaces (CRI-TO-OCI.md §1.7, §2.5, §2.9-§2.14)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from tests.support.daemon import Daemon
from tests.support.images import (
    PASSWD,
    TestImages,
    build_image,
    busybox_rootfs_tar,
    push,
)
from tests.support.layers import Entry, tar_bytes
from tests.support.pods import Pods, busybox_daemon, container_config, pod_config
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e

RD = pb.SecurityProfile(profile_type=pb.SecurityProfile.RuntimeDefault)
UNCONFINED = pb.SecurityProfile(profile_type=pb.SecurityProfile.Unconfined)
SLEEP = ["sleep", "3600"]
# The capability numbers of the names used below (linux/capability.h).
CAP_BITS = {"CHOWN": 0, "DAC_OVERRIDE": 1, "FOWNER": 3, "FSETID": 4, "KILL": 5, "SETGID": 6,
            "SETUID": 7, "SETPCAP": 8, "NET_BIND_SERVICE": 10, "NET_ADMIN": 12, "NET_RAW": 13,
            "SYS_CHROOT": 18, "MKNOD": 27, "AUDIT_WRITE": 29, "SETFCAP": 31}
DEFAULT_CAPS = ("CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID",
                "SETUID", "SETFCAP", "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL",
                "AUDIT_WRITE")
# /etc/group of the test image: "app" (1000) is also a member of staff (50) and games (60).
GROUP = b"root:x:0:\napp:x:1000:\nstaff:x:50:app\ngames:x:60:nobody,app\nnogroup:x:65534:\n"


def mask(*names: str) -> int:
    return sum(1 << CAP_BITS[n] for n in names)


def status_field(text: str, name: str) -> str:
    for line in text.splitlines():
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"{name} not in {text!r}")


def own_status(name: str) -> str:
    return status_field(Path("/proc/self/status").read_text(), name)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, registry: LocalRegistry,
           test_images: TestImages) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("security")
    users = build_image(
        [busybox_rootfs_tar(), tar_bytes([Entry("etc", "dir"),
                                          Entry("etc/passwd", data=PASSWD),
                                          Entry("etc/group", data=GROUP)])],
        config={"Cmd": ["sh"], "Env": ["PATH=/bin"]})
    push(registry, "security/users", "latest", users)
    with busybox_daemon(base, registry, test_images) as d:
        d.extra["users"] = registry.ref("security/users:latest")
        d.client.pull(d.extra["users"])
        yield d


@pytest.fixture(scope="module")
def pods(daemon: Daemon) -> Iterator[Pods]:
    p = Pods(daemon.client)
    yield p
    p.cleanup()


@pytest.fixture(scope="module")
def plain(pods: Pods) -> tuple[str, Any]:
    """An ordinary pod shared by the unprivileged tests."""
    pod = pod_config()
    return pods.run(pod), pod


@pytest.fixture(scope="module")
def privileged(pods: Pods) -> tuple[str, Any]:
    pod = pod_config(linux=pb.LinuxPodSandboxConfig(
        security_context=pb.LinuxSandboxSecurityContext(privileged=True)))
    return pods.run(pod), pod


def run(daemon: Daemon, pods: Pods, where: tuple[str, Any], name: str,
        image: str = "busybox", command: list[str] | None = None, **sc: Any) -> str:
    sid, pod = where
    cfg = container_config(daemon.extra[image], name, command=command or SLEEP)
    cfg.linux.security_context.CopyFrom(pb.LinuxContainerSecurityContext(**sc))
    return pods.run_container(sid, cfg, pod)


def sh(pods: Pods, cid: str, script: str) -> tuple[int, str]:
    r = pods.exec(cid, ["sh", "-c", script], timeout=30)
    return r.exit_code, (r.stdout + r.stderr).decode()


def proc_status(pods: Pods, cid: str) -> str:
    code, out = sh(pods, cid, "cat /proc/self/status")
    assert code == 0, out
    return out


# ---- seccomp ----------------------------------------------------------------------------------

def test_seccomp_modes(daemon: Daemon, pods: Pods, plain: tuple[str, Any],
                       tmp_path: Path) -> None:
    # A Localhost profile of our own: everything allowed but mkdir/mkdirat (EACCES).
    profile = tmp_path / "no-mkdir.json"
    profile.write_text(json.dumps({
        "defaultAction": "SCMP_ACT_ALLOW",
        "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO",
                      "errnoRet": 13}]}))
    local = pb.SecurityProfile(profile_type=pb.SecurityProfile.Localhost,
                               localhost_ref=str(profile))
    seen = {}
    for name, extra in {"rd": {"seccomp": RD}, "legacy": {"seccomp_profile_path":
                                                          "runtime/default"},
                        "local": {"seccomp": local}, "unconfined": {"seccomp": UNCONFINED},
                        "absent": {}}.items():
        cid = run(daemon, pods, plain, f"seccomp-{name}", **extra)
        seen[name] = (cid, status_field(proc_status(pods, cid), "Seccomp"))
    assert {k: v for k, (_, v) in seen.items()} == {
        "rd": "2", "legacy": "2", "local": "2", "unconfined": "0", "absent": "0"}

    rd, local_cid, free = seen["rd"][0], seen["local"][0], seen["absent"][0]
    # A new user namespace needs no capability, so only the filter can refuse it: the
    # default profile denies unshare(2) without CAP_SYS_ADMIN; no filter lets it through.
    code, out = sh(pods, rd, "busybox unshare -U true")
    assert code != 0 and "Operation not permitted" in out, out
    assert sh(pods, free, "busybox unshare -U true && echo yes") == (0, "yes\n")
    code, out = sh(pods, rd, "mkdir -p /mnt && busybox mount -t tmpfs none /mnt")
    assert code != 0 and "permission denied" in out, out  # busybox's words for EPERM
    # ... but lets ordinary work through (fork, exec, files, sockets via sh and cat).
    assert sh(pods, rd, "mkdir /tmp/d && echo ok > /tmp/d/f && cat /tmp/d/f") == (0, "ok\n")
    # The Localhost profile is the file, verbatim.
    code, out = sh(pods, local_cid, "mkdir /tmp/x")
    assert code != 0 and "Permission denied" in out, out
    assert sh(pods, local_cid, "busybox unshare -U true && echo yes") == (0, "yes\n")


def test_seccomp_unconfined_privileged_can_unshare_and_mount(
        daemon: Daemon, pods: Pods, privileged: tuple[str, Any]) -> None:
    cid = run(daemon, pods, privileged, "unconfined-priv", privileged=True, seccomp=RD)
    assert status_field(proc_status(pods, cid), "Seccomp") == "0"  # privileged: no filter
    assert sh(pods, cid, "busybox unshare -u true && echo yes") == (0, "yes\n")
    code, out = sh(pods, cid, "mkdir -p /mnt && busybox mount -t tmpfs none /mnt && "
                              "busybox mount | grep ' /mnt '")
    assert code == 0 and "tmpfs" in out, out


def test_localhost_missing_profile_is_invalid_argument(
        daemon: Daemon, pods: Pods, plain: tuple[str, Any], tmp_path: Path) -> None:
    sid, pod = plain
    cfg = container_config(daemon.extra["busybox"], "missing-profile", command=SLEEP)
    cfg.linux.security_context.seccomp.CopyFrom(pb.SecurityProfile(
        profile_type=pb.SecurityProfile.Localhost, localhost_ref=str(tmp_path / "nope.json")))
    with pytest.raises(grpc.RpcError) as e:
        pods.create(sid, cfg, pod)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "nope.json" in (e.value.details() or "")
    cfg.linux.security_context.ClearField("seccomp")
    cfg.linux.security_context.apparmor.CopyFrom(RD)
    with pytest.raises(grpc.RpcError) as e:
        pods.create(sid, cfg, pod)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "AppArmor is not enabled on this host" in (e.value.details() or "")


# ---- capabilities and privileged -------------------------------------------------------------

def test_capabilities(daemon: Daemon, pods: Pods, plain: tuple[str, Any],
                      privileged: tuple[str, Any]) -> None:
    cases = {
        "caps-default": (None, mask(*DEFAULT_CAPS)),
        "caps-net-admin": (pb.Capability(add_capabilities=["NET_ADMIN"]),
                           mask(*DEFAULT_CAPS, "NET_ADMIN")),
        "caps-chown-only": (pb.Capability(drop_capabilities=["ALL"],
                                          add_capabilities=["CHOWN"]), mask("CHOWN")),
    }
    for name, (caps, want) in cases.items():
        extra = {"capabilities": caps} if caps is not None else {}
        st = proc_status(pods, run(daemon, pods, plain, name, **extra))
        assert int(status_field(st, "CapEff"), 16) == want, name
        assert int(status_field(st, "CapBnd"), 16) == want, name
    # ALL is the daemon's own effective set (root here lacks CAP_SYS_RESOURCE).
    host = int(own_status("CapEff"), 16)
    st = proc_status(pods, run(daemon, pods, plain, "caps-all",
                               capabilities=pb.Capability(add_capabilities=["ALL"])))
    assert int(status_field(st, "CapEff"), 16) == host
    assert int(status_field(st, "CapBnd"), 16) == host
    # A privileged container gets the same set.
    st = proc_status(pods, run(daemon, pods, privileged, "caps-priv", privileged=True))
    assert int(status_field(st, "CapEff"), 16) == host


def test_privileged_sysfs_rw_and_host_devices(daemon: Daemon, pods: Pods, plain: tuple[str, Any],
                                              privileged: tuple[str, Any]) -> None:
    cid = run(daemon, pods, privileged, "priv-devs", privileged=True)
    _, mounts = sh(pods, cid, "busybox mount | grep sysfs")
    assert "(rw," in mounts, mounts
    host_dev = "/dev/kmsg" if os.path.exists("/dev/kmsg") else "/dev/loop0"
    assert sh(pods, cid, f"test -e {host_dev} && echo there") == (0, "there\n")
    other = run(daemon, pods, plain, "unpriv-devs")
    _, mounts = sh(pods, other, "busybox mount | grep sysfs")
    assert "(ro," in mounts, mounts
    assert sh(pods, other, f"test -e {host_dev} || echo absent") == (0, "absent\n")


def test_privileged_container_needs_privileged_pod(daemon: Daemon, pods: Pods,
                                                   plain: tuple[str, Any]) -> None:
    with pytest.raises(grpc.RpcError) as e:
        run(daemon, pods, plain, "not-allowed", privileged=True)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


# ---- users and groups ----------------------------------------------------------------------

def test_run_as_user_group_and_supplemental_groups(daemon: Daemon, pods: Pods,
                                                   plain: tuple[str, Any]) -> None:
    def ident(name: str, **sc: Any) -> str:
        cid = run(daemon, pods, plain, name, image="users", **sc)
        code, out = sh(pods, cid, "id -u; id -g; id -G")
        assert code == 0, out
        return out

    assert ident("uid", run_as_user=pb.Int64Value(value=1000)) == "1000\n1000\n1000 50 60\n"
    assert ident("uid-gid", run_as_user=pb.Int64Value(value=1000),
                 run_as_group=pb.Int64Value(value=2000)) == "1000\n2000\n2000 50 60\n"
    assert ident("username", run_as_username="app") == "1000\n1000\n1000 50 60\n"
    assert ident("merge", run_as_user=pb.Int64Value(value=1000), supplemental_groups=[4242],
                 supplemental_groups_policy=pb.Merge) == "1000\n1000\n1000 50 60 4242\n"
    assert ident("strict", run_as_user=pb.Int64Value(value=1000), supplemental_groups=[4242],
                 supplemental_groups_policy=pb.Strict) == "1000\n1000\n1000 4242\n"


def test_no_new_privs(daemon: Daemon, pods: Pods, plain: tuple[str, Any]) -> None:
    on = run(daemon, pods, plain, "nnp-on", no_new_privs=True)
    off = run(daemon, pods, plain, "nnp-off")
    assert status_field(proc_status(pods, on), "NoNewPrivs") == "1"
    assert status_field(proc_status(pods, off), "NoNewPrivs") == "0"


def test_readonly_rootfs(daemon: Daemon, pods: Pods, plain: tuple[str, Any]) -> None:
    ro = run(daemon, pods, plain, "ro-root", readonly_rootfs=True)
    code, out = sh(pods, ro, "touch /newfile")
    assert code != 0 and "Read-only file system" in out, out
    rw = run(daemon, pods, plain, "rw-root")
    assert sh(pods, rw, "touch /newfile && echo ok") == (0, "ok\n")


def test_masked_and_readonly_paths(daemon: Daemon, pods: Pods, plain: tuple[str, Any]) -> None:
    # This kernel has no /proc/kcore (runc skips a masked path that does not exist), so
    # /proc/timer_list, also on the kubelet's list, is the file that shows the masking.
    masked = run(daemon, pods, plain, "masked",
                 masked_paths=["/proc/kcore", "/proc/keys", "/proc/timer_list"],
                 readonly_paths=["/proc/sys", "/proc/sysrq-trigger"])
    assert sh(pods, masked, "wc -c < /proc/timer_list") == (0, "0\n")
    code, out = sh(pods, masked, "echo 1 > /proc/sys/kernel/shmmax")
    assert code != 0 and "Read-only file system" in out, out
    # Unmasked ProcMount: the kubelet sends empty lists and nothing is masked.
    unmasked = run(daemon, pods, plain, "unmasked", masked_paths=[], readonly_paths=[])
    code, out = sh(pods, unmasked, "wc -c < /proc/timer_list")
    assert code == 0 and int(out) > 0, out
    assert sh(pods, unmasked, "echo 4096 > /proc/sys/kernel/shmmax && echo ok") == (0, "ok\n")


# ---- sysctls -------------------------------------------------------------------------------

def test_pod_sysctls(daemon: Daemon, pods: Pods) -> None:
    pod = pod_config(linux=pb.LinuxPodSandboxConfig(sysctls={
        "net/ipv4/ip_unprivileged_port_start": "1234", "kernel.shmmax": "65536"}))
    sid = pods.run(pod)
    cid = pods.run_container(sid, container_config(daemon.extra["busybox"], "sysctl",
                                                   command=SLEEP), pod)
    assert sh(pods, cid, "cat /proc/sys/net/ipv4/ip_unprivileged_port_start "
                         "/proc/sys/kernel/shmmax") == (0, "1234\n65536\n")
    assert Path("/proc/sys/kernel/shmmax").read_text() != "65536\n"  # the host is untouched
    pods.remove_pod(sid)


@pytest.mark.parametrize(("sysctls", "ns", "why"), [
    ({"kernel.panic": "1"}, {}, "not namespaced"),
    ({"net.core.somaxconn": "1024"}, {"network": pb.NODE}, "host network"),
    ({"kernel.shmmax": "65536"}, {"ipc": pb.NODE}, "host IPC"),
])
def test_sysctls_refused(daemon: Daemon, pods: Pods, sysctls: dict[str, str],
                         ns: dict[str, int], why: str) -> None:
    before = len(daemon.client.runtime.ListPodSandbox(pb.ListPodSandboxRequest()).items)
    pod = pod_config(linux=pb.LinuxPodSandboxConfig(
        sysctls=sysctls, security_context=pb.LinuxSandboxSecurityContext(
            namespace_options=pb.NamespaceOption(**ns))))
    with pytest.raises(grpc.RpcError) as e:
        pods.run(pod)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert why in (e.value.details() or "") and next(iter(sysctls)) in (e.value.details() or "")
    assert len(daemon.client.runtime.ListPodSandbox(pb.ListPodSandboxRequest()).items) == before


# ---- pid namespaces ----------------------------------------------------------------------

def test_host_pid_namespace(daemon: Daemon, pods: Pods) -> None:
    pod = pod_config(linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
        namespace_options=pb.NamespaceOption(pid=pb.NODE))))
    sid = pods.run(pod)
    cfg = container_config(daemon.extra["busybox"], "hostpid", command=SLEEP)
    cfg.linux.security_context.namespace_options.pid = pb.NODE
    cid = pods.run_container(sid, cfg, pod)
    host_init = Path("/proc/1/comm").read_text()
    assert sh(pods, cid, "cat /proc/1/comm") == (0, host_init)
    assert host_init.strip() not in ("sleep", "pause")
    pods.remove_pod(sid)


def test_target_pid_namespace(daemon: Daemon, pods: Pods) -> None:
    pod = pod_config()
    sid = pods.run(pod)
    own = pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
        namespace_options=pb.NamespaceOption(pid=pb.CONTAINER)))
    first = pods.run_container(sid, container_config(
        daemon.extra["busybox"], "first", command=["sleep", "4242"], linux=own), pod)
    cfg = container_config(daemon.extra["busybox"], "second", command=SLEEP)
    cfg.linux.security_context.namespace_options.pid = pb.TARGET
    cfg.linux.security_context.namespace_options.target_id = first
    second = pods.run_container(sid, cfg, pod)
    code, out = sh(pods, second, "cat /proc/1/cmdline | tr '\\0' ' '; ps -o args")
    assert code == 0 and out.startswith("sleep 4242"), out
    # A container of its own (CONTAINER) sees only itself as pid 1.
    alone = pods.run_container(sid, container_config(daemon.extra["busybox"], "alone",
                                                     command=SLEEP, linux=own), pod)
    assert sh(pods, alone, "cat /proc/1/cmdline | tr '\\0' ' '") == (0, "sleep 3600 ")
    assert "4242" not in sh(pods, alone, "ps -o args")[1]
    # Created in the target's namespace, then the target stops: the kernel ends every
    # process of that pid namespace, the waiting init of the new container too, so it is
    # EXITED and cannot be started (containerd's extra start-time check has nothing left
    # to catch).
    cfg.metadata.name = "late"
    late = pods.create(sid, cfg, pod)
    pods.stop(first)
    pods.wait_state(late, pb.CONTAINER_EXITED)
    with pytest.raises(grpc.RpcError) as err:
        pods.start(late)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    pods.remove_pod(sid)


# ---- user namespace ------------------------------------------------------------------------

def test_user_namespace_pod_refused_without_handler_support(daemon: Daemon,
                                                            pods: Pods) -> None:
    """runc 1.1 has no idmapped mounts, so Status reports user_namespaces false for every
    handler and a user-namespace pod is refused up front. (Tried by hand: runc, already in
    the new namespace, gets EACCES bind-mounting the host-root-owned pause rootfs.)"""
    status = daemon.client.runtime.Status(pb.StatusRequest(verbose=True), timeout=10)
    # This host has seccomp and neither AppArmor nor SELinux (no /sys/kernel/security).
    apparmor = Path("/sys/module/apparmor/parameters/enabled")
    assert json.loads(status.info["hostSecurity"]) == {
        "seccomp": True,
        "apparmor": apparmor.exists() and apparmor.read_text().strip() == "Y",
        "selinux": os.path.exists("/sys/fs/selinux/enforce")}
    assert not any(h.features.user_namespaces for h in status.runtime_handlers)
    userns = pb.UserNamespace(mode=pb.POD,
                              uids=[pb.IDMapping(container_id=0, host_id=200000, length=65536)],
                              gids=[pb.IDMapping(container_id=0, host_id=200000, length=65536)])
    ns = pb.NamespaceOption(userns_options=userns)
    pod = pod_config(linux=pb.LinuxPodSandboxConfig(
        security_context=pb.LinuxSandboxSecurityContext(namespace_options=ns)))
    with pytest.raises(grpc.RpcError) as err:
        pods.run(pod)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "does not support user namespaces" in str(err.value.details())
    listed = daemon.client.runtime.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=10)
    assert pod.metadata.name not in {p.metadata.name for p in listed.items}


def test_pause_container_gets_pod_profile(pods: Pods) -> None:
    def pause_seccomp(**psc: Any) -> str:
        pod = pod_config(linux=pb.LinuxPodSandboxConfig(
            security_context=pb.LinuxSandboxSecurityContext(**psc)))
        sid = pods.run(pod)
        info = json.loads(pods.pod_status(sid, verbose=True).info["info"])
        value = status_field(Path(f"/proc/{info['pid']}/status").read_text(), "Seccomp")
        pods.remove_pod(sid)
        return value

    assert pause_seccomp(seccomp=RD) == "2"
    assert pause_seccomp() == "0"
