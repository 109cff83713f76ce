"""StopPodSandbox (§4): every container killed, then the pause, then /dev/shm and the
netns. Idempotent: a pod already stopped, or gone, is no error."""

from __future__ import annotations

from pycrid.core.containers import stop as container_stop
from pycrid.core.pods.pod_parts import PodParts, detach, not_ready
from pycrid.errors import NotFound
from pycrid.faults import failpoint
from pycrid.operations import detached


@detached("StopPodSandbox")
async def stop_pod(parts: PodParts, prefix: str) -> None:
    try:
        rec = parts.find(prefix)
    except NotFound:
        return
    async with parts.nri.blocking_sync(), parts.locks(rec.id).write():
        await stop_locked(parts, rec.id)


async def stop_locked(parts: PodParts, sid: str) -> None:
    """The stop itself, under the pod's write lock (RemovePodSandbox and recovery stop a
    pod too)."""
    containers = parts.containers
    for c in containers.of_sandbox(sid):
        async with parts.locks(c.id).write():
            await container_stop.stop_locked(containers, c.id, 0)
    await parts.nri.stop_pod(sid)
    failpoint("sandbox.stop")
    parts.stopping.add(sid)
    try:
        await parts.controller.stop(sid)
    finally:
        parts.stopping.discard(sid)
    not_ready(parts, sid)  # the pause is dead: before the network goes, not after
    failpoint("sandbox.stopped")
    rec = parts.store.get(sid)
    if rec is not None and rec.netns:
        await detach(parts, sid)
        failpoint("sandbox.detached")
        await parts.network.remove_netns(rec.netns)
