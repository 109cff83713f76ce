"""CheckpointContainer and restore, end to end, with the CRIU beside the checkout
(``../shared/interop/bin/criu``, 4.2: Debian 12's 3.17 fails its check on this kernel).

A container that counts in memory and writes to its rootfs is checkpointed while it runs;
the archive has the layout checkpointctl reads; it is restored in a new pod (CreateContainer
with the archive's path as its image, then StartContainer) and goes on counting from
where it was, with its files and its log. Refusals: an exited or created container, a
request past its timeout, a host CRIU that fails its check, a handler whose runtime
cannot checkpoint, archives that cannot be restored. Skipped with the reason where the
interop CRIU is not there.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from pycrid.bench.cri import container_config, pod_config
from tests.support import interop
from tests.support.checkpoints import checkpoint_image, count, member
from tests.support.daemon import Daemon, mapped_root_state, running_daemon
from tests.support.images import TestImages
from tests.support.pods import (
    Pods,
    busybox_daemon,
    daemon_config,
    leftovers,
    log_text,
    wait_for,
)
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e

#: Counts in a shell variable (memory only), writes files, removes a directory of the
#: image and replaces another (an overlay whiteout and an opaque directory).
COUNTER = ("echo data > /written; rm -rf /var/tmp; rm -rf /home; mkdir /home; "
           "echo new > /home/new; i=0; while true; do i=$((i+1)); echo $i > /tmp/count; "
           "echo count $i; sleep 0.2; done")
#: A stand-in ``criu`` that stalls before a dump while a flag file exists (the timeout
#: test), and otherwise is the real one.
SLOW_CRIU = """#!/bin/sh
if [ "$1" = swrk ] && [ -e {flag} ]; then
  echo $$ > {flag}.pids
  sleep 60 & echo $! >> {flag}.pids
  wait
fi
exec {criu} "$@"
"""


@pytest.fixture(scope="module")
def criu() -> Path:
    return interop.require("criu")


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("checkpoint")


@pytest.fixture(scope="module")
def daemon(base: Path, criu: Path, registry: LocalRegistry,
           test_images: TestImages) -> Iterator[Daemon]:
    wrapper = base / "bin" / "criu"
    wrapper.parent.mkdir()
    wrapper.write_text(SLOW_CRIU.format(flag=base / "slow", criu=criu))
    wrapper.chmod(0o755)
    config = daemon_config(registry, test_images, base) + (
        '[plugins."pycrid.cri.v1.runtime"]\n'
        f'criu_path = "{wrapper}"\n')
    with busybox_daemon(base, registry, test_images, config) as d:
        yield d


@pytest.fixture
def clean(daemon: Daemon, pods: Pods) -> Iterator[None]:
    yield
    pods.cleanup()
    assert leftovers(daemon.root, daemon.state) == []


def _pod(base: Path, name: str, *, shared_pid: bool = False) -> Any:
    cfg = pod_config(name, shared_pid=shared_pid)
    cfg.log_directory = str(base / "logs" / name)
    return cfg


def _counter(pods: Pods, daemon: Daemon, base: Path, name: str, *,
             shared_pid: bool = False) -> tuple[str, str, Any]:
    """A pod and its running counter: (pod id, container id, pod config)."""
    pod = _pod(base, name, shared_pid=shared_pid)
    sid = pods.run(pod)
    cfg = container_config(daemon.extra["busybox"], "counter", ["sh", "-c", COUNTER],
                           shared_pid=shared_pid)
    cfg.log_path = "counter.log"
    cid = pods.run_container(sid, cfg, pod)
    wait_for(lambda: count(pods, cid) >= 3, 30, "the counter to count")
    return sid, cid, pod


def _checkpoint(daemon: Daemon, cid: str, location: Path, timeout: int = 0) -> None:
    daemon.client.runtime.CheckpointContainer(pb.CheckpointContainerRequest(
        container_id=cid, location=str(location), timeout=timeout), timeout=120)


def _members(archive: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(archive) as tf:
        return {m.name.rstrip("/"): m for m in tf.getmembers()}


def _counts(log: str) -> list[int]:
    return [int(line.split()[1]) for line in log.splitlines() if line.startswith("count ")]


def _restore(pods: Pods, base: Path, archive: Path | str, name: str, *,
             shared_pid: bool = False) -> tuple[str, str]:
    """A new pod and a container created from ``archive`` (a path or a checkpoint image)."""
    pod = _pod(base, name, shared_pid=shared_pid)
    sid = pods.run(pod)
    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="counter"),
                             image=pb.ImageSpec(image=str(archive)), log_path="counter.log")
    cfg.linux.security_context.namespace_options.pid = pb.POD if shared_pid else pb.CONTAINER
    return sid, pods.create(sid, cfg, pod)


def test_status_says_checkpointing_works(daemon: Daemon, base: Path) -> None:
    info = json.loads(daemon.client.runtime.Status(
        pb.StatusRequest(verbose=True), timeout=10).info["checkpoint"])
    # runc's containers can be checkpointed; gVisor's runsc (offered when installed) not.
    refusals = info.pop("handlers")
    assert info == {"criu": str(base / "bin" / "criu"), "criu_version": "4.2",
                    "criu_error": ""}
    assert refusals.pop("runc") == ""
    assert all(refusals.values()) and set(refusals) <= {"runsc"}, refusals
    out = subprocess.run([sys.executable, "-m", "pycrid", "status", "--address",
                          daemon.address], capture_output=True, text=True, timeout=60)
    assert re.search(rf"^Checkpoint: +CRIU 4\.2 \({re.escape(str(base / 'bin' / 'criu'))}\); "
                     "handlers runc(; not runsc: .*)?$", out.stdout, re.M), out.stdout


def test_checkpoint_archive_and_restore_in_a_new_pod(daemon: Daemon, pods: Pods, base: Path,
                                                     clean: None) -> None:
    src_pod, cid, _ = _counter(pods, daemon, base, "source")
    archive = base / "counter.tar"
    _checkpoint(daemon, cid, archive)

    # The container ran on, thawed.
    before = count(pods, cid)
    wait_for(lambda: count(pods, cid) > before, 10, "the checkpointed container to count on")
    assert pods.status(cid).status.state == pb.CONTAINER_RUNNING

    # The archive: the layout checkpointctl reads (containerd's names), mode 0600.
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600
    members = _members(archive)
    assert members["checkpoint"].isdir()
    for name in ("checkpoint/inventory.img", "checkpoint/pstree.img", "config.dump",
                 "spec.dump", "status.dump", "status", "container.log", "dump.log",
                 "stats-dump", "rootfs-diff.tar", "deleted.files"):
        assert members[name].isfile(), name
    assert any(n.startswith("checkpoint/pages-") for n in members)
    config = json.loads(member(archive, "config.dump"))
    status = pods.status(cid).status
    assert (config["id"], config["rootfsImageName"], config["rootfsImageRef"]) == (
        cid, status.image.image, status.image_ref)
    assert config["name"].startswith("counter_source_pycrid-bench_")
    assert config["checkpointedTime"].endswith("Z") and config["restored"] is False
    spec = json.loads(member(archive, "spec.dump"))
    assert spec["annotations"]["io.kubernetes.cri.container-name"] == "counter"
    assert spec["annotations"]["io.kubernetes.cri.sandbox-name"] == "source"
    dumped = json.loads(member(archive, "status.dump"))
    assert (dumped["id"], dumped["state"], dumped["metadata"]) == (cid, 1, {"name": "counter"})
    assert isinstance(dumped["created_at"], int)  # Go's int64, not protobuf JSON's string
    pid = json.loads(pods.status(cid, verbose=True).info["info"])["pid"]
    assert json.loads(member(archive, "status"))["Pid"] == pid > 0
    with tarfile.open(archive) as tf:
        diff = tf.extractfile("rootfs-diff.tar")
        assert diff is not None
        with tarfile.open(fileobj=diff) as inner:
            changed = set(inner.getnames())
    assert {"written", "tmp/count", "home", "home/new"} <= changed
    assert not any(n.rsplit("/", 1)[-1].startswith(".wh.") for n in changed)
    assert json.loads(member(archive, "deleted.files")) == ["/home/app", "/var/tmp"]
    checkpointed = _counts("\n".join(line.split(" ", 3)[3] for line in
                                      member(archive, "container.log").decode().splitlines()))
    assert checkpointed, "the log so far is in the archive"
    assert not (base / "root" / "containers" / cid / "checkpoint").exists()

    # Restored in a new pod: created, then started by CRIU, counting on from the dump.
    dst_pod, rid = _restore(pods, base, archive, "restored")
    created = pods.status(rid).status
    assert created.state == pb.CONTAINER_CREATED
    assert created.image.image == status.image.image
    assert created.annotations["restored"] == "true"
    assert created.annotations["checkpointImage"] == str(archive)
    pods.start(rid)
    assert pods.status(rid).status.state == pb.CONTAINER_RUNNING
    first = count(pods, rid)
    assert first >= max(checkpointed)
    wait_for(lambda: count(pods, rid) > first, 10, "the restored container to count on")
    assert pods.exec(rid, ["cat", "/written"]).stdout == b"data\n"
    assert pods.exec(rid, ["cat", "/home/new"]).stdout == b"new\n"
    listing = pods.exec(rid, ["ls", "-a", "/home", "/var"]).stdout.decode()
    assert "app" not in listing and "tmp" not in listing

    # Its log: the archive's lines, then the restored process's, one count after another.
    log = log_text(str(base / "logs" / "restored" / "counter.log"))
    counts = _counts(log)
    assert counts[:len(checkpointed)] == checkpointed
    assert counts == list(range(1, len(counts) + 1)), counts

    # The restored processes live in the new pod's namespaces, not the old one's.
    pid = json.loads(pods.status(rid, verbose=True).info["info"])["pid"]
    netns = json.loads(pods.pod_status(dst_pod, verbose=True).info["info"])["netns"]
    old_netns = json.loads(pods.pod_status(src_pod, verbose=True).info["info"])["netns"]
    assert os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(netns).st_ino
    assert os.stat(netns).st_ino != os.stat(old_netns).st_ino
    assert not (base / "root" / "containers" / rid / "restore").exists()

    # It stops and goes like any other container.
    pods.stop(rid, timeout=2)
    assert pods.status(rid).status.state == pb.CONTAINER_EXITED


def test_restore_into_a_pod_sharing_its_pid_namespace(daemon: Daemon, pods: Pods, base: Path,
                                                      clean: None) -> None:
    """A pod with a pause container (shareProcessNamespace): the PID namespace is the
    pod's, so CRIU dumps it as external and the restore joins the new pod's."""
    _, cid, _ = _counter(pods, daemon, base, "shared", shared_pid=True)
    archive = base / "shared.tar"
    _checkpoint(daemon, cid, archive)
    with pytest.raises(grpc.RpcError) as e:
        _restore(pods, base, archive, "not-shared")
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "the new pod must do the same" in e.value.details()
    _, rid = _restore(pods, base, archive, "shared-again", shared_pid=True)
    pods.start(rid)
    first = count(pods, rid)
    wait_for(lambda: count(pods, rid) > first, 10, "the restored container to count on")


def test_restore_from_a_checkpoint_image(daemon: Daemon, pods: Pods, base: Path,
                                         clean: None, registry: LocalRegistry) -> None:
    """An archive made into an OCI image and pulled like any other: the kubelet's way."""
    _, cid, _ = _counter(pods, daemon, base, "image-source")
    archive = base / "image.tar"
    _checkpoint(daemon, cid, archive)
    image = checkpoint_image(registry, archive, "checkpoints/counter")
    image_id = daemon.client.pull(image)
    _, rid = _restore(pods, base, image_id, "from-image")
    status = pods.status(rid).status
    assert status.state == pb.CONTAINER_CREATED
    assert status.annotations["checkpointImage"] == image_id
    pods.start(rid)
    first = count(pods, rid)
    wait_for(lambda: count(pods, rid) > first, 10, "the restored container to count on")
    assert pods.exec(rid, ["cat", "/written"]).stdout == b"data\n"
    counts = _counts(log_text(str(base / "logs" / "from-image" / "counter.log")))
    assert counts == list(range(1, len(counts) + 1))


def test_crictl_checkpoint_and_restore(daemon: Daemon, pods: Pods, base: Path,
                                      clean: None, tmp_path: Path) -> None:
    """The same with the real crictl: ``crictl checkpoint --export``, then ``crictl create``
    of the archive (no pull) and ``crictl start``."""
    argv = interop.crictl(daemon.address, tmp_path, timeout=60)

    def crictl(*args: str) -> str:
        done = subprocess.run([*argv, *args],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    _, cid, _ = _counter(pods, daemon, base, "crictl-source")
    archive = base / "crictl.tar"
    assert crictl("checkpoint", "--export", str(archive), cid) == cid
    pod = {"metadata": {"name": "crictl-restored", "namespace": "default", "uid": "u1"},
           "log_directory": str(base / "logs" / "crictl-restored"),
           "linux": {"security_context": {"namespace_options": {"pid": 1}}}}
    ctr = {"metadata": {"name": "counter"}, "image": {"image": str(archive)},
           "log_path": "counter.log",
           "linux": {"security_context": {"namespace_options": {"pid": 1}}}}
    (tmp_path / "pod.json").write_text(json.dumps(pod))
    (tmp_path / "ctr.json").write_text(json.dumps(ctr))
    sid = crictl("runp", str(tmp_path / "pod.json"))
    pods.pods.append(sid)  # removed with the test's other pods
    rid = crictl("create", "--no-pull", sid, str(tmp_path / "ctr.json"),
                 str(tmp_path / "pod.json"))
    crictl("start", rid)
    first = int(crictl("exec", rid, "cat", "/tmp/count"))
    wait_for(lambda: int(crictl("exec", rid, "cat", "/tmp/count")) > first, 10,
             "the restored container to count on")
    assert crictl("exec", rid, "cat", "/written") == "data"
    counts = _counts(log_text(str(base / "logs" / "crictl-restored" / "counter.log")))
    assert counts == list(range(1, len(counts) + 1))


def test_checkpoint_refused_for_a_container_that_does_not_run(
        daemon: Daemon, pods: Pods, base: Path, clean: None) -> None:
    pod = _pod(base, "idle")
    sid = pods.run(pod)
    created = pods.create(sid, container_config(daemon.extra["busybox"], "idle",
                                                ["sleep", "60"]), pod)
    exited = pods.run_container(sid, container_config(daemon.extra["busybox"], "done",
                                                      ["true"]), pod)
    pods.wait_state(exited, pb.CONTAINER_EXITED)
    for cid, state in ((created, "CONTAINER_CREATED"), (exited, "CONTAINER_EXITED")):
        location = base / f"refused-{state}.tar"
        with pytest.raises(grpc.RpcError) as e:
            _checkpoint(daemon, cid, location)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert e.value.details() == (f"container {cid} is in {state} state; only running "
                                     "containers can be checkpointed")
        assert not location.exists()
    with pytest.raises(grpc.RpcError) as e:
        _checkpoint(daemon, "0" * 64, base / "none.tar")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_checkpoint_location_must_be_an_absolute_path_in_a_directory(
        daemon: Daemon, pods: Pods, base: Path, clean: None) -> None:
    _, cid, _ = _counter(pods, daemon, base, "where")
    for location, why in (("relative.tar", "must be an absolute path"),
                          (str(base / "no-such-dir" / "x.tar"), "does not exist"),
                          (str(base), "is a directory"), ("", "must name")):
        with pytest.raises(grpc.RpcError) as e:
            daemon.client.runtime.CheckpointContainer(pb.CheckpointContainerRequest(
                container_id=cid, location=location), timeout=60)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert why in e.value.details()


def test_timeout_leaves_the_container_running_and_no_archive(
        daemon: Daemon, pods: Pods, base: Path, clean: None) -> None:
    _, cid, _ = _counter(pods, daemon, base, "slow")
    out = base / "slow-out"
    out.mkdir()
    (base / "slow").touch()  # the wrapper stalls CRIU: the container is frozen meanwhile
    try:
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            _checkpoint(daemon, cid, out / "slow.tar", timeout=2)
        took = time.monotonic() - started
    finally:
        (base / "slow").unlink()
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "did not finish within 2s" in e.value.details()
    assert took < 10
    assert os.listdir(out) == []  # no archive, no temporary file
    state = json.loads(subprocess.run(
        ["runc", f"--root={daemon.state}/runc", "state", cid], capture_output=True,
        check=True).stdout)
    assert state["status"] == "running"  # thawed
    before = count(pods, cid)
    wait_for(lambda: count(pods, cid) > before, 10, "the container to count on")
    assert not (base / "root" / "containers" / cid / "checkpoint").exists()
    # The stalled CRIU (the wrapper and its sleep) went with runc.
    pids = [int(p) for p in (base / "slow.pids").read_text().split()]
    assert len(pids) == 2
    assert [p for p in pids if _alive(p)] == []
    # And the next checkpoint works.
    _checkpoint(daemon, cid, out / "again.tar")
    assert (out / "again.tar").is_file()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_restore_refusals(daemon: Daemon, pods: Pods, base: Path, clean: None) -> None:
    pod = _pod(base, "refusals")
    sid = pods.run(pod)

    def create(image: str, **kw: Any) -> grpc.RpcError:
        cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="r"),
                                 image=pb.ImageSpec(image=image), **kw)
        cfg.linux.security_context.namespace_options.pid = pb.CONTAINER
        with pytest.raises(grpc.RpcError) as e:
            pods.create(sid, cfg, pod)
        return e.value

    junk = base / "junk.tar"
    junk.write_bytes(b"not a tar")
    e = create(str(junk))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "is not a checkpoint archive" in e.details()

    plain = base / "plain.tar"
    with tarfile.open(plain, "w") as tf:
        info = tarfile.TarInfo("config.dump")
        info.size = 2
        tf.addfile(info, io.BytesIO(b"{}"))
    e = create(str(plain))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "has no spec.dump, checkpoint/inventory.img" in e.details()

    # A real archive whose base image is not here.
    _, cid, _ = _counter(pods, daemon, base, "gone-base")
    archive = base / "gone-base.tar"
    _checkpoint(daemon, cid, archive)
    edited = base / "edited.tar"
    _rewrite(archive, edited, "config.dump", lambda doc: {
        **doc, "rootfsImageRef": "example.invalid/none@sha256:" + "0" * 64,
        "rootfsImageName": "example.invalid/none:1", "rootfsImage": "example.invalid/none:1"})
    e = create(str(edited))
    assert e.code() == grpc.StatusCode.NOT_FOUND
    assert "base image 'example.invalid/none@sha256:" in e.details()

    # A bind mount the checkpointed container had and the request does not.
    _rewrite(archive, edited, "spec.dump", lambda spec: {
        **spec, "mounts": [*spec["mounts"], {"destination": "/data", "type": "bind",
                                             "source": "/tmp", "options": ["rbind"]}]})
    e = create(str(edited))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "needs the bind mounts its container had, which this request lacks: /data" in (
        e.details())
    assert not [c for c in pods.rt.ListContainers(pb.ListContainersRequest(), timeout=30)
                .containers if c.metadata.name == "r"]


def test_failed_restore_is_a_start_error_that_leaves_nothing(
        daemon: Daemon, pods: Pods, base: Path, clean: None) -> None:
    """CRIU cannot restore (the processes' core images are gone): StartContainer fails with
    CRIU's own reason, the container is EXITED with StartError (as a failed runc start
    is), and its removal leaves nothing (the clean fixture checks)."""
    _, cid, _ = _counter(pods, daemon, base, "broken-src")
    archive = base / "broken-src.tar"
    _checkpoint(daemon, cid, archive)
    broken = base / "broken.tar"
    with tarfile.open(archive) as tin, tarfile.open(broken, "w") as tout:
        for m in tin.getmembers():
            if not m.name.startswith("checkpoint/core-"):
                tout.addfile(m, tin.extractfile(m) if m.isfile() else None)
    _, rid = _restore(pods, base, broken, "broken")
    with pytest.raises(grpc.RpcError) as e:
        pods.start(rid)
    assert e.value.code() == grpc.StatusCode.UNKNOWN
    assert e.value.details().startswith(f"runc restore {rid} failed: ")
    # A missing image reads as an empty one.
    assert e.value.details().endswith("(CRIU: Unexpected EOF on (empty-image))")
    status = pods.status(rid).status
    assert (status.state, status.reason, status.exit_code) == (
        pb.CONTAINER_EXITED, "StartError", 128)
    pods.remove(rid)


def _rewrite(src: Path, dst: Path, name: str, change: Any) -> None:
    """A copy of archive ``src`` with JSON member ``name`` changed."""
    with tarfile.open(src) as tin, tarfile.open(dst, "w") as tout:
        for m in tin.getmembers():
            f = tin.extractfile(m) if m.isfile() else None
            data = f.read() if f is not None else None
            if m.name == name and data is not None:
                data = json.dumps(change(json.loads(data))).encode()
                m.size = len(data)
            tout.addfile(m, None if data is None else io.BytesIO(data))


def test_restore_pending_survives_a_daemon_restart(
        daemon: Daemon, pods: Pods, base: Path, clean: None) -> None:
    """Created from a checkpoint, not started: no runc container exists until the start,
    and recovery must not take that for a container that died."""
    _, cid, _ = _counter(pods, daemon, base, "pending-src")
    archive = base / "pending.tar"
    _checkpoint(daemon, cid, archive)
    _, rid = _restore(pods, base, archive, "pending")
    _restart(daemon)
    assert pods.status(rid).status.state == pb.CONTAINER_CREATED
    pods.start(rid)
    first = count(pods, rid)
    wait_for(lambda: count(pods, rid) > first, 10, "the restored container to count on")


def _restart(daemon: Daemon) -> None:
    """Stop the module's daemon and start it again on the same root and config."""
    from tests.support.daemon import serve_command, wait_ready

    daemon.proc.terminate()
    daemon.proc.wait(30)
    with open(daemon.log_path, "ab") as logf:
        daemon.proc = subprocess.Popen(
            serve_command(str(Path(daemon.root).parent / "config.toml"), daemon.root,
                          daemon.state, daemon.address),
            stdout=logf, stderr=logf, stdin=subprocess.DEVNULL)
    wait_ready(daemon)


# ---- a host whose CRIU fails its check, and a handler whose runtime cannot ---------------

FAILING_CRIU = """#!/bin/sh
case "$1" in
--version) echo "Version: 3.17.1" ;;
check) echo "Error (criu/vdso.c:381): vdso: Unexpected rt vDSO area bounds" >&2; exit 1 ;;
*) exit 1 ;;
esac
"""


def _host_criu_or_stand_in(base: Path) -> str:
    """Debian's CRIU where its check fails on this kernel (this project's machines), else
    a stand-in that fails the same way."""
    debian = "/usr/sbin/criu"
    if os.access(debian, os.X_OK) and subprocess.run(
            [debian, "check"], capture_output=True).returncode != 0:
        return debian
    stand_in = base / "failing-criu"
    stand_in.write_text(FAILING_CRIU)
    stand_in.chmod(0o755)
    return str(stand_in)


def test_refused_when_criu_fails_its_check_or_the_handler_cannot(
        tmp_path: Path, registry: LocalRegistry, test_images: TestImages) -> None:
    failing = _host_criu_or_stand_in(tmp_path)
    # With runsc installed the daemon offers the gVisor handler "runsc" unasked: its pods
    # cannot be checkpointed with CRIU at all.
    gvisor = shutil.which("runsc") is not None
    config = daemon_config(registry, test_images, tmp_path) + (
        '[plugins."pycrid.cri.v1.runtime"]\n'
        f'criu_path = "{failing}"\n')
    with running_daemon(str(tmp_path), config) as d:
        info = json.loads(d.client.runtime.Status(
            pb.StatusRequest(verbose=True), timeout=10).info["checkpoint"])
        assert info["criu"] == failing
        assert info["criu_error"].startswith(f"`{failing} check` fails on this kernel (vdso: ")
        assert "a newer CRIU is needed" in info["criu_error"]
        assert info["handlers"]["runc"] == info["criu_error"]
        if gvisor:
            assert info["handlers"]["runsc"] == (
                "gVisor (runsc) containers cannot be checkpointed with CRIU: their processes "
                "run on gVisor's own kernel (runsc's own checkpoint is not used)")
        busybox = test_images.busybox.ref(registry)
        d.client.pull(busybox)
        pods = Pods(d.client)
        try:
            pod = pod_config("nocriu")
            sid = pods.run(pod)
            cid = pods.run_container(sid, container_config(busybox, "c", ["sleep", "60"]), pod)
            with pytest.raises(grpc.RpcError) as e:
                _checkpoint(d, cid, tmp_path / "x.tar")
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert e.value.details() == (f"container {cid} cannot be checkpointed: "
                                         f"{info['criu_error']}")
            assert not (tmp_path / "x.tar").exists()
            assert pods.status(cid).status.state == pb.CONTAINER_RUNNING
            if gvisor:
                runsc_pod = pod_config("gvisor")
                rsid = pods.run(runsc_pod, handler="runsc")
                cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="r"),
                                         image=pb.ImageSpec(image=str(tmp_path / "x.tar")))
                (tmp_path / "x.tar").write_bytes(b"")
                with pytest.raises(grpc.RpcError) as e:
                    pods.create(rsid, cfg, runsc_pod)
                assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert e.value.details() == (
                    f"cannot restore {tmp_path / 'x.tar'} in pod sandbox {rsid}: "
                    f"{info['handlers']['runsc']}")
        finally:
            pods.cleanup()


def test_user_namespace_pods(tmp_path: Path, registry: LocalRegistry,
                             test_images: TestImages) -> None:
    """A container of a pod with its own user namespace (runc 1.5.1, idmapped mounts):
    CRIU 4.2 dumps it (seen by hand with runc 1.5.1 on this kernel), and a restore into
    such a pod is refused by name: by hand CRIU could not read its images as the
    container's root, then could not remount /sys."""
    runc = interop.idmap_runc()
    criu = interop.require("criu")
    config = daemon_config(registry, test_images, tmp_path) + (
        f'[plugins."pycrid.cri.v1.runtime"]\ncriu_path = "{criu}"\n'
        '[plugins."pycrid.cri.v1.runtime".runtimes.idmap.options]\n'
        f'BinaryName = "{runc}"\nRoot = "{tmp_path / "idmap-root"}"\n')
    # The pod's mapped root must pass through the directories above its bundles.
    with mapped_root_state() as state, running_daemon(str(tmp_path), config,
                                                      state_dir=state) as d:
        busybox = test_images.busybox.ref(registry)
        d.client.pull(busybox)
        pods = Pods(d.client)
        try:
            pod = pod_config("userns")
            opts = pod.linux.security_context.namespace_options
            opts.userns_options.mode = pb.POD
            opts.userns_options.uids.add(host_id=200000, container_id=0, length=65536)
            opts.userns_options.gids.add(host_id=200000, container_id=0, length=65536)
            sid = pods.run(pod, handler="idmap")
            cfg = container_config(busybox, "counter", ["sh", "-c", COUNTER])
            cfg.linux.security_context.namespace_options.CopyFrom(opts)
            cfg.linux.security_context.namespace_options.pid = pb.CONTAINER
            cid = pods.run_container(sid, cfg, pod)
            wait_for(lambda: count(pods, cid) >= 3, 30, "the counter to count")
            archive = tmp_path / "userns.tar"
            _checkpoint(d, cid, archive)
            assert "checkpoint/inventory.img" in _members(archive)
            before = count(pods, cid)
            wait_for(lambda: count(pods, cid) > before, 10, "the container to count on")
            again = pod_config("userns-restored")
            again.linux.security_context.namespace_options.CopyFrom(opts)
            rsid = pods.run(again, handler="idmap")
            restored = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="counter"),
                                          image=pb.ImageSpec(image=str(archive)))
            restored.linux.security_context.namespace_options.CopyFrom(
                cfg.linux.security_context.namespace_options)
            with pytest.raises(grpc.RpcError) as e:
                pods.create(rsid, restored, again)
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "the pod has its own user namespace, and restoring into one is not " \
                   "supported" in e.value.details()
        finally:
            pods.cleanup()
