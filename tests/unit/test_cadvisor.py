"""containerd's API for cAdvisor: protos, filters, records -> containerd messages, the view,
and the pause controller's anchor (pycrid/cadvisor, sandbox/pause.py)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from cri_api.v1 import api_pb2 as pb

from pycrid.cadvisor import filters, objects
from pycrid.cadvisor.proto import containers_pb2, task_pb2, tasks_pb2, version_pb2
from pycrid.cadvisor.view import ContainerdView
from pycrid.core.anchors import PodAnchors
from pycrid.errors import InvalidArgument, NotFound
from pycrid.oci.spec_inputs import SpecPolicy
from pycrid.sandbox.controller import SandboxAnchor
from pycrid.sandbox.pause import PauseController
from pycrid.sandbox.pinned import PinnedController
from pycrid.sandbox.router import SandboxRouter
from pycrid.stats.cgroup_hierarchy import Hierarchy
from pycrid.store.db import Database
from pycrid.store.records import ContainerRecord, SandboxRecord, container_store, sandbox_store

ROOT = Path(__file__).resolve().parents[2]
PROTO = ROOT / "src" / "pycrid" / "cadvisor" / "proto"
SID = "a" * 64
CID = "b" * 64

# ---- protos -------------------------------------------------------------------------


def test_generated_modules_are_current(tmp_path: Path) -> None:
    subprocess.run(["bash", str(ROOT / "scripts" / "gen-proto.sh"), str(tmp_path)], check=True,
                   env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"}, cwd=ROOT)
    for name in ("containers", "task", "tasks", "version"):
        for ext in ("_pb2.py", "_pb2.pyi"):
            fresh = (tmp_path / "pycrid" / "cadvisor" / "proto" / (name + ext)).read_text()
            assert fresh == (PROTO / (name + ext)).read_text(), f"{name}{ext} is stale"


def test_wire_names_and_numbers_are_containerds() -> None:
    # What cAdvisor's Go client puts on the wire: method paths and the fields it reads.
    svc = containers_pb2.DESCRIPTOR.services_by_name["Containers"]
    assert svc.full_name == "containerd.services.containers.v1.Containers"
    assert [m.name for m in svc.methods] == ["Get", "List", "ListStream"]
    tasks = tasks_pb2.DESCRIPTOR.services_by_name["Tasks"]
    assert tasks.full_name == "containerd.services.tasks.v1.Tasks"
    assert version_pb2.DESCRIPTOR.services_by_name["Version"].full_name == \
        "containerd.services.version.v1.Version"
    c = containers_pb2.Container.DESCRIPTOR.fields_by_name
    assert {n: c[n].number for n in ("id", "labels", "image", "spec", "created_at",
                                     "sandbox")} == {"id": 1, "labels": 2, "image": 3,
                                                     "spec": 5, "created_at": 8, "sandbox": 11}
    p = task_pb2.Process.DESCRIPTOR
    assert p.full_name == "containerd.v1.types.Process"
    assert {f.name: f.number for f in p.fields}["pid"] == 3
    assert {f.name: f.number for f in p.fields}["status"] == 4
    assert task_pb2.Process(pid=7, status=task_pb2.RUNNING).SerializeToString() == \
        b"\x18\x07\x20\x02"
    assert tasks_pb2.GetRequest.DESCRIPTOR.fields_by_name["container_id"].number == 1


# ---- filters ------------------------------------------------------------------------


def fields(**kw: str) -> filters.Fields:
    return filters.container_fields(id=kw.get("id", "x"), image=kw.get("image", "img"),
                                     runtime="io.containerd.runc.v2", snapshotter="overlayfs",
                                     labels={"io.cri-containerd.kind": "sandbox", "app": "web"})


@pytest.mark.parametrize(("expressions", "matches"), [
    ([], True),
    (['labels."io.cri-containerd.kind"==sandbox'], True),
    (['labels."io.cri-containerd.kind"==container'], False),
    (["labels.app"], True),
    (["labels.missing"], False),
    (["labels.missing!=x"], True),
    (["id==x,image==img"], True),
    (["id==x,image==other"], False),
    (["id==nope", "image==img"], True),  # any expression
    (["image~=^im"], True),
    (['image=="img"'], True),
    (["runtime.name==io.containerd.runc.v2"], True),
    (["snapshotter==overlayfs"], True),
    (["image==docker.io/library/busybox:1.36"], False),
])
def test_filter_matching(expressions: list[str], matches: bool) -> None:
    assert filters.matcher(expressions)(fields()) is matches


def test_bare_values_keep_dots_and_colons() -> None:
    sel = filters.parse("image==docker.io/library/busybox:1.36")
    assert sel == [filters.Selector(("image",), "==", "docker.io/library/busybox:1.36")]
    assert filters.matcher(["image==docker.io/library/busybox:1.36"])(
        fields(image="docker.io/library/busybox:1.36"))


@pytest.mark.parametrize(("text", "why"), [
    ("", "field name is missing"), ("id==", "needs a value"), ("==a", "field name"),
    ("id==a,", "field name is missing"), ("a b", "',' or the end"),
    ("image~=(", "not a regular expression"),
])
def test_bad_filters_are_invalid_arguments(text: str, why: str) -> None:
    with pytest.raises(InvalidArgument, match=why):
        filters.matcher([text])


# ---- records -> containerd messages -------------------------------------------------


def sandbox(**kw: object) -> SandboxRecord:
    cfg = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name="web", namespace="ns", uid="u1"),
        labels={"io.kubernetes.pod.name": "web", "io.kubernetes.pod.namespace": "ns",
                "version": "pod"})
    fields = {"phase": "ready", "pid": 4242, "image_id": "sha256:pause",
              "image_name": "registry.k8s.io/pause:3.10", **kw}
    return SandboxRecord(id=SID, name="web_ns_u1_0", config=cfg, runtime_handler="",
                         created_at=1_700_000_000_123_456_789, **fields)  # type: ignore[arg-type]


def container(**kw: object) -> ContainerRecord:
    cfg = pb.ContainerConfig(metadata=pb.ContainerMetadata(name="app"),
                             labels={"io.kubernetes.container.name": "app"})
    fields = {"phase": "created", "pid": 4300, "started_at": 2, "image_id": "sha256:busybox",
              "image_name": "docker.io/library/busybox:1.36", **kw}
    return ContainerRecord(id=CID, sandbox_id=SID, name="app_web_ns_u1_0", config=cfg,
                           created_at=1_700_000_001_000_000_000, **fields)  # type: ignore[arg-type]


def test_labels_are_image_then_cri_then_kind() -> None:
    got = objects.labels({"version": "cri", objects.KIND_LABEL: "spoofed"},
                         {"version": "image", "from-image": "1", "big": "x" * 5000},
                         objects.SANDBOX)
    assert got == {"version": "cri", "from-image": "1", objects.KIND_LABEL: "sandbox"}


def test_container_message_carries_the_spec_as_containerds_any() -> None:
    msg = objects.container_message(id=CID, labels={"a": "b"}, image="busybox", spec=b"{}",
                                    created_at=1_500_000_000_250_000_000, updated_at=0)
    assert msg.spec.type_url == "types.containerd.io/opencontainers/runtime-spec/1/Spec"
    assert msg.spec.value == b"{}"
    assert msg.runtime.name == "io.containerd.runc.v2"
    assert (msg.snapshotter, msg.snapshot_key) == ("overlayfs", CID)
    assert msg.created_at.seconds == 1_500_000_000 and msg.created_at.nanos == 250_000_000
    assert msg.updated_at == msg.created_at
    assert msg.sandbox == ""  # containerd sets it only for shim-mode sandboxes


@pytest.mark.parametrize(("changes", "want"), [
    ({"phase": "creating", "pid": 0, "started_at": 0}, None),
    ({"started_at": 0}, objects.Task(task_pb2.CREATED, 4300)),
    ({}, objects.Task(task_pb2.RUNNING, 4300)),
    ({"finished_at": 9, "exit_code": 3, "pid": 0},
     objects.Task(task_pb2.STOPPED, 0, 3, 9)),
    ({"finished_at": 9, "exit_code": 137, "reason": "OOMKilled", "pid": 0},
     objects.Task(task_pb2.STOPPED, 0, 137, 9, task_pb2.OOMKILLED)),
    ({"unknown": True}, objects.Task(task_pb2.UNKNOWN, 4300)),
])
def test_container_tasks(changes: dict[str, object], want: objects.Task | None) -> None:
    assert objects.container_task(container(**changes)) == want


def test_sandbox_tasks() -> None:
    assert objects.sandbox_task(sandbox(), 4242) == objects.Task(task_pb2.RUNNING, 4242)
    assert objects.sandbox_task(sandbox(phase="creating", pid=0), 0) is None
    assert objects.sandbox_task(sandbox(phase="creating", pid=0), 77) == \
        objects.Task(task_pb2.RUNNING, 77)
    assert objects.sandbox_task(sandbox(phase="notready"), 0) == objects.Task(task_pb2.STOPPED)
    msg = objects.Task(task_pb2.STOPPED, 0, 1, 1_000_000_001).message(CID)
    assert (msg.container_id, msg.exited_at.seconds, msg.exited_at.nanos) == (CID, 1, 1)


# ---- the view over records and files ------------------------------------------------


class Images:
    def __init__(self) -> None:
        self.reads: list[str] = []

    def config(self, image_id: str) -> bytes:
        self.reads.append(image_id)
        if image_id == "sha256:busybox":
            return json.dumps({"config": {"Labels": {"version": "image", "maintainer": "x"}}
                               }).encode()
        raise NotFound(f"content {image_id} not found")


def make_view(tmp_path: Path, images: Images) -> tuple[ContainerdView, Path]:
    db = Database(str(tmp_path / "db.sqlite"))
    pods, ctrs = sandbox_store(db), container_store(db)
    pods.put(sandbox())
    ctrs.put(container())
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    view = ContainerdView(
        sandboxes=pods, containers=ctrs,
        anchor=lambda rec: SandboxAnchor(cgroups_path=f"/k8s.io/{rec.id}", pid=rec.pid,
                                         spec=str(bundles / rec.id)),
        container_spec=lambda cid: str(bundles / cid), image_config=images.config)
    return view, bundles


def test_view_serves_records_with_their_specs(tmp_path: Path) -> None:
    images = Images()
    view, bundles = make_view(tmp_path, images)
    with pytest.raises(NotFound, match="not found"):  # no spec on disk yet: no container
        view.container(CID, "k8s.io")
    (bundles / SID).write_bytes(b'{"ociVersion": "1.2.0", "hostname": "pause"}')
    (bundles / CID).write_bytes(b'{"ociVersion": "1.2.0", "hostname": "app"}')
    pod = view.container(SID, "k8s.io")
    assert json.loads(pod.spec.value)["hostname"] == "pause"
    assert pod.labels[objects.KIND_LABEL] == "sandbox"
    assert pod.labels["io.kubernetes.pod.name"] == "web"
    assert pod.image == "registry.k8s.io/pause:3.10"
    ctr = view.container(CID, "k8s.io")
    assert dict(ctr.labels) == {"io.kubernetes.container.name": "app", "version": "image",
                                "maintainer": "x", objects.KIND_LABEL: "container"}
    assert ctr.image == "docker.io/library/busybox:1.36"
    view.container(CID, "k8s.io")
    assert images.reads.count("sha256:busybox") == 1  # image labels read once
    with pytest.raises(NotFound, match=f'container "{"c" * 64}" in namespace "k8s.io"'):
        view.container("c" * 64, "k8s.io")
    assert sorted(view.ids()) == sorted([SID, CID])


def test_view_tasks(tmp_path: Path) -> None:
    view, _ = make_view(tmp_path, Images())
    assert view.task(SID, "k8s.io").pid == 4242
    assert view.task(CID, "k8s.io").status == task_pb2.RUNNING
    assert {t.container_id for t in view.tasks()} == {SID, CID}
    view.containers.update(CID, phase="creating", pid=0, started_at=0)
    with pytest.raises(NotFound, match="no running task"):
        view.task(CID, "k8s.io")
    assert [t.container_id for t in view.tasks()] == [SID]
    with pytest.raises(NotFound, match="in namespace"):
        view.task("d" * 64, "k8s.io")


# ---- the pause controller's anchor --------------------------------------------------


def test_pause_anchor(tmp_path: Path) -> None:
    runtime = SimpleNamespace(exit_of=lambda oid: None)
    ctl = PauseController(runtime=runtime, snapshotter=SimpleNamespace(),  # type: ignore[arg-type]
                          root_dir=str(tmp_path / "root"), state_dir=str(tmp_path / "state"),
                          policy=SpecPolicy(cgroup_driver="cgroupfs"))
    rec = sandbox()
    rec.config.linux.cgroup_parent = "/kubepods/besteffort/podu1"
    got = ctl.anchor(rec)
    assert got == SandboxAnchor(cgroups_path=f"/kubepods/besteffort/podu1/{SID}", pid=4242,
                                spec=str(tmp_path / "state" / "sandboxes" / SID / "config.json"))
    # Being created: the record has no pid yet; conmon's pid file has it once runc created it.
    creating = sandbox(phase="creating", pid=0)
    assert ctl.anchor(creating).pid == 0
    bundle = tmp_path / "state" / "sandboxes" / SID
    bundle.mkdir(parents=True)
    (bundle / "pidfile").write_text("5151")
    assert ctl.anchor(creating).pid == 5151
    # Stopped: no live process stands for the pod any more.
    assert ctl.anchor(sandbox(phase="notready")).pid == 0
    # A parent that does not fit the driver names no cgroup instead of failing the caller.
    rec.config.linux.cgroup_parent = "kubepods.slice"
    assert ctl.anchor(rec).cgroups_path == ""


# ---- which process stands for a pod (core/anchors.py), by controller ----------------


class _Controller:
    """A sandbox controller that has no process of its own for the pod."""

    def anchor(self, rec: SandboxRecord) -> SandboxAnchor:
        return SandboxAnchor(cgroups_path=f"/k8s.io/{rec.id}", pid=0, spec="")


def test_a_pod_without_a_process_takes_a_running_containers_pid(tmp_path: Path) -> None:
    db = Database(str(tmp_path / "db.sqlite"))
    ctrs = container_store(db)
    anchors = PodAnchors(controller=_Controller(), sandboxes=sandbox_store(db),  # type: ignore[arg-type]
                         containers=ctrs)
    pod = sandbox(pid=0, controller="pinned")
    assert anchors.of(pod).pid == 0  # nothing runs yet
    ctrs.put(container(pid=4300, started_at=0))  # created, not started
    ctrs.put(dataclasses.replace(container(), id="e" * 64, pid=0, finished_at=9))  # exited
    ctrs.put(dataclasses.replace(container(), id="f" * 64, sandbox_id="other", pid=99))
    assert anchors.of(pod).pid == 0
    ctrs.update(CID, started_at=2)
    got = anchors.of(pod)
    assert (got.pid, got.cgroups_path) == (4300, f"/k8s.io/{SID}")
    assert anchors.of(sandbox(phase="notready", pid=0, controller="pinned")).pid == 0


def test_a_pod_without_a_process_has_its_cgroup_while_a_container_stands_in(
        tmp_path: Path) -> None:
    """Made when one of its containers starts standing in, made anew when another takes
    over (cAdvisor asks for the pid only when the cgroup appears), gone when none runs."""
    hierarchy = Hierarchy(v1={"memory": str(tmp_path / "memory"), "cpu": str(tmp_path / "cpu")})
    pinned = PinnedController(root_dir=str(tmp_path / "r"), state_dir=str(tmp_path / "s"),
                              cgroups=hierarchy)
    rec = sandbox(pid=0, controller="pinned")
    layout = tmp_path / "s" / "sandboxes" / SID
    layout.mkdir(parents=True)
    dirs = [str(tmp_path / m / "k8s.io" / SID) for m in ("cpu", "memory")]
    (layout / "sandbox.json").write_text(json.dumps({"pins": {}, "cgroups": dirs}))
    pinned.stand_in(rec, 0)
    assert not any(Path(d).exists() for d in dirs)
    pinned.stand_in(rec, 4300)
    assert all(Path(d).is_dir() for d in dirs)
    Path(dirs[0], "marker").touch()  # a plain directory here: the marker shows a re-make
    pinned.stand_in(rec, 4300)
    assert Path(dirs[0], "marker").exists()  # same stand-in: left alone
    Path(dirs[0], "marker").unlink()
    pinned.stand_in(rec, 4400)
    assert all(Path(d).is_dir() for d in dirs)
    pinned.stand_in(rec, 0)
    assert not any(Path(d).exists() for d in dirs)


def test_the_pinned_controllers_anchor(tmp_path: Path) -> None:
    rec = sandbox(pid=0, controller="pinned")
    rec.config.linux.cgroup_parent = "/kubepods/besteffort/podu1"
    cgroupfs = PinnedController(root_dir=str(tmp_path / "r"), state_dir=str(tmp_path / "s"),
                                cgroups=Hierarchy(v1={"memory": "/sys/fs/cgroup/memory"}))
    assert cgroupfs.anchor(rec) == SandboxAnchor(
        cgroups_path=f"/kubepods/besteffort/podu1/{SID}", pid=0, spec="")
    # With systemd it makes no cgroup (a scope needs a process): none stands for the pod.
    systemd = PinnedController(root_dir=str(tmp_path / "r"), state_dir=str(tmp_path / "s"),
                               cgroups=Hierarchy(v1={"memory": "/sys/fs/cgroup/memory"}),
                               cgroup_driver="systemd")
    rec.config.linux.cgroup_parent = "kubepods-besteffort-podu1.slice"
    assert systemd.anchor(rec).cgroups_path == ""
    router = SandboxRouter({"pinned": cgroupfs}, lambda sid: "pinned")
    rec.config.linux.cgroup_parent = "/kubepods"
    assert router.anchor(rec).cgroups_path == f"/kubepods/{SID}"
