"""Containers created from a checkpoint archive, started by restoring it.

CreateContainer whose image is the absolute path of a file is a restore: CRI-O's rule
(server/container_create.go: the image "is a file. Assuming it is a checkpoint
archive"), which containerd shared until 2.4 removed restore from CreateContainer. So
is one whose image is a checkpoint image: an archive made into a one-layer OCI image
(``checkpointctl build``, buildah) whose manifest carries the annotation
``org.criu.checkpoint.container.name`` (CRI-O's ``checkIfCheckpointOCIImage``;
containerd 2.3 looked for the same in its index): pulled like any image, it is how
the kubelet restores (KEP-2008). As both do, the create makes the container and the
start restores it (CRI-O's ``ContainerRestore`` at StartContainer, containerd 2.3's
``Restore`` mark):

- create: the archive's config.dump names the base image, which must be here; the
  container is made from the request (name, mounts, resources, log path) on that image
  in the new pod, the archive is unpacked into the container's directory, its rootfs
  changes go onto the new writable layer before it is mounted, and its log becomes the
  new container's log. Nothing runs yet.
- start: conmon runs ``runc restore`` on CRIU's images (CRI-O's RestoreContainer); the
  processes come back running, in the new pod's namespaces and cgroup. No ``runc start``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from dataclasses import dataclass
from typing import Any

from cri_api.v1 import api_pb2 as pb

from pycrid.core.containers.parts import ContainerParts
from pycrid.errors import FailedPrecondition, InvalidArgument, NotFound
from pycrid.runtime.checkpoint_archive import (
    CHECKPOINT_DIR,
    Manifest,
    copy_log,
    read_manifest,
    read_manifest_in_layers,
    unpack,
)
from pycrid.store.image_records import ImageRecord
from pycrid.store.records import ContainerRecord, SandboxRecord
from pycrid.tasks import stoppable_thread

#: containerd 2.3's annotations on a restored container (CRImportCheckpoint).
RESTORED = "restored"
CHECKPOINTED_AT = "checkpointedAt"
CHECKPOINT_IMAGE = "checkpointImage"
#: checkpointctl's CheckpointAnnotationName: what marks a checkpoint image.
CHECKPOINT_ANNOTATION = "org.criu.checkpoint.container.name"


def is_archive(image: str) -> bool:
    """An image that names a file: image references never start with a slash."""
    return image.startswith("/") and os.path.isfile(image)


def checkpoint_image(parts: ContainerParts, image: str) -> ImageRecord | None:
    """The local image ``image`` names, when it is a checkpoint image."""
    try:
        rec = parts.images.resolve_local(image)
    except InvalidArgument:
        return None
    if rec is None or not rec.chain:
        return None
    return rec if parts.images.annotated(rec, CHECKPOINT_ANNOTATION) else None


@dataclass(frozen=True)
class RestorePlan:
    #: The archive's path, or the checkpoint image's name.
    archive: str
    #: The request's config on the checkpoint's base image.
    config: pb.ContainerConfig
    manifest: Manifest
    #: A checkpoint image's top layer (its files are the archive's); "" for an archive.
    image_chain: str = ""


async def plan(parts: ContainerParts, config: pb.ContainerConfig,
               sandbox: SandboxRecord) -> RestorePlan | None:
    """None when the config's image is no checkpoint; else read the archive's (or the
    checkpoint image's) metadata and make the container's config, before any side
    effect: a refusal leaves nothing."""
    archive = config.image.image
    from_file = is_archive(archive)
    image = None if from_file else checkpoint_image(parts, archive)
    if image is None and not from_file:
        return None
    why = parts.runtime.checkpoint_refusal(sandbox.runtime_handler)
    if why is not None:
        raise FailedPrecondition(f"cannot restore {archive} in pod sandbox {sandbox.id}: {why}")
    opts = sandbox.config.linux.security_context.namespace_options
    if opts.HasField("userns_options") and opts.userns_options.mode == pb.POD:
        raise FailedPrecondition(
            f"cannot restore {archive} in pod sandbox {sandbox.id}: the pod has its own user "
            "namespace, and restoring into one is not supported (CRIU runs the restore as "
            "the container's root, which cannot read the images, and runc 1.5.1 with "
            "CRIU 4.2 failed to remount /sys there)")
    chain = image.chain[-1] if image is not None else ""
    if chain:
        layers = parts.bundles.image_layers(chain)
        manifest = await asyncio.to_thread(read_manifest_in_layers, layers, archive)
    else:
        manifest = await asyncio.to_thread(read_manifest, archive)
    dumped = manifest.config
    names = [str(dumped.get(k) or "") for k in ("rootfsImageRef", "rootfsImageName",
                                                 "rootfsImage")]
    base = next((n for n in names if n and _present(parts, n)), None)
    if base is None:
        shown = next((n for n in names if n), "")
        raise NotFound(f"the base image {shown!r} of checkpoint {archive} is not present: "
                       "pull it first" if shown else
                       f"checkpoint {archive}: config.dump names no base image")
    new = pb.ContainerConfig()
    new.CopyFrom(config)
    new.image.image = base  # its digest when the archive has it: the very same image
    new.image.user_specified_image = str(dumped.get("rootfsImage") or base)
    if not new.command and not new.args:
        # What ran (CRIU brings it back; the spec only has to name it).
        new.command.extend(str(a) for a in (manifest.spec.get("process") or {}).get("args")
                           or [])
    new.annotations[RESTORED] = "true"
    new.annotations[CHECKPOINTED_AT] = str(dumped.get("checkpointedTime") or "")
    new.annotations[CHECKPOINT_IMAGE] = archive
    return RestorePlan(archive=archive, config=new, manifest=manifest, image_chain=chain)


def _present(parts: ContainerParts, ref: str) -> bool:
    try:
        return parts.images.resolve_local(ref) is not None
    except InvalidArgument:
        return False


async def unpack_archive(parts: ContainerParts, cid: str, restore: RestorePlan) -> str:
    """The archive, unpacked into the container's restore directory (removed with the
    container); that directory."""
    dest = parts.paths.restore(cid)

    def run(stop: Any) -> None:
        shutil.rmtree(dest, ignore_errors=True)
        os.makedirs(dest, mode=0o700)
        if not restore.image_chain:
            unpack(restore.archive, dest, stop)

    await stoppable_thread(run)
    if restore.image_chain:
        await parts.bundles.copy_image(cid, restore.image_chain, dest)
    return dest


def _binds(spec: dict[str, Any]) -> set[str]:
    return {str(m.get("destination")) for m in spec.get("mounts") or []
            if m.get("type") == "bind" or "bind" in (m.get("options") or ())
            or "rbind" in (m.get("options") or ())}


def _shares_pid(spec: dict[str, Any]) -> bool:
    return any(ns.get("type") == "pid" and ns.get("path")
               for ns in (spec.get("linux") or {}).get("namespaces") or [])


def check_compatible(restore: RestorePlan, spec: dict[str, Any]) -> None:
    """What CRIU cannot bridge, said before it tries: every bind mount it dumped needs a
    source again (CRI-O's "expects following bind mounts defined"), and a process that
    lived in its pod's PID namespace needs a pod that shares one."""
    dumped = restore.manifest.spec
    missing = sorted(_binds(dumped) - _binds(spec))
    if missing:
        raise InvalidArgument(f"restoring {restore.archive} needs the bind mounts its "
                              f"container had, which this request lacks: {', '.join(missing)}")
    if _shares_pid(dumped) != _shares_pid(spec):
        had = "shared" if _shares_pid(dumped) else "did not share"
        raise InvalidArgument(
            f"restoring {restore.archive}: its pod {had} a PID namespace among its "
            "containers (namespace_options.pid POD), and the new pod must do the same")


async def restore_log(parts: ContainerParts, cid: str, log_path: str) -> None:
    """The log so far, from the archive (when it has one), continued by the restored
    container's conmon (which appends)."""
    await asyncio.to_thread(copy_log, parts.paths.restore(cid), log_path)


def forget_log(log_path: str) -> None:
    """Undo of ``restore_log`` (a create that fails after it made the log)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(log_path)


def images_of(parts: ContainerParts, rec: ContainerRecord) -> str:
    """CRIU's images of a container created from a checkpoint."""
    return os.path.join(parts.paths.restore(rec.id), CHECKPOINT_DIR)


async def forget_archive(parts: ContainerParts, cid: str) -> None:
    """Once restored, the unpacked archive goes (containerd removes its restore dir)."""
    await asyncio.to_thread(shutil.rmtree, parts.paths.restore(cid), True)
