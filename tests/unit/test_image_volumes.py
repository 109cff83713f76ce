"""Image volume parts: read-only views of real snapshots, sub-path resolution, the keys the
sweeps rely on, and ImageSpec.image_ref on the wire (root, real mounts, no mocks)."""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cri_api.v1 import api_pb2 as pb
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from pycrid.cri_fields import IMAGE_REF, image_ref, set_image_ref
from pycrid.errors import InvalidArgument, NotFound
from pycrid.host import mounts as mnt
from pycrid.images.overlay import OverlaySnapshotter
from pycrid.runtime.image_volumes import (
    mount_image_volume,
    owner_of,
    remove_image_volumes,
    snapshot_key,
)
from pycrid.store.db import Database

CID = "c" * 64
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="mounts need root")


def test_keys_name_their_container() -> None:
    assert snapshot_key(CID, 3) == f"image-volume/{CID}/3"
    assert owner_of(snapshot_key(CID, 3)) == CID
    for other in (CID, "extract-1", "sha256:" + "a" * 64, "image-volume/", f"image-volume/{CID}"):
        assert owner_of(other) is None


@pytest.fixture
def sn(tmp_path: Path) -> Iterator[OverlaySnapshotter]:
    s = OverlaySnapshotter(str(tmp_path / "sn"), Database(str(tmp_path / "meta.db")))
    yield s
    for mp in mnt.mounts_under(str(tmp_path)):
        mnt.unmount(mp, detach=True)


def layer(sn: OverlaySnapshotter, name: str, parent: str | None,
          build: dict[str, bytes | str | None]) -> None:
    """A committed snapshot: bytes are files, str symlinks, None directories."""
    sn.prepare(f"tmp-{name}", parent)
    fs = Path(sn.upper_dir(f"tmp-{name}"))
    for rel, what in build.items():
        if what is None:
            (fs / rel).mkdir(parents=True)
        elif isinstance(what, str):
            (fs / rel).symlink_to(what)
        else:
            (fs / rel).write_bytes(what)
    sn.commit(name, f"tmp-{name}")


@pytest.fixture
def image(sn: OverlaySnapshotter) -> str:
    layer(sn, "l1", None, {"etc": None, "etc/one": b"1\n", "file": b"f\n", "rel": "etc",
                           "abs": "/etc", "up": "../../.."})
    layer(sn, "l2", "l1", {"etc": None, "etc/two": b"2\n"})
    return "l2"


@root_only
def test_view_is_the_image_read_only(sn: OverlaySnapshotter, image: str,
                                     tmp_path: Path) -> None:
    bundle = str(tmp_path / "bundle")
    host = mount_image_volume(sn, container_id=CID, index=0, parent=image, bundle=bundle,
                              sub_path="", what="m")
    assert host == os.path.join(bundle, "image-volumes", "0")
    assert sorted(os.listdir(os.path.join(host, "etc"))) == ["one", "two"]
    with pytest.raises(OSError) as e:
        Path(host, "new").write_bytes(b"x")
    assert e.value.errno == errno.EROFS
    assert sn.stat(snapshot_key(CID, 0)).parent == image


@root_only
@pytest.mark.parametrize(("sub", "found"), [("etc", "etc"), ("etc/", "etc"), ("rel", "etc"),
                                            ("./etc/../etc", "etc"), (".", "")])
def test_sub_path_inside_the_image(sn: OverlaySnapshotter, image: str, tmp_path: Path,
                                   sub: str, found: str) -> None:
    bundle = str(tmp_path / "bundle")
    host = mount_image_volume(sn, container_id=CID, index=1, parent=image, bundle=bundle,
                              sub_path=sub, what="m")
    assert host == os.path.join(bundle, "image-volumes", "1", found).rstrip("/")


@root_only
@pytest.mark.parametrize(("sub", "error", "words"), [
    ("nope", NotFound, "does not exist in the image"),
    ("etc/nope/deeper", NotFound, "does not exist"),
    ("file", InvalidArgument, "is not a directory (only directories can be mounted)"),
    ("etc/one", InvalidArgument, "is not a directory"),
    ("..", InvalidArgument, "escapes the image's root"),
    ("etc/../..", InvalidArgument, "escapes"),
    ("/etc", InvalidArgument, "escapes"),
    ("abs", InvalidArgument, "escapes"),  # an absolute link: Go's os.Root refuses it too
    ("up", InvalidArgument, "escapes"),
])
def test_sub_path_refused(sn: OverlaySnapshotter, image: str, tmp_path: Path, sub: str,
                          error: type[Exception], words: str) -> None:
    bundle = str(tmp_path / "bundle")
    with pytest.raises(error, match=f"^m: image_sub_path {re.escape(repr(sub))} .*"
                                    f"{re.escape(words)}"):
        mount_image_volume(sn, container_id=CID, index=0, parent=image, bundle=bundle,
                           sub_path=sub, what="m")


@root_only
def test_removal_takes_only_the_containers_views(sn: OverlaySnapshotter, image: str,
                                                 tmp_path: Path) -> None:
    other = "d" * 64
    for cid, index, parent in ((CID, 0, image), (CID, 4, "l1"), (other, 0, image)):
        mount_image_volume(sn, container_id=cid, index=index, parent=parent,
                           bundle=str(tmp_path / cid), sub_path="", what="m")
    assert [i.key for i in sn.walk(prefix=f"image-volume/{CID}/")] == [
        snapshot_key(CID, 0), snapshot_key(CID, 4)]
    for mp in mnt.mounts_under(str(tmp_path / CID)):
        mnt.unmount(mp)
    assert sorted(remove_image_volumes(sn, CID)) == ["l1", "l2"]
    assert [i.key for i in sn.walk(prefix="image-volume/")] == [snapshot_key(other, 0)]
    assert remove_image_volumes(sn, CID) == []
    assert len(sn.walk()) == 3  # l1, l2 and the other container's view


def _generated_image_spec() -> Any:
    """An ImageSpec class with the real field 20, as a newer cri-api generates it."""
    fd = descriptor_pb2.FileDescriptorProto(name="imagespec_test.proto", package="t",
                                            syntax="proto3")
    msg = fd.message_type.add(name="ImageSpec")
    msg.field.add(name="image", number=1, type=9, label=1)
    msg.field.add(name="image_ref", number=IMAGE_REF, type=9, label=1)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("t.ImageSpec"))


def test_image_ref_is_field_20_on_the_wire_and_survives_copies() -> None:
    ref = "sha256:" + "ab" * 32
    cfg = pb.ContainerConfig(mounts=[pb.Mount(container_path="/v",
                                              image=pb.ImageSpec(image="busybox"))])
    assert image_ref(cfg.mounts[0].image) == ""
    set_image_ref(cfg.mounts[0].image, ref)
    stored = pb.ContainerConfig.FromString(cfg.SerializeToString())  # the record store
    status = pb.ContainerStatus(mounts=stored.mounts)
    copied = pb.ContainerStatus()
    copied.CopyFrom(status)
    assert image_ref(copied.mounts[0].image) == ref
    real = _generated_image_spec().FromString(copied.mounts[0].image.SerializeToString())
    assert (real.image, real.image_ref) == ("busybox", ref)
    assert real.SerializeToString() == copied.mounts[0].image.SerializeToString()
