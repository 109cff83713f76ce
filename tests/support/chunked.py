"""zstd:chunked layers written in Python, for unit tests that need to bend the format.

The real producer is skopeo (``tests/data/zstd-chunked/`` holds a layer it wrote, and
the e2e tests use it directly); this writer lays a tar out the same way
(containers/storage's pkg/chunked): every regular file's contents in a zstd frame of
its own, the headers and padding between them in frames of their own, then skippable
frames with the TOC, the tar-split and the 64-byte footer. ``toc_hook`` and
``tarsplit_hook`` change the metadata before it is written, and the annotations are
computed afterwards: a producer that lies consistently, which only the diff id and
the files' digests can catch.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import random
import shutil
import struct
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zstandard

from tests.support.images import ImageBuild, push
from tests.support.layers import Entry, tar_bytes
from tests.support.registry import LocalRegistry

_SKIPPABLE = b"\x50\x2a\x4d\x18"
_FOOTER_MAGIC = b"GNUlInUx"
_TYPES = {tarfile.REGTYPE: "reg", tarfile.AREGTYPE: "reg", tarfile.DIRTYPE: "dir",
          tarfile.SYMTYPE: "symlink", tarfile.LNKTYPE: "hardlink", tarfile.CHRTYPE: "char",
          tarfile.BLKTYPE: "block", tarfile.FIFOTYPE: "fifo"}

Hook = Callable[[Any], None]


def _sha(b: bytes) -> str:
    return "sha256:" + hashlib.sha256(b).hexdigest()


def _skippable(data: bytes) -> bytes:
    return _SKIPPABLE + struct.pack("<I", len(data)) + data


def zstd_chunked(tar: bytes, *, toc_hook: Hook | None = None,
                 tarsplit_hook: Hook | None = None) -> tuple[bytes, dict[str, str]]:
    """The zstd:chunked blob of ``tar`` and its layer annotations."""
    z = zstandard.ZstdCompressor(level=3)
    out = bytearray()
    pending = bytearray()  # uncompressed bytes of the frame being gathered
    entries: list[dict[str, Any]] = []
    split: list[dict[str, Any]] = []
    pos = 0
    with tarfile.open(fileobj=io.BytesIO(tar), mode="r:") as tf:
        for m in tf:
            seg = tar[pos:m.offset_data]
            pending += seg
            split.append({"type": 2, "payload": base64.b64encode(seg).decode()})
            e: dict[str, Any] = {"type": _TYPES[m.type], "name": m.name, "mode": m.mode}
            if m.linkname:
                e["linkName"] = m.linkname
            if m.uid:
                e["uid"] = m.uid
            if m.gid:
                e["gid"] = m.gid
            pos = m.offset_data
            if m.isreg() and m.size:
                out += z.compress(bytes(pending))
                pending.clear()
                data = tar[pos:pos + m.size]
                e.update(size=m.size, digest=_sha(data), offset=len(out))
                out += z.compress(data)
                e["endOffset"] = len(out)
                pos += m.size
            split.append({"type": 1, "name": m.name, **({"size": m.size} if m.isreg()
                                                        and m.size else {})})
            entries.append(e)
    rest = tar[pos:]
    pending += rest
    split.append({"type": 2, "payload": base64.b64encode(rest).decode()})
    out += z.compress(bytes(pending))
    if tarsplit_hook is not None:
        tarsplit_hook(split)
    split_json = b"".join(json.dumps(s).encode() + b"\n" for s in split)
    split_z = z.compress(split_json)
    toc: dict[str, Any] = {"version": 1, "entries": entries, "tarSplitDigest": _sha(split_z)}
    if toc_hook is not None:
        toc_hook(toc)
    toc_json = json.dumps(toc).encode()
    toc_z = z.compress(toc_json)
    toc_at = len(out) + 8
    out += _skippable(toc_z)
    split_at = len(out) + 8
    out += _skippable(split_z)
    out += _skippable(struct.pack("<7Q", toc_at, len(toc_z), len(toc_json), 1, split_at,
                                  len(split_z), len(split_json)) + _FOOTER_MAGIC)
    return bytes(out), {
        "io.github.containers.zstd-chunked.manifest-checksum": _sha(toc_z),
        "io.github.containers.zstd-chunked.manifest-position":
            f"{toc_at}:{len(toc_z)}:{len(toc_json)}:1",
        "io.github.containers.zstd-chunked.tarsplit-position":
            f"{split_at}:{len(split_z)}:{len(split_json)}",
    }


# ---------------------------------------------------------------------------
# Images with versions, made zstd:chunked by skopeo


_WORDS = [bytes(w, "ascii") for w in (
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho "
    "sigma tau upsilon phi chi psi omega config value true false none path usr lib share "
    "local bin sbin etc var opt data cache log run tmp home root node pod container image "
    "layer chunk file digest sha256 zstd gzip tar split index json yaml toml").split()]


def text(size: int, seed: int) -> bytes:
    """``size`` bytes of word salad (compresses about as well as source code)."""
    rnd = random.Random(seed)
    out = b" ".join(rnd.choices(_WORDS, k=size // 5 + 8))
    return out[:size]


def app_layers(version: int, *, layers: int = 3, files: int = 40, size: int = 4096,
               changed: float = 0.05, seed: int = 0, binary: float = 0.0) -> list[bytes]:
    """Layer tars of a made-up application image, ``layers`` layers of ``files`` files
    of ``size`` bytes on average (text; a ``binary`` share of them random bytes, which
    do not compress). Version 2 is a rebuild: in every layer, a ``changed`` share of the
    files has new contents and one file is new; the rest is byte for byte v1's."""
    every = max(1, round(1 / changed)) if changed else 0
    odd = max(1, round(1 / binary)) if binary else 0
    tars = []
    for n in range(layers):
        entries = [Entry(f"app{n}", "dir"), Entry(f"app{n}/lib", "dir")]
        for i in range(files):
            bump = version > 1 and every and i % every == every // 2
            s = seed * 1_000_003 + n * 10_007 + i + (500_000 if bump else 0)
            length = size // 2 + (s * 7919) % size
            data = random.Random(s).randbytes(length) if odd and i % odd == 0 else \
                text(length, s)
            entries.append(Entry(f"app{n}/lib/f{i:05d}.txt", data=data))
        entries.append(Entry(f"app{n}/VERSION", data=f"{version}\n".encode()))
        if version > 1:
            entries.append(Entry(f"app{n}/lib/new-in-{version}.txt",
                                 data=text(size, seed + 99 + n)))
        tars.append(tar_bytes(entries))
    return tars


def skopeo_chunked(registry: LocalRegistry, build: ImageBuild, name: str,
                   skopeo: str | Path) -> str:
    """Push ``build`` and have skopeo copy it to ``name`` (repo:tag) with zstd:chunked
    layers; returns the new manifest's digest."""
    repo, _, tag = name.rpartition(":")
    src = f"{repo}-src:{tag}"
    push(registry, src.rpartition(":")[0], tag, build)
    digest_file = Path(tempfile.mkdtemp()) / "digest"
    try:
        subprocess.run(
            [str(skopeo), "--insecure-policy", "copy", "--quiet", "--src-tls-verify=false",
             "--dest-tls-verify=false", "--dest-compress-format", "zstd:chunked",
             "--digestfile", str(digest_file), f"docker://{registry.host}/{src}",
             f"docker://{registry.host}/{name}"],
            check=True, capture_output=True, timeout=300)
        return digest_file.read_text().strip()
    finally:
        shutil.rmtree(digest_file.parent, ignore_errors=True)
