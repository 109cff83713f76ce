"""StopContainer (CRI-TO-OCI.md §4), and an NRI plugin's eviction, which is a stop."""

from __future__ import annotations

import signal

from cri_api.v1 import api_pb2 as pb

from pycrid.core.containers.exited import record_exit
from pycrid.core.containers.parts import ContainerParts, now_ns
from pycrid.errors import DeadlineExceeded, NotFound
from pycrid.faults import failpoint
from pycrid.operations import detached
from pycrid.runtime.exits import Exit
from pycrid.runtime.interface import RuncStatus

#: How long to wait for an exit after SIGKILL before calling the container lost.
KILL_WAIT = 30.0


@detached("StopContainer")
async def stop_container(parts: ContainerParts, prefix: str, grace: float) -> None:
    """CRI-TO-OCI.md §4: unknown id or not running is success; signal, wait, SIGKILL."""
    try:
        rec = parts.find(prefix)
    except NotFound:
        return
    async with parts.nri.blocking_sync(), parts.locks(rec.id).write():
        await stop_locked(parts, rec.id, grace)


async def stop_locked(parts: ContainerParts, cid: str, grace: float) -> None:
    """Stop the process, then tell NRI (once per container, also for one that had
    already exited on its own)."""
    await _stop_process(parts, cid, grace)
    rec = parts.store.get(cid)
    if rec is not None and rec.finished_at:
        await parts.nri.stop_container(cid)


async def _stop_process(parts: ContainerParts, cid: str, grace: float) -> None:
    rec = parts.store.get(cid)
    if rec is None or rec.state not in (pb.CONTAINER_RUNNING, pb.CONTAINER_UNKNOWN):
        return
    if grace > 0:
        if cid not in parts.inflight.stop_signalled:
            parts.inflight.stop_signalled.add(cid)
            await parts.runtime.kill(cid, signal.Signals[rec.stop_signal].value)
            failpoint("container.signalled")
        exit_ = await parts.waiters.wait(cid, grace)
        if exit_ is not None:
            record_exit(parts, exit_)
            return
    await parts.runtime.kill(cid, signal.SIGKILL)
    failpoint("container.killed")
    exit_ = await parts.waiters.wait(cid, KILL_WAIT)
    if exit_ is None:
        state = await parts.runtime.state(cid)
        if state is not None and state.status is not RuncStatus.STOPPED:
            raise DeadlineExceeded(f"container {cid} did not exit {KILL_WAIT:.0f}s "
                                   "after SIGKILL")
        exit_ = Exit(cid, 255, now_ns(), reason="Unknown")
    record_exit(parts, exit_)


async def evict(parts: ContainerParts, cid: str, reason: str) -> None:
    """An NRI plugin's eviction: stop the container at once; its status says
    ``Evicted`` with the plugin's reason (upstream drops evictions)."""
    async with parts.nri.blocking_sync():
        if parts.store.get(cid) is None:
            return
        async with parts.locks(cid).write():
            rec = parts.store.get(cid)
            if rec is None or rec.state not in (pb.CONTAINER_RUNNING,
                                                pb.CONTAINER_UNKNOWN):
                return
            parts.inflight.evicted[cid] = reason
            await stop_locked(parts, cid, 0)
