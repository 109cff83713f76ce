"""What the core needs from an OCI runtime: the narrow interface a second runtime implements.

Shaped after containerd's task API, cut to what a CRI runtime uses. Every
object is addressed by its id; its bundle (``config.json`` plus ``rootfs``)
is prepared by the caller.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pycrid.errors import FailedPrecondition
from pycrid.runtime.exits import Exit
from pycrid.stats.cgroup_stats import CgroupStats
from pycrid.stdio import ProcessIO

#: Why a runtime that says nothing about checkpointing refuses it.
NO_CHECKPOINT = "its runtime cannot checkpoint or restore containers"


@dataclass(frozen=True)
class CreateOptions:
    id: str
    bundle: str
    #: For the monitor's own messages.
    name: str
    #: The CRI log file; empty for no log (the pause container).
    log_path: str = ""
    tty: bool = False
    stdin: bool = False
    stdin_once: bool = False
    #: The pod's runtime handler (empty: the default one).
    runtime_handler: str = ""


@dataclass(frozen=True)
class CheckpointPaths:
    """Where one checkpoint goes (runc's ``--image-path`` and ``--work-path``)."""

    #: CRIU's images of the processes.
    images: str
    #: CRIU's log (``dump.log``) and statistics (``stats-dump``).
    work: str


class RuncStatus(enum.Enum):
    """runc's ``status`` of a container (``runc state``/``runc list``)."""

    CREATING = "creating"
    CREATED = "created"
    RUNNING = "running"
    PAUSING = "pausing"
    PAUSED = "paused"
    STOPPED = "stopped"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class RuncState:
    """What runc reports of one container; ``raw`` is its JSON as printed, for the
    verbose info of PodSandboxStatus."""

    id: str
    status: RuncStatus
    pid: int
    raw: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> RuncState:
        try:
            status = RuncStatus(doc.get("status"))
        except ValueError:
            status = RuncStatus.UNKNOWN
        return cls(str(doc.get("id", "")), status, int(doc.get("pid") or 0), doc)


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: bytes
    stderr: bytes


class ContainerRuntime(abc.ABC):
    #: The directory exit files appear in (one ``ExitWatcher`` watches it).
    exit_dir: str

    @abc.abstractmethod
    async def create(self, opts: CreateOptions) -> int:
        """Create the container (its init waits to be started); returns the init's host pid."""

    @abc.abstractmethod
    async def start(self, object_id: str) -> None: ...

    @abc.abstractmethod
    async def kill(self, object_id: str, signal: int) -> bool:
        """Signal the init process; False when there is no running process to signal."""

    @abc.abstractmethod
    async def delete(self, object_id: str) -> None:
        """Forget the container, killing it first if it runs; no error if it is unknown."""

    @abc.abstractmethod
    async def update(self, object_id: str, resources: dict[str, Any]) -> None:
        """Change a live container's cgroup limits (an OCI ``linux.resources`` object)."""

    @abc.abstractmethod
    async def state(self, object_id: str) -> RuncState | None:
        """The runtime's view (``runc state``), or None for an unknown container."""

    @abc.abstractmethod
    async def states(self) -> dict[str, RuncState]:
        """Every container the runtime knows, by id (one ``runc list``: recovery asks
        once instead of once per container)."""

    @abc.abstractmethod
    async def exec_sync(self, object_id: str, process: dict[str, Any], *,
                        limit: float | None, output_cap: int) -> ExecResult:
        """Run ``process`` in the container and collect its output (each stream capped)."""

    @abc.abstractmethod
    async def exec_stream(self, object_id: str, process: dict[str, Any], io: ProcessIO) -> int:
        """Run ``process`` in the container wired to a client's stdio; its exit code.
        Cancelling kills the process."""

    @abc.abstractmethod
    async def attach(self, bundle: str, io: ProcessIO) -> None:
        """Join the container's main process stdio until its output ends; cancelling
        detaches."""

    @abc.abstractmethod
    def watch(self, object_id: str, bundle: str) -> bool:
        """Watch the container's monitor (done by ``create``; again after a restart): if
        it dies without recording an exit, ``monitor_lost`` runs by itself. False when
        no monitor of it runs."""

    @abc.abstractmethod
    async def monitor_lost(self, object_id: str, bundle: str, reason: str = "") -> Exit | None:
        """Its monitor died without recording the exit: kill what is left of the
        container, release what the monitor held and record the exit (containerd's
        code 255, with ``reason``); returns it, or None if the container still runs."""

    @abc.abstractmethod
    def exit_of(self, object_id: str) -> Exit | None:
        """The recorded exit of the container's init, if it has exited."""

    @abc.abstractmethod
    def forget_exit(self, object_id: str) -> None:
        """Drop the exit record of a removed container."""

    @abc.abstractmethod
    def oom_killed(self, bundle: str) -> bool:
        """Whether the kernel's OOM killer ended the container."""

    @abc.abstractmethod
    async def reopen_log(self, bundle: str, log_path: str) -> None:
        """Have the monitor reopen the CRI log; returns once ``log_path`` exists again
        (the kubelet opens it right after the call)."""

    def own_stats(self, object_id: str) -> Callable[[], CgroupStats | None] | None:
        """How to read the usage of a container the host has no cgroup of its own for
        (a gVisor sub-container: its sandbox measures it); the reader blocks, for the
        stats worker thread. None: read the container's cgroup, as for runc."""
        return None

    def close(self) -> None:
        """The daemon is stopping: stop what watches the containers (they run on)."""
        return None

    # ---- checkpoint and restore (CRIU). A runtime that cannot refuses; the runc one
    # ---- overrides all five. -------------------------------------------------------

    def checkpoint_refusal(self, runtime_handler: str) -> str | None:
        """Why containers of ``runtime_handler`` ("" the default) cannot be checkpointed or
        restored here; None when they can."""
        return NO_CHECKPOINT

    async def pause(self, object_id: str) -> None:
        """Freeze every process of the container (its cgroup freezer)."""
        raise FailedPrecondition(NO_CHECKPOINT)

    async def resume(self, object_id: str) -> None:
        """Thaw a frozen container; no error when it is not frozen."""
        raise FailedPrecondition(NO_CHECKPOINT)

    async def checkpoint(self, object_id: str, paths: CheckpointPaths) -> None:
        """Write the container's process state to ``paths``, leaving it running (frozen
        if it was). Cancelling kills the checkpoint's processes."""
        raise FailedPrecondition(NO_CHECKPOINT)

    async def restore(self, opts: CreateOptions, images: str) -> int:
        """Create the container from CRIU images (``images``) instead of its process:
        it runs when this returns; the init's host pid."""
        raise FailedPrecondition(NO_CHECKPOINT)
