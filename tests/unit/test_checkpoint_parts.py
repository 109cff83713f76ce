"""The parts of checkpoint/restore that need no container: the CRIU check, runc's
checkpoint feature, the writable layer's diff both ways, the archive (write, read,
unpack), Go's JSON and time formats, and the thread a cancel stops."""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import os
import re
import stat
import tarfile
import threading
import time
from pathlib import Path

import pytest
from cri_api.v1 import api_pb2 as pb

from pycrid.cri_fields import go_json
from pycrid.errors import Aborted, DataLoss, FailedPrecondition, InvalidArgument
from pycrid.host import criu
from pycrid.images.layer_paths import is_opaque
from pycrid.runtime import checkpoint_archive as archive
from pycrid.runtime import rootfs_diff
from pycrid.runtime.handlers import features_from
from pycrid.status_command import _checkpoint
from pycrid.tasks import stoppable_thread

# ---- CRIU -------------------------------------------------------------------------------

FAILED_CHECK = """Warn  (criu/kerndat.c:1290): Can't keep kdat cache on non-tempfs
Error (criu/vdso.c:381): vdso: Unexpected rt vDSO area bounds
Error (criu/vdso.c:613): vdso: Failed to fill self vdso symtable
Error (criu/kerndat.c:1615): kerndat_vdso_fill_symtable failed when initializing kerndat.
Error (criu/crtools.c:260): Could not initialize kernel features detection.
"""


def test_criu_version_and_check_output() -> None:
    assert criu.parse_version("Version: 4.2\n") == (4, 2)
    assert criu.parse_version("Version: 3.17.1\nGitID: v3.17.1\n") == (3, 17, 1)
    assert criu.parse_version("criu: unknown option") is None
    assert criu.check_error(FAILED_CHECK) == (
        "vdso: Unexpected rt vDSO area bounds; vdso: Failed to fill self vdso symtable; "
        "kerndat_vdso_fill_symtable failed when initializing kerndat.")
    assert criu.check_error("something odd\n") == "something odd"


def _fake_criu(path: Path, version: str, check_rc: int, check_out: str = "") -> str:
    path.write_text(f"""#!/bin/sh
case "$1" in
--version) echo "Version: {version}" ;;
check) printf '%s' '{check_out}'; exit {check_rc} ;;
esac
""")
    path.chmod(0o755)
    return str(path)


async def test_criu_probe_says_why_not(tmp_path: Path) -> None:
    missing = await criu.probe(str(tmp_path / "nope"))
    assert not missing.works
    assert missing.error == (f"CRIU is not installed: {str(tmp_path / 'nope')!r} (config "
                             "criu_path) does not exist or is not executable")
    old = await criu.probe(_fake_criu(tmp_path / "old", "3.15", 0))
    assert old.version == "3.15"
    assert "is too old: checkpointing pods needs CRIU 3.16 or newer" in old.error
    broken = await criu.probe(_fake_criu(tmp_path / "broken", "3.17.1", 1,
                                         "Error (criu/vdso.c:381): vdso: bounds"))
    assert broken.error == (f"`{tmp_path / 'broken'} check` fails on this kernel (vdso: "
                            "bounds): a newer CRIU is needed (set criu_path to it)")
    good = await criu.probe(_fake_criu(tmp_path / "good", "4.2", 0, "Looks good."))
    assert good.works and good.version == "4.2" and good.path == str(tmp_path / "good")


def test_runc_features_say_whether_it_checkpoints() -> None:
    annotations = {"org.opencontainers.runc.checkpoint.enabled": "true"}
    assert features_from({"annotations": annotations}).checkpoint
    assert not features_from({"annotations": {}}).checkpoint
    assert not features_from({}).checkpoint  # runsc and friends say nothing


def test_status_line() -> None:
    assert _checkpoint({"criu_error": "CRIU is not installed: x"}) == (
        "not possible: CRIU is not installed: x")
    assert _checkpoint({"criu": "/c", "criu_version": "4.2", "criu_error": "",
                        "handlers": {"runc": "", "runsc": "no"}}) == (
        "CRIU 4.2 (/c); handlers runc; not runsc: no")


# ---- the writable layer's diff -----------------------------------------------------------

def _layer(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def _whiteout(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, stat.S_IFCHR, 0)


def _opaque(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    os.setxattr(path, "trusted.overlay.opaque", b"y")


@pytest.fixture
def layers(tmp_path: Path) -> tuple[Path, Path]:
    """An image layer and a container's upper directory over it: a file changed, one
    added, a file and a directory removed, a directory removed and made again."""
    lower, upper = tmp_path / "lower", tmp_path / "upper"
    _layer(lower, {"etc/motd": "hi", "etc/keep": "k", "var/tmp/x": "x", "home/app/a": "a",
                   "home/app2": "b", "bin/sh": "sh"})
    _layer(upper, {"etc/keep": "changed", "written": "data", "home/new": "new"})
    _whiteout(upper / "etc" / "motd")
    _whiteout(upper / "var" / "tmp")
    _opaque(upper / "home")
    (upper / "link").symlink_to("/etc/keep")
    os.link(upper / "written", upper / "hard")
    os.setxattr(upper / "written", "user.note", b"yes")
    os.setxattr(upper / "etc", "trusted.overlay.origin", b"overlay's own")
    return lower, upper


def test_diff_is_the_changes_and_the_removed_paths(layers: tuple[Path, Path],
                                                   tmp_path: Path) -> None:
    lower, upper = layers
    out = tmp_path / "out"
    out.mkdir()
    summary = rootfs_diff.write_diff(str(upper), [str(lower)], str(out))
    assert json.loads((out / "deleted.files").read_text()) == [
        "/etc/motd", "/home/app", "/home/app2", "/var/tmp"]
    with tarfile.open(out / "rootfs-diff.tar") as tf:
        members = {m.name: m for m in tf.getmembers()}
        assert set(members) == {"etc", "etc/keep", "hard", "home", "home/new", "link",
                                "var", "written"}
        assert summary == rootfs_diff.DiffSummary(entries=8, deleted=4)
        assert members["link"].issym() and members["link"].linkname == "/etc/keep"
        assert {members["hard"].islnk(), members["written"].islnk()} == {True, False}
        written = members["written"] if members["written"].isreg() else members["hard"]
        assert written.pax_headers["SCHILY.xattr.user.note"] == "yes"
        assert not any(k.startswith("SCHILY.xattr.trusted.overlay")
                       for m in members.values() for k in m.pax_headers)
        assert members["etc"].uname == ""


def test_diff_refuses_what_it_cannot_carry(layers: tuple[Path, Path], tmp_path: Path) -> None:
    lower, upper = layers
    os.setxattr(upper / "home", "trusted.overlay.redirect", b"/elsewhere")
    with pytest.raises(FailedPrecondition, match="/home uses overlayfs redirect"):
        rootfs_diff.write_diff(str(upper), [str(lower)], str(tmp_path))


def test_diff_stops_when_asked(layers: tuple[Path, Path], tmp_path: Path) -> None:
    stop = threading.Event()
    stop.set()
    with pytest.raises(Aborted):
        rootfs_diff.write_diff(str(layers[1]), [str(layers[0])], str(tmp_path), stop)


def _merged(lower: Path, upper: Path) -> dict[str, str]:
    """What overlayfs would show: the lower layer under the upper directory's changes."""
    seen: dict[str, str] = {}
    for root in (lower, upper):
        for dirpath, dirs, files in os.walk(root):
            rel_dir = os.path.relpath(dirpath, root)
            if root == upper and rel_dir != "." and is_opaque(dirpath):
                for k in [k for k in seen if k.startswith(rel_dir + "/")]:
                    del seen[k]
            for name in files + dirs:
                rel = os.path.normpath(os.path.join(rel_dir, name))
                st = os.lstat(os.path.join(dirpath, name))
                if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                    for k in [k for k in seen if k == rel or k.startswith(rel + "/")]:
                        del seen[k]
                elif stat.S_ISREG(st.st_mode):
                    seen[rel] = Path(dirpath, name).read_text()
                elif stat.S_ISLNK(st.st_mode):
                    seen[rel] = "-> " + os.readlink(os.path.join(dirpath, name))
    return seen


def test_diff_applied_on_a_new_layer_shows_the_same_tree(layers: tuple[Path, Path],
                                                         tmp_path: Path) -> None:
    lower, upper = layers
    out = tmp_path / "out"
    out.mkdir()
    rootfs_diff.write_diff(str(upper), [str(lower)], str(out))
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    rootfs_diff.apply_diff(str(out), str(fresh), [str(lower)])
    assert _merged(lower, fresh) == _merged(lower, upper) == {
        "etc/keep": "changed", "written": "data", "hard": "data", "home/new": "new",
        "bin/sh": "sh", "link": "-> /etc/keep"}
    assert os.getxattr(fresh / "written", "user.note") == b"yes"


def test_containerd_style_diff_gzip_with_whiteouts(tmp_path: Path) -> None:
    """containerd 2.x writes a gzip OCI layer with .wh. entries under the same name."""
    lower = tmp_path / "lower"
    _layer(lower, {"etc/motd": "hi", "opt/a": "a", "opt/b": "b"})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name in ("etc/.wh.motd", "opt/.wh..wh..opq"):
            tf.addfile(tarfile.TarInfo(name))
        data = b"new"
        info = tarfile.TarInfo("opt/c")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    src = tmp_path / "src"
    src.mkdir()
    (src / "rootfs-diff.tar").write_bytes(gzip.compress(buf.getvalue()))
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    rootfs_diff.apply_diff(str(src), str(fresh), [str(lower)])
    assert _merged(lower, fresh) == {"opt/c": "new"}


def test_deleted_files_must_be_a_list_of_paths(tmp_path: Path) -> None:
    (tmp_path / "deleted.files").write_text('{"not": "a list"}')
    with pytest.raises(DataLoss, match="not a list of paths"):
        rootfs_diff.read_deleted(str(tmp_path / "deleted.files"))
    (tmp_path / "deleted.files").write_text('["/../../etc/passwd", "/"]')
    # Names are cleaned to stay inside the layer; the root itself is never removed.
    assert rootfs_diff.read_deleted(str(tmp_path / "deleted.files")) == ["/../../etc/passwd"]
    with tarfile.open(fileobj=io.BytesIO(rootfs_diff.whiteouts_tar(
            ["/../../etc/passwd"]))) as tf:
        assert tf.getnames() == ["etc/.wh.passwd"]


# ---- the archive -------------------------------------------------------------------------

def test_go_time() -> None:
    assert archive.go_time(0) == "0001-01-01T00:00:00Z"
    assert archive.go_time(1_700_000_000_000_000_000) == "2023-11-14T22:13:20Z"
    assert archive.go_time(1_700_000_000_120_000_000) == "2023-11-14T22:13:20.12Z"


def test_go_json_writes_what_go_reads() -> None:
    status = pb.ContainerStatus(
        id="c", state=pb.CONTAINER_RUNNING, created_at=1_700_000_000_000_000_001,
        metadata=pb.ContainerMetadata(name="n"), labels={"a": "1"},
        mounts=[pb.Mount(container_path="/m", readonly=True)])
    assert json.loads(go_json(status)) == {
        "id": "c", "state": 1, "created_at": 1_700_000_000_000_000_001,
        "metadata": {"name": "n"}, "labels": {"a": "1"},
        "mounts": [{"container_path": "/m", "readonly": True}]}
    assert json.loads(go_json(pb.ExecSyncResponse(stdout=b"\x00\xff"))) == {"stdout": "AP8="}


def _tree(root: Path) -> None:
    _layer(root, {"config.dump": '{"id": "c"}', "spec.dump": '{"process": {}}',
                  "checkpoint/inventory.img": "inv", "checkpoint/pages-1.img": "pages"})


def test_pack_writes_beside_the_location_then_renames(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _tree(src)
    out = tmp_path / "out"
    out.mkdir()
    size = archive.pack(str(src), str(out / "a.tar"))
    assert os.listdir(out) == ["a.tar"]
    assert (out / "a.tar").stat().st_size == size
    assert stat.S_IMODE((out / "a.tar").stat().st_mode) == 0o600
    with tarfile.open(out / "a.tar") as tf:
        names = tf.getnames()
        assert names.index("checkpoint") < names.index("checkpoint/inventory.img")
        assert tf.getmember("checkpoint").isdir()
    manifest = archive.read_manifest(str(out / "a.tar"))
    assert manifest.config == {"id": "c"} and manifest.spec == {"process": {}}


def test_pack_stopped_leaves_nothing(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _tree(src)
    out = tmp_path / "out"
    out.mkdir()
    stop = threading.Event()
    stop.set()
    with pytest.raises(Aborted):
        archive.pack(str(src), str(out / "a.tar"), stop)
    assert os.listdir(out) == []


def test_unpack_keeps_files_and_directories_only_inside(tmp_path: Path) -> None:
    path = tmp_path / "hostile.tar"
    with tarfile.open(path, "w") as tf:
        for name, kind in (("checkpoint", tarfile.DIRTYPE), ("../../escape", tarfile.REGTYPE),
                           ("checkpoint/link", tarfile.SYMTYPE), ("dev", tarfile.CHRTYPE),
                           ("/abs/file", tarfile.REGTYPE)):
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = "/etc/passwd" if kind == tarfile.SYMTYPE else ""
            tf.addfile(info, io.BytesIO(b"") if kind == tarfile.REGTYPE else None)
    dest = tmp_path / "dest"
    dest.mkdir()
    archive.unpack(str(path), str(dest))
    found = sorted(str(p.relative_to(dest)) for p in dest.rglob("*"))
    assert found == ["abs", "abs/file", "checkpoint", "escape"]
    assert not (tmp_path.parent / "escape").exists()
    with pytest.raises(InvalidArgument, match=re.escape(
            "has no config.dump, spec.dump, checkpoint/inventory.img")):
        archive.read_manifest(str(path))
    with tarfile.open(path, "a") as tf:
        tf.addfile(tarfile.TarInfo("escape"), io.BytesIO(b""))
    again = tmp_path / "again"
    again.mkdir()
    with pytest.raises(DataLoss, match="twice"):
        archive.unpack(str(path), str(again))


def test_not_an_archive(tmp_path: Path) -> None:
    (tmp_path / "x").write_bytes(b"\x00" * 10)
    with pytest.raises(InvalidArgument, match="is not a checkpoint archive"):
        archive.read_manifest(str(tmp_path / "x"))


# ---- a thread a cancel stops ---------------------------------------------------------------

async def test_stoppable_thread_is_stopped_and_waited_for() -> None:
    events: list[str] = []

    def work(stop: threading.Event) -> None:
        while not stop.wait(0.01):
            pass
        time.sleep(0.05)
        events.append("ended")

    task = asyncio.ensure_future(stoppable_thread(work))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert events == ["ended"]  # the thread had finished before the cancel got through
