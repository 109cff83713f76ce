"""What stands for a pod ended: its pause process exited (wake whoever waits for it at
once, and, from the exit monitor in order with every other exit, mark the pod not
ready), or the pins of a pod without one disappeared (not ready at once)."""

from __future__ import annotations

import logging

from pycrid.core.pods.pod_parts import PodParts, not_ready
from pycrid.runtime.exits import Exit

log = logging.getLogger(__name__)


def notify_exit(parts: PodParts, exit_: Exit) -> None:
    """From the exit watcher, at once: wake whoever waits for the pause to exit."""
    parts.controller.exited(exit_.id, exit_)


def lost(parts: PodParts, sid: str) -> None:
    """From the controller's watch: the pinned namespaces of a pod without a pause are
    gone (someone unmounted them). The pod is not ready, as when a pause dies (containerd
    marks a sandbox NOTREADY when its shim dies); the kubelet then stops and recreates it."""
    rec = parts.store.get(sid)
    if rec is not None and rec.ready:
        log.warning("pod sandbox %s: its pinned namespaces are gone; it is not ready", sid)
        not_ready(parts, sid)


async def handle_exit(parts: PodParts, exit_: Exit) -> None:
    """From the exit monitor: the pause process ended, the pod is no longer ready."""
    rec = parts.store.get(exit_.id)
    if rec is not None and rec.ready:
        if rec.id not in parts.stopping:
            log.warning("pause process of pod %s exited with %d", rec.id, exit_.code)
        not_ready(parts, rec.id)
