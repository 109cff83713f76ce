"""Layer application against real directories (root, no mocks): one layer onto its own
directory, as the streaming unpacker applies each layer. Pulls through snapshots and
overlay mounts are in test_pull_stream.py.

Every hostile case checks two things: the outcome (contained inside the root, or
refused with the right error kind) and that a canary directory outside the root
is unchanged. Layers with layers below (``has_lower``) keep their whiteouts as
overlayfs whiteouts; hostile cases run both ways.
"""

from __future__ import annotations

import io
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from pycrid.errors import DataLoss, PermissionDenied
from pycrid.images.layer_paths import OPAQUE_XATTR, is_whiteout
from pycrid.images.layer_tar import Applied, apply_tar
from pycrid.images.unpack import inherit_dirs, needs_lowers
from tests.support.layers import Entry, tar_bytes


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


def apply(root: Path, entries: list[Entry], **kw: bool) -> Applied:
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


@pytest.mark.parametrize("has_lower", [False, True], ids=["bottom", "upper"])
@pytest.mark.parametrize(
    "case",
    ["abs-name", "dotdot-name", "abs-symlink-dir", "rel-symlink-dir", "symlink-chain",
     "symlink-then-file", "whiteout-outside", "opaque-outside"],
)
def test_hostile_names_are_contained(tmp_path: Path, canary: Path, case: str,
                                     has_lower: bool) -> None:
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
    apply(root, entries, has_lower=has_lower)
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


@pytest.mark.parametrize("has_lower", [False, True], ids=["bottom", "upper"])
@pytest.mark.parametrize("name", [".wh..", ".wh...", "a/.wh...", "a/b/.wh...", ".wh..wh..."])
def test_malformed_whiteouts_are_refused(tmp_path: Path, canary: Path, name: str,
                                         has_lower: bool) -> None:
    """``.wh...`` names the parent of its directory: it must never delete upwards."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f").write_bytes(b"kept")
    before, siblings = full_state(canary), sorted(os.listdir(tmp_path))
    with pytest.raises(DataLoss, match="malformed whiteout"):
        apply(root, [Entry(name)], has_lower=has_lower)
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


@pytest.mark.parametrize("has_lower", [False, True], ids=["bottom", "upper"])
def test_hostile_entries_change_nothing_outside(tmp_path: Path, canary: Path,
                                                has_lower: bool) -> None:
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
    ], has_lower=has_lower)
    assert full_state(canary) == before
    assert sorted(os.listdir(tmp_path)) == siblings
    inside = root / str(canary).lstrip("/")
    # Every write landed in one place inside the root; the last one wins, and the opaque
    # marker keeps what this same layer wrote.
    assert (inside / "keep").read_bytes() == b"through rel link"
    # made, then whited out through the other link: gone, or a whiteout over lower layers
    sub = inside / "sub"
    assert is_whiteout(sub.lstat()) if has_lower else not os.path.lexists(sub)
    assert is_whiteout((root / "keep").lstat()) if has_lower else True


# ---- whiteouts as overlayfs reads them, and directories the tar does not list ------------


def test_whiteouts_become_overlay_whiteouts_in_an_upper_layer(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    applied = apply(root, [
        Entry("d", "dir"), Entry("d/.wh.gone"), Entry("d/mine", data=b"1"),
        Entry("d/.wh..wh..opq"),
        Entry("e/.wh.x"),                          # parent not in the tar: made for it
        Entry("f"), Entry(".wh.f"),                # written, then whited out: a whiteout
        Entry(".wh.g"), Entry("g/new", data=b"2"),  # whited out, then written under
    ], has_lower=True)
    assert is_whiteout((root / "d" / "gone").lstat())
    assert (root / "d" / "mine").read_bytes() == b"1"  # the layer's own entry stays
    assert os.getxattr(root / "d", OPAQUE_XATTR) == b"y"
    assert is_whiteout((root / "e" / "x").lstat())
    assert is_whiteout((root / "f").lstat())
    # A whiteout replaced by a directory hides what lower layers had there.
    assert os.getxattr(root / "g", OPAQUE_XATTR) == b"y"
    assert (root / "g" / "new").read_bytes() == b"2"
    assert not list(root.rglob(".wh.*"))
    assert sorted(os.path.relpath(p, root.resolve()) for p in applied.implicit) == ["e", "g"]


def test_whiteouts_in_the_bottom_layer_only_remove(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    apply(root, [Entry("d", "dir"), Entry("d/f", data=b"1"), Entry("d/.wh.f"),
                 Entry("d/.wh.never"), Entry("d/.wh..wh..opq"), Entry("x/.wh.y")])
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == ["d"]
    with pytest.raises(OSError):
        os.getxattr(root / "d", OPAQUE_XATTR)


def test_overlay_xattrs_in_a_layer_are_skipped(tmp_path: Path) -> None:
    """A layer's own trusted.overlay.* xattrs would be read by overlayfs (an opaque dir, a
    redirect to another path): only the unpacker may write them."""
    root = tmp_path / "root"
    root.mkdir()
    apply(root, [Entry("d", "dir", pax={"SCHILY.xattr.trusted.overlay.opaque": "y",
                                        "SCHILY.xattr.trusted.overlay.redirect": "/etc",
                                        "SCHILY.xattr.user.kept": "v"})], has_lower=True)
    assert os.listxattr(root / "d") == ["user.kept"]


def test_implicit_dirs_inherit_and_symlinks_below_are_noticed(tmp_path: Path) -> None:
    lower = tmp_path / "lower"
    lower.mkdir()
    apply(lower, [Entry("usr", "dir", mode=0o750, uid=7, gid=8,
                        pax={"SCHILY.xattr.user.tag": "lower"}),
                  Entry("usr/lib", "dir"), Entry("lib", "symlink", linkname="usr/lib"),
                  Entry("etc", data=b"a file")])
    upper = tmp_path / "upper"
    upper.mkdir()
    applied = apply(upper, [Entry("usr/share/doc", data=b"x")], has_lower=True)
    implicit = [os.path.relpath(p, upper.resolve()) for p in applied.implicit]
    assert sorted(implicit) == ["usr", "usr/share"]
    assert not needs_lowers(str(upper), implicit, [str(lower)])
    inherit_dirs(str(upper), implicit, [str(lower)])
    st = (upper / "usr").lstat()
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o750, 7, 8)
    assert os.getxattr(upper / "usr", "user.tag") == b"lower"
    assert st.st_mtime == 1_700_000_000
    assert stat.S_IMODE((upper / "usr" / "share").lstat().st_mode) == 0o755  # none below
    # Through the symlink below, or under a file below: the layer needs the lowers in view.
    for entry in ("lib/x.so", "etc/x"):
        other = tmp_path / entry.replace("/", "-")
        other.mkdir()
        applied = apply(other, [Entry(entry, data=b"x")], has_lower=True)
        implicit = [os.path.relpath(p, other.resolve()) for p in applied.implicit]
        assert needs_lowers(str(other), implicit, [str(lower)]), entry
    # With them in view the name goes through the link, and a file is no directory.
    through = tmp_path / "through"
    through.mkdir()
    applied = apply_tar(str(through), io.BytesIO(tar_bytes([Entry("lib/x.so", data=b"x")])),
                        lowers=[str(lower)])
    assert (through / "usr" / "lib" / "x.so").read_bytes() == b"x"
    assert not os.path.lexists(through / "lib")
    with pytest.raises(DataLoss, match="not a directory"):
        apply_tar(str(through), io.BytesIO(tar_bytes([Entry("etc/x", data=b"x")])),
                  lowers=[str(lower)])


@pytest.mark.parametrize("fmt", ["gnu", "posix"])
def test_sparse_files_are_written_whole(tmp_path: Path, fmt: str) -> None:
    """File data is copied straight from the stream, except a sparse member's, which needs
    tarfile's map (GNU tar makes both sparse formats)."""
    tar = shutil.which("tar")
    if tar is None:
        pytest.skip("GNU tar is not installed")
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "sparse", "wb") as f:
        f.truncate(3 << 20)
        f.seek(1 << 20)
        f.write(b"middle" * 100)
        f.seek((3 << 20) - 5)
        f.write(b"tail!")
    archive = tmp_path / "layer.tar"
    subprocess.run([tar, "--sparse", f"--format={fmt}", "-cf", str(archive), "-C", str(src),
                    "sparse", "--owner=0", "--group=0"], check=True)
    root = tmp_path / "root"
    root.mkdir()
    with open(archive, "rb") as f:
        apply_tar(str(root), f)
    assert (root / "sparse").read_bytes() == (src / "sparse").read_bytes()
