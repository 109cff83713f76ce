"""Pods in a user namespace (``hostUsers: false``, KEP-127) with a runc that makes idmapped
mounts (the interop runc 1.5.1; Debian's 1.1.5 has none, and these tests skip with it).

The module's daemon runs the interop runc for every pod, its state in a directory the
pods' mapped root can pass through (pytest's own tree is 0700). Each test checks what a
pod in a user namespace changes on the node and in the container: the id maps, who owns
the rootfs, the pod files, the volumes (with the kubelet's mappings and without), image
volumes, the namespaces the pod's user namespace owns, exec/attach/port-forward, stats,
NRI (the real Go plugins), unmasked /proc, a restart, the chowned-copy fallback
(``slow_chown``) and the refusal of a state directory the mapped root cannot reach.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import re
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from tests.support import interop, network
from tests.support.daemon import Daemon, mapped_root_state, nri_paths, running_daemon
from tests.support.images import TestImages
from tests.support.pods import (
    Pods,
    container_config,
    daemon_config,
    leftovers,
    pod_config,
    wait_for,
)
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e

#: ioctl_ns(2): the user namespace owning a namespace.
NS_GET_USERNS = 0xB701
SIZE = 65536
PAGE = "<html>hello from a user namespace</html>\n"


def userns(host: int) -> pb.UserNamespace:
    m = [pb.IDMapping(container_id=0, host_id=host, length=SIZE)]
    return pb.UserNamespace(mode=pb.POD, uids=m, gids=m)


def namespaces(host: int, *, pinned: bool = True, host_net: bool = False) -> pb.NamespaceOption:
    return pb.NamespaceOption(pid=pb.CONTAINER if pinned else pb.POD,
                              network=pb.NODE if host_net else pb.POD,
                              userns_options=userns(host))


def userns_pod(host: int, *, pinned: bool = True, host_net: bool = False, **kw: Any) -> Any:
    return pod_config(hostname="" if host_net else "mapped-pod", linux=pb.LinuxPodSandboxConfig(
        security_context=pb.LinuxSandboxSecurityContext(
            namespace_options=namespaces(host, pinned=pinned, host_net=host_net))), **kw)


def userns_container(image: str, host: int, name: str = "c", *, pinned: bool = True,
                     host_net: bool = False, command: list[str] | None = None,
                     **kw: Any) -> Any:
    sc = kw.pop("security", pb.LinuxContainerSecurityContext())
    sc.namespace_options.CopyFrom(namespaces(host, pinned=pinned, host_net=host_net))
    return container_config(image, name, command=command or ["sleep", "3600"],
                            linux=pb.LinuxContainerConfig(security_context=sc), **kw)


def sh(pods: Pods, cid: str, script: str) -> str:
    r = pods.exec(cid, ["sh", "-c", script])
    assert r.exit_code == 0, (script, r.stdout, r.stderr)
    return str(r.stdout.decode())


def owner_userns(path: str) -> int:
    """The inode of the user namespace owning the namespace at ``path``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        owner = fcntl.ioctl(fd, NS_GET_USERNS)
    finally:
        os.close(fd)
    try:
        return os.fstat(owner).st_ino
    finally:
        os.close(owner)


def _config(registry: LocalRegistry, images: TestImages, base: Path, runc: Path,
            extra: str = "") -> str:
    return (daemon_config(registry, images, base)
            + '[plugins."pycrid.cri.v1.runtime"]\n'
            f'runtime_path = "{runc}"\nstats_collect_period = "1s"\n' + extra)


@pytest.fixture(scope="module")
def runc() -> Path:
    return interop.idmap_runc()


@pytest.fixture(scope="module")
def daemon(runc: Path, tmp_path_factory: pytest.TempPathFactory, registry: LocalRegistry,
           test_images: TestImages) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("userns")
    with mapped_root_state() as state, running_daemon(
            str(base), _config(registry, test_images, base, runc), state_dir=state) as d:
        d.extra["base"] = str(base)
        d.extra["busybox"] = test_images.busybox.ref(registry)
        d.client.pull(d.extra["busybox"])
        yield d
        assert leftovers(d.root, d.state) == []


def test_status_says_the_handler_runs_user_namespace_pods(daemon: Daemon) -> None:
    """CRI Status (what the kubelet and critest check before asking for such a pod) and
    ``pycrid status``."""
    st = daemon.client.runtime.Status(pb.StatusRequest(), timeout=30)
    # (gVisor's runsc, offered when it is installed, has no user-namespace pods.)
    assert {(h.name, h.features.user_namespaces) for h in st.runtime_handlers
            if h.name != "runsc"} == {("", True), ("runc", True)}
    out = subprocess.run([sys.executable, "-m", "pycrid", "status", "--address",
                          daemon.address], capture_output=True, text=True, timeout=60)
    rows = {k.strip(): v for k, v in (line.split(":", 1) for line in out.stdout.splitlines())}
    assert "; user namespaces" in rows["runc"], out.stdout


@pytest.mark.parametrize("pinned", [True, False], ids=["without-pause", "with-pause"])
def test_pod_in_its_user_namespace(daemon: Daemon, pods: Pods, pinned: bool) -> None:
    host = SIZE * 51
    pod = userns_pod(host, pinned=pinned)
    sid = pods.run(pod)
    cid = pods.run_container(sid, userns_container(daemon.extra["busybox"], host,
                                                   pinned=pinned), pod)
    assert sh(pods, cid, "cat /proc/self/uid_map /proc/self/gid_map").split() == \
        ["0", str(host), str(SIZE)] * 2
    assert sh(pods, cid, "id -u; id -g; hostname").split() == ["0", "0", "mapped-pod"]
    # The image's files, the pod files and /dev/shm belong to the container's root.
    owners = sh(pods, cid, "stat -c %u:%g / /bin/busybox /etc/hosts /etc/hostname "
                           "/etc/resolv.conf; touch /new /etc/hosts; echo x > /dev/shm/x; "
                           "stat -c %u:%g /new /dev/shm/x")
    assert owners.split() == ["0:0"] * 7, owners
    # On the node: what the container wrote belongs to its first host id; the bundles
    # are open to that gid only.
    bundle = Path(daemon.state, "containers", cid)
    assert (bundle / "rootfs" / "new").stat().st_uid == host
    for d in (bundle, Path(daemon.state, "sandboxes", sid)):
        st = d.stat()
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o710, 0, host), d
    # The pod's namespaces are its user namespace's, and it is pinned.
    pin = Path(daemon.state, "sandboxes", sid, "ns", "user")
    user = pin.stat().st_ino
    info = json.loads(pods.status(cid, verbose=True).info["info"])
    ctr_pid = info["pid"]
    assert os.stat(f"/proc/{ctr_pid}/ns/user").st_ino == user
    for kind in ("net", "ipc", "uts"):
        assert owner_userns(f"/proc/{ctr_pid}/ns/{kind}") == user, kind
    spec = info["runtimeSpec"]
    assert {"type": "user", "path": str(pin)} in spec["linux"]["namespaces"]
    if pinned:
        assert {p.name for p in pin.parent.iterdir()} == {"user", "ipc", "uts"}
    pods.stop_pod(sid)
    assert not pin.exists() or os.stat(pin).st_dev == pin.parent.stat().st_dev
    pods.remove_pod(sid)


@pytest.mark.parametrize("pinned", [True, False], ids=["without-pause", "with-pause"])
def test_host_network_pod_in_its_user_namespace(daemon: Daemon, pods: Pods,
                                                pinned: bool) -> None:
    """Its user namespace is a new one (no netns to make it in), pinned all the same;
    /sys is the node's, bound read-only (a new sysfs needs a netns of its own)."""
    host = SIZE * 52
    pod = userns_pod(host, pinned=pinned, host_net=True)
    sid = pods.run(pod)
    cid = pods.run_container(sid, userns_container(daemon.extra["busybox"], host,
                                                   pinned=pinned, host_net=True), pod)
    assert sh(pods, cid, "cat /proc/self/uid_map").split() == ["0", str(host), str(SIZE)]
    assert sh(pods, cid, "hostname").strip() == socket.gethostname()
    spec = json.loads(pods.status(cid, verbose=True).info["info"])["runtimeSpec"]
    (sys_mount,) = [m for m in spec["mounts"] if m["destination"] == "/sys"]
    assert sys_mount["type"] == "bind" and "rro" in sys_mount["options"]
    assert "Read-only" in pods.exec(cid, ["touch", "/sys/x"]).stderr.decode()


def test_volumes_with_and_without_the_pods_mappings(daemon: Daemon, pods: Pods,
                                                    tmp_path: Path) -> None:
    """The kubelet sends the pod's mappings with each volume (KEP-127): runc binds it
    idmapped, so the node's root is the container's root there, both ways. A volume sent
    without mappings is a plain bind: the node's root is nobody in the container, and
    what the container's root writes belongs to the pod's first host id."""
    host = SIZE * 53
    maps = userns(host)
    vol = tmp_path / "vol"
    vol.mkdir()
    vol.chmod(0o777)
    (vol / "nodes").write_text("the node's root wrote this\n")
    pod = userns_pod(host)
    sid = pods.run(pod)
    mounts = [pb.Mount(container_path="/mapped", host_path=str(vol), uidMappings=maps.uids,
                       gidMappings=maps.gids),
              pb.Mount(container_path="/plain", host_path=str(vol)),
              pb.Mount(container_path="/img", readonly=True,
                       image=pb.ImageSpec(image=daemon.extra["busybox"]))]
    cid = pods.run_container(sid, userns_container(daemon.extra["busybox"], host,
                                                   mounts=mounts), pod)
    seen = sh(pods, cid, "stat -c %u:%g /mapped/nodes /plain/nodes /img/bin/busybox; "
                         "echo a > /mapped/by-root-mapped; echo b > /plain/by-root-plain")
    assert seen.split() == ["0:0", "65534:65534", "0:0"], seen
    assert (vol / "by-root-mapped").stat().st_uid == 0
    assert (vol / "by-root-plain").stat().st_uid == host
    # The spec says so: runc made the idmapped mount because the mount carries the maps.
    spec = json.loads(pods.status(cid, verbose=True).info["info"])["runtimeSpec"]
    by_dest = {m["destination"]: m for m in spec["mounts"]}
    want = [{"containerID": 0, "hostID": host, "size": SIZE}]
    assert by_dest["/mapped"]["uidMappings"] == want
    assert "uidMappings" not in by_dest["/plain"]
    for f in ("/etc/hosts", "/etc/hostname", "/etc/resolv.conf"):
        assert by_dest[f]["uidMappings"] == want and by_dest[f]["gidMappings"] == want, f
    assert "uidMappings" not in by_dest["/dev/shm"]


@pytest.mark.timeout(180)
def test_exec_attach_port_forward_and_stats(daemon: Daemon, pods: Pods,
                                            tmp_path: Path) -> None:
    """The real crictl's exec, attach and port-forward, and the stats calls, on a pod in
    its user namespace."""
    host = SIZE * 54
    pod = userns_pod(host)
    sid = pods.run(pod)
    web = pods.run_container(sid, userns_container(
        daemon.extra["busybox"], host, "web", command=["sh", "-c",
            f"mkdir -p /www && printf '{PAGE}' > /www/index.html && exec httpd -f -p 8080 "
            "-h /www"]), pod)
    crictl = interop.crictl(daemon.address, tmp_path)
    out = subprocess.run([*crictl, "exec", "-i", "-r", "websocket", web, "sh", "-c",
                          "cat; id -u"], input=b"in\n", capture_output=True, timeout=120)
    assert (out.returncode, out.stdout, out.stderr) == (0, b"in\n0\n", b""), out
    talker = pods.run_container(sid, userns_container(
        daemon.extra["busybox"], host, "talker", stdin=True, stdin_once=True,
        command=["sh", "-c", "read l; echo got:$l:$(id -u)"]), pod)
    out = subprocess.run([*crictl, "attach", "-i", talker], input=b"one\n",
                         capture_output=True, timeout=120)
    assert (out.returncode, out.stdout) == (0, b"got:one:0\n"), out
    proc = subprocess.Popen([*crictl, "port-forward", sid, "0:8080"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        first = proc.stdout.readline()
        found = re.fullmatch(rb"Forwarding from 127\.0\.0\.1:(\d+) -> 8080\n", first)
        assert found, (first, proc.poll())
        response = wait_for(lambda: (r := network.http_get(int(found.group(1)))).endswith(
            PAGE.encode()) and r, 30, "the page through port-forward")
        assert response.startswith(b"HTTP/1.")
    finally:
        proc.kill()
        proc.communicate()

    def stats() -> Any:
        s = pods.rt.ContainerStats(pb.ContainerStatsRequest(container_id=web),
                                   timeout=30).stats
        return s if s.cpu.usage_core_nano_seconds.value and s.memory.working_set_bytes.value \
            else None

    assert wait_for(stats, 30, "the web container's stats").writable_layer.used_bytes.value > 0
    pod_stats = pods.rt.PodSandboxStats(pb.PodSandboxStatsRequest(pod_sandbox_id=sid),
                                        timeout=30).stats
    assert {c.attributes.metadata.name for c in pod_stats.linux.containers} >= {"web"}


def test_unmasked_proc_in_a_user_namespace_pod(daemon: Daemon, pods: Pods) -> None:
    """``procMount: Unmasked`` reaches the CRI as empty masked and read-only path lists
    (the kubelet's choice; the API server allows it only with ``hostUsers: false``, and
    the CRI cannot tell it from a client that sends no lists, so the runtime honours the
    lists as they come, as containerd does): nothing is mounted over /proc, and the
    container's root, with CAP_SYS_ADMIN of its user namespace, mounts a procfs of its
    own in a new PID namespace (what nested containers need)."""
    host = SIZE * 55
    pod = userns_pod(host)
    sid = pods.run(pod)
    admin = pb.Capability(add_capabilities=["SYS_ADMIN"])
    unmasked = pods.run_container(sid, userns_container(
        daemon.extra["busybox"], host, "unmasked", security=pb.LinuxContainerSecurityContext(
            capabilities=admin)), pod)
    masked = pods.run_container(sid, userns_container(
        daemon.extra["busybox"], host, "masked", security=pb.LinuxContainerSecurityContext(
            capabilities=admin, masked_paths=["/proc/keys", "/proc/timer_list"],
            readonly_paths=["/proc/sys"])), pod)

    def under_proc(cid: str) -> list[str]:
        return sorted(line.split()[1] for line in sh(pods, cid, "cat /proc/mounts").splitlines()
                      if line.split()[1].startswith("/proc/"))

    assert under_proc(unmasked) == []
    assert under_proc(masked) == ["/proc/keys", "/proc/sys", "/proc/timer_list"]
    # In the new PID namespace, sh (which execs readlink) is pid 1: the procfs is that
    # namespace's.
    nested = "mkdir -p /p && unshare -p -f sh -c 'mount -t proc proc /p && readlink /p/self'"
    assert sh(pods, unmasked, nested).strip() == "1"


def test_nri_go_plugins_see_and_adjust_a_user_namespace_pod(daemon: Daemon, pods: Pods,
                                                            tmp_path: Path) -> None:
    """nri-logger sees the pod's and the container's user namespace (by the path of its
    pin: the NRI API has no id mapping field); nri-ulimit-adjuster and
    nri-device-injector adjust the container as they do any other."""
    for binary in ("nri-logger", "nri-ulimit-adjuster", "nri-device-injector"):
        interop.require(binary)
    sock = nri_paths(daemon.extra["base"])["socket_path"]
    logs = {n: tmp_path / f"{n}.log" for n in ("logger", "ulimit", "devices")}
    argv = {"logger": ["nri-logger", "-socket-path", sock, "-idx", "10"],
            "ulimit": ["nri-ulimit-adjuster", "-socket", sock, "-idx", "20", "-name",
                       "ulimit-adjuster"],
            "devices": ["nri-device-injector", "-socket-path", sock, "-idx", "30"]}
    procs = {}
    try:
        for n, (binary, *args) in argv.items():
            with open(logs[n], "ab") as out:
                procs[n] = subprocess.Popen([str(interop.require(binary)), *args],
                                            stdin=subprocess.DEVNULL, stdout=out, stderr=out)

        def registered() -> bool:
            info = daemon.client.runtime.Status(pb.StatusRequest(verbose=True),
                                                timeout=10).info
            names = {p["name"] for p in json.loads(info.get("nri") or "{}").get("plugins", [])}
            return {"nri-logger", "ulimit-adjuster", "nri-device-injector"} <= names

        wait_for(registered, 30, "the Go plugins to register")
        host = SIZE * 56
        vol = tmp_path / "nri-dir"
        vol.mkdir()
        (vol / "file").write_text("injected\n")
        pod = userns_pod(host, annotations={
            "ulimits.noderesource.dev/container.work":
                "- type: nofile\n  soft: 1357\n  hard: 2468\n",
            # A user namespace cannot make device nodes: runc binds the node's own, so
            # the device must exist at that path on the node.
            "devices.noderesource.dev/container.work":
                "- path: /dev/fuse\n  type: c\n  major: 10\n  minor: 229\n",
            "mounts.noderesource.dev/container.work":
                f"- source: {vol}\n  destination: /nri-mount\n  type: bind\n"
                "  options: [rbind, ro]\n"})
        sid = pods.run(pod)
        cid = pods.run_container(sid, userns_container(daemon.extra["busybox"], host, "work"),
                                 pod)
        limits = sh(pods, cid, "cat /proc/1/limits")
        assert re.search(r"Max open files\s+1357\s+2468", limits), limits
        assert sh(pods, cid, "stat -c '%t:%T' /dev/fuse").strip() == "a:e5"
        assert sh(pods, cid, "cat /nri-mount/file") == "injected\n"
        pin = str(Path(daemon.state, "sandboxes", sid, "ns", "user"))
        # The logger dumps each pod and container it is shown as YAML, a line a record:
        # the namespace list has the pin's path, then its type.
        msgs = re.findall(r'msg="([^"]*)"', logs["logger"].read_text(errors="replace"))
        for event in ("RunPodSandbox", "CreateContainer"):
            pairs = list(itertools.pairwise(msgs))
            assert any(a.startswith(f"{event}:") and a.endswith(f"- path: {pin}")
                       and b.startswith(f"{event}:") and b.endswith("type: user")
                       for a, b in pairs), (event, [m for m in msgs if "ns/user" in m])
        assert sh(pods, cid, "cat /proc/self/uid_map").split() == ["0", str(host), str(SIZE)]
    finally:
        for p in procs.values():
            p.terminate()
            p.wait(10)


def test_a_restart_keeps_user_namespace_pods(runc: Path, tmp_path: Path,
                                             registry: LocalRegistry,
                                             test_images: TestImages) -> None:
    """After a restart, user-namespace pods (with and without a pause) are ready, their
    containers run, and new containers join the same pinned user namespace."""
    base = tmp_path / "d"
    config = _config(registry, test_images, base, runc)
    busybox = test_images.busybox.ref(registry)
    host = SIZE * 57
    with mapped_root_state() as state:
        with running_daemon(str(base), config, state_dir=state) as d:
            d.client.pull(busybox)
            pods = Pods(d.client)
            made = []
            for pinned in (True, False):
                pod = userns_pod(host, pinned=pinned)
                sid = pods.run(pod)
                made.append((sid, pod, pinned,
                             pods.run_container(sid, userns_container(busybox, host,
                                                                      pinned=pinned), pod)))
        with running_daemon(str(base), config, state_dir=state) as d:
            pods = Pods(d.client)
            for sid, pod, pinned, cid in made:
                assert pods.pod_status(sid).status.state == pb.SANDBOX_READY
                assert pods.status(cid).status.state == pb.CONTAINER_RUNNING
                late = pods.run_container(sid, userns_container(busybox, host, "late",
                                                                pinned=pinned), pod)
                pids = [json.loads(pods.status(c, verbose=True).info["info"])["pid"]
                        for c in (cid, late)]
                assert len({os.stat(f"/proc/{p}/ns/user").st_ino for p in pids}) == 1
                assert sh(pods, late, "cat /proc/self/uid_map").split() == \
                    ["0", str(host), str(SIZE)]
                pods.remove_pod(sid)
            assert leftovers(d.root, d.state) == []


def test_chowned_copy_where_idmapped_layers_fail(runc: Path, tmp_path: Path,
                                                 registry: LocalRegistry,
                                                 test_images: TestImages) -> None:
    """Where the kernel or file system cannot idmap the layers (a fail point stands in
    for that here), a pod in a user namespace is refused, naming ``slow_chown``; with
    ``slow_chown = true`` it gets a copy of the image chowned to its ids, shared by its
    containers and collected after them."""
    busybox = test_images.busybox.ref(registry)
    host = SIZE * 58
    env = {"PYCRID_FAILPOINTS": "sandbox.idmap,container.idmap"}
    with mapped_root_state() as state:
        base = tmp_path / "refused"
        with running_daemon(str(base), _config(registry, test_images, base, runc),
                            env=env, state_dir=state) as d:
            with pytest.raises(grpc.RpcError) as e:
                Pods(d.client).run(userns_pod(host, pinned=False))
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "slow_chown = true" in e.value.details(), e.value.details()
            assert leftovers(d.root, d.state) == []
    with mapped_root_state() as state:
        base = tmp_path / "copied"
        section = '[plugins."pycrid.cri.v1.images"]\n'
        config = _config(registry, test_images, base, runc).replace(
            section, section + "slow_chown = true\n", 1)
        with running_daemon(str(base), config, env=env, state_dir=state) as d:
            d.client.pull(busybox)
            pods = Pods(d.client)
            pod = userns_pod(host, pinned=False)
            sid = pods.run(pod)
            cids = [pods.run_container(sid, userns_container(busybox, host, n, pinned=False),
                                       pod) for n in ("a", "b")]
            for cid in cids:
                owners = sh(pods, cid, "stat -c %u:%g /bin/busybox /etc; touch /x; "
                                       "stat -c %u /x")
                assert owners.split() == ["0:0", "0:0", "0"], owners
            assert "using a chowned copy" in d.log()
            copies = _snapshots(d, "remapped-")
            assert len(copies) == 2, copies  # the pause image's and busybox's
            pods.remove_pod(sid)
            assert _snapshots(d, "remapped-") == []
            assert leftovers(d.root, d.state) == []


def _snapshots(d: Daemon, prefix: str) -> list[str]:
    import sqlite3

    conn = sqlite3.connect(f"file:{Path(d.root, 'metadata', 'pycrid.db')}?mode=ro", uri=True)
    try:
        return [k for (k,) in conn.execute("SELECT key FROM overlay_snapshots")
                if k.startswith(prefix)]
    finally:
        conn.close()


def test_a_state_directory_the_mapped_root_cannot_reach_is_refused(
        runc: Path, tmp_path: Path, registry: LocalRegistry, test_images: TestImages) -> None:
    """runc sets the rootfs up from inside the pod's user namespace: with a directory above
    the state directory it cannot search (pytest's, 0700), RunPodSandbox names it."""
    base = tmp_path / "d"
    with running_daemon(str(base), _config(registry, test_images, base, runc)) as d:
        with pytest.raises(grpc.RpcError) as e:
            Pods(d.client).run(userns_pod(SIZE * 59))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = e.value.details()
        blocked = next(p for p in reversed(Path(d.state).parents)
                       if not p.stat().st_mode & stat.S_IXOTH)
        assert f"cannot enter {blocked}," in details and "chmod o+x" in details, details
        assert leftovers(d.root, d.state) == []
