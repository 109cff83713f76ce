"""Image volumes (CRI Mount.image, the kubelet's image volume source) end to end.

A pulled image is mounted read-only in a real runc container: its files (all its
layers, whiteouts applied) are visible, writes fail with EROFS, a sub-path mounts a
directory of it, bad requests fail with a clear code and leave nothing, and
ContainerStatus.mounts reports the image id. Removal, a failed create, a kill -9
half-way through a create and a lost record all end with no mount, view snapshot or
directory left.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from pycrid.cri_fields import image_ref
from tests.support.daemon import Daemon, mounts_under, running_daemon
from tests.support.images import TestImages
from tests.support.pods import (
    Pods,
    busybox_daemon,
    container_config,
    daemon_config,
    leftovers,
    pod_config,
)
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, registry: LocalRegistry,
           test_images: TestImages) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("imgvol")
    with busybox_daemon(base, registry, test_images) as d:
        d.extra["layered"] = test_images.layered.ref(registry)
        d.extra["layered_id"] = d.client.pull(d.extra["layered"])
        yield d


def volume(image: str, path: str = "/vol", sub_path: str = "", **kw: Any) -> Any:
    kw.setdefault("readonly", True)
    return pb.Mount(container_path=path, image=pb.ImageSpec(image=image),
                    image_sub_path=sub_path, **kw)


def sleeper(d: Daemon, *mounts: Any, name: str = "c") -> Any:
    return container_config(d.extra["busybox"], name, command=["sleep", "3600"],
                            mounts=list(mounts))


def views(d: Daemon) -> list[str]:
    """Image volume snapshots in the daemon's metadata."""
    db = sqlite3.connect(f"file:{os.path.join(d.root, 'metadata', 'pycrid.db')}?mode=ro",
                         uri=True)
    try:
        return [k for (k,) in db.execute(
            "SELECT key FROM overlay_snapshots WHERE key LIKE 'image-volume/%'")]
    finally:
        db.close()


def committed(d: Daemon) -> set[str]:
    db = sqlite3.connect(f"file:{os.path.join(d.root, 'metadata', 'pycrid.db')}?mode=ro",
                         uri=True)
    try:
        return {k for (k,) in db.execute(
            "SELECT key FROM overlay_snapshots WHERE kind = 'committed'")}
    finally:
        db.close()


def own_leftovers(d: Daemon, *ids: str) -> list[str]:
    """``leftovers`` less container cgroups of others' runs on this shared machine."""
    return [x for x in leftovers(d.root, d.state)
            if not x.startswith("cgroup ") or any(i in x for i in ids)]


def no_container_traces(d: Daemon) -> None:
    assert views(d) == []
    assert mounts_under(os.path.join(d.state, "containers")) == []
    assert os.listdir(os.path.join(d.state, "containers")) == []
    assert os.listdir(os.path.join(d.root, "containers")) == []


def test_image_is_mounted_read_only_with_all_its_layers(daemon: Daemon, pods: Pods) -> None:
    pod = pod_config()
    sid = pods.run(pod)
    cid = pods.run_container(sid, sleeper(
        daemon, volume(daemon.extra["layered"]), volume(daemon.extra["busybox"], "/bb")), pod)
    pods.wait_state(cid, pb.CONTAINER_RUNNING)

    # Three layers: layer 2's file, layer 1's whited-out file gone, the opaque dir's
    # new content only, and a single-layer image beside it.
    assert pods.exec(cid, ["cat", "/vol/data/b.txt"]).stdout == b"b from layer 2\n"
    assert pods.exec(cid, ["test", "-e", "/vol/data/a.txt"]).exit_code == 1
    assert pods.exec(cid, ["ls", "/vol/opt/dir"]).stdout.split() == [b"new.txt"]
    assert pods.exec(cid, ["cat", "/bb/etc/passwd"]).stdout.startswith(b"root:")
    # Not noexec: the image's own binaries run from the volume (critest checks this too).
    assert pods.exec(cid, ["/vol/bin/busybox", "true"]).exit_code == 0

    for cmd in (["touch", "/vol/new"], ["sh", "-c", "echo x > /vol/data/b.txt"],
                ["rm", "/bb/etc/passwd"], ["mkdir", "/vol/data/d"]):
        r = pods.exec(cid, cmd)
        assert r.exit_code != 0, cmd
        assert b"Read-only file system" in r.stderr, (cmd, r.stderr)
    assert pods.exec(cid, ["cat", "/vol/data/b.txt"]).stdout == b"b from layer 2\n"

    # The host side is read-only too: a view of the image, no writable layer.
    st = pods.status(cid).status
    by_path = {m.container_path: m for m in st.mounts}
    for path in ("/vol", "/bb"):
        host = by_path[path].host_path
        assert host.startswith(os.path.join(daemon.state, "containers", cid) + "/")
        with pytest.raises(OSError) as e:
            open(os.path.join(host, "host-write"), "w").close()
        assert e.value.errno == 30  # EROFS
    assert len(views(daemon)) == 2

    pods.stop(cid)
    pods.remove(cid)
    no_container_traces(daemon)
    pods.remove_pod(sid)


def test_status_reports_the_image_id_of_each_volume(daemon: Daemon, pods: Pods) -> None:
    pod = pod_config()
    sid = pods.run(pod)
    by_name = daemon.extra["layered"]
    by_id = daemon.extra["layered_id"]
    cid = pods.create(sid, sleeper(daemon, volume(by_name), volume(by_id, "/by-id")), pod)
    mounts = {m.container_path: m for m in pods.status(cid).status.mounts}
    # image_ref is what PullImage answered (critest compares the two).
    assert image_ref(mounts["/vol"].image) == by_id
    assert image_ref(mounts["/by-id"].image) == by_id
    assert mounts["/vol"].image.image == by_name  # the request, as given
    assert mounts["/vol"].readonly
    # host_path is the mounted image (containerd reports it the same way).
    assert os.path.ismount(mounts["/vol"].host_path)
    pods.remove(cid)
    no_container_traces(daemon)
    pods.remove_pod(sid)


def test_sub_path_mounts_a_directory_of_the_image(daemon: Daemon, pods: Pods) -> None:
    pod = pod_config()
    sid = pods.run(pod)
    cid = pods.run_container(sid, sleeper(
        daemon, volume(daemon.extra["layered"], "/opt", "opt/dir"),
        volume(daemon.extra["layered"], "/lib", "lib/")), pod)
    pods.wait_state(cid, pb.CONTAINER_RUNNING)
    assert pods.exec(cid, ["ls", "/opt"]).stdout.split() == [b"new.txt"]
    assert pods.exec(cid, ["cat", "/opt/new.txt"]).stdout == b"new from layer 3\n"
    # lib -> usr/lib is a symlink inside the image: followed, staying inside it.
    assert sorted(pods.exec(cid, ["ls", "/lib"]).stdout.split()) == [
        b"one.so", b"three.so", b"two.so"]
    host = {m.container_path: m.host_path for m in pods.status(cid).status.mounts}
    assert host["/lib"].endswith("/usr/lib")
    r = pods.exec(cid, ["touch", "/opt/x"])
    assert r.exit_code != 0 and b"Read-only file system" in r.stderr
    pods.stop(cid)
    pods.remove(cid)
    no_container_traces(daemon)
    pods.remove_pod(sid)


BAD = [
    # (what, mount, gRPC code, words of the message)
    ("missing sub-path", {"sub_path": "no/such/dir"}, grpc.StatusCode.NOT_FOUND,
     "image_sub_path 'no/such/dir' does not exist"),
    ("file sub-path", {"sub_path": "data/b.txt"}, grpc.StatusCode.INVALID_ARGUMENT,
     "is not a directory"),
    ("escaping sub-path", {"sub_path": "data/../../.."}, grpc.StatusCode.INVALID_ARGUMENT,
     "escapes the image's root"),
    ("absolute sub-path", {"sub_path": "/etc"}, grpc.StatusCode.INVALID_ARGUMENT,
     "escapes the image's root"),
    ("writable", {"readonly": False}, grpc.StatusCode.INVALID_ARGUMENT, "must be read-only"),
    ("host path", {"host_path": "/tmp"}, grpc.StatusCode.INVALID_ARGUMENT,
     "takes no host_path"),
]


@pytest.mark.parametrize(("what", "kw", "code", "words"), BAD, ids=[b[0] for b in BAD])
def test_bad_image_volume_fails_clearly_and_leaves_nothing(
        daemon: Daemon, pods: Pods, what: str, kw: dict[str, Any], code: grpc.StatusCode,
        words: str) -> None:
    pod = pod_config()
    sid = pods.run(pod)
    with pytest.raises(grpc.RpcError) as e:
        pods.create(sid, sleeper(daemon, volume(daemon.extra["layered"], **kw)), pod)
    assert e.value.code() == code, e.value
    assert "ImageVolumeMountFailed" in str(e.value.details())
    assert words in str(e.value.details())
    assert "'/vol'" in str(e.value.details())
    assert list(pods.rt.ListContainers(pb.ListContainersRequest(), timeout=10).containers) == []
    no_container_traces(daemon)
    # The name is free again: the corrected request succeeds.
    cid = pods.create(sid, sleeper(daemon, volume(daemon.extra["layered"])), pod)
    pods.remove(cid)
    pods.remove_pod(sid)
    assert own_leftovers(daemon, sid, cid) == []


def test_image_not_pulled_is_not_found(daemon: Daemon, pods: Pods, registry: LocalRegistry,
                                       test_images: TestImages) -> None:
    pod = pod_config()
    sid = pods.run(pod)
    missing = test_images.multi.ref(registry)
    with pytest.raises(grpc.RpcError) as e:
        pods.create(sid, sleeper(daemon, volume(missing)), pod)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert e.value.details() == (f"ImageVolumeMountFailed: mount '/vol': image {missing!r} "
                                 "not found: pull it first")
    no_container_traces(daemon)
    pods.remove_pod(sid)


def test_removing_the_image_in_use_keeps_the_volume_until_the_container_goes(
        daemon: Daemon, pods: Pods, registry: LocalRegistry, test_images: TestImages) -> None:
    """containerd does not refuse RemoveImage of an image a volume uses (its lease keeps
    the snapshot); neither does pycrid: the name goes, the layers stay while the volume
    needs them and are collected once the container is removed."""
    before = committed(daemon)
    zstd = test_images.zstd.ref(registry)
    daemon.client.pull(zstd)
    added = committed(daemon) - before
    assert added  # the zstd layer's chain (its base layer is busybox's)
    pod = pod_config()
    sid = pods.run(pod)
    cid = pods.run_container(sid, sleeper(daemon, volume(zstd)), pod)
    pods.wait_state(cid, pb.CONTAINER_RUNNING)
    daemon.client.remove(zstd)
    assert daemon.client.list(zstd) == []
    assert committed(daemon) >= added  # kept: the volume is built on them
    assert pods.exec(cid, ["cat", "/vol/zstd.txt"]).stdout == b"zstd layer\n"
    pods.stop(cid)
    pods.remove(cid)
    assert committed(daemon) == before
    no_container_traces(daemon)
    pods.remove_pod(sid)


def _sql(d: Daemon, statement: str, *args: str) -> None:
    db = sqlite3.connect(os.path.join(d.root, "metadata", "pycrid.db"))
    try:
        with db:
            db.execute(statement, args)
    finally:
        db.close()


def test_kill_during_create_then_restart_leaves_nothing(
        tmp_path: Path, registry: LocalRegistry, test_images: TestImages) -> None:
    """kill -9 right after the image volumes are mounted (before the spec and runc):
    the restart rolls the create back, mounts and views included."""
    config = daemon_config(registry, test_images, tmp_path)
    layered = test_images.layered.ref(registry)
    with running_daemon(str(tmp_path), config,
                        env={"PYCRID_FAILPOINTS": "container.image_volumes:kill"}) as d:
        d.client.pull(test_images.busybox.ref(registry))
        d.client.pull(layered)
        d.extra["busybox"] = test_images.busybox.ref(registry)
        pods = Pods(d.client)
        pod = pod_config()
        sid = pods.run(pod)
        with pytest.raises(grpc.RpcError) as e:
            pods.create(sid, sleeper(d, volume(layered)), pod)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        d.proc.wait(30)
        assert views(d), "the daemon died before mounting the volume"
        assert mounts_under(os.path.join(d.state, "containers"))
    with running_daemon(str(tmp_path), config) as d:
        d.extra["busybox"] = test_images.busybox.ref(registry)
        pods = Pods(d.client)
        assert list(pods.rt.ListContainers(pb.ListContainersRequest(), timeout=10).containers) \
            == []
        no_container_traces(d)
        cid = pods.run_container(sid, sleeper(d, volume(layered)), pod)
        assert pods.exec(cid, ["cat", "/vol/data/c.txt"]).stdout == b"c from layer 2\n"
        pods.remove_pod(sid)
        assert own_leftovers(d, sid, cid) == []


def test_restart_keeps_the_volume_and_sweeps_one_no_record_owns(
        tmp_path: Path, registry: LocalRegistry, test_images: TestImages) -> None:
    """After kill -9 a running container keeps its image volume (and its removal later
    leaves nothing); a container whose record was lost has its volume swept."""
    config = daemon_config(registry, test_images, tmp_path)
    layered = test_images.layered.ref(registry)
    with running_daemon(str(tmp_path), config) as d:
        d.extra["busybox"] = test_images.busybox.ref(registry)
        d.client.pull(d.extra["busybox"])
        d.client.pull(layered)
        pods = Pods(d.client)
        pod = pod_config()
        sid = pods.run(pod)
        kept = pods.run_container(sid, sleeper(d, volume(layered), name="kept"), pod)
        lost = pods.run_container(sid, sleeper(d, volume(layered, sub_path="opt"),
                                               name="lost"), pod)
        d.proc.kill()
        d.proc.wait(30)
    _sql(d, "DELETE FROM containers WHERE id = ?", lost)
    with running_daemon(str(tmp_path), config) as d:
        pods = Pods(d.client)
        assert "removed orphaned container " + lost in d.log()
        assert views(d) == [f"image-volume/{kept}/0"]
        assert not [m for m in mounts_under(d.state) if lost in m]
        st = pods.status(kept).status
        assert st.state == pb.CONTAINER_RUNNING
        assert image_ref(st.mounts[0].image) == d.client.status(layered).image.id
        assert pods.exec(kept, ["cat", "/vol/data/b.txt"]).stdout == b"b from layer 2\n"
        pods.stop(kept)
        pods.remove(kept)
        no_container_traces(d)
        pods.remove_pod(sid)
        assert own_leftovers(d, sid, kept, lost) == []
