"""A pod's pause process ended: wake whoever waits for it at once, and (from the exit
monitor, in order with every other exit) mark the pod not ready."""

from __future__ import annotations

import logging

from pycrid.core.pods.pod_parts import PodParts, not_ready
from pycrid.runtime.exits import Exit

log = logging.getLogger(__name__)


def notify_exit(parts: PodParts, exit_: Exit) -> None:
    """From the exit watcher, at once: wake whoever waits for the pause to exit."""
    parts.controller.exited(exit_.id, exit_)


async def handle_exit(parts: PodParts, exit_: Exit) -> None:
    """From the exit monitor: the pause process ended, the pod is no longer ready."""
    rec = parts.store.get(exit_.id)
    if rec is not None and rec.ready:
        if rec.id not in parts.stopping:
            log.warning("pause process of pod %s exited with %d", rec.id, exit_.code)
        not_ready(parts, rec.id)
