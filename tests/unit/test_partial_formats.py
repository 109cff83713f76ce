"""The zstd:chunked TOC and tar-split parsers, on a layer skopeo wrote and on hostile ones."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import zstandard

from pycrid.images.layer_paths import clean_name
from pycrid.images.partial import chunked_toc, layout, tarsplit
from pycrid.images.partial.chunked_toc import CHECKSUM, POSITION, TARSPLIT_POSITION
from pycrid.images.partial.layout import FileData, Layout, Unusable
from tests.support.chunked import zstd_chunked
from tests.support.layers import Entry, tar_bytes

DATA = Path(__file__).resolve().parents[1] / "data" / "zstd-chunked"


def real_layer() -> tuple[bytes, dict[str, Any], str]:
    """A layer skopeo 1.22 wrote with ``--dest-compress-format zstd:chunked``."""
    meta = json.loads((DATA / "layer.json").read_text())
    return (DATA / "layer.tar.zst").read_bytes(), meta["descriptor"]["annotations"], \
        meta["diff_id"]


def parse(blob: bytes, ann: dict[str, str]) -> Layout:
    pos = chunked_toc.locate(ann, len(blob))
    start, end = pos.metadata_range()
    toc_json, split_z = chunked_toc.open_metadata(pos, blob[start:end])
    toc = chunked_toc.parse_toc(toc_json, pos)
    return tarsplit.layout(chunked_toc.inflate_tarsplit(pos, toc, split_z), toc)


def rebuild(blob: bytes, lay: Layout) -> bytes:
    out = bytearray()
    for p in lay.pieces:
        if isinstance(p, bytes):
            out += p
        else:
            data = zstandard.ZstdDecompressor().stream_reader(
                blob[p.start:p.end], read_across_frames=True).read()
            assert hashlib.sha256(data).hexdigest() == p.digest.split(":")[1]
            out += data
    return bytes(out)


def test_skopeo_layer_rebuilds_to_its_diff_id() -> None:
    blob, ann, diff_id = real_layer()
    lay = parse(blob, ann)
    tar = rebuild(blob, lay)
    assert len(tar) == lay.tar_size
    assert "sha256:" + hashlib.sha256(tar).hexdigest() == diff_id
    names = [f.name for f in lay.files()]
    # Files with contents only (the empty file, links and dirs live in the segments).
    assert names == ["etc/os-release", "usr/share/text.txt", "usr/share/copy.txt",
                     "usr/share/xattr", "usr/share/sparse-zeros", "usr/bin/tool"]
    text, copy = lay.files()[1:3]
    assert text.digest == copy.digest and text.start != copy.start


def small_tar() -> bytes:
    return tar_bytes([Entry("a", "dir"), Entry("a/one", data=b"1" * 5000),
                      Entry("a/two", data=b"2" * 7000), Entry("a/empty"),
                      Entry("a/link", "symlink", linkname="one")])


def test_python_writer_matches_the_format() -> None:
    tar = small_tar()
    blob, ann = zstd_chunked(tar)
    assert rebuild(blob, parse(blob, ann)) == tar
    # A plain zstd reader sees the tar (the metadata frames are skippable).
    assert zstandard.ZstdDecompressor().stream_reader(blob, read_across_frames=True).read() == tar


def with_ann(**changes: str | None) -> tuple[bytes, dict[str, str]]:
    blob, ann = zstd_chunked(small_tar())
    for k, v in changes.items():
        key = {"checksum": CHECKSUM, "position": POSITION, "tarsplit": TARSPLIT_POSITION,
               "estargz": chunked_toc.ESTARGZ_TOC_DIGEST}[k]
        if v is None:
            ann.pop(key, None)
        else:
            ann[key] = v
    return blob, ann


@pytest.mark.parametrize(("changes", "why"), [
    ({"checksum": None}, "not a sha256"),
    ({"checksum": "md5:abc"}, "not a sha256"),
    ({"checksum": "sha256:" + "0" * 64}, "does not match the manifest's checksum"),
    ({"position": "1:2:3"}, "malformed"),
    ({"position": "x:2:3:1"}, "malformed"),
    ({"position": "8:99999999:3:1"}, "outside"),
    ({"position": "0:10:3:1"}, "outside"),
    ({"tarsplit": None}, "no tar-split"),
    ({"tarsplit": "1:2"}, "malformed"),
    ({"estargz": "sha256:" + "1" * 64}, "both"),
])
def test_bad_annotations_are_unusable(changes: dict[str, str | None], why: str) -> None:
    blob, ann = with_ann(**changes)
    with pytest.raises(Unusable, match=why):
        parse(blob, ann)


def test_toc_type_and_sizes_are_checked() -> None:
    blob, ann = zstd_chunked(small_tar())
    off, length, size, _ = ann[POSITION].split(":")
    with pytest.raises(Unusable, match="unknown TOC type"):
        parse(blob, {**ann, POSITION: f"{off}:{length}:{size}:2"})
    with pytest.raises(Unusable, match="declared"):
        parse(blob, {**ann, POSITION: f"{off}:{length}:{int(size) - 1}:1"})
    with pytest.raises(Unusable, match="too large"):
        parse(blob, {**ann, POSITION: f"{off}:{length}:{1 << 40}:1"})


def lying(toc_hook: Any = None, tarsplit_hook: Any = None, tar: bytes | None = None) -> None:
    blob, ann = zstd_chunked(tar or small_tar(), toc_hook=toc_hook, tarsplit_hook=tarsplit_hook)
    parse(blob, ann)


def reg(toc: dict[str, Any], name: str = "a/one") -> dict[str, Any]:
    return next(e for e in toc["entries"] if e["name"] == name)


@pytest.mark.parametrize(("hook", "why"), [
    (lambda t: t.update(version=2), "version 1"),
    (lambda t: t.update(entries={}), "entries"),
    (lambda t: t.pop("tarSplitDigest"), "tar-split digest"),
    (lambda t: t.update(tarSplitDigest="sha256:" + "0" * 64), "tarSplitDigest"),
    (lambda t: t["entries"].append(7), "not an object"),
    (lambda t: t["entries"].append({"type": "socket", "name": "s"}), "type"),
    (lambda t: reg(t).update(name="../../etc/passwd"), "climbs out"),
    (lambda t: reg(t).update(name="/etc/passwd"), "absolute"),
    (lambda t: reg(t).update(name="a/\0x"), "NUL"),
    (lambda t: reg(t).update(name=5), "named"),
    (lambda t: reg(t).update(size=-1), "not a count"),
    (lambda t: reg(t).update(size=1.5), "not a count"),
    (lambda t: reg(t).update(offset=True), "not a count"),
    (lambda t: reg(t).pop("digest"), "no sha256 digest"),
    (lambda t: reg(t).update(digest="sha256:XYZ"), "no sha256 digest"),
    (lambda t: reg(t).update(endOffset=1 << 40), "outside"),
    (lambda t: reg(t).update(offset=0), "outside"),
    (lambda t: reg(t).update(endOffset=reg(t)["offset"]), "outside"),
    (lambda t: t["entries"].append(dict(reg(t))), "twice"),
    (lambda t: reg(t, "a/two").update(offset=reg(t)["offset"]), "overlaps"),
    (lambda t: reg(t).update(size=4999), "4999 in the TOC"),
    (lambda t: t["entries"].append({**reg(t), "name": "a/ghost"}), "overlaps|does not"),
])
def test_hostile_tocs_are_unusable(hook: Any, why: str) -> None:
    with pytest.raises(Unusable, match=why):
        lying(toc_hook=hook)


def test_a_toc_file_the_tar_split_lacks_is_unusable() -> None:
    def ghost(t: dict[str, Any]) -> None:
        last = max(e.get("endOffset", 0) for e in t["entries"])
        t["entries"].append({"type": "reg", "name": "a/ghost", "size": 1, "offset": last,
                             "endOffset": last + 1, "digest": "sha256:" + "a" * 64})
    with pytest.raises(Unusable, match="the tar-split does not"):
        lying(toc_hook=ghost)


def test_too_many_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunked_toc, "MAX_ENTRIES", 3)
    with pytest.raises(Unusable, match="too many"):
        lying()


def split_file(s: list[dict[str, Any]], name: str = "a/one") -> dict[str, Any]:
    return next(e for e in s if e.get("name") == name)


@pytest.mark.parametrize(("hook", "why"), [
    (lambda s: s.append({"type": 3}), "unknown type"),
    (lambda s: s.append("x"), "unknown type"),
    (lambda s: split_file(s).update(size=1), "1 bytes in the tar-split"),
    (lambda s: split_file(s).update(name="a/other"), "no TOC entry"),
    (lambda s: split_file(s).update(name="../x"), "climbs out"),
    (lambda s: s.append(dict(split_file(s))), "twice"),
    (lambda s: split_file(s).update(name_raw="YQ=="), "not UTF-8"),
    (lambda s: split_file(s).update(size="5000"), "malformed"),
    (lambda s: s[0].update(payload="%%%"), "base64"),
    (lambda s: s[0].update(payload=5), "base64"),
    (lambda s: s.reverse(), "overlaps or precedes"),
])
def test_hostile_tar_splits_are_unusable(hook: Any, why: str) -> None:
    with pytest.raises(Unusable, match=why):
        lying(tarsplit_hook=hook)


def test_tar_split_that_is_not_json() -> None:
    toc = chunked_toc.Toc({}, "sha256:" + "0" * 64, 100)
    with pytest.raises(Unusable, match="not JSON"):
        tarsplit.layout(b'{"type": 2, "payload": ""}\n{garbage', toc)


def test_names() -> None:
    assert clean_name("./a//b/") == "a/b"  # how TOC names are written to the index
    assert layout.check_name("a/./b", "x") == "a/./b"
    for bad in ("", "..", "a/../b", "/a"):
        with pytest.raises(Unusable):
            layout.check_name(bad, "x")
    f = FileData("a", 1, "sha256:" + "0" * 64, 1, 2)
    assert Layout((b"x", f), 2).files() == [f]
