"""Partial pulls of zstd:chunked images skopeo made, from a real registry (through a proxy
that can refuse or corrupt ranges), into a real content store, overlay snapshots and
SQLite: files reused and counted, the same tree as a whole pull, fallbacks that cost at
most one extra request, and never a layer that did not verify."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import tarfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pycrid.config.images_schema import ImagesConfig
from pycrid.errors import DataLoss
from pycrid.host import mounts as mnt
from pycrid.images.content import ContentStore
from pycrid.images.distribution import RegistryClient
from pycrid.images.hosts import RegistryHosts
from pycrid.images.image_service import ImageService
from pycrid.images.overlay import OverlaySnapshotter
from pycrid.images.partial.file_index import FileIndex
from pycrid.images.pull_report import PullReport
from pycrid.store.db import Database
from pycrid.store.image_records import ImageRecord, ImageStore
from tests.support import interop
from tests.support.chunked import app_layers, skopeo_chunked
from tests.support.estargz import app_entries, estargz_image
from tests.support.images import build_image, push
from tests.support.rangeproxy import RangeProxy, Tamper
from tests.support.registry import LocalRegistry

SKOPEO = interop.binary("skopeo")
pytestmark = pytest.mark.skipif(SKOPEO is None, reason="needs skopeo from ../shared/interop")


@dataclass(frozen=True)
class Versions:
    """app:v1 and app:v2 (5% of every layer's files changed), zstd:chunked by skopeo."""

    registry: LocalRegistry
    v1_tars: list[bytes]
    v2_tars: list[bytes]


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Versions]:
    reg = LocalRegistry(tmp_path_factory.mktemp("partial-registry"))
    reg.start()
    try:
        v1, v2 = app_layers(1), app_layers(2)
        assert SKOPEO is not None
        for tag, tars in (("v1", v1), ("v2", v2)):
            skopeo_chunked(reg, build_image(tars, compression="gzip",
                                            config={"Cmd": ["sh"]}), f"app:{tag}", SKOPEO)
        yield Versions(reg, v1, v2)
    finally:
        reg.stop()


@contextlib.contextmanager
def proxy(versions: Versions, mode: str = "pass",
          tamper: Tamper | None = None) -> Iterator[RangeProxy]:
    with RangeProxy(versions.registry, mode, tamper).running() as p:
        yield p


@pytest.fixture(scope="module")
def esgz(versions: Versions) -> Versions:
    """esgz:v1 and esgz:v2 in the same registry: the same files, as eStargz layers
    (written by tests/support/estargz.py, checked against the Go producer)."""
    for v in (1, 2):
        push(versions.registry, "esgz", f"v{v}", estargz_image(app_entries(v)))
    return versions


class Node:
    def __init__(self, base: Path, svc: ImageService, db: Database) -> None:
        self.base, self.svc, self.db = base, svc, db

    async def pull(self, ref: str) -> tuple[ImageRecord, PullReport]:
        rec = await self.svc.pull(ref, None)
        if self.svc.partial is not None:
            await self.svc.partial.indexed()  # done after the pull: the tests look at it
        return rec, self.svc.pull_reports.get(rec.id, PullReport())

    @contextlib.contextmanager
    def rootfs(self, rec: ImageRecord) -> Iterator[Path]:
        where = self.base / f"view-{rec.id[7:19]}"
        key = f"view-{rec.id}"
        self.svc.snapshotter.view(key, rec.chain[-1])
        where.mkdir()
        for m in self.svc.snapshotter.mounts(key):
            mnt.mount(m, str(where))
        try:
            yield where
        finally:
            mnt.unmount(str(where))
            where.rmdir()
            self.svc.snapshotter.remove(key)


@contextlib.asynccontextmanager
async def node(base: Path, **config: Any) -> AsyncIterator[Node]:
    os.makedirs(base, exist_ok=True)
    db = Database(str(base / "meta.db"))
    svc = ImageService(
        store=ImageStore(db), content=ContentStore(str(base / "content")),
        snapshotter=OverlaySnapshotter(str(base / "sn"), db),
        client=RegistryClient(RegistryHosts(None)), config=ImagesConfig(**config),
        files=FileIndex(db))
    try:
        yield Node(base, svc, db)
    finally:
        await svc.close()
        db.close()
    assert mnt.mounts_under(str(base)) == []


def shared(old_layer: Path, new_layer: Path) -> tuple[int, int]:
    """(files of ``new_layer`` that are hard links to ``old_layer``'s, changed files),
    checking that exactly the unchanged ones are links."""
    same = changed = 0
    for f in sorted(new_layer.rglob("f*.txt")):
        old = old_layer / f.relative_to(new_layer)
        if old.read_bytes() == f.read_bytes():
            assert f.stat().st_ino == old.stat().st_ino
            same += 1
        else:
            assert f.stat().st_nlink == 1
            changed += 1
    return same, changed


def unchanged_bytes(versions: Versions) -> int:
    """Bytes of v2's files whose contents some file of v1 has: what a partial pull of v2
    after v1 reuses. Exactly that: a pull indexes the layers it committed only once it
    has ended, so the files one layer of v2 shares with another (app{n}/VERSION) are not
    taken from each other (they once were, when timing allowed)."""
    def files(tars: list[bytes]) -> list[bytes]:
        out = []
        for t in tars:
            with tarfile.open(fileobj=io.BytesIO(t)) as tf:
                out += [tf.extractfile(m).read() for m in tf if m.isreg()]  # type: ignore[union-attr]
        return out
    old = {hashlib.sha256(f).digest() for f in files(versions.v1_tars)}
    return sum(len(f) for f in files(versions.v2_tars) if hashlib.sha256(f).digest() in old)


def layer_size(n: Node, digest: str) -> int:
    manifest = n.svc.content.read(n.svc.store.list()[-1].manifest)
    return next(d["size"] for d in json.loads(manifest)["layers"] if d["digest"] == digest)


def tree(root: Path) -> dict[str, tuple[int, int, int, bytes]]:
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_mode, st.st_uid, st.st_mtime_ns,
                                              hashlib.sha256(p.read_bytes()).digest())
    return out


async def test_v2_after_v1_fetches_only_the_changed_files(tmp_path: Path,
                                                          versions: Versions) -> None:
    with proxy(versions) as p:
        async with node(tmp_path / "a") as n:
            _, cold = await n.pull(f"{p.host}/app:v1")
            assert cold.partial_layers == 0 and cold.reused == 0  # nothing here to reuse
            assert n.svc.partial is not None and not n.svc.partial.index.is_empty()
            p.seen.clear()
            v2, warm = await n.pull(f"{p.host}/app:v2")
            assert warm.partial_layers == 3
            # ~5% of the files changed: the rest is reused, and what came over the wire
            # (mostly the TOCs and tar-splits, with files this small) is a part of v2.
            assert warm.reused == unchanged_bytes(versions)
            v2_blobs = sum(layer_size(n, d) for d in v2.layers)
            meta = n.svc.content.size(v2.manifest) + n.svc.content.size(v2.id)
            assert warm.fetched + warm.skipped == v2_blobs + meta
            assert warm.fetched < 0.6 * v2_blobs
            # One request for the TOC and one for the files of each layer.
            ranged = [s for s in p.seen if s.range]
            assert len(ranged) == 6 and all(s.status == 206 for s in ranged)
            with n.rootfs(v2) as root:
                partial_tree = tree(root)
                assert (root / "app0/VERSION").read_text() == "2\n"
        async with node(tmp_path / "b", enable_partial_images=False) as whole:
            v2w, report = await whole.pull(f"{p.host}/app:v2")
            assert v2w.id == v2.id and report.partial_layers == 0
            with whole.rootfs(v2w) as root:
                assert tree(root) == partial_tree


async def test_hard_links_share_unchanged_files(tmp_path: Path, versions: Versions) -> None:
    with proxy(versions) as p:
        async with node(tmp_path, use_hard_links=True) as n:
            v1, _ = await n.pull(f"{p.host}/app:v1")
            v2, warm = await n.pull(f"{p.host}/app:v2")
            assert warm.linked_files > 100
            sn = n.svc.snapshotter
            same, changed = shared(Path(sn.upper_dir(v1.chain[0])),
                                   Path(sn.upper_dir(v2.chain[0])))
            assert same > 30 and changed >= 1
            # Removing v1 leaves v2's files (the other name of each) and drops v1's rows.
            assert await n.svc.remove(v1.id)
            assert n.svc.partial is not None
            assert n.svc.partial.index.layers() == set(v2.chain)
            with n.rootfs(v2) as root:
                assert (root / "app0/lib/f00001.txt").stat().st_nlink == 1


async def test_registry_without_ranges_costs_one_request_per_layer(
        tmp_path: Path, versions: Versions) -> None:
    with proxy(versions, "norange") as p:
        async with node(tmp_path) as n:
            await n.pull(f"{p.host}/app:v1")
            p.seen.clear()
            v2, report = await n.pull(f"{p.host}/app:v2")
            assert report.partial_layers == 0
            for digest in v2.layers:
                got = p.blob_requests(digest)
                assert [s.status for s in got] == [200, 200]  # the TOC try, then the blob


async def test_registry_answering_one_range_at_a_time(tmp_path: Path,
                                                      versions: Versions) -> None:
    with proxy(versions, "single") as p:
        async with node(tmp_path) as n:
            await n.pull(f"{p.host}/app:v1")
            p.seen.clear()
            _, report = await n.pull(f"{p.host}/app:v2")
            assert report.partial_layers == 3
            ranged = [s for s in p.seen if s.range]
            assert any(s.status == 200 and "," in s.range for s in ranged)  # tried, refused
            assert sum(1 for s in ranged if s.status == 206) > 6


class FlipFiles:
    """Corrupt the answers for file data, not the first range asked of a blob (its TOC)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(self, path: str, rng: str, body: bytes) -> bytes:
        if path not in self.seen:
            self.seen.add(path)
            return body
        return flip_everything(path, rng, body)


def flip_everything(path: str, rng: str, body: bytes) -> bytes:
    """One bit in every 256 bytes (multipart headers aside: the part is still read)."""
    bad = bytearray(body)
    for i in range(200, len(bad), 256):
        bad[i] ^= 0x01
    return bytes(bad)


async def test_tampered_file_ranges_fall_back_to_whole_layers(tmp_path: Path,
                                                              versions: Versions) -> None:
    with proxy(versions) as good:
        async with node(tmp_path / "ref") as ref_node:
            ref_v2, _ = await ref_node.pull(f"{good.host}/app:v2")
            with ref_node.rootfs(ref_v2) as root:
                expected = tree(root)
    with proxy(versions, tamper=FlipFiles()) as p:
        async with node(tmp_path / "n") as n:
            await n.pull(f"{p.host}/app:v1")
            v2, report = await n.pull(f"{p.host}/app:v2")
            assert report.partial_layers == 0  # every layer refused, then pulled whole
            with n.rootfs(v2) as root:
                assert tree(root) == expected


async def test_tampered_toc_is_refused(tmp_path: Path, versions: Versions) -> None:
    with proxy(versions, tamper=flip_everything) as p:
        async with node(tmp_path) as n:
            p.tamper = None
            await n.pull(f"{p.host}/app:v1")
            p.tamper = flip_everything
            v2, report = await n.pull(f"{p.host}/app:v2")
            assert report.partial_layers == 0  # the TOC's checksum did not match
            assert n.svc.store.get(v2.id) is not None


async def test_tampered_everything_fails_and_leaves_nothing(tmp_path: Path,
                                                            versions: Versions) -> None:
    """A registry that corrupts every range it sends and every whole blob: an error,
    never a layer."""
    with proxy(versions) as p:
        async with node(tmp_path) as n:
            v1, _ = await n.pull(f"{p.host}/app:v1")
            before = {i.key for i in n.svc.snapshotter.walk()}
            p.tamper, p.tamper_whole = flip_everything, True
            with pytest.raises(DataLoss):
                await n.pull(f"{p.host}/app:v2")
            await n.svc.gc()
            assert {i.key for i in n.svc.snapshotter.walk()} == before
            assert n.svc.store.list() == [n.svc.store.get(v1.id)]
            assert n.svc.content.digests() == v1.content()


async def test_estargz_v2_after_v1(tmp_path: Path, esgz: Versions) -> None:
    with proxy(esgz) as p:
        async with node(tmp_path / "a", use_hard_links=True) as n:
            _, cold = await n.pull(f"{p.host}/esgz:v1")
            assert cold.partial_layers == 0
            p.seen.clear()
            v2, warm = await n.pull(f"{p.host}/esgz:v2")
            assert warm.partial_layers == 3 and warm.linked_files > 100
            # The unchanged files, and each layer's landmark (one byte).
            assert warm.reused == unchanged_bytes(esgz) + 3
            assert warm.fetched < warm.skipped
            # Per layer: the end of the blob (footer and TOC), maybe the rest of the TOC,
            # the probe, and the files.
            ranged = [s for s in p.seen if s.range]
            assert 9 <= len(ranged) <= 12 and all(s.status == 206 for s in ranged)
            with n.rootfs(v2) as root:
                partial_tree = tree(root)
                assert (root / "app0/VERSION").read_text() == "2\n"
        async with node(tmp_path / "b", enable_partial_images=False) as whole:
            v2w, _ = await whole.pull(f"{p.host}/esgz:v2")
            with whole.rootfs(v2w) as root:
                assert tree(root) == partial_tree


async def test_estargz_tampered_members_fall_back(tmp_path: Path, esgz: Versions,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    class AfterMetadata:
        """Corrupt what comes after a blob's metadata and probe: its first two ranges (the
        TOCs of these layers fit in the first)."""

        def __init__(self) -> None:
            self.seen: dict[str, int] = {}

        def __call__(self, path: str, rng: str, body: bytes) -> bytes:
            n = self.seen[path] = self.seen.get(path, 0) + 1
            return flip_everything(path, rng, body) if n > 2 else body

    caplog.set_level(logging.INFO, logger="pycrid.images.partial")
    with proxy(esgz) as p:
        async with node(tmp_path, use_hard_links=True) as n:
            await n.pull(f"{p.host}/esgz:v1")
            p.tamper = AfterMetadata()
            v2, report = await n.pull(f"{p.host}/esgz:v2")
            assert report.partial_layers == 0 and n.svc.store.get(v2.id) is not None
            whole = [r.getMessage() for r in caplog.records if "is pulled whole" in
                     r.getMessage()]
            # Refused for what the corrupted ranges held, never for the metadata.
            assert whole and not any("TOC" in m for m in whole), whole
            with n.rootfs(v2) as root:
                assert (root / "app1/VERSION").read_text() == "2\n"


async def test_a_layer_unpacked_from_its_blob_is_indexed_too(tmp_path: Path,
                                                             versions: Versions) -> None:
    """A layer with a TOC committed from a blob already here (no partial pull asked
    first) still has its files recorded."""
    from pycrid.images.mediatypes import Descriptor

    with proxy(versions) as p:
        async with node(tmp_path) as n:
            v1, _ = await n.pull(f"{p.host}/app:v1")
            assert n.svc.partial is not None
            index = n.svc.partial.index
            assert index.layers() == set(v1.chain)
            index.retain(set())
            manifest = json.loads(n.svc.content.read(v1.manifest))
            for chain_id, d in zip(v1.chain, manifest["layers"], strict=True):
                n.svc.partial.committed(chain_id, Descriptor.from_json(d))
            await n.svc.partial.indexed()
            assert index.layers() == set(v1.chain)
