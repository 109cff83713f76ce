"""eStargz layers written in Python, for the partial-pull tests.

The real producer (containerd/stargz-snapshotter's estargz package, Go) is not on this
machine's test path; ``tests/data/estargz/`` holds two layers it wrote, and
``tests/unit/test_partial_estargz.py`` checks this writer against them: the same
uncompressed tar for the same input (so the headers are Go's, as the reader expects)
and the same TOC shape, checked against the eStargz spec (docs/estargz.md) by
``check_spec``, which the Go-made layers pass too. Like the producer's ``Build``: a
``.no.prefetch.landmark`` first, each entry's header in the gzip member open at the
time, each regular file's contents (each ``chunk`` bytes of it) starting a member of
its own, the TOC as the last tar entry in a member of its own, then the 51-byte footer.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
import zlib
from collections.abc import Callable
from typing import Any

from pycrid.images.partial import gotar
from tests.support.layers import Entry

TOC_DIGEST = "containerd.io/snapshot/stargz/toc.digest"
LANDMARK = ".no.prefetch.landmark"
_KINDS = {"file": "reg", "dir": "dir", "symlink": "symlink", "hardlink": "hardlink",
          "char": "char", "block": "block", "fifo": "fifo"}
MTIME = 1_700_000_000  # what tests.support.layers.tar_bytes gives every entry


def _gzip(data: bytes) -> bytes:
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    return z.compress(data) + z.flush()


def _rfc3339(t: int) -> str:
    import time
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def footer(toc_offset: int) -> bytes:
    """The spec's 51-byte footer: an empty gzip member whose extra field says where the
    TOC is."""
    extra = b"SG" + struct.pack("<H", 22) + f"{toc_offset:016x}STARGZ".encode()
    return (b"\x1f\x8b\x08\x04" + bytes(4) + b"\x00\xff" + struct.pack("<H", len(extra))
            + extra + b"\x01\x00\x00\xff\xff" + bytes(8))


def estargz(entries: list[Entry], *, pax_names: bool = False, chunk: int = 4 << 20,
            toc_hook: Callable[[dict[str, Any]], None] | None = None,
            ) -> tuple[bytes, dict[str, str], str]:
    """The blob, its annotations and its diff id. ``pax_names``: long names as the
    producer writes them from an input that had them as PAX records (Python's and GNU
    tar's); without it, as from a Go-written input (split)."""
    blob = bytearray()
    member = bytearray()  # the uncompressed bytes of the member now open
    tar = hashlib.sha256()
    toc: list[dict[str, Any]] = []

    def close() -> None:
        if member:
            blob.extend(_gzip(bytes(member)))
            tar.update(member)
            member.clear()

    landmark = Entry(LANDMARK, data=b"\x0f", mode=0)
    for i, e in enumerate([landmark, *entries]):
        kind = _KINDS[e.kind]
        mtime = 0 if i == 0 else MTIME
        mode = e.mode if e.kind != "dir" or e.mode != 0o644 else 0o755
        xattrs = {k[len("SCHILY.xattr."):]: v.encode() for k, v in e.pax.items()
                  if k.startswith("SCHILY.xattr.")}
        g = gotar.Entry(name=e.name + ("/" if e.kind == "dir" else ""), kind=kind,
                        mode=mode, uid=e.uid, gid=e.gid, size=len(e.data), mtime=mtime,
                        linkname=e.linkname, devmajor=e.devmajor, devminor=e.devminor,
                        xattrs=xattrs)
        member += gotar.header(g, pax_names=pax_names)
        ent: dict[str, Any] = {"name": g.name, "type": kind}
        for key, value in (("size", g.size if kind == "reg" else 0),
                           ("modtime", _rfc3339(mtime) if mtime else ""),
                           ("linkName", g.linkname), ("mode", g.mode), ("uid", g.uid),
                           ("gid", g.gid), ("devMajor", g.devmajor),
                           ("devMinor", g.devminor)):
            if value:
                ent[key] = value
        if xattrs:
            ent["xattrs"] = {k: base64.b64encode(v).decode() for k, v in xattrs.items()}
        if kind == "reg":
            ent["digest"] = "sha256:" + hashlib.sha256(e.data).hexdigest()
        toc.append(ent)
        if kind != "reg" or not e.data:
            continue
        for at in range(0, len(e.data), chunk):
            close()
            piece = e.data[at:at + chunk]
            this = ent if at == 0 else {"name": g.name, "type": "chunk"}
            this["offset"] = len(blob)
            if at:
                this["chunkOffset"] = at
                toc.append(this)
            if len(e.data) > chunk and at + chunk < len(e.data):
                this["chunkSize"] = len(piece)
            this["chunkDigest"] = "sha256:" + hashlib.sha256(piece).hexdigest()
            member += piece
        member += gotar.padding(len(e.data))
    close()
    doc: dict[str, Any] = {"version": 1, "entries": toc}
    if toc_hook is not None:
        toc_hook(doc)
    toc_json = json.dumps(doc, indent="\t").encode()
    toc_offset = len(blob)
    toc_tar = (gotar.header(gotar.Entry(name="stargz.index.json", kind="reg", mode=0, uid=0,
                                        gid=0, size=len(toc_json)))
               + toc_json + gotar.padding(len(toc_json)) + bytes(2 * gotar.BLOCK))
    blob += _gzip(toc_tar)
    tar.update(toc_tar)
    blob += footer(toc_offset)
    ann = {TOC_DIGEST: "sha256:" + hashlib.sha256(toc_json).hexdigest()}
    return bytes(blob), ann, "sha256:" + tar.hexdigest()


def check_spec(blob: bytes, toc_digest: str) -> dict[str, Any]:
    """What docs/estargz.md says an eStargz blob MUST be, checked: the 51-byte footer and
    the TOC offset in it, the TOC as the last tar entry ``stargz.index.json`` in a gzip
    member of its own matching ``toc_digest``, version 1, every entry's required fields,
    a gzip member starting at every non-empty regular file's and chunk's offset holding
    its data (checked against ``chunkDigest``), chunks following their file, the
    no-prefetch landmark. Returns the TOC."""
    assert len(blob) > 51
    foot = blob[-51:]
    assert foot[:4] == b"\x1f\x8b\x08\x04" and foot[10:12] == struct.pack("<H", 26)
    assert foot[12:14] == b"SG" and foot[14:16] == struct.pack("<H", 22)
    assert foot[32:38] == b"STARGZ" and foot[-13:] == b"\x01\x00\x00\xff\xff" + bytes(8)
    toc_offset = int(foot[16:32], 16)
    d = zlib.decompressobj(31)
    toc_tar = d.decompress(blob[toc_offset:-51])
    assert d.eof and not d.unused_data, "the TOC member is one gzip member"
    assert toc_tar[:18] == b"stargz.index.json\0" and toc_tar[156:157] == b"0"
    size = int(toc_tar[124:135], 8)
    toc_json = toc_tar[512:512 + size]
    assert "sha256:" + hashlib.sha256(toc_json).hexdigest() == toc_digest
    assert toc_tar[512 + size:].strip(b"\0") == b"", "nothing after the TOC but padding"
    toc = json.loads(toc_json)
    assert toc["version"] == 1
    file: dict[str, Any] | None = None
    for e in toc["entries"]:
        assert isinstance(e["name"], str) and e["type"] in (
            "dir", "reg", "symlink", "hardlink", "char", "block", "fifo", "chunk")
        if e["type"] in ("symlink", "hardlink"):
            assert e.get("linkName")
        if e["type"] == "chunk":
            assert file is not None and e["name"] == file["name"]
            assert e["offset"] > 0 and e["chunkOffset"] > 0 and e["chunkDigest"]
        elif e["type"] == "reg" and e.get("size"):
            assert e["digest"].startswith("sha256:") and e["chunkDigest"] and e["offset"] > 0
            file = e
        else:
            file = None
        if e["type"] in ("reg", "chunk") and e.get("offset"):
            assert blob[e["offset"]:e["offset"] + 3] == b"\x1f\x8b\x08", e["name"]
            z = zlib.decompressobj(31)
            data = z.decompress(blob[e["offset"]:toc_offset])
            assert file is not None
            n = e.get("chunkSize") or (file["size"] - e.get("chunkOffset", 0))
            assert "sha256:" + hashlib.sha256(data[:n]).hexdigest() == e["chunkDigest"]
    assert any(e["name"] == LANDMARK for e in toc["entries"])
    return dict(toc)


def estargz_image(layers: list[list[Entry]], *, pax_names: bool = False,
                  config: dict[str, Any] | None = None) -> Any:
    """An OCI image (``tests.support.images.ImageBuild``) of eStargz layers, each
    descriptor annotated with its TOC digest as the producers do."""
    from tests.support.images import OCI_CONFIG, OCI_MANIFEST, ImageBuild, _json, digest_of

    blobs: dict[str, bytes] = {}
    descs, diff_ids = [], []
    for entries in layers:
        blob, ann, diff_id = estargz(entries, pax_names=pax_names)
        blobs[digest_of(blob)] = blob
        descs.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                      "digest": digest_of(blob), "size": len(blob), "annotations": ann})
        diff_ids.append(diff_id)
    cfg = _json({"architecture": "amd64", "os": "linux", "config": dict(config or {}),
                 "rootfs": {"type": "layers", "diff_ids": diff_ids}})
    blobs[digest_of(cfg)] = cfg
    manifest = _json({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                      "config": {"mediaType": OCI_CONFIG, "digest": digest_of(cfg),
                                 "size": len(cfg)}, "layers": descs})
    return ImageBuild(manifest=manifest, manifest_digest=digest_of(manifest),
                      media_type=OCI_MANIFEST, config=cfg, blobs=blobs,
                      layer_digests=tuple(d["digest"] for d in descs),
                      diff_ids=tuple(diff_ids), platform=("linux", "amd64"))


def app_entries(version: int, *, layers: int = 3, files: int = 40,
                size: int = 4096) -> list[list[Entry]]:
    """The entries of ``tests.support.chunked.app_layers``' image, per layer."""
    import io
    import tarfile

    from tests.support.chunked import app_layers

    out = []
    for t in app_layers(version, layers=layers, files=files, size=size):
        with tarfile.open(fileobj=io.BytesIO(t)) as tf:
            out.append([Entry(m.name.rstrip("/"), "dir" if m.isdir() else "file",
                              data=tf.extractfile(m).read() if m.isreg() else b"",  # type: ignore[union-attr]
                              mode=m.mode) for m in tf])
    return out
