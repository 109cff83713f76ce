"""What a container's exit changes: its record (once, with the reason), its pod's
anchor, the CRI event, its sessions, NRI's StopContainer and the runc container.

Exits come from the exit watcher (``parts.waiters``, at once) and the exit monitor
(``handle_exit``, in order, retried if it raises); a stop records the exit it waited
for itself."""

from __future__ import annotations

from pycrid.core import events
from pycrid.core.containers.parts import ContainerParts
from pycrid.faults import failpoint
from pycrid.runtime.exits import Exit


async def handle_exit(parts: ContainerParts, exit_: Exit) -> None:
    """From the exit monitor (retried if it raises): record the exit, then NRI's
    StopContainer (once per container, whoever stops it first)."""
    if (starting := parts.inflight.starting.get(exit_.id)) is not None:
        await starting.wait()  # the start's record, event and NRI hooks come first
    if parts.store.get(exit_.id) is None:
        return  # removed meanwhile
    failpoint("exit.handle")
    record_exit(parts, exit_)
    await parts.nri.container_exited(exit_.id)
    # The runc container is done with once its exit is recorded (the OOM check read its
    # cgroup): delete it now, as containerd deletes a task when it exits, so that
    # RemoveContainer has no runc to run.
    async with parts.locks(exit_.id).write():
        if parts.store.get(exit_.id) is not None:
            await parts.runtime.delete(exit_.id)


def record_exit(parts: ContainerParts, exit_: Exit) -> None:
    """The exit in the record, once: reason OOMKilled when conmon saw the cgroup's OOM
    event (memory.oom_control on v1, memory.events on v2), Evicted for an NRI
    eviction, the exit's own (Unknown), else Completed or Error (also for code 255 of a
    container whose conmon died, as containerd says for a dead shim)."""
    rec = parts.store.get(exit_.id)
    if rec is None or rec.finished_at:
        return
    reason, message = exit_.reason, exit_.message
    if rec.id in parts.inflight.evicted:
        reason, message = "Evicted", parts.inflight.evicted[rec.id]
    elif not reason and exit_.code == 137 and parts.runtime.oom_killed(
            parts.paths.bundle(exit_.id)):
        reason = "OOMKilled"
    if not reason:
        reason = "Completed" if exit_.code == 0 else "Error"
    finish(parts, rec.id, exit_.at_ns, exit_.code, reason, message)


def finish(parts: ContainerParts, cid: str, at_ns: int, code: int, reason: str,
           message: str) -> None:
    rec = parts.store.update(cid, finished_at=at_ns, exit_code=code, reason=reason,
                             message=message, pid=0)
    parts.anchors.refresh(rec.sandbox_id)
    parts.events.emit(events.STOPPED, cid, rec.sandbox_id)
    parts.sessions.end(cid, f"container {cid} exited with {code}")
