"""PullImage of a multi-layer image of incompressible data from the local registry, beside a
plain HTTP download of the same manifest, config and layer blobs in the same round."""

from __future__ import annotations

import contextlib
import http.client
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tests.support.images import OCI_MANIFEST, big_layer, build_image, push

from bench.common import Target, timed
from bench.report import Section

REPO = "bench/pull"
CONCURRENCY = 3  # pycrid's default max_concurrent_downloads
MIB = 1 << 20
CHUNK = 1 << 20


def layer_sizes(total_mb: int, layers: int) -> list[int]:
    """``total_mb`` MiB split over ``layers`` layers of whole MiB."""
    q, r = divmod(total_mb, layers)
    return [q + (1 if i < r else 0) for i in range(layers)]


def fetch(port: int, path: str, accept: str = "") -> int:
    """GET ``path`` on 127.0.0.1:port, following one redirect; bytes of body read."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("GET", path, headers={"Accept": accept} if accept else {})
        resp = conn.getresponse()
        if resp.status in (301, 302, 307):
            resp.read()
            return fetch(port, resp.headers["Location"], accept)
        if resp.status != 200:
            raise RuntimeError(f"GET {path}: {resp.status}")
        n = 0
        while chunk := resp.read(CHUNK):
            n += len(chunk)
        return n
    finally:
        conn.close()


def http_download(port: int, config: str, layers: list[str]) -> int:
    """Manifest, then config and layers ``CONCURRENCY`` at a time; total bytes."""
    total = fetch(port, f"/v2/{REPO}/manifests/latest", OCI_MANIFEST)
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        total += sum(pool.map(lambda d: fetch(port, f"/v2/{REPO}/blobs/{d}"),
                              [config, *layers]))
    return total


def blob_gets(target: Target, layers: list[str], since: int) -> int:
    """Layer blob GETs in the registry's access log after byte offset ``since``."""
    with open(target.registry.log_path, errors="replace") as f:
        f.seek(since)
        text = f.read()
    return sum(text.count(f'"GET /v2/{REPO}/blobs/{d}') for d in layers)


def run(target: Target, total_mb: int, n_layers: int, rounds: int) -> Section:
    sec = Section("pull")
    sizes = layer_sizes(total_mb, n_layers)
    print(f"building a {total_mb} MiB image of {n_layers} layers ...", file=sys.stderr)
    build = build_image([big_layer(mb, name=f"layer{i}.bin", seed=1000 + i)
                         for i, mb in enumerate(sizes)], compression="gzip")
    push(target.registry, REPO, "latest", build)
    ref = f"{target.registry.host}/{REPO}:latest"
    blob_bytes = sum(len(build.blobs[d]) for d in build.layer_digests)
    image_bytes = blob_bytes + len(build.config) + len(build.manifest)
    mb = image_bytes / MIB
    pull_ms: list[float] = []
    http_ms: list[float] = []
    missing_downloads = 0
    try:
        for i in range(rounds):
            def pull() -> None:
                offset = target.registry.log_path.stat().st_size
                ms, _ = timed(lambda: target.client.pull(ref, timeout=600))
                pull_ms.append(ms)
                nonlocal missing_downloads
                time.sleep(0.05)  # the registry writes its access log line after the body
                if blob_gets(target, list(build.layer_digests), offset) < n_layers:
                    missing_downloads += 1
                target.client.remove(ref)  # untimed: the next round downloads again

            def download() -> None:
                ms, got = timed(lambda: http_download(target.registry.port, build.config_digest,
                                                      list(build.layer_digests)))
                if got != image_bytes:
                    raise RuntimeError(f"HTTP download got {got} bytes, expected {image_bytes}")
                http_ms.append(ms)

            for step in ((pull, download) if i % 2 == 0 else (download, pull)):
                step()
            print(f"\rpull {i + 1}/{rounds}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
    finally:
        left = [img for img in target.client.list() if ref in img.repo_tags]
        for img in left:
            with contextlib.suppress(Exception):
                target.client.remove(img.id)
    sec.floor("HTTP download", http_ms)
    sec.floor("HTTP download throughput", [mb / (ms / 1000) for ms in http_ms], unit="MB/s")
    sec.figure(f"PullImage ({total_mb} MiB, {n_layers} layers)", pull_ms, floor="HTTP download")
    sec.figure("PullImage throughput", [mb / (ms / 1000) for ms in pull_ms], unit="MB/s",
               floor="HTTP download throughput")
    if missing_downloads:
        sec.notes.append(f"{missing_downloads} of {rounds} pulls did not fetch every layer "
                         "from the registry (content kept after RemoveImage?)")
    sec.notes.append(f"image {image_bytes / MIB:.1f} MiB (gzip of random data); MB/s is MiB "
                     f"per second; the HTTP floor fetches {CONCURRENCY} blobs at a time "
                     "and keeps nothing")
    extra: dict[str, Any] = {"image": {"ref": ref, "digest": build.manifest_digest,
                                       "layers": n_layers, "layer_mib": sizes,
                                       "bytes": image_bytes}, "rounds": rounds,
                             "concurrency": CONCURRENCY}
    sec.extra.update(extra)
    return sec
