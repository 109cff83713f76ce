"""kill -9 of the daemon at every step of every mutating CRI operation.

Each case starts a daemon with ``PYCRID_FAILPOINTS=<step>:kill`` (the daemon
SIGKILLs itself when it reaches that step), drives the operation until the
daemon dies under the call, restarts it without fail points and checks:

* every object the client was told exists still exists, in the state the
  truth gives it (a container SIGKILLed before the crash is EXITED, one whose
  ``runc start`` ran is RUNNING), and nothing the client was not told of is
  visible;
* recovery finished or undid the operation by itself (the orphan sweep, for traces
  no record explains, removed nothing), and no trace of any other object is left:
  bundles, volumes, exit files, runc state, conmon processes, mounts, netns, CNI cache
  entries and pod IPs, writable snapshots and image volume views, container cgroups;
* the operation, retried, succeeds; afterwards removing everything leaves
  nothing at all (``leftovers``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from tests.support import interop
from tests.support.daemon import (
    Daemon,
    daemon_ids,
    mapped_root_state,
    mounts_under,
    running_daemon,
)
from tests.support.images import TestImages
from tests.support.network import allocated_ips
from tests.support.pods import (
    Pods,
    command_lines,
    container_cgroups,
    container_config,
    daemon_config,
    leftovers,
    pod_config,
    wait_for,
)
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e

#: operation -> the fail points along its path, in order.
MATRIX: dict[str, list[str]] = {
    "RunPodSandbox": ["sandbox.record", "sandbox.netns", "sandbox.network", "sandbox.files",
                      "sandbox.shm", "sandbox.rootfs", "sandbox.spec", "sandbox.created",
                      "sandbox.started"],
    "CreateContainer": ["container.record", "container.rootfs", "container.image_volumes",
                        "container.bundle", "container.created"],
    "StartContainer": ["container.start", "container.started"],
    "StopContainer": ["container.signalled", "container.killed"],
    "RemoveContainer": ["container.remove", "container.cleaned"],
    "StopPodSandbox": ["sandbox.stop", "sandbox.stopped", "sandbox.detached"],
    "RemovePodSandbox": ["sandbox.remove", "sandbox.shutdown"],
    "PullImage": ["pull.manifest", "pull.downloaded", "pull.unpacking", "pull.unpacked"],
    # With the interop CRIU (skipped without it): frozen before and after the dump; a
    # container created from a checkpoint archive, and its start, which restores it.
    "CheckpointContainer": ["container.frozen", "container.dumped"],
    # (The steps a restore shares with any create or start are CreateContainer's and
    # StartContainer's above; these are its own.)
    "RestoreCreate": ["restore.unpacked", "restore.logged"],
    "RestoreStart": ["restore.restoring", "restore.restored"],
}
CRIU_OPS = ("CheckpointContainer", "RestoreCreate", "RestoreStart")
#: Writes a file, then counts in memory (what a checkpoint has to carry).
COUNTER = ["sh", "-c", "echo data > /written; i=0; "
           "while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done"]
#: The same for a pod without a pause process (drop_infra_ctr): its own steps where the
#: pause's would be.
PINNED: dict[str, list[str]] = {
    "RunPodSandbox": ["sandbox.record", "sandbox.netns", "sandbox.network", "sandbox.files",
                      "sandbox.shm", "sandbox.pinned"],
    "CreateContainer": ["container.record", "container.bundle", "container.created"],
    "StopPodSandbox": ["sandbox.stop", "sandbox.stopped", "sandbox.detached"],
    "RemovePodSandbox": ["sandbox.remove", "sandbox.shutdown"],
}
#: Pods in a user namespace (with a runc that makes idmapped mounts): the pod steps, and
#: a container's create, whose rootfs and image volume are idmapped mounts, with and
#: without a pause. The idmapped layers are bound on a scratch point in the bundle while
#: the overlay is mounted: a crash right then is one more step.
USERNS: dict[str, list[str]] = {
    "RunPodSandbox": [*MATRIX["RunPodSandbox"][:-4], "sandbox.idmapped_layers",
                      *MATRIX["RunPodSandbox"][-4:]],
    "CreateContainer": ["container.record", "container.idmapped_layers", "container.rootfs",
                        "container.image_volumes", "container.bundle", "container.created"],
    "StopPodSandbox": MATRIX["StopPodSandbox"],
    "RemovePodSandbox": MATRIX["RemovePodSandbox"],
}
USERNS_PINNED: dict[str, list[str]] = {
    "RunPodSandbox": PINNED["RunPodSandbox"],
    "CreateContainer": ["container.record", "container.idmapped_layers", "container.bundle",
                        "container.created"],
    "StopPodSandbox": PINNED["StopPodSandbox"],
}
CASES = ([(op, point, "pause") for op, points in MATRIX.items() for point in points]
         + [(op, point, "pinned") for op, points in PINNED.items() for point in points]
         + [(op, point, "userns") for op, points in USERNS.items() for point in points]
         + [(op, point, "userns-pinned") for op, points in USERNS_PINNED.items()
            for point in points])
#: The pod's user namespace mappings (the kubelet picks a multiple of 65536).
USERNS_MAP = [pb.IDMapping(container_id=0, host_id=65536 * 40, length=65536)]


@dataclass
class World:
    """What the client was told exists, and the states it expects after the restart."""

    pod: Any = None
    sid: str = ""
    cid: str = ""
    #: A container created from a checkpoint archive (RestoreStart).
    rid: str = ""
    pods: dict[str, int] = field(default_factory=dict)
    containers: dict[str, int] = field(default_factory=dict)
    images: list[str] = field(default_factory=list)


class Scenario:
    def __init__(self, op: str, point: str, registry: LocalRegistry,
                 images: TestImages, kind: str = "pause", archive: Path | None = None) -> None:
        self.op, self.point = op, point
        self.pinned, self.userns = kind.endswith("pinned"), kind.startswith("userns")
        self.registry, self.images = registry, images
        self.busybox = images.busybox.ref(registry)
        self.layered = images.layered.ref(registry)
        #: Where CheckpointContainer writes (the checkpoint and restore cases).
        self.archive = archive or Path("/nonexistent")

    def _namespaces(self, opts: Any) -> None:
        opts.pid = pb.CONTAINER if self.pinned else pb.POD
        if self.userns:
            opts.userns_options.CopyFrom(pb.UserNamespace(mode=pb.POD, uids=USERNS_MAP,
                                                          gids=USERNS_MAP))

    def pod(self) -> Any:
        """A pod with a pause container, or (pinned) one without; in a user namespace
        of its own or not."""
        cfg = pod_config()
        self._namespaces(cfg.linux.security_context.namespace_options)
        return cfg

    def sleeper(self, name: str = "c") -> Any:
        cfg = self._sleeper(name)
        self._namespaces(cfg.linux.security_context.namespace_options)
        return cfg

    def restored(self) -> Any:
        """A container made from the checkpoint archive (its image is the archive's path)."""
        return container_config(str(self.archive), "restored")

    def _sleeper(self, name: str) -> Any:
        if self.op in CRIU_OPS:
            return container_config(self.busybox, name, command=COUNTER)
        if self.op == "StopContainer":
            # Ignores SIGTERM, so the daemon dies inside the grace period and the retried
            # stop has to SIGKILL.
            # /tmp/ignoring says the trap is in place (see ``prepare``).
            return container_config(self.busybox, name, command=[
                "sh", "-c", "trap '' TERM; touch /tmp/ignoring; sleep 3600 & wait"])
        if self.op == "CreateContainer":
            # With an image volume (its own mount and snapshot view) to clean up too.
            return container_config(self.busybox, name, command=["sleep", "3600"], mounts=[
                pb.Mount(container_path="/vol", readonly=True,
                         image=pb.ImageSpec(image=self.busybox))])
        return container_config(self.busybox, name, command=["sleep", "3600"])

    # ---- before the crash: set the stage, then the call the daemon dies in ----------------

    def prepare(self, d: Daemon, pods: Pods) -> World:
        w = World()
        if self.op == "PullImage":
            return w  # the call is the first pull: any pull would meet the fail point
        d.client.pull(self.images.pause.ref(self.registry))
        d.client.pull(self.busybox)
        if self.op == "RunPodSandbox":
            return w
        w.pod = self.pod()
        w.sid = pods.run(w.pod)
        w.pods[w.sid] = pb.SANDBOX_READY
        if self.op == "CreateContainer":
            return w
        w.cid = pods.create(w.sid, self.sleeper(), w.pod)
        w.containers[w.cid] = pb.CONTAINER_CREATED
        if self.op == "StartContainer":
            return w
        pods.start(w.cid)
        w.containers[w.cid] = pb.CONTAINER_RUNNING
        if self.op == "StopContainer":
            # A SIGTERM that came before the shell's trap would end it at once.
            wait_for(lambda: pods.exec(w.cid, ["test", "-e", "/tmp/ignoring"]).exit_code == 0,
                     10, "the container to ignore SIGTERM")
        if self.op == "RemoveContainer":
            pods.stop(w.cid)
            w.containers[w.cid] = pb.CONTAINER_EXITED
        if self.op in ("RestoreCreate", "RestoreStart"):
            # Checkpointed, then stopped: its restore comes back in the same pod (whose
            # PID namespace the pause holds) with the same pids.
            wait_for(lambda: pods.exec(w.cid, ["test", "-e", "/tmp/count"]).exit_code == 0,
                     10, "the counter to count")
            _checkpoint(d, w.cid, self.archive)
            pods.stop(w.cid)
            w.containers[w.cid] = pb.CONTAINER_EXITED
        if self.op == "RestoreStart":
            w.rid = pods.create(w.sid, self.restored(), w.pod)
            w.containers[w.rid] = pb.CONTAINER_CREATED
        return w

    def call(self, pods: Pods, d: Daemon, w: World) -> None:
        ops: dict[str, Callable[[], object]] = {
            "RunPodSandbox": lambda: pods.run(self.pod()),
            "CreateContainer": lambda: pods.create(w.sid, self.sleeper(), w.pod),
            "StartContainer": lambda: pods.start(w.cid),
            "StopContainer": lambda: pods.stop(w.cid, timeout=30),
            "RemoveContainer": lambda: pods.remove(w.cid),
            "StopPodSandbox": lambda: pods.stop_pod(w.sid),
            "RemovePodSandbox": lambda: pods.remove_pod(w.sid),
            "PullImage": lambda: d.client.pull(self.layered),
            "CheckpointContainer": lambda: _checkpoint(d, w.cid, self.archive),
            "RestoreCreate": lambda: pods.create(w.sid, self.restored(), w.pod),
            "RestoreStart": lambda: pods.start(w.rid),
        }
        ops[self.op]()

    # ---- after the restart ----------------------------------------------------------

    def expected(self, w: World) -> World:
        """What the truth is after the crash at this point."""
        if self.op == "StartContainer" and self.point == "container.started":
            w.containers[w.cid] = pb.CONTAINER_RUNNING  # runc start ran: the start is finished
        elif self.op == "RestoreStart" and self.point == "restore.restored":
            w.containers[w.rid] = pb.CONTAINER_RUNNING  # runc restore ran: so did the start
        elif self.op == "StopContainer" and self.point == "container.killed":
            w.containers[w.cid] = pb.CONTAINER_EXITED  # SIGKILLed while nobody watched
        elif self.op == "RemoveContainer":
            del w.containers[w.cid]  # the recorded intent: the removal is finished
        elif self.op == "StopPodSandbox":
            w.containers[w.cid] = pb.CONTAINER_EXITED  # killed before the first fail point
            if self.point != "sandbox.stop":
                w.pods[w.sid] = pb.SANDBOX_NOTREADY  # the pause was killed too
        elif self.op == "RemovePodSandbox":
            w.pods.clear()
            w.containers.clear()
        return w

    def retry(self, d: Daemon, pods: Pods, w: World) -> Callable[[], None]:
        """The client's retry, and what must hold after it."""
        def run_pod() -> None:
            sid = pods.run(self.pod())
            assert pods.pod_status(sid).status.state == pb.SANDBOX_READY

        def create() -> None:
            cid = pods.create(w.sid, self.sleeper(), w.pod)
            pods.start(cid)
            assert pods.status(cid).status.state == pb.CONTAINER_RUNNING
            assert pods.exec(cid, ["test", "-x", "/vol/bin/busybox"]).exit_code == 0

        def start() -> None:
            if pods.status(w.cid).status.state == pb.CONTAINER_CREATED:
                pods.start(w.cid)
            else:
                # Recovery finished the start; a second StartContainer is refused, as
                # containerd refuses to start a running container.
                with pytest.raises(grpc.RpcError) as e:
                    pods.start(w.cid)
                assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert pods.exec(w.cid, ["true"]).exit_code == 0

        def stop() -> None:
            pods.stop(w.cid, timeout=1)
            st = pods.status(w.cid).status
            assert (st.state, st.exit_code) == (pb.CONTAINER_EXITED, 137)

        def remove() -> None:
            pods.remove(w.cid)

        def stop_pod() -> None:
            pods.stop_pod(w.sid)
            assert pods.pod_status(w.sid).status.state == pb.SANDBOX_NOTREADY

        def remove_pod() -> None:
            pods.remove_pod(w.sid)

        def pull() -> None:
            d.client.pull(self.layered)
            assert d.client.status(self.layered).image.id

        def checkpoint() -> None:
            # Recovery thawed it and removed what the checkpoint had gathered: it counts
            # on, and a checkpoint goes through.
            assert _runc_status(d, w.cid) == "running"
            assert not os.path.exists(os.path.join(d.root, "containers", w.cid, "checkpoint"))
            before = _count(pods, w.cid)
            wait_for(lambda: _count(pods, w.cid) > before, 10, "the container to count on")
            _checkpoint(d, w.cid, self.archive)
            assert self.archive.is_file()

        def restore_create() -> None:
            rid = pods.create(w.sid, self.restored(), w.pod)
            pods.start(rid)
            assert pods.exec(rid, ["cat", "/written"]).stdout == b"data\n"

        def restore_start() -> None:
            if pods.status(w.rid).status.state == pb.CONTAINER_CREATED:
                pods.start(w.rid)
            first = _count(pods, w.rid)
            wait_for(lambda: _count(pods, w.rid) > first, 10, "the restored one to count on")
            assert json.loads(pods.status(w.rid, verbose=True).info["info"])["pid"] > 0

        return {"RunPodSandbox": run_pod, "CreateContainer": create, "StartContainer": start,
                "StopContainer": stop, "RemoveContainer": remove, "StopPodSandbox": stop_pod,
                "RemovePodSandbox": remove_pod, "PullImage": pull,
                "CheckpointContainer": checkpoint, "RestoreCreate": restore_create,
                "RestoreStart": restore_start}[self.op]


def _checkpoint(d: Daemon, cid: str, location: Path) -> None:
    d.client.runtime.CheckpointContainer(pb.CheckpointContainerRequest(
        container_id=cid, location=str(location)), timeout=120)


def _count(pods: Pods, cid: str) -> int:
    r = pods.exec(cid, ["cat", "/tmp/count"], timeout=10)
    return int(r.stdout or 0) if r.exit_code == 0 else 0


def _runc_status(d: Daemon, cid: str) -> str:
    out = subprocess.run(["runc", f"--root={d.state}/runc", "state", cid],
                         capture_output=True, check=True).stdout
    return str(json.loads(out)["status"])


def _start(base: Path, registry: LocalRegistry, images: TestImages,
           failpoints: str = "", state: str | None = None, criu: Path | None = None
           ) -> contextlib.AbstractContextManager[Daemon]:
    """The daemon of a case; with ``state`` (user-namespace pods), the interop runc and
    that state directory, which the pods' mapped root can pass through; with ``criu``,
    that CRIU."""
    env = {"PYCRID_FAILPOINTS": failpoints} if failpoints else None
    config = daemon_config(registry, images, base)
    runtime = []
    if state is not None:
        runtime.append(f'runtime_path = "{interop.idmap_runc()}"')
    if criu is not None:
        runtime.append(f'criu_path = "{criu}"')
    if runtime:
        config += '[plugins."pycrid.cri.v1.runtime"]\n' + "\n".join(runtime) + "\n"
    return running_daemon(str(base), config, env=env, state_dir=state)


def _listed(pods: Pods) -> tuple[dict[str, int], dict[str, int]]:
    rt = pods.rt
    return ({p.id: p.state for p in rt.ListPodSandbox(pb.ListPodSandboxRequest(),
                                                      timeout=30).items},
            {c.id: c.state for c in rt.ListContainers(pb.ListContainersRequest(),
                                                      timeout=30).containers})


def _log_since(d: Daemon, offset: int) -> str:
    with open(d.log_path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def strays(d: Daemon, pods: set[str], containers: set[str]) -> list[str]:
    """Traces of any object other than ``pods`` and ``containers``."""
    known = pods | containers
    found: list[str] = []

    def names(*parts: str) -> set[str]:
        path = os.path.join(*parts)
        return set(os.listdir(path)) if os.path.isdir(path) else set()

    for base in (d.state, d.root):
        found += [f"container dir {n}" for n in names(base, "containers") - containers]
        found += [f"sandbox dir {n}" for n in names(base, "sandboxes") - pods]
    found += [f"exit file {n}" for n in names(d.state, "exits") - known]
    found += [f"runc state {n}" for n in names(d.state, "runc") - known]
    netns = names(d.state, "netns")
    if len(netns) > len(pods):
        found.append(f"netns {sorted(netns)} for {len(pods)} pods")
    for mp in mounts_under(d.state) + mounts_under(d.root):
        if not any(k in mp for k in known) and "/netns/" not in mp:
            found.append(f"mount {mp}")
    for pid, cmd in command_lines():
        if "conmon" in cmd.split(" ", 1)[0] and d.state in cmd:
            argv = cmd.split()
            cid = argv[argv.index("--cid") + 1] if "--cid" in argv else "?"
            if cid not in known:
                found.append(f"conmon {pid} of {cid}")
    found += [f"cgroup {c}" for c in container_cgroups(daemon_ids(d.root) - known)]
    results = os.path.join(d.root, "cni", "results")
    for n in names(results):
        with open(os.path.join(results, n)) as f:
            if json.load(f).get("containerId") not in pods:
                found.append(f"CNI cache entry {n}")
    ips = allocated_ips(os.path.dirname(d.root))
    if len(ips) > len(pods):
        found.append(f"pod IPs {ips} for {len(pods)} pods")
    return found


@pytest.mark.parametrize(("op", "point", "kind"), CASES,
                         ids=[f"{o}-{p}" + ("" if k == "pause" else f"-{k}") for o, p, k in CASES])
def test_kill_at_every_step(op: str, point: str, kind: str, tmp_path: Path,
                            registry: LocalRegistry, test_images: TestImages) -> None:
    criu = interop.require("criu") if op in CRIU_OPS else None
    s = Scenario(op, point, registry, test_images, kind, archive=tmp_path / "ckpt.tar")
    if s.userns:
        interop.idmap_runc()
    with contextlib.ExitStack() as stack:
        state = stack.enter_context(mapped_root_state()) if s.userns else None
        _crash_and_recover(s, tmp_path, registry, test_images, state, criu)


def _crash_and_recover(s: Scenario, tmp_path: Path, registry: LocalRegistry,
                       test_images: TestImages, state: str | None, criu: Path | None) -> None:
    op, point = s.op, s.point
    with _start(tmp_path, registry, test_images, f"{point}:kill", state, criu) as d:
        pods = Pods(d.client)
        world = s.prepare(d, pods)
        with pytest.raises(grpc.RpcError) as e:
            s.call(pods, d, world)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value
        d.proc.wait(30)
        assert d.proc.returncode == -signal.SIGKILL, f"the daemon did not die at {point}"
    world = s.expected(world)
    offset = os.path.getsize(tmp_path / "pycrid.log")
    with _start(tmp_path, registry, test_images, state=state, criu=criu) as d:
        pods = Pods(d.client)
        try:
            assert _listed(pods) == (world.pods, world.containers)
            assert strays(d, set(world.pods), set(world.containers)) == []
            # Recovery itself finished or undid the operation: the orphan sweep (for
            # traces no record explains) found nothing.
            assert "removed orphaned" not in _log_since(d, offset)
            if op == "PullImage":
                assert d.client.list(s.layered) == []  # the client was never told of it
            s.retry(d, pods, world)()
        finally:
            for p in pods.rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=30).items:
                pods.remove_pod(p.id)
        assert leftovers(d.root, d.state) == []
