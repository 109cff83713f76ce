"""Start-up sweep of what no record owns: the last line of crash safety.

Records are written before side effects and deleted after them, so recovery
normally finds every trace through a record. This sweep covers the rest (a
record an operator gave up (docs/upgrades.md), a bug, a state dir copied over): any
bundle, volume dir, exit file, runc container, writable snapshot, image volume
view (by its container's id), conmon process, pinned netns or CNI cache entry
named for an id that is neither a known pod nor a known container is removed
with the same cleanup functions a removal uses (the network's traces by the pod
network itself, ``SandboxNetwork.sweep``). It runs after record recovery and
before the gate opens.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pycrid.images.snapshots import TEMP_PREFIX, Kind, Snapshotter
from pycrid.network.sandbox_network import SandboxNetwork
from pycrid.runtime import image_volumes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Layout:
    """Where objects leave traces, by id (the daemon's root and state dirs)."""

    root: str
    state: str
    exit_dir: str

    def sandbox_dirs(self) -> list[str]:
        return [os.path.join(self.state, "sandboxes"), os.path.join(self.root, "sandboxes")]

    def container_dirs(self) -> list[str]:
        return [os.path.join(self.state, "containers"), os.path.join(self.root, "containers")]


@dataclass(frozen=True)
class Recorded:
    """What the records own: pod ids, container ids, and the netns paths of pods."""

    pods: set[str]
    containers: set[str]
    netns: set[str]


def _names(directory: str) -> set[str]:
    try:
        return {n for n in os.listdir(directory) if not n.startswith(".")}
    except FileNotFoundError:
        return set()


def conmon_processes(exit_dir: str) -> dict[int, str]:
    """pid -> container id of every conmon that writes its exit file to ``exit_dir``."""
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if not argv or not argv[0].endswith(b"conmon"):
            continue
        args = [a.decode(errors="replace") for a in argv]
        if "--exit-dir" in args and "--cid" in args:
            i, j = args.index("--exit-dir"), args.index("--cid")
            if i + 1 < len(args) and j + 1 < len(args) and args[i + 1] == exit_dir:
                found[int(entry)] = args[j + 1]
    return found


async def sweep(*, layout: Layout, recorded: Recorded, runtime_ids: set[str],
                snapshotter: Snapshotter, network: SandboxNetwork,
                remove_sandbox: Callable[[str], Awaitable[object]],
                remove_container: Callable[[str], Awaitable[None]]) -> list[str]:
    """Remove every trace of unknown ids; returns what was removed (for the log)."""
    known = recorded.pods | recorded.containers
    removed: list[str] = []
    sandbox_ids = set().union(*(_names(d) for d in layout.sandbox_dirs())) - known
    container_ids = set().union(*(_names(d) for d in layout.container_dirs()))
    container_ids |= _names(layout.exit_dir) | runtime_ids
    container_ids |= {image_volumes.owner_of(i.key) or i.key for i in snapshotter.walk()
                      if i.kind is not Kind.COMMITTED and not i.key.startswith(TEMP_PREFIX)}
    container_ids -= known | sandbox_ids
    for sid in sorted(sandbox_ids):
        await remove_sandbox(sid)
        removed.append(f"pod sandbox {sid}")
    for cid in sorted(container_ids):
        await remove_container(cid)
        removed.append(f"container {cid}")
    for pid, cid in conmon_processes(layout.exit_dir).items():
        if cid not in known:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            removed.append(f"conmon {pid} of {cid}")
    removed += await network.sweep(recorded.pods, recorded.netns)
    return removed
