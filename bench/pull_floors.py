"""The two floors of the pull section, timed in the same rounds as PullImage: a plain HTTP
download of an image's manifest, config and layer blobs, and a minimal pull (the same
download, with the work every runtime must do on a layer as it arrives)."""

from __future__ import annotations

import functools
import hashlib
import http.client
import os
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import zstandard
from isal import isal_zlib
from tests.support.images import OCI_MANIFEST

REPO = "bench/pull"
CONCURRENCY = 3  # pycrid's default max_concurrent_downloads
CHUNK = 1 << 20


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


def get(port: int, path: str, accept: str = "") -> bytes:
    """The whole body of :func:`fetch`."""
    parts: list[bytes] = []
    fetch(port, path, accept, parts.append)
    return b"".join(parts)


class _Same:
    """The decompressor of an uncompressed layer."""

    def decompress(self, data: bytes) -> bytes:
        return data


def _decompressor(compression: str) -> Any:
    if compression == "gzip":
        return isal_zlib.decompressobj(31)  # 31: a gzip header, as the layers have
    if compression == "none":
        return _Same()
    # Across frames: zstd:chunked is a frame per file (and skippable frames).
    return zstandard.ZstdDecompressor().decompressobj(read_across_frames=True)


def minimal_layer(port: int, digest: str, compression: str, diff_id: str,
                  scratch: Path) -> int:
    """Download one layer blob and, as it arrives, do what any runtime must do with it
    (containerd and pycrid both do it): hash it, write it, decompress it, hash the tar
    (the diff id) and write that out; then fsync the blob and check both digests. The tar
    is written as one file, not unpacked: a lower bound on the unpack. An uncompressed
    layer is its tar (its diff id is its digest): hashed once. Bytes received."""
    blob_hash, tar_hash, inflate = hashlib.sha256(), hashlib.sha256(), _decompressor(compression)
    plain = compression == "none"
    name = digest.split(":", 1)[1]
    with open(scratch / f"{name}.blob", "wb") as blob, \
            open(scratch / f"{name}.tar", "wb") as tar:

        def take(chunk: bytes) -> None:
            blob_hash.update(chunk)
            blob.write(chunk)
            data = inflate.decompress(chunk)
            if not plain:
                tar_hash.update(data)
            tar.write(data)

        n = fetch(port, f"/v2/{REPO}/blobs/{digest}", sink=take)
        blob.flush()
        os.fsync(blob.fileno())
    tar_digest = "sha256:" + (blob_hash if plain else tar_hash).hexdigest()
    if "sha256:" + blob_hash.hexdigest() != digest or tar_digest != diff_id:
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
