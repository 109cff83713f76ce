"""PullImage of a multi-layer image of incompressible data from the local registry, beside
two floors timed in the same round: a plain HTTP download of the same manifest, config and
layer blobs, and a minimal pull (the same download, with the work every runtime must do
on a layer as it arrives); once with gzip layers and once with zstd layers of the same
tars."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.client
import os
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zstandard
from isal import isal_zlib
from tests.support.images import OCI_MANIFEST, ImageBuild, big_layer, build_image, push

from bench.common import Target, timed
from bench.report import Section

REPO = "bench/pull"
CONCURRENCY = 3  # pycrid's default max_concurrent_downloads
MIB = 1 << 20
CHUNK = 1 << 20
#: compression -> tag; gzip first, so its figures keep the names they always had.
VARIANTS = {"gzip": "latest", "zstd": "zstd"}


def layer_sizes(total_mb: int, layers: int) -> list[int]:
    """``total_mb`` MiB split over ``layers`` layers of whole MiB."""
    q, r = divmod(total_mb, layers)
    return [q + (1 if i < r else 0) for i in range(layers)]


def fetch(port: int, path: str, accept: str = "",
          sink: Callable[[bytes], object] | None = None) -> int:
    """GET ``path`` on 127.0.0.1:port, following one redirect; bytes of body read, each
    chunk handed to ``sink`` when there is one."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("GET", path, headers={"Accept": accept} if accept else {})
        resp = conn.getresponse()
        if resp.status in (301, 302, 307):
            resp.read()
            return fetch(port, resp.headers["Location"], accept, sink)
        if resp.status != 200:
            raise RuntimeError(f"GET {path}: {resp.status}")
        n = 0
        while chunk := resp.read(CHUNK):
            n += len(chunk)
            if sink is not None:
                sink(chunk)
        return n
    finally:
        conn.close()


def _decompressor(compression: str) -> Any:
    if compression == "gzip":
        return isal_zlib.decompressobj(31)  # 31: a gzip header, as the layers have
    return zstandard.ZstdDecompressor().decompressobj()


def minimal_layer(port: int, digest: str, compression: str, diff_id: str,
                  scratch: Path) -> int:
    """Download one layer blob and, as it arrives, do what any runtime must do with it
    (containerd and pycrid both do it): hash it, write it, decompress it, hash the tar
    (the diff id) and write that out; then fsync the blob and check both digests. The tar
    is written as one file, not unpacked: a lower bound on the unpack. Bytes received."""
    blob_hash, tar_hash, inflate = hashlib.sha256(), hashlib.sha256(), _decompressor(compression)
    name = digest.split(":", 1)[1]
    with open(scratch / f"{name}.blob", "wb") as blob, \
            open(scratch / f"{name}.tar", "wb") as tar:

        def take(chunk: bytes) -> None:
            blob_hash.update(chunk)
            blob.write(chunk)
            data = inflate.decompress(chunk)
            tar_hash.update(data)
            tar.write(data)

        n = fetch(port, f"/v2/{REPO}/blobs/{digest}", sink=take)
        blob.flush()
        os.fsync(blob.fileno())
    if "sha256:" + blob_hash.hexdigest() != digest or "sha256:" + tar_hash.hexdigest() != \
            diff_id:
        raise RuntimeError(f"minimal pull of {digest}: a digest does not match")
    return n


def _manifest_then(port: int, tag: str, gets: list[Callable[[], int]]) -> int:
    """The manifest, then ``gets`` ``CONCURRENCY`` at a time; total bytes."""
    total = fetch(port, f"/v2/{REPO}/manifests/{tag}", OCI_MANIFEST)
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        running = [pool.submit(get) for get in gets]
        return total + sum(f.result() for f in running)


def http_download(port: int, tag: str, config: str, layers: list[str]) -> int:
    """Manifest, then config and layers ``CONCURRENCY`` at a time, read and discarded;
    total bytes."""
    return _manifest_then(port, tag, [functools.partial(fetch, port, f"/v2/{REPO}/blobs/{d}")
                                      for d in [config, *layers]])


def minimal_pull(port: int, tag: str, config: str, layers: list[tuple[str, str]],
                 compression: str, under: Path) -> int:
    """As :func:`http_download`, each layer (digest, diff id) through
    :func:`minimal_layer` into a scratch directory under ``under`` (the run's own, on the
    file system the runtime under test writes to when it is ours), removed afterwards;
    total bytes."""
    with tempfile.TemporaryDirectory(prefix="minimal-pull-", dir=under) as tmp:
        return _manifest_then(port, tag, [
            functools.partial(fetch, port, f"/v2/{REPO}/blobs/{config}"),
            *(functools.partial(minimal_layer, port, digest, compression, diff_id, Path(tmp))
              for digest, diff_id in layers)])


def blob_gets(target: Target, layers: list[str], since: int) -> int:
    """Layer blob GETs in the registry's access log after byte offset ``since``."""
    with open(target.registry.log_path, errors="replace") as f:
        f.seek(since)
        text = f.read()
    return sum(text.count(f'"GET /v2/{REPO}/blobs/{d}') for d in layers)


@dataclass
class Variant:
    """One compression of the bench image and its timings."""

    compression: str
    tag: str
    build: ImageBuild
    ref: str
    pull_ms: list[float] = field(default_factory=list)
    http_ms: list[float] = field(default_factory=list)
    minimal_ms: list[float] = field(default_factory=list)
    missing_downloads: int = 0

    @property
    def bytes(self) -> int:
        b = self.build
        return sum(len(b.blobs[d]) for d in b.layer_digests) + len(b.config) + len(b.manifest)

    def pull(self, target: Target) -> None:
        offset = target.registry.log_path.stat().st_size
        ms, _ = timed(lambda: target.client.pull(self.ref, timeout=600))
        self.pull_ms.append(ms)
        time.sleep(0.05)  # the registry writes its access log line after the body
        layers = list(self.build.layer_digests)
        if blob_gets(target, layers, offset) < len(layers):
            self.missing_downloads += 1
        target.client.remove(self.ref)  # untimed: the next round downloads again

    def download(self, target: Target) -> None:
        ms, got = timed(lambda: http_download(target.registry.port, self.tag,
                                              self.build.config_digest,
                                              list(self.build.layer_digests)))
        if got != self.bytes:
            raise RuntimeError(f"HTTP download got {got} bytes, expected {self.bytes}")
        self.http_ms.append(ms)

    def minimal(self, target: Target) -> None:
        b = self.build
        ms, got = timed(lambda: minimal_pull(
            target.registry.port, self.tag, b.config_digest,
            list(zip(b.layer_digests, b.diff_ids, strict=True)), self.compression,
            target.base))
        if got != self.bytes:
            raise RuntimeError(f"minimal pull got {got} bytes, expected {self.bytes}")
        self.minimal_ms.append(ms)


def run(target: Target, total_mb: int, n_layers: int, rounds: int) -> Section:
    sec = Section("pull")
    sizes = layer_sizes(total_mb, n_layers)
    print(f"building a {total_mb} MiB image of {n_layers} layers, "
          f"{' and '.join(VARIANTS)} ...", file=sys.stderr)
    tars = [big_layer(mb, name=f"layer{i}.bin", seed=1000 + i) for i, mb in enumerate(sizes)]
    variants: list[Variant] = []
    for compression, tag in VARIANTS.items():
        build = build_image(tars, compression=compression)
        push(target.registry, REPO, tag, build)
        variants.append(Variant(compression, tag, build, f"{target.registry.host}/{REPO}:{tag}"))
    del tars
    try:
        for i in range(rounds):
            # Alternate which goes first, pull or floors, and which compression.
            steps: list[Callable[[], None]] = []
            for v in variants if i % 2 == 0 else reversed(variants):
                trio = [lambda v=v: v.pull(target), lambda v=v: v.download(target),
                        lambda v=v: v.minimal(target)]
                steps += trio if i % 2 == 0 else trio[::-1]
            for step in steps:
                step()
            print(f"\rpull {i + 1}/{rounds}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
    finally:
        refs = {v.ref for v in variants}
        for img in target.client.list():
            if refs & set(img.repo_tags):
                with contextlib.suppress(Exception):
                    target.client.remove(img.id)
    for v in variants:
        mb = v.bytes / MIB
        suffix = "" if v.compression == "gzip" else f" {v.compression}"
        floor = f"HTTP download{suffix}"
        sec.floor(floor, v.http_ms)
        sec.floor(f"{floor} throughput", [mb / (ms / 1000) for ms in v.http_ms], unit="MB/s")
        sec.figure(f"PullImage{suffix} ({total_mb} MiB, {n_layers} layers)", v.pull_ms,
                   floor=floor)
        sec.figure(f"PullImage{suffix} throughput", [mb / (ms / 1000) for ms in v.pull_ms],
                   unit="MB/s", floor=f"{floor} throughput")
        minimal = f"minimal pull{suffix}"
        sec.floor(minimal, v.minimal_ms)
        sec.figure(f"PullImage{suffix} against the minimal pull", v.pull_ms, floor=minimal)
        if v.missing_downloads:
            sec.notes.append(f"{v.compression}: {v.missing_downloads} of {rounds} pulls did "
                             "not fetch every layer from the registry (content kept after "
                             "RemoveImage?)")
    gz = variants[0]
    sec.notes.append(f"image {gz.bytes / MIB:.1f} MiB (gzip of random data; the zstd variant "
                     "has the same layer tars); MB/s is MiB per second; the HTTP floor fetches "
                     f"{CONCURRENCY} blobs at a time and keeps nothing; the minimal pull "
                     "fetches the same way and hashes, writes and decompresses each layer "
                     "as it arrives, hashes and writes its tar as one file, fsyncs the blob "
                     "(no snapshot, no untar, no metadata)")

    def image(v: Variant) -> dict[str, Any]:
        return {"ref": v.ref, "digest": v.build.manifest_digest, "layers": n_layers,
                "layer_mib": sizes, "bytes": v.bytes, "compression": v.compression}

    sec.extra.update({"image": image(gz), "images": [image(v) for v in variants],
                      "rounds": rounds, "concurrency": CONCURRENCY})
    return sec
