"""Layer application against real directories and real overlay mounts (root, no mocks).

Every hostile case checks two things: the outcome (contained inside the root, or
refused with the right error kind) and that a canary directory outside the root
is unchanged.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from pycrid.errors import DataLoss, InvalidArgument, PermissionDenied
from pycrid.images import mount as mnt
from pycrid.images.overlay import OverlaySnapshotter
from pycrid.images.service import chain_ids
from pycrid.images.snapshots import Kind
from pycrid.images.unpack import apply_tar, cleanup_mounts, unpack_layer
from pycrid.store.db import Database
from tests.support.images import LAYERED_EXPECTED, layered_layers
from tests.support.layers import Entry, compress, tar_bytes


def snapshot_tree(path: Path) -> dict[str, tuple[int, bytes | str]]:
    out: dict[str, tuple[int, bytes | str]] = {}
    for p in sorted(path.rglob("*")):
        st = p.lstat()
        if p.is_symlink():
            out[str(p)] = (st.st_mode, os.readlink(p))
        elif p.is_file():
            out[str(p)] = (st.st_mode, p.read_bytes())
        else:
            out[str(p)] = (st.st_mode, "")
    return out


def apply(root: Path, entries: list[Entry], **kw: bool) -> int:
    return apply_tar(str(root), io.BytesIO(tar_bytes(entries)), **kw)


def up(canary: Path) -> str:
    """A relative path from deep inside any root up to the canary."""
    return "../" * 16 + str(canary).lstrip("/")


def test_regular_entries_and_metadata(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    apply(root, [
        Entry("etc", "dir", mode=0o755),
        Entry("etc/conf", data=b"hello", mode=0o640, uid=1000, gid=1001),
        Entry("bin/tool", data=b"#!x", mode=0o4755),  # parent dir missing from the tar
        Entry("etc/link", "symlink", linkname="/etc/conf"),
        Entry("etc/hard", "hardlink", linkname="etc/conf"),
        Entry("run/fifo", "fifo"),
        Entry("etc/cap", data=b"c", pax={"SCHILY.xattr.user.test": "v1"}),
    ])
    conf = (root / "etc/conf").lstat()
    assert (root / "etc/conf").read_bytes() == b"hello"
    assert (stat.S_IMODE(conf.st_mode), conf.st_uid, conf.st_gid) == (0o640, 1000, 1001)
    assert conf.st_mtime == 1_700_000_000
    assert stat.S_IMODE((root / "bin/tool").lstat().st_mode) == 0o4755
    assert os.readlink(root / "etc/link") == "/etc/conf"
    assert (root / "etc/hard").lstat().st_ino == conf.st_ino
    assert stat.S_ISFIFO((root / "run/fifo").lstat().st_mode)
    assert os.getxattr(root / "etc/cap", "user.test") == b"v1"
    assert (root / "etc").lstat().st_mtime == 1_700_000_000  # restored after its children


@pytest.mark.parametrize(
    "case",
    ["abs-name", "dotdot-name", "abs-symlink-dir", "rel-symlink-dir", "symlink-chain",
     "symlink-then-file", "whiteout-outside", "opaque-outside"],
)
def test_hostile_names_are_contained(tmp_path: Path, canary: Path, case: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    before = snapshot_tree(canary)
    entries = {
        "abs-name": [Entry(f"{canary}/pwned", data=b"x")],
        "dotdot-name": [Entry(f"{up(canary)}/pwned", data=b"x")],
        "abs-symlink-dir": [Entry("esc", "symlink", linkname=str(canary)),
                            Entry("esc/pwned", data=b"x")],
        "rel-symlink-dir": [Entry("a/b", "dir"), Entry("a/b/esc", "symlink", linkname=up(canary)),
                            Entry("a/b/esc/pwned", data=b"x")],
        "symlink-chain": [Entry("l1", "symlink", linkname="l2"),
                          Entry("l2", "symlink", linkname=f"{canary}"),
                          Entry("l1/sub/pwned", data=b"x")],
        "symlink-then-file": [Entry("keep", "symlink", linkname=f"{canary}/keep"),
                              Entry("keep", data=b"overwritten")],
        "whiteout-outside": [Entry("esc", "symlink", linkname=str(canary)),
                             Entry("esc/.wh.keep")],
        "opaque-outside": [Entry("esc", "symlink", linkname=str(canary)),
                           Entry("esc/.wh..wh..opq")],
    }[case]
    apply(root, entries)
    assert snapshot_tree(canary) == before
    inside = [p for p in root.rglob("*") if p.name in ("pwned", "keep") and not p.is_symlink()]
    if case not in ("whiteout-outside", "opaque-outside"):
        assert inside, "the entry should have landed inside the root"


def test_symlink_loop_is_refused(tmp_path: Path, canary: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(DataLoss, match="too many levels"):
        apply(root, [Entry("a", "symlink", linkname="b"), Entry("b", "symlink", linkname="a"),
                     Entry("a/x", data=b"x")])


@pytest.mark.parametrize("linkname", ["../../../../etc/passwd", "a/../../x", "/../../keep"])
def test_hardlink_out_of_the_layer_is_refused(tmp_path: Path, canary: Path,
                                              linkname: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    before = snapshot_tree(canary)
    with pytest.raises(PermissionDenied, match="lies outside the layer"):
        apply(root, [Entry("h", "hardlink", linkname=linkname)])
    assert snapshot_tree(canary) == before
    assert not (root / "h").exists()


def test_hardlink_through_a_symlinked_dir_stays_inside(tmp_path: Path, canary: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    # esc -> /canary resolves to <root>/canary, where there is no "keep": the link fails
    # rather than linking the real canary file.
    with pytest.raises(DataLoss, match="does not exist"):
        apply(root, [Entry("esc", "symlink", linkname=str(canary)),
                     Entry("h", "hardlink", linkname="esc/keep")])
    assert (canary / "keep").stat().st_nlink == 1


def test_device_nodes_need_permission(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(PermissionDenied, match="device nodes"):
        apply(root, [Entry("dev/null", "char", devmajor=1, devminor=3)])
    assert not (root / "dev/null").exists()
    apply(root, [Entry("dev/null", "char", devmajor=1, devminor=3)], allow_device_nodes=True)
    assert stat.S_ISCHR((root / "dev/null").lstat().st_mode)


@pytest.mark.parametrize("how", ["truncated", "garbage"])
def test_corrupt_archives(tmp_path: Path, how: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    tar = tar_bytes([Entry("big", data=os.urandom(100_000))])
    data = tar[:30_000] if how == "truncated" else b"\x00garbage" * 100 + tar[512:]
    with pytest.raises(DataLoss):
        apply_tar(str(root), io.BytesIO(data))


# ---- unpack_layer: snapshots, overlay mounts, diff ids -------------------------------------


@pytest.fixture
def snapshotter(tmp_path: Path) -> Iterator[OverlaySnapshotter]:
    sn = OverlaySnapshotter(str(tmp_path / "sn"), Database(str(tmp_path / "meta.db")))
    yield sn
    assert mnt.mounts_under(str(tmp_path)) == []


def unpack_all(sn: OverlaySnapshotter, tmp_path: Path, layers: list[bytes],
               compression: str = "gzip") -> list[str]:
    diff_ids = ["sha256:" + hashlib.sha256(t).hexdigest() for t in layers]
    chain = chain_ids(diff_ids)
    for i, tar in enumerate(layers):
        blob = tmp_path / f"blob{i}"
        blob.write_bytes(compress(tar, compression))
        unpack_layer(sn, blob_path=str(blob), media_type="application/vnd.oci.image.layer.v1.tar",
                     diff_id=diff_ids[i], chain_id=chain[i], parent=chain[i - 1] if i else None,
                     allow_device_nodes=False, mount_dir=str(tmp_path / "mnt"))
    return chain


def test_layered_image_through_overlay(snapshotter: OverlaySnapshotter, tmp_path: Path) -> None:
    chain = unpack_all(snapshotter, tmp_path, layered_layers())
    assert [i.kind for i in snapshotter.walk()] == [Kind.COMMITTED] * len(chain)
    snapshotter.view("check", chain[-1])
    target = tmp_path / "view"
    target.mkdir()
    mnt.mount(snapshotter.mounts("check")[0], str(target))
    try:
        for rel, want in LAYERED_EXPECTED.items():
            p = target / rel
            if want is None:
                assert not os.path.lexists(p), rel
            elif isinstance(want, str):
                assert os.readlink(p) == want[2:], rel
            else:
                assert p.read_bytes() == want, rel
    finally:
        mnt.unmount(str(target))
    snapshotter.remove("check")


@pytest.mark.parametrize("compression", ["none", "gzip", "zstd"])
def test_compressions(snapshotter: OverlaySnapshotter, tmp_path: Path, compression: str) -> None:
    chain = unpack_all(snapshotter, tmp_path, [tar_bytes([Entry("f", data=b"1")])], compression)
    assert snapshotter.stat(chain[0]).kind is Kind.COMMITTED


def test_failures_leave_nothing(snapshotter: OverlaySnapshotter, tmp_path: Path) -> None:
    base = unpack_all(snapshotter, tmp_path, [tar_bytes([Entry("f", data=b"1")])])
    bad = tar_bytes([Entry("ok", data=b"x"), Entry("h", "hardlink", linkname="../../x")])
    blob = tmp_path / "bad"
    blob.write_bytes(gzip.compress(bad))
    wrong_diff = "sha256:" + "0" * 64
    with pytest.raises(PermissionDenied):
        unpack_layer(snapshotter, blob_path=str(blob), media_type="",
                     diff_id="sha256:" + hashlib.sha256(bad).hexdigest(),
                     chain_id="sha256:" + "9" * 64, parent=base[0],
                     allow_device_nodes=False, mount_dir=str(tmp_path / "mnt"))
    good = tar_bytes([Entry("g", data=b"2")])
    blob.write_bytes(gzip.compress(good))
    with pytest.raises(DataLoss, match="diffID mismatch"):
        unpack_layer(snapshotter, blob_path=str(blob), media_type="", diff_id=wrong_diff,
                     chain_id="sha256:" + "9" * 64, parent=base[0], allow_device_nodes=False,
                     mount_dir=str(tmp_path / "mnt"))
    # Only the base layer remains; no scratch snapshot, no directory, no mount.
    assert [i.key for i in snapshotter.walk()] == base
    assert len(os.listdir(Path(snapshotter.root, "snapshots"))) == 1
    assert os.listdir(tmp_path / "mnt") == []


def test_cleanup_after_a_crash(snapshotter: OverlaySnapshotter, tmp_path: Path) -> None:
    base = unpack_all(snapshotter, tmp_path, [tar_bytes([Entry("f", data=b"1")])])
    # What a crash mid-unpack leaves: a scratch snapshot, mounted, and a stray directory.
    mounts = snapshotter.prepare("extract-dead-1", base[0])
    mp = tmp_path / "mnt" / "leftover"
    mp.mkdir(parents=True)
    mnt.mount(mounts[0], str(mp))
    Path(snapshotter.root, "snapshots", "999").mkdir()
    removed = cleanup_mounts(str(tmp_path / "mnt")) + snapshotter.cleanup()
    assert len(removed) == 3, removed
    assert [i.key for i in snapshotter.walk()] == base
    assert mnt.mounts_under(str(tmp_path)) == []


def full_state(path: Path) -> dict[str, tuple[object, ...]]:
    """Everything lstat and read tell about a tree, times included."""
    out: dict[str, tuple[object, ...]] = {}
    for p in [path, *sorted(path.rglob("*"))]:
        st = p.lstat()
        body: object = (os.readlink(p) if p.is_symlink()
                        else p.read_bytes() if p.is_file() else None)
        out[str(p)] = (st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns,
                       st.st_nlink, body)
    return out


@pytest.mark.parametrize("name", [".wh..", ".wh...", "a/.wh...", "a/b/.wh...", ".wh..wh..."])
def test_malformed_whiteouts_are_refused(tmp_path: Path, canary: Path, name: str) -> None:
    """``.wh...`` names the parent of its directory: it must never delete upwards."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f").write_bytes(b"kept")
    before, siblings = full_state(canary), sorted(os.listdir(tmp_path))
    with pytest.raises(DataLoss, match="malformed whiteout"):
        apply(root, [Entry(name)])
    assert (root / "a" / "b" / "f").read_bytes() == b"kept"
    assert full_state(canary) == before
    assert sorted(os.listdir(tmp_path)) == siblings


def test_dir_times_never_follow_a_later_symlink(tmp_path: Path, canary: Path) -> None:
    """A dir whose parent is later replaced by a link out of the root keeps no deferred
    mtime that could be set through that link."""
    root = tmp_path / "root"
    root.mkdir()
    before, siblings = full_state(canary), sorted(os.listdir(tmp_path))
    apply(root, [Entry("a", "dir"), Entry("a/sub", "dir"),
                 Entry("a", "symlink", linkname=str(canary))])
    assert os.readlink(root / "a") == str(canary)
    assert full_state(canary) == before
    assert sorted(os.listdir(tmp_path)) == siblings


def test_hostile_entries_change_nothing_outside(tmp_path: Path, canary: Path) -> None:
    """One layer with every trick at once; afterwards the canary is identical to the byte
    and to the nanosecond, and nothing new sits next to the root."""
    root = tmp_path / "root"
    root.mkdir()
    before, siblings = full_state(canary), sorted(os.listdir(tmp_path))
    apply(root, [
        Entry(f"{canary}/keep", data=b"abs"),
        Entry(f"{up(canary)}/sub/new", data=b"dotdot"),
        Entry("e1", "symlink", linkname=str(canary)),
        Entry("e1/keep", data=b"through abs link", mode=0o777),
        Entry("e1/sub", "dir", mode=0o777),
        Entry("d/e2", "symlink", linkname=up(canary)),
        Entry("d/e2/keep", data=b"through rel link"),
        Entry("d/e2/.wh.sub"),
        Entry("e1/.wh..wh..opq"),
        Entry("../../.wh.root"),
        Entry("../.wh.keep"),
    ])
    assert full_state(canary) == before
    assert sorted(os.listdir(tmp_path)) == siblings
    inside = root / str(canary).lstrip("/")
    # Every write landed in one place inside the root; the last one wins, and the opaque
    # marker keeps what this same layer wrote.
    assert (inside / "keep").read_bytes() == b"through rel link"
    assert not (inside / "sub").exists()  # made, then whited out through the other link


def test_opaque_dir_hides_lower_entries_at_every_depth(snapshotter: OverlaySnapshotter,
                                                       tmp_path: Path) -> None:
    lower = tar_bytes([Entry("d", "dir"), Entry("d/old", data=b"1"), Entry("d/sub", "dir"),
                       Entry("d/sub/old", data=b"1"), Entry("other", data=b"1")])
    upper = tar_bytes([Entry("d", "dir"), Entry("d/sub", "dir"), Entry("d/sub/new", data=b"2"),
                       Entry("d/.wh..wh..opq"), Entry(".wh.other")])
    chain = unpack_all(snapshotter, tmp_path, [lower, upper])
    snapshotter.view("check", chain[-1])
    target = tmp_path / "view"
    target.mkdir()
    mnt.mount(snapshotter.mounts("check")[0], str(target))
    try:
        found = sorted(str(p.relative_to(target)) for p in target.rglob("*"))
    finally:
        mnt.unmount(str(target))
    assert found == ["d", "d/sub", "d/sub/new"]
    # The committed upper layer holds no whiteout files, only the kernel's records.
    upper_fs = Path(snapshotter.upper_dir(chain[-1]))
    assert not [p for p in upper_fs.rglob(".wh.*")]


def test_unknown_media_type_is_refused_before_anything(snapshotter: OverlaySnapshotter,
                                                       tmp_path: Path) -> None:
    blob = tmp_path / "blob"
    blob.write_bytes(tar_bytes([Entry("f")]))
    with pytest.raises(InvalidArgument, match="application/x-bogus"):
        unpack_layer(snapshotter, blob_path=str(blob), media_type="application/x-bogus",
                     diff_id="sha256:" + "0" * 64, chain_id="sha256:" + "1" * 64, parent=None,
                     allow_device_nodes=False, mount_dir=str(tmp_path / "mnt"))
    assert snapshotter.walk() == []
    assert os.listdir(Path(snapshotter.root, "snapshots")) == []
