"""The overlayfs snapshotter against real directories and real mounts (root, no mocks)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from pycrid.errors import AlreadyExists, FailedPrecondition, NotFound
from pycrid.host import mounts as mnt
from pycrid.images.overlay import OverlaySnapshotter
from pycrid.images.snapshots import Kind, Mount
from pycrid.store.db import Database

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts need root")


@pytest.fixture
def sn(tmp_path: Path) -> Iterator[OverlaySnapshotter]:
    s = OverlaySnapshotter(str(tmp_path / "sn"), Database(str(tmp_path / "meta.db")))
    yield s
    for mp in mnt.mounts_under(str(tmp_path)):
        mnt.unmount(mp, detach=True)


def fs_of(sn: OverlaySnapshotter, key: str) -> Path:
    return Path(sn.upper_dir(key))


def committed(sn: OverlaySnapshotter, name: str, parent: str | None,
              files: dict[str, bytes]) -> None:
    sn.prepare(f"tmp-{name}", parent)
    for rel, data in files.items():
        (fs_of(sn, f"tmp-{name}") / rel).write_bytes(data)
    sn.commit(name, f"tmp-{name}")


def test_prepare_commit_and_mount_shapes(sn: OverlaySnapshotter) -> None:
    [m] = sn.prepare("a-active", None, {"x": "y"})
    assert m == Mount("bind", str(fs_of(sn, "a-active")), ("rbind", "rw"))
    info = sn.stat("a-active")
    assert (info.kind, info.parent, info.labels) == (Kind.ACTIVE, None, {"x": "y"})
    sn.commit("a", "a-active")
    with pytest.raises(NotFound):
        sn.stat("a-active")
    assert sn.stat("a").kind is Kind.COMMITTED
    assert sn.stat("a").labels == {"x": "y"}  # kept when commit passes none
    assert not (fs_of(sn, "a").parent / "work").exists()
    committed(sn, "b", "a", {})
    [m] = sn.prepare("c", "b")
    assert m.type == "overlay"
    assert m.options[-3:] == (
        f"lowerdir={fs_of(sn, 'b')}:{fs_of(sn, 'a')}",  # newest parent first
        f"upperdir={fs_of(sn, 'c')}", f"workdir={fs_of(sn, 'c').parent / 'work'}")
    assert sn.view("v1", "a") == [Mount("bind", str(fs_of(sn, "a")), ("rbind", "ro"))]
    [v2] = sn.view("v2", "b")
    assert v2.type == "overlay"
    assert not any(o.startswith(("upperdir", "workdir")) for o in v2.options)
    assert sn.mounts("v2") == [v2]
    assert [i.key for i in sn.walk()] == ["a", "b", "c", "v1", "v2"]


def test_errors(sn: OverlaySnapshotter) -> None:
    sn.prepare("act", None)
    with pytest.raises(AlreadyExists):
        sn.prepare("act", None)
    with pytest.raises(NotFound):
        sn.prepare("x", "missing")
    with pytest.raises(FailedPrecondition):
        sn.prepare("x", "act")  # parent not committed
    with pytest.raises(NotFound):
        sn.stat("missing")
    with pytest.raises(NotFound):
        sn.remove("missing")
    committed(sn, "base", None, {})
    with pytest.raises(AlreadyExists):
        sn.commit("base", "act")
    assert sn.stat("act").kind is Kind.ACTIVE  # a failed commit changes nothing
    sn.view("view", "base")
    with pytest.raises(FailedPrecondition):
        sn.commit("v", "view")
    with pytest.raises(FailedPrecondition):
        sn.remove("base")  # has a child
    sn.remove("view")
    sn.remove("base")
    assert [i.key for i in sn.walk()] == ["act"]
    assert os.listdir(Path(sn.root, "snapshots")) == [fs_of(sn, "act").parent.name]


def test_overlay_mount_merges_and_records_changes(sn: OverlaySnapshotter, tmp_path: Path) -> None:
    committed(sn, "l1", None, {"a": b"1", "b": b"1"})
    committed(sn, "l2", "l1", {"b": b"2"})
    [m] = sn.prepare("rw", "l2")
    target = tmp_path / "target"
    target.mkdir()
    mnt.mount(m, str(target))
    try:
        assert mnt.mounts_under(str(tmp_path)) == [str(target)]
        assert {p.name: p.read_bytes() for p in target.iterdir()} == {"a": b"1", "b": b"2"}
        (target / "c").write_bytes(b"3")
        (target / "a").unlink()
    finally:
        mnt.unmount(str(target))
    assert mnt.mounts_under(str(tmp_path)) == []
    upper = fs_of(sn, "rw")
    assert (upper / "c").read_bytes() == b"3"
    assert os.stat(upper / "a", follow_symlinks=False).st_rdev == 0  # an overlay whiteout
    assert (fs_of(sn, "l1") / "a").read_bytes() == b"1"  # the lower layer is untouched


def test_usage_counts_blocks_inodes_and_hardlinks_once(sn: OverlaySnapshotter) -> None:
    sn.prepare("u", None)
    fs = fs_of(sn, "u")
    (fs / "d").mkdir()
    (fs / "d" / "f").write_bytes(b"x" * 100_000)
    os.link(fs / "d" / "f", fs / "hard")
    u = sn.usage("u")
    assert u.inodes == 2  # d and f; the hard link is the same inode
    assert 100_000 <= u.size < 200_000
    total = sn.fs_usage()
    assert total.size >= u.size and total.inodes > u.inodes


def test_deep_stacks_mount(sn: OverlaySnapshotter, tmp_path: Path) -> None:
    """130 layers: more lowerdirs than fit in mount(2)'s one page of options."""
    parent = None
    for i in range(130):
        committed(sn, f"l{i}", parent, {f"f{i}": str(i).encode()})
        parent = f"l{i}"
    sn.view("top", parent)
    [m] = sn.mounts("top")
    assert len(",".join(m.options)) > 4096
    target = tmp_path / "deep"
    target.mkdir()
    mnt.mount(m, str(target))
    try:
        assert len(os.listdir(target)) == 130
        assert (target / "f0").read_bytes() == b"0"
        with pytest.raises(OSError):
            (target / "new").write_bytes(b"read-only view")
    finally:
        mnt.unmount(str(target))


def test_cleanup_removes_orphans_both_ways(sn: OverlaySnapshotter) -> None:
    committed(sn, "keep", None, {"f": b"1"})
    committed(sn, "gone", None, {})
    committed(sn, "gone-child", "gone", {})
    os.rename(fs_of(sn, "gone").parent, Path(sn.root, "elsewhere"))  # its dir vanished
    os.rename(Path(sn.root, "elsewhere"), Path(sn.root, "snapshots", "777"))  # stray dir
    sn.prepare("extract-abc-sha256:1", "keep")  # unpack scratch left by a crash
    removed = sn.cleanup()
    assert len(removed) == 4, removed
    assert [i.key for i in sn.walk()] == ["keep"]
    assert os.listdir(Path(sn.root, "snapshots")) == [fs_of(sn, "keep").parent.name]
    assert (fs_of(sn, "keep") / "f").read_bytes() == b"1"
    assert sn.cleanup() == []


def test_records_persist_across_a_reopen(sn: OverlaySnapshotter, tmp_path: Path) -> None:
    committed(sn, "a", None, {})
    sn.prepare("b", "a")
    again = OverlaySnapshotter(sn.root, Database(str(tmp_path / "meta.db")))
    assert [(i.key, i.parent, i.kind) for i in again.walk()] == [
        ("a", None, Kind.COMMITTED), ("b", "a", Kind.ACTIVE)]
    assert again.cleanup() == []


def test_walk_by_key_prefix(sn: OverlaySnapshotter) -> None:
    for key in ("image-volume/a/0", "image-volume/a/1", "image-volume/ab/0", "image-volume/b/0",
                "image-volume0", "image-volume/a"):
        sn.prepare(key, None)
    assert [i.key for i in sn.walk(prefix="image-volume/a/")] == [
        "image-volume/a/0", "image-volume/a/1"]
    assert len(sn.walk(prefix="image-volume/")) == 5
    assert len(sn.walk()) == 6
    assert sn.walk(prefix="nothing") == []


def test_commit_on_a_parent_chosen_at_commit(sn: OverlaySnapshotter) -> None:
    """Layers unpacked side by side: each prepared with no parent, committed on top of the
    chain below once that is committed; the stack mounts as if prepared on it."""
    committed(sn, "base", None, {"a": b"1"})
    sn.prepare("layer-2", None)
    (fs_of(sn, "layer-2") / "b").write_bytes(b"2")
    sn.prepare("layer-3", None)
    (fs_of(sn, "layer-3") / "c").write_bytes(b"3")
    with pytest.raises(FailedPrecondition, match="not committed"):
        sn.commit("top", "layer-3", parent="layer-2")
    sn.commit("mid", "layer-2", parent="base")
    sn.commit("top", "layer-3", parent="mid")
    assert [sn.stat(k).parent for k in ("base", "mid", "top")] == [None, "base", "mid"]
    sn.prepare("on-base", "base")
    with pytest.raises(FailedPrecondition, match="already has parent"):
        sn.commit("other", "on-base", parent="mid")
    with pytest.raises(AlreadyExists):
        sn.prepare("again", None)
        sn.commit("top", "again", parent="mid")
    assert sn.stat("again").kind is Kind.ACTIVE  # a refused commit changes nothing
    sn.view("v", "top")
    target = Path(sn.root) / "mnt"
    target.mkdir()
    mnt.mount(sn.mounts("v")[0], str(target))
    try:
        assert sorted(p.name for p in target.iterdir()) == ["a", "b", "c"]
    finally:
        mnt.unmount(str(target))
    with pytest.raises(FailedPrecondition):
        sn.remove("mid")  # it has a child now
