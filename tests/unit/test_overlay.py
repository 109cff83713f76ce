"""The overlayfs snapshotter's contract: kinds, parents, mounts, errors, persistence."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pycrid.errors import AlreadyExists, FailedPrecondition, NotFound
from pycrid.images import mount as mnt
from pycrid.images.overlay import OverlaySnapshotter
from pycrid.images.snapshots import Kind
from pycrid.store.db import Database


def make(tmp_path: Path) -> OverlaySnapshotter:
    return OverlaySnapshotter(str(tmp_path / "sn"), Database(str(tmp_path / "meta.db")))


def test_lifecycle_and_mounts(tmp_path: Path) -> None:
    sn = make(tmp_path)
    (m,) = sn.prepare("a-active", None)
    assert m.type == "bind" and "rw" in m.options
    Path(sn.upper_dir("a-active"), "one").write_text("1")
    sn.commit("a", "a-active")
    with pytest.raises(NotFound):
        sn.stat("a-active")
    assert sn.stat("a").kind is Kind.COMMITTED
    (m,) = sn.prepare("b-active", "a")
    assert m.type == "overlay"
    opts = dict(o.split("=", 1) for o in m.options if "=" in o)
    assert opts["lowerdir"].endswith("/fs") and "upperdir" in opts and "workdir" in opts
    target = tmp_path / "t"
    target.mkdir()
    mnt.mount(m, str(target))
    try:
        assert (target / "one").read_text() == "1"
        (target / "two").write_text("2")
    finally:
        mnt.unmount(str(target))
    assert Path(sn.upper_dir("b-active"), "two").read_text() == "2"
    sn.commit("b", "b-active")
    (v,) = sn.view("v", "b")
    assert v.type == "overlay" and not any(o.startswith("upperdir") for o in v.options)
    assert sn.stat("v").parent == "b"
    assert sn.usage("b").inodes == 1
    assert sn.fs_usage().inodes >= 2


def test_errors(tmp_path: Path) -> None:
    sn = make(tmp_path)
    sn.prepare("a-active", None)
    with pytest.raises(AlreadyExists):
        sn.prepare("a-active", None)
    with pytest.raises(NotFound):
        sn.prepare("x", "missing")
    with pytest.raises(FailedPrecondition, match="not committed"):
        sn.prepare("x", "a-active")
    sn.commit("a", "a-active")
    sn.prepare("c", "a")
    with pytest.raises(FailedPrecondition, match="has a child"):
        sn.remove("a")
    with pytest.raises(FailedPrecondition, match="not active"):
        sn.commit("z", "a")
    sn.prepare("d", None)
    with pytest.raises(AlreadyExists):
        sn.commit("a", "d")
    sn.remove("c")
    sn.remove("a")
    with pytest.raises(NotFound):
        sn.remove("a")


def test_records_persist_and_cleanup_finds_orphans(tmp_path: Path) -> None:
    sn = make(tmp_path)
    sn.prepare("a-active", None)
    sn.commit("a", "a-active")
    sn.prepare("b", "a")
    again = make(tmp_path)
    assert [(i.key, i.parent, i.kind) for i in again.walk()] == [
        ("a", None, Kind.COMMITTED), ("b", "a", Kind.ACTIVE)]
    # A record whose directory vanished takes its children with it; a stray dir goes too.
    shutil.rmtree(Path(again.upper_dir("a")).parent)
    Path(again.root, "snapshots", "77").mkdir()
    removed = again.cleanup()
    assert len(removed) == 2 + 1, removed  # "a", its child "b", the stray dir
    assert again.walk() == []
