"""StartContainer: NRI's StartContainer, ``runc start`` (or, for a container created from a
checkpoint, its restore: restore.py), the record; a failed start is recorded as an exit,
as containerd records it."""

from __future__ import annotations

import asyncio

from cri_api.v1 import api_pb2 as pb

from pycrid.core import events
from pycrid.core.containers import restore
from pycrid.core.containers.create import create_options
from pycrid.core.containers.exited import finish
from pycrid.core.containers.parts import ContainerParts, now_ns, state_name
from pycrid.errors import FailedPrecondition
from pycrid.faults import failpoint
from pycrid.operations import detached
from pycrid.store.records import ContainerPhase


@detached("StartContainer")
async def start_container(parts: ContainerParts, prefix: str) -> None:
    async with parts.nri.blocking_sync():
        rec = parts.find(prefix)
        async with parts.locks(rec.id).write():
            done = parts.inflight.starting[rec.id] = asyncio.Event()
            try:
                await _start_locked(parts, rec.id)
            finally:
                del parts.inflight.starting[rec.id]
                done.set()


async def _start_locked(parts: ContainerParts, cid: str) -> None:
    rec = parts.current(cid)
    if rec.phase is not ContainerPhase.CREATED or rec.state != pb.CONTAINER_CREATED:
        raise FailedPrecondition(
            f"container {rec.id} is in {state_name(rec.state)} state, not created")
    sandbox = parts.sandboxes.get(rec.sandbox_id)
    if sandbox is None or not sandbox.ready:
        raise FailedPrecondition(f"pod sandbox {rec.sandbox_id} of container "
                                 f"{rec.id} is not ready")
    started = now_ns()
    pid = rec.pid
    try:
        failpoint("container.start")
        await parts.nri.start_container(rec)
        if rec.restore:
            failpoint("restore.restoring")
            pid = await parts.runtime.restore(create_options(parts, rec, sandbox),
                                              restore.images_of(parts, rec))
            failpoint("restore.restored")
        else:
            await parts.runtime.start(rec.id)
    except Exception as e:
        # containerd records a start failure as an exit with StartError, code 128.
        finish(parts, rec.id, now_ns(), 128, "StartError", str(e))
        await parts.runtime.delete(rec.id)
        raise
    # Killed here, recovery finds runc's container running and finishes the start.
    failpoint("container.started")
    restored = rec.restore
    rec = parts.store.update(rec.id, started_at=started, pid=pid, restore=False)
    if restored:
        await restore.forget_archive(parts, rec.id)
    parts.anchors.refresh(rec.sandbox_id)
    parts.events.emit(events.STARTED, rec.id, rec.sandbox_id)
    await parts.nri.post_start(rec)
