"""The layer kinds the pull section times, and the images made of them.

Two sets of layer tars, each ``--pull-mb`` MiB over ``--pull-layers`` layers: random data
(one file per layer; does not compress) and text-like data (many small files of made-up
words in directories, about 3x under gzip: the shape of most of a real image). Each is
pushed gzip, zstd and uncompressed; the text set also as zstd:chunked, written by
upstream skopeo (``--dest-compress-format zstd:chunked``) where the interop folder has
it: per-file zstd frames and a table of contents in a skippable frame, which a full pull
reads as plain zstd.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import string
import subprocess
from dataclasses import dataclass

from tests.support import interop
from tests.support.images import (
    OCI_MANIFEST,
    ImageBuild,
    big_layer,
    build_image,
    digest_of,
    push,
)
from tests.support.layers import Entry, tar_bytes
from tests.support.registry import LocalRegistry

from bench.pull_floors import REPO, get


@dataclass(frozen=True)
class Kind:
    """One way of shipping a layer set: its compression, its content, its tag."""

    name: str
    compression: str  # gzip | zstd | none | zstd:chunked
    content: str  # random | text
    tag: str

    @property
    def suffix(self) -> str:
        """What figure names carry: none for gzip of random data (the names it always had)."""
        return "" if self.name == "gzip" else f" {self.name}"

    @property
    def decoder(self) -> str:
        """How its blobs decompress: zstd:chunked is plain zstd to a full pull."""
        return "zstd" if self.compression == "zstd:chunked" else self.compression


KINDS = (
    Kind("gzip", "gzip", "random", "latest"),
    Kind("zstd", "zstd", "random", "zstd"),
    Kind("uncompressed", "none", "random", "tar"),
    Kind("gzip text", "gzip", "text", "gzip-text"),
    Kind("zstd text", "zstd", "text", "zstd-text"),
    Kind("uncompressed text", "none", "text", "tar-text"),
    Kind("zstd:chunked text", "zstd:chunked", "text", "zstd-chunked-text"),
)
KIND_NAMES = tuple(k.name for k in KINDS)


def kind_list(text: str) -> list[str]:
    """``--pull-kinds``: names of :data:`KINDS`, comma-separated."""
    names = [v.strip() for v in text.split(",") if v.strip()]
    bad = [n for n in names if n not in KIND_NAMES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"layer kinds are {','.join(KIND_NAMES)}, not {bad}")
    return names


@dataclass(frozen=True)
class Pushed:
    """An image as pushed: what the floors fetch and check."""

    manifest_digest: str
    config_digest: str
    layers: tuple[tuple[str, str], ...]  # (blob digest, diff id), bottom first
    bytes: int  # manifest + config + layer blobs

    @classmethod
    def of(cls, b: ImageBuild) -> Pushed:
        return cls(b.manifest_digest, b.config_digest,
                   tuple(zip(b.layer_digests, b.diff_ids, strict=True)),
                   len(b.manifest) + len(b.config) + sum(len(b.blobs[d])
                                                         for d in b.layer_digests))


def layer_sizes(total_mb: int, layers: int) -> list[int]:
    """``total_mb`` MiB split over ``layers`` layers of whole MiB."""
    q, r = divmod(total_mb, layers)
    return [q + (1 if i < r else 0) for i in range(layers)]


def text_layer(size_mb: int, seed: int) -> bytes:
    """An uncompressed layer tar of ``size_mb`` MiB of text-like files (512 B to 64 KiB,
    32 to a directory), made-up words drawn with Zipf-like weights: repeatable for a seed,
    and about as compressible as source code."""
    rng = random.Random(seed)
    vocab = ["".join(rng.choices(string.ascii_lowercase + "_", k=rng.randint(1, 10)))
             for _ in range(4000)]
    weights = [1.0 / (i + 1) for i in range(len(vocab))]
    marks = ["\n", "\n    ", "\n        ", "(", ")", "{", "}", "=", ",", ";", "0", "1"]
    share = 0.08 * sum(weights) / len(marks)  # about 8% of the tokens: breaks and signs
    cum_weights = list(itertools.accumulate(weights + [share] * len(marks)))
    vocab += marks
    top = f"layer{seed}"
    entries = [Entry(top, "dir")]
    left, n = size_mb << 20, 0
    while left > 0:
        size = min(left, int(2 ** rng.uniform(9, 16)))
        if n % 32 == 0:
            entries.append(Entry(f"{top}/d{n // 32:04}", "dir"))
        words = rng.choices(vocab, cum_weights=cum_weights, k=size // 5 + 1)
        entries.append(Entry(f"{top}/d{n // 32:04}/f{n:05}.txt",
                             data=" ".join(words).encode()[:size]))
        left -= size
        n += 1
    return tar_bytes(entries)


def layer_tars(content: str, total_mb: int, n_layers: int) -> list[bytes]:
    sizes = layer_sizes(total_mb, n_layers)
    if content == "random":
        return [big_layer(mb, name=f"layer{i}.bin", seed=1000 + i) for i, mb in enumerate(sizes)]
    return [text_layer(mb, seed=2000 + i) for i, mb in enumerate(sizes)]


def skopeo_chunked(reg: LocalRegistry, src_tag: str, kind: Kind) -> Pushed:
    """``REPO:src_tag`` copied to ``REPO:<kind.tag>`` by upstream skopeo as zstd:chunked;
    what it pushed, read back from the registry."""
    skopeo = interop.binary("skopeo")
    if skopeo is None:
        raise FileNotFoundError(f"{interop.ROOT / 'bin' / 'skopeo'} (makes zstd:chunked)")
    subprocess.run([str(skopeo), "copy", "--quiet", "--src-tls-verify=false",
                    "--dest-tls-verify=false", "--dest-compress-format", "zstd:chunked",
                    "--dest-force-compress-format",
                    f"docker://{reg.host}/{REPO}:{src_tag}",
                    f"docker://{reg.host}/{REPO}:{kind.tag}"],
                   check=True, capture_output=True, timeout=600)
    manifest = get(reg.port, f"/v2/{REPO}/manifests/{kind.tag}", OCI_MANIFEST)
    doc = json.loads(manifest)
    config = get(reg.port, f"/v2/{REPO}/blobs/{doc['config']['digest']}")
    diff_ids = json.loads(config)["rootfs"]["diff_ids"]
    layers = [x["digest"] for x in doc["layers"]]
    return Pushed(digest_of(manifest), doc["config"]["digest"],
                  tuple(zip(layers, diff_ids, strict=True)),
                  len(manifest) + len(config) + sum(x["size"] for x in doc["layers"]))


def push_kinds(reg: LocalRegistry, kinds: list[Kind], total_mb: int,
               n_layers: int) -> dict[str, Pushed]:
    """Every kind of ``kinds`` pushed as ``REPO:<tag>``; kind name -> what was pushed."""
    out: dict[str, Pushed] = {}
    for content in ("random", "text"):
        mine = [k for k in kinds if k.content == content]
        if not mine:
            continue
        tars = layer_tars(content, total_mb, n_layers)
        plain = {k.compression for k in mine} | ({"none"} if any(
            k.compression == "zstd:chunked" for k in mine) else set())
        for compression in ("gzip", "zstd", "none"):
            if compression not in plain:
                continue
            build = build_image(tars, compression=compression)
            tag = next(k.tag for k in KINDS if k.content == content
                       and k.compression == compression)
            push(reg, REPO, tag, build)
            for k in mine:
                if k.compression == compression:
                    out[k.name] = Pushed.of(build)
        del tars
        for k in mine:
            if k.compression == "zstd:chunked":
                src = next(x.tag for x in KINDS if x.content == content
                           and x.compression == "none")
                out[k.name] = skopeo_chunked(reg, src, k)
    return out
