"""RemovePodSandbox: stop the pod, mark it as being removed (so a crash half-way is
finished by recovery), then remove its containers, its sandbox, its network and its
record. Idempotent: a pod already gone is no error."""

from __future__ import annotations

from pycrid.core import events
from pycrid.core.containers.remove import remove_locked
from pycrid.core.pods.pod_parts import PodParts, detach
from pycrid.core.pods.stop import stop_locked
from pycrid.errors import NotFound
from pycrid.faults import failpoint
from pycrid.operations import detached
from pycrid.store.records import PodPhase, SandboxRecord


@detached("RemovePodSandbox")
async def remove_pod(parts: PodParts, prefix: str) -> None:
    try:
        rec = parts.find(prefix)
    except NotFound:
        return
    async with parts.nri.blocking_sync(), parts.locks(rec.id).write():
        await stop_locked(parts, rec.id)
        parts.store.update(rec.id, phase=PodPhase.REMOVING)
        await remove_rest(parts, rec)


async def remove_rest(parts: PodParts, rec: SandboxRecord) -> None:
    """Everything after the stop, for a pod marked REMOVING (also by recovery)."""
    for c in parts.containers.of_sandbox(rec.id):
        async with parts.locks(c.id).write():
            await remove_locked(parts.containers, c.id)
    failpoint("sandbox.remove")
    released = await parts.controller.shutdown(rec.id)
    failpoint("sandbox.shutdown")
    if rec.netns:
        await detach(parts, rec.id)
        await parts.network.remove_netns(rec.netns)
    parts.store.delete(rec.id)
    parts.names.release(rec.name)
    parts.locks.drop(rec.id)
    parts.events.emit(events.DELETED, rec.id, rec.id)
    await parts.nri.remove_pod(rec.id)
    await parts.images.release(released)
