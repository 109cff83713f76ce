"""A zstd:chunked layer rebuilt from files on this node and fetched ranges, applied by the
ordinary unpacker: the same tree and diff id as a whole download, files shared only when
asked and safe, and nothing unverified accepted."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import random
import stat
from pathlib import Path
from typing import Any

import pytest

from pycrid.errors import DataLoss
from pycrid.images.partial import chunked_toc, tarsplit
from pycrid.images.partial.file_index import FileIndex
from pycrid.images.partial.layout import Layout
from pycrid.images.partial.materialize import Job, Materialized, materialize
from pycrid.images.partial.plan import Plan, make_plan
from pycrid.images.partial.reassemble import Dirs, LocalMismatch, Ranges
from pycrid.images.unpack import extract
from pycrid.store.db import Database
from tests.support.chunked import zstd_chunked
from tests.support.layers import Entry, tar_bytes

A = b"file a, the same in both\n" * 400
C = b"file c: same bytes, other mode\n" * 300
D = random.Random(3).randbytes(30000)


def v1_tar() -> bytes:
    return tar_bytes([Entry("etc", "dir"), Entry("etc/a", data=A),
                      Entry("etc/b", data=b"b of v1\n" * 100), Entry("etc/c", data=C)])


def v2_tar() -> bytes:
    return tar_bytes([
        Entry("etc", "dir"), Entry("etc/a", data=A), Entry("etc/b", data=b"b of v2\n" * 99),
        Entry("etc/c", data=C, mode=0o600), Entry("etc/d", data=D),
        Entry("etc/again", data=A), Entry("etc/empty"), Entry("etc/sym", "symlink", linkname="a"),
        Entry("etc/hard", "hardlink", linkname="etc/a"), Entry("etc/.wh.gone"),
        Entry("usr/x", data=b"xattr\n", pax={"SCHILY.xattr.user.k": "v"}),
    ])


V2_DIFF_ID = "sha256:" + hashlib.sha256(v2_tar()).hexdigest()


def parse(blob: bytes, ann: dict[str, str]) -> Layout:
    pos = chunked_toc.locate(ann, len(blob))
    start, end = pos.metadata_range()
    toc_json, split_z = chunked_toc.open_metadata(pos, blob[start:end])
    toc = chunked_toc.parse_toc(toc_json, pos)
    return tarsplit.layout(chunked_toc.inflate_tarsplit(pos, toc, split_z), toc)


def fed(blob: bytes, ranges: list[tuple[int, int]], seed: int = 0) -> Ranges:
    """The ranges' bytes in random pieces, as the loop would hand them over."""
    data = b"".join(blob[s:e] for s, e in ranges)
    rnd, pos, pieces = random.Random(seed), 0, []
    while pos < len(data):
        n = rnd.randint(1, 9000)
        pieces.append(data[pos:pos + n])
        pos += n
    it = iter(pieces)
    return Ranges(lambda: next(it, b""), ranges)


def tree(root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            st = p.lstat()
            rel = str(p.relative_to(root))
            desc: dict[str, Any] = {"mode": st.st_mode, "uid": st.st_uid, "gid": st.st_gid,
                                    "xattrs": {k: os.getxattr(p, k, follow_symlinks=False)
                                               for k in os.listxattr(p, follow_symlinks=False)}}
            if stat.S_ISREG(st.st_mode):
                desc.update(data=p.read_bytes(), mtime=st.st_mtime_ns)
            elif stat.S_ISLNK(st.st_mode):
                desc["link"] = os.readlink(p)
            elif stat.S_ISCHR(st.st_mode):
                desc["rdev"] = st.st_rdev
            out[rel] = desc
    return out


class Node:
    """A node with v1's layer unpacked and indexed."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.index = FileIndex(Database(str(tmp / "db" / "meta.db")))
        self.v1 = tmp / "v1"
        self.v1.mkdir()
        blob, ann = zstd_chunked(v1_tar())
        extract(io.BufferedReader(io.BytesIO(blob)), str(self.v1), name="v1", has_lower=False,
                allow_device_nodes=False)
        self.index.add("L1", [(f.digest, f.name, f.size) for f in parse(blob, ann).files()])
        self.blob, self.ann = zstd_chunked(v2_tar())
        self.lay = parse(self.blob, self.ann)
        self.dirs = {"L1": str(self.v1)}

    def plan(self) -> Plan:
        return make_plan(self.lay, self.index, self.dirs.get)

    def apply(self, plan: Plan, *, hard_links: bool, name: str = "new",
              blob: bytes | None = None) -> tuple[Path, Materialized]:
        root = self.tmp / name
        root.mkdir()
        job = Job(self.lay, plan, str(root), "v2", has_lower=True, allow_device_nodes=False,
                  hard_links=hard_links, diff_id=V2_DIFF_ID)
        return root, materialize(job, fed(blob or self.blob, plan.ranges))

    def whole(self) -> Path:
        root = self.tmp / "whole"
        root.mkdir()
        extract(io.BufferedReader(io.BytesIO(self.blob)), str(root), name="v2",
                has_lower=True, allow_device_nodes=False)
        return root


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def test_plan_takes_what_the_node_has(node: Node) -> None:
    plan = node.plan()
    local = {node.lay.pieces[i].name: src.path for i, src in plan.local.items()}  # type: ignore[union-attr]
    assert local == {"etc/a": "etc/a", "etc/c": "etc/c", "etc/again": "etc/a"}
    assert plan.reused == 2 * len(A) + len(C)
    fetched = {f.name for f in node.lay.files() if (f.start, f.end) in
               [r for r in plan.ranges] or any(s <= f.start and f.end <= e
                                                for s, e in plan.ranges)}
    assert {"etc/b", "etc/d", "usr/x"} <= fetched and "etc/a" not in fetched
    assert plan.fetch_bytes < len(node.blob)


@pytest.mark.parametrize("hard_links", [False, True])
def test_same_tree_and_diff_id_as_a_whole_download(node: Node, hard_links: bool) -> None:
    root, got = node.apply(node.plan(), hard_links=hard_links)
    assert got.extracted.diff_id == V2_DIFF_ID
    assert tree(root) == tree(node.whole())
    assert got.reused == 2 * len(A) + len(C)
    a, v1a = (root / "etc/a").stat(), (node.v1 / "etc/a").stat()
    if hard_links:
        # a and again share v1's file; c differs in mode, so it is a copy.
        assert a.st_ino == v1a.st_ino == (root / "etc/again").stat().st_ino
        assert (root / "etc/c").stat().st_ino != (node.v1 / "etc/c").stat().st_ino
        assert got.linked == 2
    else:
        assert a.st_ino != v1a.st_ino and v1a.st_nlink == 1 and got.linked == 0
    landed = {path: digest for digest, path, _ in got.landed}
    assert landed["etc/d"] == next(f.digest for f in node.lay.files() if f.name == "etc/d")
    assert "etc/empty" not in landed


def test_nothing_local_is_a_plain_rebuild(node: Node) -> None:
    root, got = node.apply(Plan(ranges=[(f.start, f.end) for f in node.lay.files()]),
                           hard_links=True)
    assert tree(root) == tree(node.whole()) and got.reused == 0 and got.linked == 0


@pytest.mark.parametrize(("name", "hard_links"), [("etc/c", False), ("etc/a", True),
                                                  ("etc/a", False)])
def test_a_changed_local_file_is_refused(node: Node, name: str, hard_links: bool) -> None:
    # Files of this node are checked by the diff id only; when that comes out wrong they
    # are hashed one by one, and the one that changed is named (its row is then dropped).
    # etc/a is linked when hard links are on; etc/c (another mode in v2) is always copied.
    plan = node.plan()
    data = bytearray((node.v1 / name).read_bytes())
    data[10] ^= 1
    (node.v1 / name).write_bytes(data)
    with pytest.raises(LocalMismatch, match="hashes to") as e:
        node.apply(plan, hard_links=hard_links)
    assert e.value.source.path == name


def test_a_vanished_local_file_is_refused(node: Node) -> None:
    plan = node.plan()
    (node.v1 / "etc/c").unlink()
    with pytest.raises(LocalMismatch, match="cannot be opened"):
        node.apply(plan, hard_links=False)


def test_tampered_fetched_bytes_are_refused(node: Node) -> None:
    plan = node.plan()
    d = next(f for f in node.lay.files() if f.name == "etc/d")
    bad = bytearray(node.blob)
    bad[(d.start + d.end) // 2] ^= 0xFF
    with pytest.raises(DataLoss, match="etc/d"):
        node.apply(plan, hard_links=False, blob=bytes(bad))


def test_short_answer_is_refused(node: Node) -> None:
    plan = node.plan()
    root = node.tmp / "short"
    root.mkdir()
    it = iter([node.blob[plan.ranges[0][0]:plan.ranges[0][0] + 10]])
    job = Job(node.lay, plan, str(root), "v2", has_lower=True, allow_device_nodes=False,
              hard_links=False, diff_id=V2_DIFF_ID)
    with pytest.raises(DataLoss, match="ended before"):
        materialize(job, Ranges(lambda: next(it, b""), plan.ranges))


def test_rows_of_gone_layers_are_not_used_and_symlinks_never_followed(node: Node) -> None:
    # The plan takes rows of committed snapshots as the index has them (their files never
    # change); the rebuild opens each through no symlink. A row naming a file through a
    # symlink of its layer (which could point anywhere on the host) is refused when the
    # layer is rebuilt, before anything is read from it (the puller then drops the row and
    # pulls the layer whole).
    (node.tmp / "elsewhere").mkdir()
    (node.tmp / "elsewhere" / "a").write_bytes(A)
    os.symlink(str(node.tmp / "elsewhere"), node.v1 / "esc")
    digest_a = next(f.digest for f in node.lay.files() if f.name == "etc/a")
    node.index.forget("L1", "etc/a")
    node.index.forget("L1", "etc/again")
    node.index.add("L2", [(digest_a, "esc/a", len(A))])
    node.dirs["L2"] = str(node.v1)
    node.index.add("L0", [(digest_a, "etc/a", len(A))])  # a layer no longer committed
    plan = node.plan()
    used = {(s.layer, s.path) for s in plan.local.values()}
    assert ("L0", "etc/a") not in used and ("L2", "esc/a") in used
    with pytest.raises(LocalMismatch, match="cannot be opened") as e:
        node.apply(plan, hard_links=True)
    assert (e.value.source.layer, e.value.source.path) == ("L2", "esc/a")


def test_index_rows_follow_layers(tmp_path: Path) -> None:
    index = FileIndex(Database(str(tmp_path / "meta.db")))
    assert index.is_empty()
    d = "sha256:" + "1" * 64
    index.add("L1", [(d, "a", 1), (d, "b", 1)])
    index.add("L2", [(d, "c", 1)])
    assert [f.path for f in index.lookup([d])[d]] == ["a", "b", "c"]
    index.add("L1", [(d, "z", 1)])  # a layer indexed again replaces its rows
    assert [f.path for f in index.lookup([d])[d]] == ["z", "c"]
    assert index.retain({"L2"}) == 1 and index.layers() == {"L2"}
    # Survives a restart: a new Database on the same file.
    again = FileIndex(Database(str(tmp_path / "meta.db")))
    assert [f.path for f in again.lookup([d])[d]] == ["c"]



def test_files_of_this_node_are_opened_through_no_symlink(tmp_path: Path) -> None:
    # Each directory is opened once (through no symlink) and kept; a name in it is opened
    # O_NOFOLLOW. A symlink anywhere on the way is refused, however many directories are
    # kept open.
    root = tmp_path / "layer"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f").write_bytes(b"x")
    (root / "e").mkdir()
    (root / "e" / "g").write_bytes(b"z")
    (tmp_path / "outside").write_bytes(b"host file")
    os.symlink("f", root / "d" / "link")
    os.symlink("d", root / "dl")
    os.symlink(str(tmp_path / "outside"), root / "abs")
    dirs = Dirs()
    dirs.KEEP = 1  # every other directory closes the one before
    try:
        for path, want in [("d/f", b"x"), ("e/g", b"z"), ("d/f", b"x"), ("./e//g", b"z")]:
            fd = dirs.open(str(root), path)
            try:
                assert os.read(fd, 100) == want
            finally:
                os.close(fd)
        for bad in ("d/link", "dl/f", "abs"):
            with pytest.raises(OSError) as e:
                os.close(dirs.open(str(root), bad))
            assert e.value.errno == errno.ELOOP, bad
        with pytest.raises(FileNotFoundError):
            dirs.open(str(root), "d/missing")
    finally:
        dirs.close()
