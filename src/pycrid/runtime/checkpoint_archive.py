"""The checkpoint archive: the layout checkpointctl reads, and containerd and CRI-O write.

A plain tar (containerd's ``archive.Diff`` of its checkpoint directory, CRI-O's
``exportCheckpoint``) holding, by checkpointctl's names (lib/metadata.go):

- ``checkpoint/``: CRIU's images (``inventory.img``, ``pages-*.img``, ...);
- ``dump.log``, ``stats-dump``: CRIU's log and statistics (runc's work path);
- ``config.dump``: checkpointctl's ContainerConfig (id, name, base image, runtime, times);
- ``spec.dump``: the container's OCI spec (its ``io.kubernetes.cri.*`` annotations are
  how checkpointctl tells a containerd-style archive and finds pod and container names);
- ``status.dump``: the CRI ContainerStatus as JSON (containerd);
- ``status``: containerd's own status record (checkpointctl's ContainerdStatus);
- ``container.log``: the container's CRI log so far;
- ``rootfs-diff.tar``, ``deleted.files``: the writable layer (``rootfs_diff.py``).

It holds every memory page of the processes, so it is written mode 0600 (both do), to a
temporary file beside ``location`` that is renamed over it once complete and synced:
a failed or cancelled checkpoint leaves no archive, whole or half.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import secrets
import shutil
import stat
import tarfile
import threading
from dataclasses import dataclass
from typing import Any

from pycrid.errors import Aborted, DataLoss, InvalidArgument
from pycrid.images.layer_paths import clean_name, lower_entry

CHECKPOINT_DIR = "checkpoint"
INVENTORY = "inventory.img"
CONFIG_DUMP = "config.dump"
SPEC_DUMP = "spec.dump"
STATUS_DUMP = "status.dump"
CONTAINERD_STATUS = "status"
CONTAINER_LOG = "container.log"
_MAX_JSON = 32 << 20
_CHUNK = 1 << 20


def go_time(ns: int) -> str:
    """A Go ``time.Time`` as encoding/json writes it (RFC 3339, nanoseconds, UTC); Go's
    zero time for 0."""
    if ns <= 0:
        return "0001-01-01T00:00:00Z"
    secs, frac = divmod(ns, 1_000_000_000)
    base = datetime.datetime.fromtimestamp(secs, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return base + (f".{frac:09d}".rstrip("0") if frac else "") + "Z"


@dataclass(frozen=True)
class ArchiveConfig:
    """config.dump (checkpointctl's ContainerConfig, as containerd fills it)."""

    id: str
    name: str
    #: ContainerStatus.image.image, image_ref, and the name the user asked for.
    rootfs_image_name: str
    rootfs_image_ref: str
    rootfs_image: str
    #: The pod's runtime handler (CRI-O writes the handler; containerd its shim's name).
    runtime: str
    created_ns: int
    checkpointed_ns: int

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "rootfsImage": self.rootfs_image,
                "rootfsImageRef": self.rootfs_image_ref,
                "rootfsImageName": self.rootfs_image_name, "runtime": self.runtime,
                "createdTime": go_time(self.created_ns),
                "checkpointedTime": go_time(self.checkpointed_ns),
                "restoredTime": go_time(0), "restored": False}


@dataclass(frozen=True)
class ArchiveMetadata:
    """What the daemon writes beside CRIU's files."""

    config: ArchiveConfig
    spec: dict[str, Any]
    #: The CRI ContainerStatus as JSON (the CRI edge makes it).
    status_dump: bytes
    #: containerd's status record: CreatedAt, StartedAt, FinishedAt, ExitCode, Pid, ...
    containerd_status: dict[str, Any]


def write_metadata(dest: str, meta: ArchiveMetadata) -> None:
    def dump(name: str, data: bytes) -> None:
        fd = os.open(os.path.join(dest, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)

    dump(CONFIG_DUMP, json.dumps(meta.config.to_json()).encode())
    dump(SPEC_DUMP, json.dumps(meta.spec).encode())
    dump(STATUS_DUMP, meta.status_dump)
    dump(CONTAINERD_STATUS, json.dumps(meta.containerd_status).encode())


def save_log(log_path: str, dest: str) -> None:
    """The container's CRI log so far, taken while it is frozen (as CRI-O does), so that
    the restored process goes on from the log's last line and does not repeat it."""
    if log_path:
        with contextlib.suppress(FileNotFoundError):
            shutil.copyfile(log_path, os.path.join(dest, CONTAINER_LOG), follow_symlinks=False)


def pack(src: str, location: str, stop: threading.Event | None = None) -> int:
    """The tar of everything under ``src`` (directories first, names relative), written
    beside ``location`` and renamed over it when complete; its size."""
    tmp = os.path.join(os.path.dirname(location),
                       f".{os.path.basename(location)}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tf:
                for dirpath, dirs, files in os.walk(src):
                    dirs.sort()
                    for name in [*dirs, *sorted(files)]:
                        if stop is not None and stop.is_set():
                            raise Aborted("writing the checkpoint archive was stopped")
                        path = os.path.join(dirpath, name)
                        info = tf.gettarinfo(path, arcname=os.path.relpath(path, src))
                        info.uname = info.gname = ""
                        if info.isreg():
                            with open(path, "rb") as f:
                                tf.addfile(info, f)
                        else:
                            tf.addfile(info)
            out.flush()
            os.fsync(out.fileno())
            size = out.tell()
        os.replace(tmp, location)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return size


@dataclass(frozen=True)
class Manifest:
    """What a restore needs to know of an archive before unpacking it."""

    config: dict[str, Any]
    spec: dict[str, Any]


def _open(archive: str) -> tarfile.TarFile:
    try:
        return tarfile.open(archive, mode="r:*")
    except (OSError, tarfile.TarError) as e:
        raise InvalidArgument(f"{archive} is not a checkpoint archive (not a readable "
                              f"tar: {e})") from None


def read_manifest(archive: str) -> Manifest:
    """config.dump and spec.dump of ``archive``, checking that CRIU's images are there."""
    found: dict[str, Any] = {}
    has_images = False
    with _open(archive) as tf:
        try:
            for info in tf:
                name = clean_name(info.name)
                if name == f"{CHECKPOINT_DIR}/{INVENTORY}" and info.isreg():
                    has_images = True
                if name in (CONFIG_DUMP, SPEC_DUMP) and info.isreg():
                    found[name] = _json_member(tf, info, archive)
        except tarfile.TarError as e:
            raise DataLoss(f"checkpoint archive {archive} is corrupt: {e}") from None
    missing = [n for n in (CONFIG_DUMP, SPEC_DUMP) if n not in found]
    if not has_images:
        missing.append(f"{CHECKPOINT_DIR}/{INVENTORY}")
    if missing:
        raise InvalidArgument(f"{archive} is not a checkpoint archive: it has no "
                              f"{', '.join(missing)}")
    return Manifest(config=found[CONFIG_DUMP], spec=found[SPEC_DUMP])


def read_manifest_in_layers(layers: list[str], what: str) -> Manifest:
    """The same, of a checkpoint image (an archive unpacked as an image's layers, top
    first): its files are looked up as overlayfs shows them."""
    found: dict[str, Any] = {}
    for name in (CONFIG_DUMP, SPEC_DUMP):
        entry = _lookup(layers, name)
        if entry is None or not stat.S_ISREG(entry[1].st_mode):
            continue
        if entry[1].st_size > _MAX_JSON:
            raise InvalidArgument(f"{what}: {name} is larger than {_MAX_JSON} bytes")
        with open(entry[0], "rb") as f:
            found[name] = _json_doc(f.read(), what, name)
    inventory = _lookup(layers, f"{CHECKPOINT_DIR}/{INVENTORY}")
    missing = [n for n in (CONFIG_DUMP, SPEC_DUMP) if n not in found]
    if inventory is None:
        missing.append(f"{CHECKPOINT_DIR}/{INVENTORY}")
    if missing:
        raise InvalidArgument(f"{what} is not a checkpoint image: it has no "
                              f"{', '.join(missing)}")
    return Manifest(config=found[CONFIG_DUMP], spec=found[SPEC_DUMP])


def _lookup(layers: list[str], rel: str) -> tuple[str, os.stat_result] | None:
    # Nothing lies above the layers: the upper root given is one that cannot exist.
    return lower_entry(os.devnull, layers, rel)


def _json_doc(data: bytes, archive: str, name: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise InvalidArgument(f"{archive}: {name} is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise InvalidArgument(f"{archive}: {name} is not a JSON object")
    return doc


def copy_files(src: str, dest: str, stop: threading.Event | None = None) -> None:
    """Regular files and directories of the tree ``src`` (a checkpoint image's mounted
    view) into ``dest``, by the same rule as ``unpack``."""
    for dirpath, dirs, files in os.walk(src):
        rel_dir = os.path.relpath(dirpath, src)
        for name in dirs:
            if not os.path.islink(os.path.join(dirpath, name)):
                os.makedirs(os.path.join(dest, rel_dir, name), mode=0o700, exist_ok=True)
        for name in files:
            if stop is not None and stop.is_set():
                raise Aborted("copying the checkpoint image was stopped")
            path = os.path.join(dirpath, name)
            if stat.S_ISREG(os.lstat(path).st_mode):
                shutil.copyfile(path, os.path.join(dest, rel_dir, name), follow_symlinks=False)


def _json_member(tf: tarfile.TarFile, info: tarfile.TarInfo, archive: str) -> dict[str, Any]:
    if info.size > _MAX_JSON:
        raise InvalidArgument(f"{archive}: {info.name} is larger than {_MAX_JSON} bytes")
    f = tf.extractfile(info)
    assert f is not None
    return _json_doc(f.read(), archive, info.name)


def unpack(archive: str, dest: str, stop: threading.Event | None = None) -> None:
    """Regular files and directories of ``archive`` into ``dest`` (names kept inside it);
    anything else (links, devices) is skipped, as containerd's restore does: the
    checkpoint code writes none."""
    real = os.path.realpath(dest)
    with _open(archive) as tf:
        try:
            for info in tf:
                if stop is not None and stop.is_set():
                    raise Aborted("unpacking the checkpoint archive was stopped")
                name = clean_name(info.name)
                if not name or not (info.isreg() or info.isdir()):
                    continue
                path = os.path.join(real, name)
                _make_parents(real, os.path.dirname(name))
                if info.isdir():
                    if not os.path.isdir(path):
                        os.mkdir(path, 0o700)
                    continue
                src = tf.extractfile(info)
                assert src is not None
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as out:
                    shutil.copyfileobj(src, out, _CHUNK)
        except tarfile.TarError as e:
            raise DataLoss(f"checkpoint archive {archive} is corrupt: {e}") from None
        except FileExistsError as e:
            raise DataLoss(f"checkpoint archive {archive} lists {e.filename} twice") from None


def _make_parents(root: str, rel_dir: str) -> None:
    """Make ``rel_dir`` under ``root``; every component must be a real directory (this
    code makes no links, so one there would mean the tree changed under it)."""
    current = root
    for comp in filter(None, rel_dir.split("/")):
        current = os.path.join(current, comp)
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            os.mkdir(current, 0o700)
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise DataLoss(f"checkpoint archive: {rel_dir} is not a directory")


def copy_log(src_dir: str, log_path: str) -> bool:
    """The archive's container.log as the new container's log, when both are there
    (containerd copies it at create, CRI-O at start); whether it did."""
    src = os.path.join(src_dir, CONTAINER_LOG)
    if not log_path or not os.path.isfile(src) or os.path.islink(src):
        return False
    os.makedirs(os.path.dirname(log_path), mode=0o755, exist_ok=True)
    shutil.copyfile(src, log_path, follow_symlinks=False)
    return True
