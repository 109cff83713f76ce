"""User namespaces on the host (host/userns.py, host/mounts.py idmapped_bind) and the layers
of a pod in one (runtime/mapped_rootfs.py): pure id maps and checks, and the real syscalls
on temporary directories (the suite runs as root)."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from cri_api.v1 import api_pb2 as pb

from pycrid.errors import FailedPrecondition, Internal, InvalidArgument
from pycrid.host.idmap import IDMap, IDRange
from pycrid.host.mounts import idmapped_bind, unmount
from pycrid.host.pins import is_pinned, unpin
from pycrid.host.userns import (
    NamespaceRequest,
    blocked_dir,
    open_userns,
    pin_namespaces,
    pin_owner,
)
from pycrid.network.netns import create_netns
from pycrid.oci.spec import pod_idmap
from pycrid.runtime.mapped_rootfs import chown_tree, remapped_key

HOST = 65536 * 70
MAP = IDMap((IDRange(0, HOST, 65536),), (IDRange(0, HOST + 1000, 65536),))


def test_idmap_translates_container_ids_to_the_node() -> None:
    assert MAP.root() == (HOST, HOST + 1000)
    assert MAP.uid(65535) == HOST + 65535 and MAP.uid(65536) is None and MAP.uid(-1) is None
    assert MAP.map_file("uid") == f"0 {HOST} 65536\n"
    assert MAP.map_file("gid") == f"0 {HOST + 1000} 65536\n"
    with pytest.raises(ValueError):
        IDMap((IDRange(1, HOST, 10),), (IDRange(0, HOST, 10),)).root()


def _opts(uid: list[pb.IDMapping], gid: list[pb.IDMapping],
          mode: int = pb.POD) -> pb.NamespaceOption:
    return pb.NamespaceOption(userns_options=pb.UserNamespace(mode=mode, uids=uid, gids=gid))


def test_pod_idmap_from_the_cri() -> None:
    m = [pb.IDMapping(container_id=0, host_id=HOST, length=65536)]
    assert pod_idmap(_opts(m, m)) == IDMap((IDRange(0, HOST, 65536),), (IDRange(0, HOST, 65536),))
    assert pod_idmap(pb.NamespaceOption()) is None
    assert pod_idmap(_opts([], [], mode=pb.NODE)) is None
    # critest's refusals: root not mapped, more than one line, CONTAINER and TARGET modes.
    unmapped = [pb.IDMapping(container_id=1, host_id=HOST, length=65536)]
    with pytest.raises(InvalidArgument, match="container uid and gid 0"):
        pod_idmap(_opts(unmapped, unmapped))
    with pytest.raises(InvalidArgument, match="exactly one"):
        pod_idmap(_opts(m * 2, m * 2))
    for mode in (pb.CONTAINER, pb.TARGET):
        with pytest.raises(InvalidArgument, match="not supported"):
            pod_idmap(_opts(m, m, mode=mode))
    with pytest.raises(InvalidArgument, match="at least 1"):
        zero = [pb.IDMapping(container_id=0, host_id=HOST, length=0)]
        pod_idmap(_opts(zero, zero))


def test_blocked_dir_finds_the_first_directory_the_mapped_root_cannot_search(
        tmp_path: Path) -> None:
    # pytest's own tree is 0700: the first directory in the way is in it.
    top = next(p for p in reversed(tmp_path.parents) if not p.stat().st_mode & stat.S_IXOTH)
    assert blocked_dir(str(tmp_path), HOST, HOST) == str(top)
    # Under /run (0755), the search bit that applies is the one that counts.
    base = Path(tempfile.mkdtemp(prefix="pycrid-unit-userns-", dir="/run"))
    try:
        os.chmod(base, 0o711)
        leaf = base / "mid" / "leaf"
        leaf.mkdir(parents=True)
        assert blocked_dir(str(leaf), HOST, HOST) is None
        os.chmod(base / "mid", 0o700)
        assert blocked_dir(str(leaf), HOST, HOST) == str(base / "mid")
        os.chown(base / "mid", -1, HOST)
        os.chmod(base / "mid", 0o710)  # the group's bit, for the group's members only
        assert blocked_dir(str(leaf), HOST, HOST) is None
        assert blocked_dir(str(leaf), HOST + 1, HOST + 1) == str(base / "mid")
        os.chown(base / "mid", HOST, -1)
        os.chmod(base / "mid", 0o100)  # the owner's bit for the owner
        assert blocked_dir(str(leaf), HOST, HOST + 1) is None
    finally:
        shutil.rmtree(base)


@pytest.fixture
def pins(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "ns"
    yield d
    for p in sorted(d.glob("*")) if d.exists() else []:
        unpin(str(p))


def _owner(path: str) -> int:
    import fcntl

    fd = os.open(path, os.O_RDONLY)
    try:
        owner = fcntl.ioctl(fd, 0xB701)  # NS_GET_USERNS
    finally:
        os.close(fd)
    try:
        return os.fstat(owner).st_ino
    finally:
        os.close(owner)


def test_a_pods_namespaces_are_made_inside_its_user_namespace(pins: Path) -> None:
    """The netns in a new user namespace with the pod's maps, that user namespace pinned
    from it, IPC and UTS made inside it (the helper joins it), hostname and sysctls set."""
    net, user = str(pins / "net"), str(pins / "user")
    create_netns(net, MAP)
    pin_owner(net, user)
    assert is_pinned(net) and is_pinned(user)
    assert _owner(net) == os.stat(user).st_ino != os.stat("/proc/self/ns/user").st_ino
    ipc, uts = str(pins / "ipc"), str(pins / "uts")
    pin_namespaces(NamespaceRequest(
        pins={"ipc": ipc, "uts": uts}, user=user, join={"net": net}, new=("ipc", "uts"),
        hostname="mapped", sysctls={"kernel.shmmni": "1234",
                                    "net.ipv4.ip_unprivileged_port_start": "0"}))
    assert _owner(ipc) == _owner(uts) == os.stat(user).st_ino
    # What the helper set is there: read from inside the namespaces by a process.
    import subprocess

    out = subprocess.run(["nsenter", f"--user={user}", f"--net={net}", f"--ipc={ipc}",
                          f"--uts={uts}", "sh", "-c",
                          "hostname; cat /proc/sys/kernel/shmmni "
                          "/proc/sys/net/ipv4/ip_unprivileged_port_start /proc/self/uid_map"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    assert out.split() == ["mapped", "1234", "0", "0", str(HOST), "65536"]


def test_a_failed_pin_leaves_nothing(pins: Path, tmp_path: Path) -> None:
    with pytest.raises(Internal, match="namespace helper"):
        pin_namespaces(NamespaceRequest(pins={"ipc": str(pins / "ipc")},
                                        user=str(tmp_path / "no-such-userns"), new=("ipc",)))
    assert list(pins.iterdir()) == []


def test_idmapped_bind_shows_the_nodes_root_as_the_pods(pins: Path, tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    (src / "f").write_text("x")
    user = str(pins / "user")
    pin_namespaces(NamespaceRequest(pins={"user": user}, idmap=MAP))
    fd = open_userns(user)
    try:
        idmapped_bind(str(src), str(dst), fd, readonly=True)
    finally:
        os.close(fd)
    try:
        st = (dst / "f").stat()
        assert (st.st_uid, st.st_gid) == (HOST, HOST + 1000)
        assert (src / "f").stat().st_uid == 0
        with pytest.raises(OSError):
            (dst / "g").write_text("read-only")
    finally:
        unmount(str(dst))


def test_chown_tree_shifts_every_file_and_keeps_set_id_bits(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "su").write_text("")
    os.chown(root / "bin" / "su", 0, 0)
    os.chmod(root / "bin" / "su", 0o4755)
    (root / "home").mkdir()
    os.chown(root / "home", 1000, 1000)
    os.symlink("/etc/passwd", root / "link")  # the link, never the host file it names
    (root / "bin" / "sh").write_text("")
    os.link(root / "bin" / "sh", root / "bin" / "ash")  # one file, two names: shifted once
    chown_tree(str(root), MAP)
    assert (root / "bin" / "ash").stat().st_uid == HOST
    assert os.lstat(root).st_uid == HOST
    su = (root / "bin" / "su").stat()
    assert (su.st_uid, su.st_gid, stat.S_IMODE(su.st_mode)) == (HOST, HOST + 1000, 0o4755)
    assert (root / "home").stat().st_uid == HOST + 1000
    assert os.lstat(root / "link").st_uid == HOST
    assert os.stat("/etc/passwd").st_uid == 0
    other = tmp_path / "other"
    (other / "home").mkdir(parents=True)
    os.chown(other / "home", 70000, 0)  # outside the pod's 65536 ids
    with pytest.raises(FailedPrecondition, match="home in the image is owned by 70000:0"):
        chown_tree(str(other), MAP)


def test_chown_tree_through_overlayfs_changes_every_name_of_a_hard_link(
        tmp_path: Path) -> None:
    """overlayfs (index=off) copies up the one name chowned; the other name of a lower
    hard link still shows the lower file, so it is chowned in its own turn."""
    from pycrid.host.mounts import Mount, mount

    lower, upper, work, merged = (tmp_path / n for n in ("lower", "upper", "work", "merged"))
    for d in (lower, upper, work, merged):
        d.mkdir()
    (lower / "a").write_text("x")
    os.link(lower / "a", lower / "b")
    mount(Mount("overlay", "overlay", ("index=off", f"lowerdir={lower}", f"upperdir={upper}",
                                       f"workdir={work}")), str(merged))
    try:
        chown_tree(str(merged), MAP)
        assert [(merged / n).stat().st_uid for n in ("a", "b")] == [HOST, HOST]
    finally:
        unmount(str(merged))
    assert (lower / "a").stat().st_uid == 0  # the layer itself never changes


def test_remapped_key_depends_on_the_image_and_the_maps() -> None:
    other = IDMap((IDRange(0, HOST + 65536, 65536),), MAP.gids)
    keys = {remapped_key("sha256:a", MAP), remapped_key("sha256:b", MAP),
            remapped_key("sha256:a", other)}
    assert len(keys) == 3 and all(k.startswith("remapped-") for k in keys)
    assert remapped_key("sha256:a", MAP) == remapped_key("sha256:a", MAP)
