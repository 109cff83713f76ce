"""CheckpointContainer: a running container's processes (CRIU, through runc), writable
layer, spec, status and log in one archive at ``location``; the container keeps running.

The order is containerd's (client/task.go ``Checkpoint``, internal/cri/server/
container_checkpoint_linux.go) and CRI-O's (internal/lib/checkpoint.go): freeze the
container, so that its files and its memory are of one instant; CRIU dumps it and leaves
it running, still frozen; the writable layer is diffed; it is thawed whatever happened.
Then the metadata files checkpointctl reads, and the archive, written beside
``location`` and renamed over it once whole. ``timeout`` bounds all of it: a checkpoint
cut short leaves the container thawed and no archive, whole or half.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections.abc import Callable

from cri_api.v1 import api_pb2 as pb

from pycrid.core.containers.parts import ContainerParts, state_name
from pycrid.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument
from pycrid.faults import failpoint
from pycrid.operations import finish
from pycrid.runtime.checkpoint_archive import (
    CHECKPOINT_DIR,
    ArchiveConfig,
    ArchiveMetadata,
    pack,
    save_log,
    write_metadata,
)
from pycrid.runtime.interface import CheckpointPaths
from pycrid.store.records import ContainerRecord
from pycrid.tasks import stoppable_thread

log = logging.getLogger(__name__)

#: The CRI ContainerStatus of a record as JSON (status.dump): the CRI edge knows how.
StatusDump = Callable[[ContainerRecord], bytes]


def _check_location(location: str) -> None:
    if not location:
        raise InvalidArgument("location must name the checkpoint archive to write")
    if not os.path.isabs(location):
        raise InvalidArgument(f"location {location!r} must be an absolute path")
    parent = os.path.dirname(location)
    if not os.path.isdir(parent):
        raise InvalidArgument(f"location {location!r}: directory {parent} does not exist")
    if os.path.isdir(location):
        raise InvalidArgument(f"location {location!r} is a directory")


async def checkpoint_container(parts: ContainerParts, prefix: str, location: str,
                               limit_s: int, status_dump: StatusDump) -> int:
    """Checkpoint the container ``prefix`` names into ``location``; the archive's size.
    ``limit_s``: the request's timeout in seconds (0: none but the caller's deadline)."""
    _check_location(location)
    started = time.monotonic()
    try:
        # No NRI sync lock: a checkpoint tells plugins nothing and changes no object, and
        # holding it for a long dump would hold every other call behind a syncing plugin.
        async with asyncio.timeout(limit_s if limit_s > 0 else None):
            rec = parts.find(prefix)
            async with parts.locks(rec.id).write():
                size = await _checkpoint_locked(parts, rec.id, location, status_dump)
    except TimeoutError:
        raise DeadlineExceeded(f"checkpoint of container {prefix} did not finish within "
                               f"{limit_s}s; the container runs on, no archive was "
                               "written") from None
    log.info("checkpointed container %s to %s (%d bytes) in %.0f ms", rec.id, location, size,
             (time.monotonic() - started) * 1000)
    return size


async def _checkpoint_locked(parts: ContainerParts, cid: str, location: str,
                             status_dump: StatusDump) -> int:
    rec = parts.current(cid)
    sandbox = parts.sandboxes.get(rec.sandbox_id)
    handler = sandbox.runtime_handler if sandbox is not None else ""
    why = parts.runtime.checkpoint_refusal(handler)
    if why is not None:
        raise FailedPrecondition(f"container {cid} cannot be checkpointed: {why}")
    if rec.state != pb.CONTAINER_RUNNING:
        raise FailedPrecondition(f"container {cid} is in {state_name(rec.state)} state; only "
                                 "running containers can be checkpointed")
    work = parts.paths.checkpoint(cid)
    await asyncio.to_thread(_fresh_dir, work)
    try:
        await _dump(parts, rec, work)
        meta = ArchiveMetadata(
            config=ArchiveConfig(
                id=cid, name=rec.name, rootfs_image_name=rec.image_name,
                rootfs_image_ref=rec.image_ref,
                rootfs_image=rec.config.image.user_specified_image or rec.config.image.image,
                runtime=handler or parts.default_handler, created_ns=rec.created_at,
                checkpointed_ns=time.time_ns()),
            spec=parts.bundles.read_spec(cid), status_dump=status_dump(rec),
            containerd_status={"CreatedAt": rec.created_at, "StartedAt": rec.started_at,
                               "FinishedAt": 0, "ExitCode": 0, "Pid": rec.pid,
                               "Reason": "", "Message": ""})
        await asyncio.to_thread(write_metadata, work, meta)
        return await stoppable_thread(lambda stop: pack(work, location, stop))
    finally:
        await asyncio.shield(asyncio.to_thread(shutil.rmtree, work, True))


async def _dump(parts: ContainerParts, rec: ContainerRecord, work: str) -> None:
    """Freeze, CRIU's dump, the writable layer's diff and the log, thaw (also when a step
    fails or the deadline cuts it short)."""
    cid = rec.id
    try:
        # runc pause and resume run whole (a cancel lands after them): a freeze cut short
        # would otherwise never be thawed.
        await finish(parts.runtime.pause(cid))
        # Killed while it is frozen, recovery thaws it (containers/recover.py).
        failpoint("container.frozen")
        await parts.runtime.checkpoint(
            cid, CheckpointPaths(images=os.path.join(work, CHECKPOINT_DIR), work=work))
        await parts.bundles.rootfs_diff(cid, work)
        await asyncio.to_thread(save_log, rec.log_path, work)
        failpoint("container.dumped")
    except BaseException:
        try:
            await finish(parts.runtime.resume(cid))
        except Exception:
            log.exception("container %s: thawing it after a failed checkpoint failed", cid)
        raise
    await finish(parts.runtime.resume(cid))


def _fresh_dir(path: str) -> None:
    """An empty ``path`` (a killed daemon's leftover is removed first, as containerd
    removes its ``ctrd-checkpoint`` before each checkpoint)."""
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path, mode=0o700)
