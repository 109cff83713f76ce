"""Unpack one layer blob, as it downloads, into a directory of its own.

Each layer is unpacked independently of the layers below it (so layers unpack side by
side while they download), the way containerd applies a layer to an overlay snapshot's
upper directory: decompressed here, applied safely by ``layer_tar`` (names resolved by
``layer_paths``, nothing outside the layer's own directory is ever touched).

A directory the layer's tar does not list but its entries need ("implicit") is made
on the spot. Once the layers below are committed it takes their metadata for that
directory (``inherit_dirs``); and when they show a symlink there instead (``lib ->
usr/lib`` in a merged-/usr image, written through by a later layer) or a file, the
layer is unpacked again from its verified blob with the layers below in view, so
names resolve through them as they would in the assembled image (``needs_lowers``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import IO, Any, cast

import zstandard
from isal import igzip

from pycrid.errors import DataLoss, InvalidArgument
from pycrid.images import mediatypes as oci
from pycrid.images.content import BlobReader
from pycrid.images.layer_paths import OVERLAY_XATTRS, is_real_dir_inside, lower_entry
from pycrid.images.layer_tar import CODEC_ERRORS, FilePlacer, apply_tar
from pycrid.images.tar_stream import CHUNK, TarStream

#: Layer types we unpack. The compression is then told by magic bytes, not by the
#: type, because registries are known to label gzip layers as plain tar and back.
LAYER_MEDIA_TYPES = frozenset({
    oci.MT_OCI_LAYER, oci.MT_OCI_LAYER_GZIP, oci.MT_OCI_LAYER_ZSTD,
    oci.MT_OCI_LAYER_NONDIST_GZIP, oci.MT_DOCKER_LAYER, oci.MT_DOCKER_LAYER_GZIP,
    "application/vnd.oci.image.layer.nondistributable.v1.tar",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
})


def check_layer_type(media_type: str) -> None:
    """Refuse a layer we could not unpack before anything of it is fetched."""
    if media_type and media_type not in LAYER_MEDIA_TYPES:
        raise InvalidArgument(f"unsupported layer media type {media_type!r}")


def _decompressed(raw: BlobReader) -> Any:
    """A reader of the uncompressed tar; the format is told by the stream's magic bytes.
    gzip goes through ISA-L (several times zlib's speed), zstd through libzstd."""
    head = raw.peek(4)[:4]
    if head[:2] == b"\x1f\x8b":
        return igzip.GzipFile(fileobj=cast(IO[bytes], raw), mode="rb")  # type: ignore[no-untyped-call]
    if head == b"\x28\xb5\x2f\xfd":
        return zstandard.ZstdDecompressor().stream_reader(
            cast(IO[bytes], raw), read_size=CHUNK, read_across_frames=True)
    return raw


@dataclass(frozen=True)
class Extracted:
    #: sha256 of the uncompressed tar (to compare with the config's diff id).
    diff_id: str
    #: Directories made only to hold entries, relative to the layer's root.
    implicit: tuple[str, ...]


def extract(raw: BlobReader, root: str, *, name: str, has_lower: bool,
            allow_device_nodes: bool, lowers: Sequence[str] = (),
            place: FilePlacer | None = None, verified: bool = False) -> Extracted:
    """Decompress and apply one layer blob (read as it downloads) onto its own directory
    ``root``; runs in a worker thread. ``name`` is the blob's digest (for messages).
    ``verified``: ``raw`` is that blob as the content store reads it, which checks it
    against ``name``, so an uncompressed layer's diff id is ``name`` and its tar is not
    hashed a second time; any other reader (a partial pull's rebuilt tar) is always
    hashed. ``place`` may put regular files in place itself (``apply_tar``)."""
    try:
        inner = _decompressed(raw)
        plain = verified and inner is raw
        reader = TarStream(inner, hashed=not plain)
        applied = apply_tar(root, reader, allow_device_nodes=allow_device_nodes,
                            has_lower=has_lower, lowers=lowers, place=place)
        reader.drain()  # tar padding after the end marker counts for the diff id
    except CODEC_ERRORS as e:
        raise DataLoss(f"layer {name} is corrupt: {e}") from None
    except DataLoss as e:
        raise DataLoss(f"layer {name}: {e}") from None
    real = os.path.realpath(root)
    diff_id = name if reader.hash is None else "sha256:" + reader.hash.hexdigest()
    return Extracted(diff_id, tuple(sorted(os.path.relpath(p, real) for p in applied.implicit)))


def needs_lowers(root: str, implicit: Iterable[str], lowers: Sequence[str]) -> bool:
    """True when a directory the layer made on its own stands where the layers below show
    a symlink or a file: unpacked with them in view, its entries land elsewhere (through
    the link) or are refused."""
    real = os.path.realpath(root)
    for rel in implicit:
        if not is_real_dir_inside(real, os.path.join(real, rel)):
            continue
        below = lower_entry(real, lowers, rel)
        if below is not None and not stat.S_ISDIR(below[1].st_mode):
            return True
    return False


def inherit_dirs(root: str, implicit: Iterable[str], lowers: Sequence[str]) -> None:
    """Give the directories a layer made only to hold its entries the owner, mode, times
    and xattrs the layers below (top first) show for them, as overlayfs copies a
    directory up (and containerd does); where they show none, 0755 root stays."""
    real = os.path.realpath(root)
    for rel in implicit:
        path = os.path.join(real, rel)
        if not is_real_dir_inside(real, path):
            continue
        below = lower_entry(real, lowers, rel)
        if below is None or not stat.S_ISDIR(below[1].st_mode):
            continue
        src, st = below
        os.lchown(path, st.st_uid, st.st_gid)
        os.chmod(path, stat.S_IMODE(st.st_mode))
        for attr in os.listxattr(src, follow_symlinks=False):
            if not attr.startswith(OVERLAY_XATTRS):
                os.setxattr(path, attr, os.getxattr(src, attr, follow_symlinks=False),
                            follow_symlinks=False)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
