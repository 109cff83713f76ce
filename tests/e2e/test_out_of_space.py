"""A full disk is the node's problem, said as such: RESOURCE_EXHAUSTED naming the path.

The daemon's root is a small tmpfs mounted by the test. A pull that does not fit, and a
container create on a root with (almost) no room left, answer RESOURCE_EXHAUSTED with
a message that names the file system or path and what was being written; nothing
half-written is left (records, snapshots, blobs, ingests); the daemon carries on, and
once space comes back (the tmpfs grown, a filler file removed) the same call succeeds.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from tests.support.daemon import Daemon, running_daemon
from tests.support.images import TestImages, big_layer, build_image, busybox_rootfs_tar
from tests.support.layers import Entry
from tests.support.pods import Pods, container_config, daemon_config, leftovers, pod_config
from tests.support.registry import LocalRegistry

pytestmark = pytest.mark.e2e

MiB = 1024 * 1024


@contextlib.contextmanager
def small_root(base: Path, size_mb: int) -> Iterator[Path]:
    root = base / "root"
    root.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700",
                    "pycrid-small-root", str(root)], check=True)
    try:
        yield root
    finally:
        subprocess.run(["umount", str(root)], check=True)


def grow(root: Path, size_mb: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size_mb}m", str(root)], check=True)


def fill(root: Path, leave: int) -> Path:
    """A filler file taking all but ``leave`` bytes of the root's file system."""
    st = os.statvfs(root)
    filler = root / "filler"
    with open(filler, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, max(st.f_bavail * st.f_frsize - leave, 1))
    return filler


def half_written(d: Daemon) -> list[str]:
    """Scratch or active snapshots, ingests and records left in the root."""
    found = [f"ingest {n}" for n in os.listdir(os.path.join(d.root, "content", "ingest"))]
    conn = sqlite3.connect(f"file:{d.root}/metadata/pycrid.db?mode=ro", uri=True)
    try:
        found += [f"snapshot {k}" for (k,) in conn.execute(
            "SELECT key FROM overlay_snapshots WHERE kind != 'committed'")]
        found += [f"container record {i}" for (i,) in conn.execute("SELECT id FROM containers")]
    finally:
        conn.close()
    return found


def exhausted(call: Callable[[], object]) -> str:
    with pytest.raises(grpc.RpcError) as e:
        call()
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value
    return str(e.value.details())


def test_pull_that_does_not_fit(tmp_path: Path, registry: LocalRegistry,
                                test_images: TestImages, push_image: Callable[..., str]) -> None:
    """A 40 MiB layer (its blob and its unpacked copy) on a 48 MiB root."""
    build = build_image([big_layer(40, seed=34)], compression="none")
    push_image(registry, "i34/big", "v1", build)
    ref = f"{registry.host}/i34/big:v1"
    with small_root(tmp_path, 48) as root, running_daemon(
            str(tmp_path), daemon_config(registry, test_images, tmp_path)) as d:
        message = exhausted(lambda: d.client.pull(ref))
        assert "no space left on device" in message
        assert str(root) in message and "tmpfs" in message, message
        assert build.layer_digests[0] in message, message  # what was being written
        assert half_written(d) == []
        blobs = os.listdir(os.path.join(d.root, "content", "blobs", "sha256"))
        assert build.layer_digests[0].split(":")[1] not in blobs
        assert d.client.list(ref) == []
        assert d.client.runtime.Version(pb.VersionRequest(), timeout=10).runtime_name
        grow(root, 160)  # space comes back
        d.client.pull(ref)
        assert d.client.status(ref).image.id == build.config_digest
        d.client.remove(ref)


def test_create_on_a_full_root(tmp_path: Path, registry: LocalRegistry,
                               test_images: TestImages, push_image: Callable[..., str]) -> None:
    """A container whose image VOLUME holds 4 MiB, created with 1 MiB left (the volume copy
    fails), then with nothing left (its record cannot be written), then with room; its pod
    removed on a full root again."""
    rootfs = busybox_rootfs_tar([Entry("data", "dir", mode=0o755),
                                 Entry("data/blob", data=os.urandom(4 * MiB))])
    volume_image = build_image([rootfs], compression="none",
                               config={"Volumes": {"/data": {}}, "Cmd": ["sleep", "3600"]})
    push_image(registry, "i34/volume", "v1", volume_image)
    ref = f"{registry.host}/i34/volume:v1"
    with small_root(tmp_path, 48) as root, running_daemon(
            str(tmp_path), daemon_config(registry, test_images, tmp_path)) as d:
        pods = Pods(d.client)
        d.client.pull(ref)
        try:
            pod = pod_config()
            pod.linux.security_context.namespace_options.pid = pb.CONTAINER  # no pause
            sid = pods.run(pod)
            cfg = container_config(ref, "c")
            cfg.linux.security_context.namespace_options.pid = pb.CONTAINER
            create = lambda: pods.create(sid, cfg, pod)  # noqa: E731
            filler = fill(root, 1 * MiB)
            message = exhausted(create)
            assert "image volume /data" in message and str(root) in message, message
            assert half_written(d) == []
            filler.unlink()
            filler = fill(root, 0)
            message = exhausted(create)
            assert "metadata database" in message and str(root) in message, message
            assert half_written(d) == []
            assert pods.rt.ListContainers(pb.ListContainersRequest(), timeout=10).containers == []
            filler.unlink()  # space comes back
            cid = create()
            pods.start(cid)
            assert pods.status(cid).status.state == pb.CONTAINER_RUNNING
            # A full root does not stop the kubelet freeing space: stop and removal (the
            # exit, the pod's state, the records' deletion) go through.
            filler = fill(root, 0)
            pods.remove_pod(sid)
            filler.unlink()
        finally:
            pods.cleanup()
        left = [x for x in leftovers(d.root, d.state) if x != f"mount {root}"]
        assert left == []

