"""RemoveContainer, and ``cleanup``: every trace of a container but its record, which
the undo of a failed create, recovery and the orphan sweep use too."""

from __future__ import annotations

from cri_api.v1 import api_pb2 as pb

from pycrid.core import events
from pycrid.core.containers.parts import ContainerParts
from pycrid.core.containers.stop import stop_locked
from pycrid.errors import NotFound
from pycrid.faults import failpoint
from pycrid.operations import detached
from pycrid.store.records import ContainerPhase


@detached("RemoveContainer")
async def remove_container(parts: ContainerParts, prefix: str) -> None:
    try:
        rec = parts.find(prefix)
    except NotFound:
        return
    async with parts.nri.blocking_sync(), parts.locks(rec.id).write():
        await remove_locked(parts, rec.id)


async def remove_locked(parts: ContainerParts, cid: str) -> None:
    rec = parts.store.get(cid)
    if rec is None:
        return
    if rec.state in (pb.CONTAINER_RUNNING, pb.CONTAINER_UNKNOWN):
        await stop_locked(parts, cid, 0)
    parts.store.update(cid, phase=ContainerPhase.REMOVING)
    parts.sessions.end(cid, f"container {cid} was removed")
    failpoint("container.remove")
    await cleanup(parts, cid)
    failpoint("container.cleaned")
    parts.store.delete(cid)
    parts.names.release(rec.name)
    parts.inflight.forget(cid)
    parts.locks.drop(cid)
    parts.events.emit(events.DELETED, cid, rec.sandbox_id)
    await parts.nri.remove_container(cid)


async def cleanup(parts: ContainerParts, cid: str) -> None:
    """Every trace of a container but its record and log (idempotent). The image chains
    its snapshots were built on are collected if no image holds them any more."""
    await parts.runtime.delete(cid)
    released = await parts.bundles.remove(cid)
    parts.runtime.forget_exit(cid)
    await parts.images.release(released)
