"""Pulls through the streaming unpacker: real content store, overlay snapshotter, SQLite and
overlay mounts (root), with the registry client replaced by blobs served from memory, so a
test can cut streams into odd pieces, corrupt them, or hold one while others go on.

What every failure must leave: no snapshot (committed or scratch), no snapshot directory,
no content blob, no ingest file, no mount.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import os
import stat
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from pycrid.config.images_schema import ImagesConfig
from pycrid.errors import DataLoss, InvalidArgument, PermissionDenied
from pycrid.host import mounts as mnt
from pycrid.images.content import ContentStore
from pycrid.images.distribution import RegistryClient
from pycrid.images.fetch import chain_ids
from pycrid.images.image_service import ImageService
from pycrid.images.layer_paths import OPAQUE_XATTR, is_whiteout
from pycrid.images.mediatypes import Descriptor
from pycrid.images.overlay import OverlaySnapshotter
from pycrid.images.snapshots import Kind
from pycrid.store.db import Database
from pycrid.store.image_records import ImageStore
from tests.support.images import (
    LAYERED_EXPECTED,
    ImageBuild,
    big_layer,
    build_image,
    layered_layers,
)
from tests.support.layers import Entry, tar_bytes

REF = "registry.test/stream/image:1"


class MemoryRegistry:
    """What ImageService asks of its registry client, answered from ImageBuilds in memory.

    ``pieces`` cycles through the chunk sizes blobs are cut into; ``served`` replaces a
    blob's bytes (corruption); ``holds`` makes a blob's stream wait at half way until a
    condition holds (checked every few ms, failing the stream after ``hold_timeout``);
    ``finished`` lists blobs in the order their streams ended.
    """

    def __init__(self, *builds: ImageBuild, pieces: tuple[int, ...] = (65536,)) -> None:
        self.manifests = {b.manifest_digest: b for b in builds}
        self.blobs = {d: data for b in builds for d, data in b.blobs.items()}
        self.tags = {f"registry.test/stream/image:{i + 1}": b for i, b in enumerate(builds)}
        self.pieces = pieces
        self.served: dict[str, bytes] = {}
        self.holds: dict[str, Any] = {}
        self.hold_timeout = 20.0
        self.finished: list[str] = []
        self.opened: list[str] = []

    async def resolve(self, ref: Any, creds: Any) -> Descriptor:
        b = self.tags[str(ref)]
        return Descriptor(b.media_type, b.manifest_digest, len(b.manifest))

    async def fetch_manifest(self, ref: Any, desc: Descriptor, creds: Any) -> bytes:
        return self.manifests[desc.digest].manifest

    def fetch_blob(self, ref: Any, desc: Descriptor, creds: Any,
                   offset: int = 0) -> contextlib.AbstractAsyncContextManager[AsyncIterator[bytes]]:
        return self._blob(desc.digest)

    @contextlib.asynccontextmanager
    async def _blob(self, digest: str) -> AsyncIterator[AsyncIterator[bytes]]:
        self.opened.append(digest)
        data = self.served.get(digest, self.blobs[digest])

        async def chunks() -> AsyncIterator[bytes]:
            pos = 0
            held = digest not in self.holds
            for size in itertools.cycle(self.pieces):
                if pos >= len(data):
                    break
                if not held and pos >= len(data) // 2:
                    held = True
                    await self._wait(self.holds[digest])
                yield data[pos:pos + size]
                pos += size
                await asyncio.sleep(0)
            self.finished.append(digest)

        yield chunks()

    async def _wait(self, cond: Any) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.hold_timeout
        while not cond():
            if loop.time() > deadline:
                raise DataLoss("test hold timed out")
            await asyncio.sleep(0.005)

    async def close(self) -> None:
        pass


@pytest.fixture
def base(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    assert mnt.mounts_under(str(tmp_path)) == []


@contextlib.asynccontextmanager
async def service(base: Path, reg: MemoryRegistry, **config: Any) -> AsyncIterator[ImageService]:
    db = Database(str(base / "meta.db"))
    svc = ImageService(
        store=ImageStore(db), content=ContentStore(str(base / "content")),
        snapshotter=OverlaySnapshotter(str(base / "sn"), db),
        client=cast(RegistryClient, reg), config=ImagesConfig(**config))
    try:
        yield svc
    finally:
        await svc.close()
        db.close()


def assert_nothing_left(svc: ImageService) -> None:
    assert svc.snapshotter.walk() == []
    assert os.listdir(Path(svc.snapshotter.root, "snapshots")) == []
    assert svc.content.digests() == set()
    assert os.listdir(Path(svc.content.root, "ingest")) == []


def scratch_files(svc: ImageService) -> set[str]:
    """Names of files in the scratch snapshots of unpacks under way."""
    found: set[str] = set()
    for info in svc.snapshotter.walk():
        if info.kind is Kind.ACTIVE:
            found |= {p.name for p in Path(svc.snapshotter.upper_dir(info.key)).rglob("*")}
    return found


@contextlib.contextmanager
def mounted_view(svc: ImageService, chain_id: str, where: Path) -> Iterator[Path]:
    svc.snapshotter.view("check", chain_id)
    where.mkdir()
    mnt.mount(svc.snapshotter.mounts("check")[0], str(where))
    try:
        yield where
    finally:
        mnt.unmount(str(where))
        svc.snapshotter.remove("check")


def check_layered(root: Path) -> None:
    for rel, want in LAYERED_EXPECTED.items():
        p = root / rel
        if want is None:
            assert not os.path.lexists(p), rel
        elif isinstance(want, str):
            assert os.readlink(p) == want[2:], rel
        else:
            assert p.read_bytes() == want, rel


def check_layered_dirs(layers: list[Path]) -> None:
    """Layer 2 whited a.txt out as overlayfs does, and its lib/two.so went through the
    lib -> usr/lib link of layer 1 (unpacked again with layer 1 in view); layer 3's
    opaque dir is an xattr; no .wh. file anywhere."""
    _, two, three = layers
    assert is_whiteout((two / "data" / "a.txt").lstat())
    assert (two / "usr" / "lib" / "two.so").read_bytes() == b"two\n"
    assert not os.path.lexists(two / "lib")
    assert os.getxattr(three / "opt" / "dir", OPAQUE_XATTR) == b"y"
    for layer in layers:
        assert not list(layer.rglob(".wh.*"))


# Odd pieces: single bytes first (the magic number spans chunks), tar-block edges, and
# sizes that are not multiples of anything.
SPLIT = (1, 1, 2, 3, 511, 512, 513, 4095, 7, 70001)


@pytest.mark.parametrize("compression", ["none", "gzip", "zstd"])
async def test_layered_image_in_odd_pieces(base: Path, compression: str) -> None:
    build = build_image(layered_layers(), compression=compression)
    reg = MemoryRegistry(build, pieces=SPLIT)
    async with service(base, reg) as svc:
        rec = await svc.pull(REF, None)
        assert rec.chain == tuple(chain_ids(list(build.diff_ids)))
        assert [(i.key, i.kind) for i in svc.snapshotter.walk()] == [
            (c, Kind.COMMITTED) for c in rec.chain]
        assert [svc.snapshotter.stat(c).parent for c in rec.chain] == [None, *rec.chain[:-1]]
        with mounted_view(svc, rec.chain[-1], base / "view") as view:
            check_layered(view)
        check_layered_dirs([Path(svc.snapshotter.upper_dir(c)) for c in rec.chain])
        assert svc.content.digests() == {build.manifest_digest, build.config_digest,
                                         *build.layer_digests}
        assert os.listdir(Path(svc.content.root, "ingest")) == []
        assert await svc.remove(REF)
        assert_nothing_left(svc)


async def test_layers_unpack_side_by_side(base: Path) -> None:
    """Layer 1 is held half-downloaded until layers 2 and 3 have been unpacked into their
    scratch snapshots: they cannot have waited for it. Committed bottom up all the same,
    whiteouts and the opaque dir hold across them."""
    build = build_image(layered_layers())
    reg = MemoryRegistry(build)
    async with service(base, reg) as svc:
        reg.holds[build.layer_digests[0]] = lambda: {"c.txt", "new.txt"} <= scratch_files(svc)
        rec = await svc.pull(REF, None)
        assert reg.finished[-1] == build.layer_digests[0]
        with mounted_view(svc, rec.chain[-1], base / "view") as view:
            check_layered(view)


def corrupt(blob: bytes) -> bytes:
    """The same length, one byte changed in the middle."""
    mid = len(blob) // 2
    return blob[:mid] + bytes([blob[mid] ^ 0xFF]) + blob[mid + 1:]


@pytest.mark.parametrize(
    ("compression", "how", "message"),
    [("none", "corrupt", "digest mismatch"),
     ("gzip", "corrupt", "corrupt|digest mismatch"),
     ("zstd", "corrupt", "corrupt|digest mismatch"),
     ("gzip", "longer", "more than"),
     ("gzip", "shorter", "truncated|got .* of"),
     ("none", "shorter", "truncated|got .* of"),
     ("gzip", "other-layer", "digest mismatch")],
)
async def test_bad_blob_mid_stream_leaves_nothing(base: Path, compression: str, how: str,
                                                  message: str) -> None:
    """The middle layer goes bad while the others are still streaming (held until the
    failure): every layer's scratch snapshot, blob and ingest file goes."""
    tars = [big_layer(1, name=f"l{i}", seed=i) for i in range(3)]
    build = build_image(tars, compression=compression)
    reg = MemoryRegistry(build, pieces=(4096, 65536))
    bad = build.layer_digests[1]
    blob = build.blobs[bad]
    reg.served[bad] = {"corrupt": corrupt(blob), "longer": blob + b"\0" * 600,
                       "shorter": blob[:-100],
                       "other-layer": build.blobs[build.layer_digests[2]]}[how]
    for d in (build.layer_digests[0], build.layer_digests[2]):
        reg.holds[d] = lambda: bad in reg.finished
    async with service(base, reg) as svc:
        with pytest.raises(DataLoss, match=message):
            await svc.pull(REF, None)
        assert_nothing_left(svc)


async def test_refused_layer_and_wrong_diff_id_leave_nothing(base: Path) -> None:
    hostile = tar_bytes([Entry("ok", data=b"x"), Entry("h", "hardlink", linkname="../../x")])
    ok = tar_bytes([Entry("f", data=b"1")])
    reg = MemoryRegistry(build_image([ok, hostile, ok]))
    async with service(base, reg) as svc:
        with pytest.raises(PermissionDenied, match="outside the layer"):
            await svc.pull(REF, None)
        assert_nothing_left(svc)
    build = build_image([ok, tar_bytes([Entry("g", data=b"2")])])
    config = build.config_json
    config["rootfs"]["diff_ids"][1] = "sha256:" + "0" * 64
    lying = rebuilt(build, config=config)
    async with service(base, MemoryRegistry(lying)) as svc:
        with pytest.raises(DataLoss, match="diffID mismatch"):
            await svc.pull(REF, None)
        assert_nothing_left(svc)


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def rebuilt(build: ImageBuild, *, config: dict[str, Any] | None = None,
            layer_type: str = "") -> ImageBuild:
    """``build`` with another image config, or another media type on its layers."""
    manifest = json.loads(build.manifest)
    blobs = dict(build.blobs)
    data = build.config
    if config is not None:
        del blobs[build.config_digest]
        data = json.dumps(config, indent=2, sort_keys=True).encode()
        blobs[digest_of(data)] = data
        manifest["config"].update(digest=digest_of(data), size=len(data))
    for layer in manifest["layers"]:
        layer["mediaType"] = layer_type or layer["mediaType"]
    raw = json.dumps(manifest, indent=2, sort_keys=True).encode()
    return ImageBuild(manifest=raw, manifest_digest=digest_of(raw), media_type=build.media_type,
                      config=data, blobs=blobs, layer_digests=build.layer_digests,
                      diff_ids=build.diff_ids, platform=build.platform)


async def test_unknown_layer_type_is_refused_before_any_download(base: Path) -> None:
    bogus = rebuilt(build_image([tar_bytes([Entry("f")])]), layer_type="application/x-bogus")
    reg = MemoryRegistry(bogus)
    async with service(base, reg) as svc:
        with pytest.raises(InvalidArgument, match="application/x-bogus"):
            await svc.pull(REF, None)
        assert not set(reg.opened) & set(bogus.layer_digests)
        assert_nothing_left(svc)


async def test_cancelled_pull_leaves_nothing(base: Path) -> None:
    build = build_image([big_layer(2, name=f"l{i}", seed=i) for i in range(3)])
    reg = MemoryRegistry(build)
    reg.hold_timeout = 3600
    async with service(base, reg) as svc:
        # Layer 3 never finishes; the pull is cancelled once the others are unpacked.
        reg.holds[build.layer_digests[2]] = lambda: False
        task = asyncio.create_task(svc.pull(REF, None))
        deadline = asyncio.get_running_loop().time() + 20
        while not {"l0", "l1"} <= scratch_files(svc) | committed_files(svc):
            assert asyncio.get_running_loop().time() < deadline, "the unpack did not start"
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await svc.gc()  # what the end of the failed pull asked for
        assert_nothing_left(svc)


def committed_files(svc: ImageService) -> set[str]:
    found: set[str] = set()
    for info in svc.snapshotter.walk():
        if info.kind is Kind.COMMITTED:
            found |= {p.name for p in Path(svc.snapshotter.upper_dir(info.key)).rglob("*")}
    return found


async def test_concurrent_pulls_share_layers(base: Path) -> None:
    """Two images on the same two bottom layers, pulled at once: each blob is fetched once,
    each chain id unpacked into one snapshot, and both images are whole."""
    one, two = (tar_bytes([Entry("bin", "dir"), Entry(f"bin/{n}", data=n.encode())])
                for n in ("a", "b"))
    a = build_image([one, two, tar_bytes([Entry("only-a", data=b"a")])])
    b = build_image([one, two, tar_bytes([Entry("only-b", data=b"b")])])
    reg = MemoryRegistry(a, b, pieces=SPLIT)
    async with service(base, reg) as svc:
        ra, rb = await asyncio.gather(svc.pull("registry.test/stream/image:1", None),
                                      svc.pull("registry.test/stream/image:2", None))
        assert ra.chain[:2] == rb.chain[:2]
        assert sorted(i.key for i in svc.snapshotter.walk()) == sorted(
            {*ra.chain, *rb.chain})
        assert sorted(reg.opened.count(d) for d in a.layer_digests[:2]) == [1, 1]
        for rec, mine in ((ra, "only-a"), (rb, "only-b")):
            with mounted_view(svc, rec.chain[-1], base / mine) as view:
                assert sorted(p.name for p in view.rglob("*")) == ["a", "b", "bin", mine]
        assert all(i.kind is Kind.COMMITTED for i in svc.snapshotter.walk())


async def test_implicit_dirs_take_the_metadata_below(base: Path) -> None:
    lower = tar_bytes([Entry("srv", "dir", mode=0o710, uid=7, gid=8),
                       Entry("srv/www", "dir", mode=0o750, uid=9, gid=9)])
    upper = tar_bytes([Entry("srv/www/index.html", data=b"hi")])
    reg = MemoryRegistry(build_image([lower, upper]))
    async with service(base, reg) as svc:
        rec = await svc.pull(REF, None)
        with mounted_view(svc, rec.chain[-1], base / "view") as view:
            for rel, want in (("srv", (0o710, 7, 8)), ("srv/www", (0o750, 9, 9))):
                st = (view / rel).lstat()
                assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == want, rel
                assert st.st_mtime == 1_700_000_000, rel
            assert (view / "srv/www/index.html").read_bytes() == b"hi"


@pytest.mark.parametrize("compression", ["none", "gzip", "zstd"])
async def test_a_wrong_diff_id_is_refused_whatever_the_compression(base: Path,
                                                                    compression: str) -> None:
    """An uncompressed layer's tar is not hashed twice (its diff id is its verified digest):
    a config naming another diff id is refused all the same."""
    ok = tar_bytes([Entry("f", data=b"1")])
    build = build_image([ok, tar_bytes([Entry("g", data=b"2")])], compression=compression)
    config = build.config_json
    config["rootfs"]["diff_ids"][1] = digest_of(tar_bytes([Entry("g", data=b"3")]))
    async with service(base, MemoryRegistry(rebuilt(build, config=config))) as svc:
        with pytest.raises(DataLoss, match="diffID mismatch"):
            await svc.pull(REF, None)
        assert_nothing_left(svc)
