"""eStargz: the footer and TOC parsers on layers the real producer wrote and on hostile
ones; the tar headers written again as Go writes them; the test writer checked against
the producer and the spec."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from pycrid.images.partial import estargz_toc, gotar
from pycrid.images.partial.layout import FileData, Layout, Unusable
from tests.support.estargz import TOC_DIGEST, check_spec, estargz
from tests.support.layers import Entry

DATA = Path(__file__).resolve().parents[1] / "data" / "estargz"


def fixture_entries() -> list[Entry]:
    """The input of the Go-made layers in tests/data/estargz (deterministic)."""
    text = b"".join(b"line %d\n" % i for i in range(800))
    return [
        Entry("etc", "dir"), Entry("etc/os-release", data=b"NAME=fixture\n"),
        Entry("etc/empty"), Entry("etc/motd", "symlink", linkname="os-release"),
        Entry("etc/hard", "hardlink", linkname="etc/os-release"),
        Entry("usr", "dir"), Entry("usr/share", "dir"),
        Entry("usr/share/" + "long-directory-name-" * 4 + "/" + "file-" * 12 + ".txt",
              data=text),
        Entry("usr/share/" + "x" * 120, data=b"unsplittable\n"),
        Entry("usr/share/xattr", data=b"x", pax={"SCHILY.xattr.user.note": "hi"}),
        Entry("usr/share/été", data=b"utf-8 name\n"),
        Entry("usr/share/big-uid", data=b"owner\n", uid=3_000_000, gid=7),
        Entry("usr/share/link-" + "t" * 90, "symlink", linkname="../" + "t" * 120),
        Entry("usr/bin", "dir"), Entry("usr/bin/tool", data=bytes(range(256)) * 40, mode=0o755),
    ]


def meta() -> dict[str, Any]:
    return dict(json.loads((DATA / "layers.json").read_text()))


def open_layer(blob: bytes, digest: str, *, pax_names: bool | None = None) -> Layout:
    off = estargz_toc.footer_offset(blob[-estargz_toc.FOOTER:], len(blob))
    js, toc_tar = estargz_toc.toc_json(blob[off:-estargz_toc.FOOTER], digest)
    entries = estargz_toc.parse(js, off)
    if pax_names is None:  # as the puller does: the probe's real bytes decide
        s = estargz_toc.styles(entries, off, toc_tar)
        return estargz_toc.choose(s, blob[s.probe[0]:s.probe[1]])
    return estargz_toc.layout(entries, off, toc_tar, pax_names=pax_names)[0]


def rebuild(blob: bytes, lay: Layout) -> bytes:
    out = bytearray()
    for p in lay.pieces:
        if isinstance(p, bytes):
            out += p
        else:
            data = gzip.decompress(blob[p.start:p.end])
            assert hashlib.sha256(data[:p.size]).hexdigest() == p.digest[7:]
            assert data[p.size:] == p.tail, p.name  # the headers we wrote again
            out += data[:p.size]
    return bytes(out)


@pytest.mark.parametrize("style", ["python", "docker"])
def test_go_made_layers_rebuild_to_their_diff_ids(style: str) -> None:
    blob, m = (DATA / f"{style}.tar.gz").read_bytes(), meta()[style]
    check_spec(blob, m["toc_digest"])
    lay = open_layer(blob, m["toc_digest"])
    tar = rebuild(blob, lay)
    assert tar == gzip.decompress(blob)
    assert "sha256:" + hashlib.sha256(tar).hexdigest() == m["diff_id"]
    names = [f.name for f in lay.files()]
    assert names[0] == ".no.prefetch.landmark" and "usr/bin/tool" in names


@pytest.mark.parametrize(("style", "pax_names"), [("python", True), ("docker", False)])
def test_test_writer_writes_the_producers_tar(style: str, pax_names: bool) -> None:
    """Same input, same tar up to the TOC (so Go's headers) as the real producer; the TOC
    itself holds blob offsets, which differ with the compressor."""
    blob, ann, _ = estargz(fixture_entries(), pax_names=pax_names)
    go = (DATA / f"{style}.tar.gz").read_bytes()

    def entries_part(b: bytes) -> bytes:
        return gzip.decompress(b[:estargz_toc.footer_offset(b[-51:], len(b))])

    assert entries_part(blob) == entries_part(go)
    toc = check_spec(blob, ann[TOC_DIGEST])
    go_toc = check_spec((DATA / f"{style}.tar.gz").read_bytes(), meta()[style]["toc_digest"])
    strip = {"offset", "chunkSize", "chunkOffset", "chunkDigest"}
    assert [{k: v for k, v in e.items() if k not in strip} for e in toc["entries"]] == \
        [{k: v for k, v in e.items() if k not in strip} for e in go_toc["entries"]]


def test_writer_chunks_large_files() -> None:
    data = bytes(range(256)) * 5000
    blob, ann, diff_id = estargz([Entry("big", data=data), Entry("small", data=b"s")],
                                 chunk=100_000)
    toc = check_spec(blob, ann[TOC_DIGEST])
    assert sum(1 for e in toc["entries"] if e["type"] == "chunk") == 12
    lay = open_layer(blob, ann[TOC_DIGEST], pax_names=False)
    assert "sha256:" + hashlib.sha256(rebuild(blob, lay)).hexdigest() == diff_id


def test_header_round_trips_through_tarfile() -> None:
    import io
    import tarfile
    e = gotar.Entry(name="a/" + "b" * 150, kind="reg", mode=0o640, uid=5, gid=6, size=3,
                    mtime=1_700_000_000, uname="u", gname="g",
                    xattrs={"user.x": b"1"})
    raw = gotar.header(e) + b"abc" + gotar.padding(3) + bytes(1024)
    with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
        (m,) = tf.getmembers()
    assert (m.name, m.mode, m.uid, m.gid, m.size, m.mtime, m.uname, m.gname) == \
        (e.name, 0o640, 5, 6, 3, 1_700_000_000, "u", "g")
    assert m.pax_headers["SCHILY.xattr.user.x"] == "1"


def small() -> list[Entry]:
    return [Entry("d", "dir"), Entry("d/a", data=b"a" * 3000), Entry("d/b", data=b"b" * 5)]


def parse(blob: bytes, ann: dict[str, str]) -> Layout:
    return open_layer(blob, ann[TOC_DIGEST], pax_names=False)


def test_footer_and_toc_member_are_checked() -> None:
    blob, ann, _ = estargz(small())
    with pytest.raises(Unusable, match="footer"):
        parse(blob[:-1] + b"\x01", ann)
    bad = bytearray(blob)
    bad[-35:-19] = b"ffffffffffffffff"
    with pytest.raises(Unusable, match="outside"):
        parse(bytes(bad), ann)
    bad = bytearray(blob)
    bad[-35:-19] = b"zzzzzzzzzzzzzzzz"
    with pytest.raises(Unusable, match="malformed"):
        parse(bytes(bad), ann)
    with pytest.raises(Unusable, match=r"toc\.digest"):
        parse(blob, {TOC_DIGEST: "sha256:" + "0" * 64})
    off = estargz_toc.footer_offset(blob[-51:], len(blob))
    with pytest.raises(Unusable, match="does not decompress"):
        estargz_toc.toc_json(b"\x1f\x8b\x08\x00" + bytes(6) + b"\xff" * 40, ann[TOC_DIGEST])
    with pytest.raises(Unusable, match="one whole gzip member"):
        estargz_toc.toc_json(blob[off:-51] + b"x", ann[TOC_DIGEST])
    with pytest.raises(Unusable, match="does not hold"):
        estargz_toc.toc_json(gzip.compress(b"other\0" + bytes(600)), ann[TOC_DIGEST])


def reg(doc: dict[str, Any], name: str = "d/a") -> dict[str, Any]:
    return next(e for e in doc["entries"] if e["name"] == name)


@pytest.mark.parametrize(("hook", "why"), [
    (lambda t: t.update(version=2), "version 1"),
    (lambda t: t.update(entries=7), "version 1"),
    (lambda t: t["entries"].append(3), "not an object"),
    (lambda t: t["entries"].append({"type": "socket", "name": "s"}), "type"),
    (lambda t: reg(t).update(name="../../etc/passwd"), "climbs out"),
    (lambda t: reg(t).update(name="/etc/passwd"), "absolute"),
    (lambda t: reg(t).update(size=-3), "not a count"),
    (lambda t: reg(t).update(uid="0"), "not a count"),
    (lambda t: reg(t).pop("digest"), "no sha256 digest"),
    (lambda t: reg(t).update(offset=1 << 40), "lies"),
    (lambda t: reg(t, "d/b").update(offset=reg(t)["offset"]), "before the previous"),
    (lambda t: reg(t).update(innerOffset=5), "innerOffset"),
    (lambda t: reg(t).update(modtime="yesterday"), "RFC 3339"),
    (lambda t: reg(t).update(userName=5), "not text"),
    (lambda t: reg(t).update(xattrs={"user.k": "%%%"}), "base64"),
    (lambda t: reg(t).update(xattrs=[1]), "not an object"),
    (lambda t: t["entries"].append({"type": "reg", "name": "stargz.index.json"}),
     "lists stargz.index.json"),
    (lambda t: t["entries"].insert(0, {"type": "chunk", "name": "x", "offset": 9}),
     "does not follow"),
])
def test_hostile_tocs_are_unusable(hook: Any, why: str) -> None:
    blob, ann, _ = estargz(small(), toc_hook=hook)
    with pytest.raises(Unusable, match=why):
        parse(blob, ann)


def test_too_many_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(estargz_toc, "MAX_ENTRIES", 2)
    blob, ann, _ = estargz(small())
    with pytest.raises(Unusable, match="too many"):
        parse(blob, ann)


def test_user_names_carry_over_to_later_entries() -> None:
    """The producer records a user name only where it changes for the uid."""
    doc = {"version": 1, "entries": [
        {"name": "a", "type": "dir", "uid": 5, "userName": "app", "mode": 0o755},
        {"name": "a/b", "type": "dir", "uid": 5, "mode": 0o755}]}
    entries = estargz_toc.parse(json.dumps(doc).encode(), 100)
    assert [e.header.uname for e in entries] == ["app", "app"]


def test_layout_pieces() -> None:
    blob, ann, _ = estargz(small())
    lay = parse(blob, ann)
    kinds = ["bytes" if isinstance(p, bytes) else "file" for p in lay.pieces]
    # head, landmark, tail, a, tail, b, tail, the TOC member
    assert kinds == ["bytes", "file", "bytes", "file", "bytes", "file", "bytes", "bytes"]
    files = lay.files()
    assert all(isinstance(f, FileData) and f.codec == "gzip" for f in files)
    assert files[-1].end == estargz_toc.footer_offset(blob[-51:], len(blob))
    assert lay.tar_size == len(gzip.decompress(blob))


def test_rebuilt_from_this_node_and_fetched_members(tmp_path: Path) -> None:
    """v2 of an eStargz layer, rebuilt from v1's files on this node and the members of
    what changed: the same tree and diff id as a whole download."""
    import io

    from pycrid.images.partial.file_index import FileIndex
    from pycrid.images.partial.formats import Estargz
    from pycrid.images.partial.materialize import Job, materialize
    from pycrid.images.partial.plan import make_plan
    from pycrid.images.unpack import extract
    from pycrid.store.db import Database
    from tests.unit.test_partial_materialize import fed, tree

    def layer(version: int) -> list[Entry]:
        return [Entry("app", "dir"), *(Entry(
            f"app/{'long-directory-name-' * 3}/{i:03d}-{'x' * 90}" if i % 7 == 0 else
            f"app/f{i:03d}", data=(b"v%d " % (version if i % 10 == 3 else 1)) * (50 + i * 13))
            for i in range(60))]

    def unpack(blob: bytes, where: Path) -> str:
        where.mkdir()
        return extract(io.BufferedReader(io.BytesIO(blob)), str(where), name="x",
                       has_lower=False, allow_device_nodes=False).diff_id

    for pax_names in (False, True):
        base = tmp_path / str(pax_names)
        base.mkdir()
        b1, a1, _ = estargz(layer(1), pax_names=pax_names)
        b2, a2, d2 = estargz(layer(2), pax_names=pax_names)
        unpack(b1, base / "v1")
        (base / "b1").write_bytes(b1)
        index = FileIndex(Database(str(base / "meta.db")))
        index.add("L1", Estargz(a1[TOC_DIGEST], len(b1)).rows(str(base / "b1")))
        lay = open_layer(b2, a2[TOC_DIGEST])
        plan = make_plan(lay, index, {"L1": str(base / "v1")}.get)
        assert 45 <= len(plan.local) < 61  # every 10th file changed; the landmark is here
        (base / "v2").mkdir()
        got = materialize(Job(lay, plan, str(base / "v2"), "v2", False, False, True, d2),
                          fed(b2, plan.ranges))
        assert got.extracted.diff_id == d2 == unpack(b2, base / "whole")
        assert tree(base / "v2") == tree(base / "whole")
        assert got.linked == len(plan.local)


def test_headers_that_differ_from_the_toc_are_refused(tmp_path: Path) -> None:
    """A producer whose headers are not Go's (here: Python's tarfile in PAX format): the
    probe says so before anything is fetched."""
    from tests.support.layers import tar_bytes

    entries = [Entry("d", "dir"), Entry("d/a", data=b"a" * 700, uid=1000, gid=1000)]
    blob, ann, _ = estargz(entries)
    # The same blob with Python's headers instead: rewrite the first member.
    off = estargz_toc.footer_offset(blob[-51:], len(blob))
    js, toc_tar = estargz_toc.toc_json(blob[off:-51], ann[TOC_DIGEST])
    s = estargz_toc.styles(estargz_toc.parse(js, off), off, toc_tar)
    python_head = tar_bytes([Entry(".no.prefetch.landmark", data=b"\x0f", mode=0)])[:512]
    with pytest.raises(Unusable, match="not the ones its TOC implies"):
        estargz_toc.choose(s, gzip.compress(python_head))
