"""Partial pulls end to end: the daemon pulls app:v2 (zstd:chunked, made by skopeo) after
app:v1 and fetches only what changed; pods of both versions share unchanged files (hard
links) and still see only their own writes; a kill -9 in the middle of a partial pull
leaves nothing half-made; the real kubelet runs a pod of an image pulled this way."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cri_api.v1 import api_pb2 as pb

from tests.support import interop
from tests.support.chunked import app_layers, skopeo_chunked
from tests.support.daemon import Daemon, containerd_socket, running_daemon
from tests.support.images import TestImages, build_image, busybox_rootfs_tar, load_standard_set
from tests.support.kubelet import running_kubelet
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

SKOPEO = interop.binary("skopeo")
SHARED = "app0/lib/f00001.txt"  # the same in v1 and v2
CHANGED = "app0/lib/f00010.txt"  # rewritten in v2


@dataclass(frozen=True)
class Apps:
    registry: LocalRegistry
    images: TestImages

    def ref(self, tag: str) -> str:
        return f"{self.registry.host}/app:{tag}"


@pytest.fixture(scope="module")
def apps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Apps]:
    """A registry of its own: the standard set, and app:v1/app:v2 (busybox plus two
    layers of 60 files; 5% of them rewritten in v2), zstd:chunked by skopeo."""
    if SKOPEO is None:
        pytest.skip("needs skopeo from ../shared/interop")
    reg = LocalRegistry(tmp_path_factory.mktemp("partial-e2e-registry"))
    reg.start()
    try:
        images = load_standard_set(reg)
        for v in (1, 2):
            build = build_image([busybox_rootfs_tar(), *app_layers(v, layers=2, files=60)],
                                config={"Cmd": ["sh"], "Env": ["PATH=/bin"]})
            skopeo_chunked(reg, build, f"app:v{v}", SKOPEO)
        yield Apps(reg, images)
    finally:
        reg.stop()


def config(apps: Apps, base: Path, *, hard_links: bool) -> str:
    section = '[plugins."pycrid.cri.v1.images"]\n'
    return daemon_config(apps.registry, apps.images, base).replace(
        section, section + f"use_hard_links = {str(hard_links).lower()}\n", 1)


def layer_dirs(d: Daemon, image: str) -> list[Path]:
    """The snapshot directories of an image's layers, bottom first."""
    chain = json.loads(d.client.status(image, verbose=True).info["info"])["chainID"]
    db = sqlite3.connect(os.path.join(d.root, "metadata", "pycrid.db"))
    try:
        rows = {k: (i, p) for k, i, p in db.execute(
            "SELECT key, id, parent FROM overlay_snapshots")}
    finally:
        db.close()
    out = []
    key = chain
    while key:
        sid, key = rows[key]
        out.append(Path(d.root, "snapshots", "overlayfs", "snapshots", str(sid), "fs"))
    return out[::-1]


def indexed_layers(d: Daemon) -> set[str]:
    db = sqlite3.connect(os.path.join(d.root, "metadata", "pycrid.db"))
    try:
        return {r[0] for r in db.execute("SELECT DISTINCT layer FROM layer_files")}
    finally:
        db.close()


def fs_used(d: Daemon) -> int:
    fs = d.client.images.ImageFsInfo(pb.ImageFsInfoRequest(), timeout=60)
    return int(sum(f.used_bytes.value for f in fs.image_filesystems))


def partial_layers(log: str, image: str) -> int:
    return len(re.findall(rf"image {re.escape(image)}: \S+ layer \S+ pulled partially", log))


def test_two_pods_see_their_own_files_after_a_write_to_a_shared_file(
        apps: Apps, tmp_path: Path) -> None:
    with running_daemon(str(tmp_path), config(apps, tmp_path, hard_links=True)) as d:
        d.client.pull(apps.images.pause.ref(apps.registry))
        d.client.pull(apps.ref("v1"))
        before = fs_used(d)
        d.client.pull(apps.ref("v2"))
        grown = fs_used(d) - before
        log = d.log()
        assert partial_layers(log, apps.ref("v2")) == 2, log[-3000:]
        assert re.search(rf"pulled image {re.escape(apps.ref('v2'))} .* bytes reused", log)
        # The unchanged file is one inode on the node, shared by both layers.
        v1_app0, v2_app0 = layer_dirs(d, apps.ref("v1"))[1], layer_dirs(d, apps.ref("v2"))[1]
        assert (v1_app0 / SHARED).stat().st_ino == (v2_app0 / SHARED).stat().st_ino
        assert (v2_app0 / CHANGED).stat().st_nlink == 1
        original = (v1_app0 / SHARED).read_bytes()
        # ImageFsInfo counts a shared file once: v2 added far less than its files' size.
        v2_files = sum(f.stat().st_size for layer in layer_dirs(d, apps.ref("v2"))[1:]
                       for f in layer.rglob("*") if f.is_file())
        assert grown < 0.5 * v2_files, (grown, v2_files)

        pods = Pods(d.client)
        try:
            ids = {}
            for tag in ("v1", "v2"):
                pod = pod_config(f"app-{tag}")
                sid = pods.run(pod)
                cid = pods.create(sid, container_config(apps.ref(tag), command=["sleep", "3600"]),
                                  pod)
                pods.start(cid)
                ids[tag] = cid
            wrote = pods.exec(ids["v1"], ["sh", "-c", f"echo written-by-v1 > /{SHARED}"])
            assert wrote.exit_code == 0, wrote.stderr
            assert pods.exec(ids["v1"], ["cat", f"/{SHARED}"]).stdout == b"written-by-v1\n"
            assert pods.exec(ids["v2"], ["cat", f"/{SHARED}"]).stdout == original
            appended = pods.exec(ids["v2"], ["sh", "-c", f"echo more >> /{SHARED}"])
            assert appended.exit_code == 0, appended.stderr
            assert pods.exec(ids["v2"], ["cat", f"/{SHARED}"]).stdout == original + b"more\n"
            assert pods.exec(ids["v1"], ["cat", f"/{SHARED}"]).stdout == b"written-by-v1\n"
            # The layers themselves never changed.
            assert (v1_app0 / SHARED).read_bytes() == original
            assert (v2_app0 / SHARED).read_bytes() == original
            assert pods.exec(ids["v2"], ["cat", "/app0/VERSION"]).stdout == b"2\n"
        finally:
            pods.cleanup()
        for tag in ("v1", "v2"):
            d.client.remove(apps.ref(tag))
        assert indexed_layers(d) == set()  # the pause image is left: not zstd:chunked


@pytest.mark.parametrize("point", ["pull.partial", "pull.downloaded", "pull.unpacking"])
def test_kill_during_a_partial_pull_leaves_nothing_half_made(
        apps: Apps, tmp_path: Path, point: str) -> None:
    text = config(apps, tmp_path, hard_links=True)
    with running_daemon(str(tmp_path), text) as d:
        d.client.pull(apps.ref("v1"))
        v1_layers = layer_dirs(d, apps.ref("v1"))
        sums = {p: hashlib.sha256(p.read_bytes()).hexdigest()
                for layer in v1_layers for p in layer.rglob("*") if p.is_file()}
    # Indexing follows the pull, and a clean stop lets it finish.
    v1_index = indexed_layers(d)
    assert v1_index, "v1's zstd:chunked layers were not indexed"
    with running_daemon(str(tmp_path), text, env={"PYCRID_FAILPOINTS": f"{point}:kill"}) as d:
        with pytest.raises(grpc.RpcError) as e:
            d.client.pull(apps.ref("v2"))
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        d.proc.wait(30)
        assert d.proc.returncode < 0, f"the daemon did not die at {point}"
    with running_daemon(str(tmp_path), text) as d:
        offset = len(d.log())  # the log file is the killed daemon's too
        assert [i.repo_tags for i in d.client.list()] == [[apps.ref("v1")]]
        # The scratch snapshot went, with its links to v1's files: v1 is whole and alone.
        snaps = os.listdir(os.path.join(d.root, "snapshots", "overlayfs", "snapshots"))
        assert len(snaps) == len(v1_layers)
        assert indexed_layers(d) == v1_index
        for p, digest in sums.items():
            assert hashlib.sha256(p.read_bytes()).hexdigest() == digest
            assert p.stat().st_nlink == 1 or not p.name.startswith("f")
        d.client.pull(apps.ref("v2"))  # the retry is partial again
        assert partial_layers(d.log()[offset:], apps.ref("v2")) == 2
        for tag in ("v1", "v2"):
            d.client.remove(apps.ref(tag))
        assert indexed_layers(d) == set()
        assert leftovers(d.root, d.state) == []


KUBELET_POD = """apiVersion: v1
kind: Pod
metadata: {{name: app, namespace: default}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {image}
    imagePullPolicy: Always
    command: ["sh", "-c", "cat /app0/VERSION /app1/VERSION; exec sleep 3600"]
"""


def test_kubelet_runs_a_static_pod_of_an_image_pulled_partially(
        apps: Apps, tmp_path: Path) -> None:
    kubelet = interop.require("kubelet")
    base = tmp_path / "node"
    with running_daemon(str(base), config(apps, base, hard_links=False)) as d:
        d.client.pull(apps.ref("v1"))  # what the node had: the kubelet asks for v2

        def remove_pods() -> None:
            pods = Pods(d.client)
            for s in d.client.runtime.ListPodSandbox(pb.ListPodSandboxRequest(),
                                                     timeout=30).items:
                pods.stop_pod(s.id)
                pods.remove_pod(s.id)

        with running_kubelet(str(kubelet), str(tmp_path / "kubelet"),
                             runtime_socket=d.address,
                             manifests={"app.yaml": KUBELET_POD.format(image=apps.ref("v2"))},
                             containerd_socket=containerd_socket(str(base)),
                             cleanup=remove_pods) as k:
            def running() -> str | None:
                for c in d.client.runtime.ListContainers(pb.ListContainersRequest(),
                                                         timeout=30).containers:
                    if c.metadata.name == "app" and c.state == pb.CONTAINER_RUNNING:
                        return str(c.id)
                return None

            try:
                cid = wait_for(running, 180, "the kubelet's pod to run")
            except AssertionError:
                raise AssertionError(f"kubelet:\n{k.log()[-3000:]}\npycrid:\n"
                                     f"{d.log()[-3000:]}") from None
            status = d.client.runtime.ContainerStatus(
                pb.ContainerStatusRequest(container_id=cid), timeout=30).status
            assert status.image_ref in d.client.status(apps.ref("v2")).image.repo_digests
            got = Pods(d.client).exec(cid, ["cat", "/app0/VERSION", "/app1/VERSION"])
            assert got.stdout == b"2\n2\n"
        assert partial_layers(d.log(), apps.ref("v2")) == 2


def test_pycrid_bench_partial_section(apps: Apps, tmp_path: Path) -> None:
    """``pycrid bench --sections partial --partial-images v1,v2`` against a pycrid it did
    not start: both pulls timed, the disk read, both images removed again."""
    base = tmp_path / "rt"
    out = tmp_path / "out.json"
    with running_daemon(str(base), config(apps, base, hard_links=False)) as d:
        busybox = apps.images.busybox.ref(apps.registry)
        r = subprocess.run(
            [str(Path(sys.executable).parent / "pycrid"), "bench", "--endpoint",
             f"unix://{d.address}", "--image", busybox, "--sections", "partial",
             "--partial-images", f"{apps.ref('v1')},{apps.ref('v2')}",
             "--partial-rounds", "1", "--json", str(out)],
            env={**os.environ, "TMPDIR": str(tmp_path)}, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=300, check=False)
        assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr[-4000:]}"
        result = json.loads(out.read_text())
        assert result["ok"] and result["leftovers"] == []
        sec = result["sections"]["partial"]
        assert sec["skipped"] is None
        fig = sec["figures"]["PullImage NEW after the old version"]
        assert fig["floor"] == "PullImage NEW, nothing to reuse" and fig["ratio"] > 0
        assert sec["figures"]["disk of the old version and NEW"]["median"] > 0
        assert partial_layers(d.log(), apps.ref("v2")) == 2  # the runtime pulled partially
        listed = {t for i in d.client.list() for t in i.repo_tags}
        assert apps.ref("v1") not in listed and apps.ref("v2") not in listed
