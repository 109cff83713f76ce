"""Start-up recovery of containers: finish or undo what a killed daemon left half done,
then reconcile each record with runc's view and conmon's exit file, and watch each live
container's conmon again (one found dead has its container killed and its exit
recorded)."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Callable

from pycrid.core import events
from pycrid.core.containers import restore
from pycrid.core.containers.parts import RECOVERY_CONCURRENCY, ContainerParts, now_ns
from pycrid.core.containers.remove import cleanup
from pycrid.runtime.exits import Exit
from pycrid.runtime.interface import RuncState, RuncStatus
from pycrid.store.records import ContainerPhase, ContainerRecord

log = logging.getLogger(__name__)


async def recover_containers(parts: ContainerParts, states: dict[str, RuncState],
                             submit: Callable[[Exit], None]) -> None:
    """Reload records (RECOVERY_CONCURRENCY at a time): finish or undo half-done work,
    then reconcile each with runc's view (``states``, from one ``runc list``) and
    conmon's exit file. Exits that happened while the daemon was down go to ``submit``
    (the exit monitor), to be handled as if they had just happened. A record whose
    recovery fails is marked unknown; the others go on."""
    bound = asyncio.Semaphore(RECOVERY_CONCURRENCY)

    async def one(rec: ContainerRecord) -> None:
        async with bound:
            try:
                await _recover_one(parts, rec, states.get(rec.id), submit)
            except Exception:
                log.exception("container %s: recovery failed; marking it unknown", rec.id)
                if parts.store.get(rec.id) is not None:
                    parts.store.update(rec.id, unknown=True)

    await asyncio.gather(*(one(rec) for rec in parts.store.all()))


async def _recover_one(parts: ContainerParts, rec: ContainerRecord, state: RuncState | None,
                       submit: Callable[[Exit], None]) -> None:
    if rec.phase is not ContainerPhase.CREATED or parts.sandboxes.get(rec.sandbox_id) is None:
        log.info("container %s: removing what an interrupted %s left", rec.id,
                 "removal" if rec.phase is ContainerPhase.REMOVING else "creation")
        await cleanup(parts, rec.id)
        parts.store.delete(rec.id)
        return
    parts.names.reserve(rec.name, rec.id)
    if rec.finished_at:
        return
    exit_ = parts.runtime.exit_of(rec.id)
    status = state.status if state is not None else None
    if rec.restore and not rec.started_at and exit_ is None and status is None:
        return  # created from a checkpoint: no runc container until StartContainer
    if status is RuncStatus.PAUSED:
        # pycrid freezes a container only while it checkpoints it: the daemon was
        # killed in the middle of one. Thawed, as the checkpoint would have left it.
        log.warning("container %s: thawing it after an interrupted checkpoint", rec.id)
        await parts.runtime.resume(rec.id)
    _drop_checkpoint_files(parts.paths.checkpoint(rec.id))
    bundle = parts.paths.bundle(rec.id)
    if exit_ is None and not parts.runtime.watch(rec.id, bundle):
        # No exit recorded and its conmon gone (killed while the daemon was down, or
        # with the node's reboot): killed if it still runs, with containerd's unknown
        # exit code and reason for a running container whose task is gone.
        log.warning("container %s: its conmon is gone and no exit was recorded", rec.id)
        exit_ = await parts.runtime.monitor_lost(rec.id, bundle, reason="Unknown")
    started = status in (RuncStatus.RUNNING, RuncStatus.PAUSED)
    if not rec.started_at and exit_ is None and started:
        # Killed between ``runc start`` and its record: the start happened; finish it.
        log.info("container %s: finishing an interrupted start", rec.id)
        # A restore's pid is known only from runc (a create's was recorded with it).
        parts.store.update(rec.id, started_at=now_ns(), restore=False,
                           pid=rec.pid or (state.pid if state is not None else 0))
        if rec.restore:
            await restore.forget_archive(parts, rec.id)
        parts.events.emit(events.STARTED, rec.id, rec.sandbox_id)
    if exit_ is not None:
        submit(exit_)


def _drop_checkpoint_files(work: str) -> None:
    """What an interrupted checkpoint gathered (memory pages among it). A stat when
    there is none, the common case, so no worker thread for it."""
    if os.path.isdir(work):
        shutil.rmtree(work, ignore_errors=True)
