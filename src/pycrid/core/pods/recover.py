"""Pods after a restart: reload the records, finish or undo what a crash interrupted,
keep a pod ready only if what stands for it still lives (and watch it again: the
pause's conmon, the pins), and (once the gate opened) CNI CHECK the networks of those
that survived."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence

from pycrid.core.containers import RECOVERY_CONCURRENCY
from pycrid.core.containers.remove import remove_locked
from pycrid.core.pods.pause_exit import lost
from pycrid.core.pods.pod_parts import PodParts, detach, not_ready
from pycrid.core.pods.remove import remove_rest
from pycrid.core.pods.stop import stop_locked
from pycrid.runtime.exits import Exit
from pycrid.runtime.interface import RuncState
from pycrid.sandbox.controller import SandboxState
from pycrid.store.records import PodPhase, SandboxRecord

log = logging.getLogger(__name__)

#: How many pods' networks recovery CHECKs at once.
_RECOVERY_CHECKS = 8


async def recover_pods(parts: PodParts, states: dict[str, RuncState],
                       submit: Callable[[Exit], None]) -> Sequence[str]:
    """Reload records (RECOVERY_CONCURRENCY at a time): undo interrupted creations,
    finish interrupted removals, and keep a pod ready only if its pause process lives
    (runc's view in ``states``; a pause exit found here goes to ``submit``) and its netns
    is still pinned. Returns the pods whose network ``check_networks`` should CHECK."""
    bound = asyncio.Semaphore(RECOVERY_CONCURRENCY)
    exited: set[str] = set()

    def exit_found(exit_: Exit) -> None:
        exited.add(exit_.id)
        submit(exit_)

    async def one(rec: SandboxRecord) -> None:
        async with bound:
            try:
                await _recover_one(parts, rec, states, exit_found)
            except Exception:
                log.exception("pod sandbox %s: recovery failed; marking it not ready",
                              rec.id)
                not_ready(parts, rec.id)

    await asyncio.gather(*(one(r) for r in parts.store.all()))
    return [r.id for r in parts.store.all() if r.ready and r.netns and r.id not in exited]


async def _recover_one(parts: PodParts, rec: SandboxRecord, states: dict[str, RuncState],
                       submit: Callable[[Exit], None]) -> None:
    if rec.creating:
        log.info("pod sandbox %s: undoing an interrupted creation", rec.id)
        for c in parts.containers.of_sandbox(rec.id):
            await remove_locked(parts.containers, c.id)
        await parts.controller.shutdown(rec.id)
        if rec.netns:
            await detach(parts, rec.id)
            await parts.network.remove_netns(rec.netns)
        parts.store.delete(rec.id)
        return
    parts.names.reserve(rec.name, rec.id)
    if rec.phase is PodPhase.REMOVING:
        log.info("pod sandbox %s: finishing an interrupted removal", rec.id)
        await stop_locked(parts, rec.id)
        await remove_rest(parts, rec)
        return
    status = parts.controller.recovered_status(rec.id, states)
    if status.exit is None and status.state is SandboxState.RUNNING:
        # Watched again: its pause's conmon (handled now if it died meanwhile), its pins.
        found = await parts.controller.watch(rec.id, functools.partial(lost, parts))
        if found is not None:
            status = dataclasses.replace(status, exit=found)
    if not rec.ready:
        return
    if status.exit is not None:
        submit(status.exit)  # handled after recovery, as a fresh exit
    elif status.state is not SandboxState.RUNNING:
        log.warning("pod sandbox %s: its %s gone", rec.id,
                    "pause process is" if rec.controller == "pause"
                    else "pinned namespaces are")
        not_ready(parts, rec.id)
    elif rec.netns and not parts.network.netns_pinned(rec.netns):
        log.warning("pod sandbox %s: network namespace %s is gone", rec.id, rec.netns)
        not_ready(parts, rec.id)


async def check_networks(parts: PodParts, ids: Sequence[str]) -> None:
    """CNI CHECK of pods that survived a restart (8 at a time); one whose network is
    broken stops being ready (a STOPPED event), as if its pause had died. Runs after
    the gate opened: CHECK costs a few plugin runs per pod, and a node with many pods
    should be serving again before they are all checked (containerd does not CHECK at
    all after a restart)."""
    bound = asyncio.Semaphore(_RECOVERY_CHECKS)
    await asyncio.gather(*(_check_network(parts, sid, bound) for sid in ids))


async def _check_network(parts: PodParts, sid: str, bound: asyncio.Semaphore) -> None:
    async with bound, parts.locks(sid).read():  # not while a stop or removal runs
        rec = parts.store.get(sid)
        if rec is None or not rec.ready:
            return
        problem = await parts.network.check(rec.id, rec.netns, rec.runtime_handler)
    if problem is not None:
        log.warning("pod sandbox %s: network CHECK failed, marking it not ready: %s",
                    sid, problem)
        not_ready(parts, sid)
