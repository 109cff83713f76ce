"""runc driven through conmon, the way CRI-O does it (CONMON-RUNC.md §1, §3, §5, §6).

Each container's init runs under its own conmon, which outlives the daemon,
writes the CRI log and records the exit status in ``<exit dir>/<id>``. The
daemon talks to conmon only at create time (the sync pipe gives the pid) and
afterwards reads the exit files; everything else is a ``runc`` command.

Every conmon is watched (runtime/monitors.py): one that dies without having written an
exit file is handled as containerd handles a dead shim (``monitor_lost``).

Exec does not use conmon: ``runc exec`` runs as a child of the daemon
(CRI-O's streaming exec does the same; see :mod:`interactive`), which costs one
process less than conmon's legacy exec and gives ExecSync an exact timeout
instead of conmon's 1 s granularity. ExecSync is a streaming exec whose output
goes to capped buffers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import tempfile
import time
from typing import Any

from pycrid.errors import NotFound, Unknown
from pycrid.host import binaries
from pycrid.runtime import interactive, runc_checkpoint
from pycrid.runtime.exits import Exit, read_exit, write_exit
from pycrid.runtime.interface import (
    CheckpointPaths,
    ContainerRuntime,
    CreateOptions,
    ExecResult,
    RuncState,
)
from pycrid.runtime.monitors import MonitorWatch, kill_monitor, read_pid, reap
from pycrid.runtime.runc_checkpoint import NO_CHECKPOINTS, CheckpointSupport
from pycrid.runtime.runc_cli import CappedSink, find_binary, read_sync, runc_message
from pycrid.runtime.signals import signal_init
from pycrid.stats.cgroup_hierarchy import Hierarchy, oom_kills
from pycrid.stdio import ProcessIO
from pycrid.tasks import Owner

log = logging.getLogger(__name__)

#: How long conmon may take to report the container's pid (runc create takes ~40 ms).
CREATE_TIMEOUT = 60.0
#: How long conmon may take to reopen a log after being asked.
REOPEN_TIMEOUT = 10.0
#: How long a deleted container's conmon may take to record the exit and end.
MONITOR_EXIT_WAIT = 5.0
#: containerd's exit code when a task's exit status is unknown (its shim died):
#: internal/cri/server/helpers.go unknownExitCode.
LOST_EXIT_CODE = 255
#: What conmon holds in the bundle and leaves behind when it is killed.
_MONITOR_FILES = ("attach", "ctl", "winsz")


class ConmonRuntime(ContainerRuntime):
    def __init__(self, *, state_dir: str, runc: str = "", conmon: str = "",
                 systemd_cgroup: bool = False, runc_root: str = "",
                 cgroups: Hierarchy | None = None, owner: Owner | None = None,
                 checkpoints: CheckpointSupport = NO_CHECKPOINTS) -> None:
        self.runc = find_binary(runc, "runc", "runtime_path")
        #: How messages name the runtime (runc, or runsc).
        self.name = os.path.basename(self.runc)
        self.conmon = find_binary(conmon, "conmon", "conmon_path")
        self.runc_root = runc_root or os.path.join(state_dir, "runc")
        self.exit_dir = os.path.join(state_dir, "exits")
        self.socket_dir = os.path.join(state_dir, "conmon")
        self.systemd_cgroup = systemd_cgroup
        #: The host's cgroup mounts, to read a container's OOM-kill counter.
        self.cgroups = cgroups if cgroups is not None else Hierarchy()
        for d in (self.runc_root, self.exit_dir, self.socket_dir):
            os.makedirs(d, mode=0o700, exist_ok=True)
        self.monitors = MonitorWatch(self._monitor_ended)
        #: Owns the handling of dead monitors (``monitor_lost`` in the background).
        self._owner = owner if owner is not None else Owner("conmon monitors")
        self._lost: dict[str, asyncio.Task[Exit | None]] = {}
        self.checkpoints = checkpoints
        #: PATH for runc and conmon when they run CRIU (runc_checkpoint.py says why).
        self.criu_path_env = runc_checkpoint.search_path(
            runc_checkpoint.criu_path_dir(state_dir, checkpoints.criu))

    def close(self) -> None:
        """Stop watching (the conmons go on; a restart watches them again)."""
        self.monitors.close()

    # ---- runc --------------------------------------------------------------------------

    def _runc_argv(self, of: str = "") -> list[str]:
        """runc and its global flags for a command on object ``of`` (the same for every
        object here)."""
        return [self.runc, f"--root={self.runc_root}",
                *(["--systemd-cgroup"] if self.systemd_cgroup else [])]

    async def _runc(self, *args: str, stdin: bytes | None = None,
                    of: str = "") -> tuple[int, bytes, str]:
        """Run one runc command on object ``of``: (exit code, stdout, its error message
        made readable)."""
        proc = await asyncio.create_subprocess_exec(
            *self._runc_argv(of), *args, stdin=asyncio.subprocess.PIPE if stdin is not None else
            asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate(stdin)
        rc = proc.returncode if proc.returncode is not None else -1
        return rc, out, runc_message(err)

    async def update(self, object_id: str, resources: dict[str, Any]) -> None:
        rc, _, err = await self._runc("update", "--resources", "-", object_id,
                                      stdin=json.dumps(resources).encode(), of=object_id)
        if rc != 0:
            raise Unknown(f"{self.name} update {object_id}: {err}")

    async def start(self, object_id: str) -> None:
        rc, _, err = await self._runc("start", object_id, of=object_id)
        if rc != 0:
            if "does not exist" in err:
                raise NotFound(f"runtime has no container {object_id}")
            raise Unknown(f"{self.name} start {object_id}: {err}")

    async def kill(self, object_id: str, sig: int) -> bool:
        direct = signal_init(self.runc_root, object_id, sig)
        if direct is not None:  # None: runc decides
            return direct
        rc, _, err = await self._runc("kill", object_id, str(sig), of=object_id)
        if rc == 0:
            return True
        if any(s in err for s in ("not running", "does not exist", "no such process",
                                  "process already finished", "container not created")):
            return False
        raise Unknown(f"{self.name} kill {object_id} {sig}: {err}")

    async def delete(self, object_id: str) -> None:
        pid = await self._unwatch(object_id)
        if os.path.isdir(os.path.join(self.runc_root, object_id)):
            # (Else runc knows nothing of it: deleted at its exit, or never created.)
            if (err := await self._force_delete(object_id)) is not None:
                raise Unknown(f"{self.name} delete {object_id}: {err}")
        await reap(pid, object_id, MONITOR_EXIT_WAIT)

    async def _force_delete(self, object_id: str) -> str | None:
        """``delete --force`` (kill, wait, remove): None when done or there was nothing
        to delete, else the runtime's reason."""
        rc, _, err = await self._runc("delete", "--force", object_id, of=object_id)
        return None if rc == 0 or "does not exist" in err else err

    async def state(self, object_id: str) -> RuncState | None:
        rc, out, err = await self._runc("state", object_id, of=object_id)
        if rc != 0:
            if "does not exist" in err:
                return None
            raise Unknown(f"{self.name} state {object_id}: {err}")
        return RuncState.from_json(json.loads(out))

    async def states(self) -> dict[str, RuncState]:
        rc, out, err = await self._runc("list", "--format", "json")
        if rc != 0:
            raise Unknown(f"{self.name} list: {err}")
        listed = json.loads(out or b"null") or []
        return {str(s["id"]): RuncState.from_json(s) for s in listed
                if isinstance(s, dict) and "id" in s}

    # ---- create through conmon ---------------------------------------------------------

    def _monitored(self, opts: CreateOptions) -> tuple[str, list[str]]:
        """What conmon runs as the OCI runtime, and the arguments it puts before
        ``create`` (``--runtime``, ``--runtime-arg``)."""
        return self.runc, [f"--root={self.runc_root}"]

    async def create(self, opts: CreateOptions) -> int:
        return await self._spawn(opts, restore="")

    async def _spawn(self, opts: CreateOptions, *, restore: str) -> int:
        """conmon runs ``runc create``, or with ``restore`` (CRIU images) ``runc restore``
        (CRI-O's RestoreContainer: conmon's ``--restore``)."""
        bundle = opts.bundle
        runtime, runtime_args = self._monitored(opts)
        argv = [
            self.conmon, "--bundle", bundle, "--cid", opts.id, "--cuuid", opts.id,
            "--name", opts.name, "--runtime", runtime,
            "--container-pidfile", os.path.join(bundle, "pidfile"),
            "--conmon-pidfile", os.path.join(bundle, "conmon.pid"),
            "--log-path", f"k8s-file:{opts.log_path}" if opts.log_path else "none",
            "--exit-dir", self.exit_dir, "--persist-dir", bundle,
            "--socket-dir-path", self.socket_dir, "--full-attach",
            "--log-level", "info",
            *(a for arg in runtime_args for a in ("--runtime-arg", arg)),
        ]
        if self.systemd_cgroup:
            argv.append("--systemd-cgroup")
        if opts.tty:
            argv.append("--terminal")
        if opts.stdin:
            argv.append("--stdin")
            if not opts.stdin_once:
                argv.append("--leave-stdin-open")
        if restore:
            # The dump took file locks (runc_checkpoint.checkpoint_args): restore them too.
            argv += ["--restore", restore, "--runtime-opt", "--file-locks"]
        rfd, wfd = os.pipe2(os.O_CLOEXEC)
        try:
            env = {"PATH": self.criu_path_env if restore else binaries.search_path(),
                   "_OCI_SYNCPIPE": str(wfd)}
            proc = await asyncio.create_subprocess_exec(
                *argv, pass_fds=(wfd,), env=env, cwd=bundle, start_new_session=True,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE)
        except BaseException:
            os.close(rfd)
            raise
        finally:
            os.close(wfd)
        try:
            message = await asyncio.wait_for(read_sync(rfd), CREATE_TIMEOUT)
        except TimeoutError:
            kill_monitor(read_pid(bundle), opts.id)
            raise Unknown(f"conmon did not report container {opts.id} within "
                          f"{CREATE_TIMEOUT:.0f}s") from None
        finally:
            stderr = b""
            with contextlib.suppress(Exception):
                _, stderr = await proc.communicate()
        what = "restore" if restore else "create"
        if message is None:
            text = stderr.decode(errors="replace").strip() or f"exit status {proc.returncode}"
            raise Unknown(f"conmon failed to {what} container {opts.id}: {text}")
        pid = int(message.get("pid", -1))
        if pid <= 0:
            text = runc_message(str(message.get("message", "")).encode())
            if restore:  # CRIU's own reason is in its log, in the bundle (work path)
                why = runc_checkpoint.criu_errors(
                    os.path.join(bundle, runc_checkpoint.RESTORE_LOG))
                text += f" (CRIU: {why})" if why else ""
            raise Unknown(f"{self.name} {what} {opts.id} failed: {text}")
        if not self.monitors.watch(opts.id, bundle):
            log.warning("conmon of %s is gone right after creating it", opts.id)
            await self.monitor_lost(opts.id, bundle)
        return pid

    # ---- monitors ----------------------------------------------------------------------

    def watch(self, object_id: str, bundle: str) -> bool:
        return self.monitors.watch(object_id, bundle)

    def _monitor_ended(self, object_id: str, bundle: str) -> None:
        """A watched conmon ended. Having written the exit file first, it ended as it
        should (the exit watcher has the news); without one, it died."""
        if self.exit_of(object_id) is None and object_id not in self._lost:
            task = self._owner.spawn(self.monitor_lost(object_id, bundle), f"lost {object_id}")
            self._lost[object_id] = task
            task.add_done_callback(lambda _: self._lost.pop(object_id, None))

    async def _unwatch(self, object_id: str) -> int:
        """Before a delete: stop watching the container's conmon (its end is expected
        now) and let a loss being handled finish (its exit file is written first); the
        pid of the conmon that was watched, 0 if none."""
        pid = self.monitors.forget(object_id)
        if (lost := self._lost.get(object_id)) is not None:
            await asyncio.wait({lost})
        return pid

    async def monitor_lost(self, object_id: str, bundle: str, reason: str = "") -> Exit | None:
        """The container's conmon died without recording an exit. As containerd does for a
        dead shim (core/runtime/v2/shim.go cleanupAfterDeadShim runs the shim's delete,
        ``runc delete --force``: cmd/containerd-shim-runc-v2/manager/manager_linux.go
        Stop), what is left of the container is killed and deleted, so exactly one copy
        of it ever runs; what conmon held is released (its attach socket and fifos; the
        log descriptor closed with it); and the exit is recorded as containerd's CRI
        records a task whose wait failed: code 255 (internal/cri/server/events.go
        startContainerExitMonitor). ``reason`` "" lets the exit handler say Error, as
        containerd does for that code; recovery passes Unknown, containerd's reason for
        a running container whose task is gone after a restart (restart.go). None when
        the container could not be killed: then it still runs, and no exit is made up."""
        self.monitors.forget(object_id)
        if (found := self.exit_of(object_id)) is not None:
            return found  # conmon wrote it after all
        log.warning("conmon of container %s died without recording an exit; killing what "
                    "is left of the container", object_id)
        if (err := await self._force_delete(object_id)) is not None:
            log.error("container %s lost its conmon and could not be deleted: %s",
                      object_id, err)
            return None
        for name in _MONITOR_FILES:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(bundle, name))
        return write_exit(self.exit_dir, Exit(
            object_id, LOST_EXIT_CODE, time.time_ns(), reason=reason,
            message="its monitor (conmon) died; what was left of the container was killed"))

    # ---- checkpoint and restore ------------------------------------------------------

    def checkpoint_refusal(self, runtime_handler: str) -> str | None:
        if not self.checkpoints.runc_can:
            return (f"its runtime {self.runc} cannot checkpoint containers (`runc features` "
                    "does not say org.opencontainers.runc.checkpoint.enabled)")
        criu = self.checkpoints.criu
        return None if criu.works else criu.error

    async def pause(self, object_id: str) -> None:
        rc, _, err = await self._runc("pause", object_id, of=object_id)
        if rc != 0:
            raise Unknown(f"{self.name} pause {object_id}: {err}")

    async def resume(self, object_id: str) -> None:
        rc, _, err = await self._runc("resume", object_id, of=object_id)
        if rc != 0 and "not paused" not in err:
            raise Unknown(f"{self.name} resume {object_id}: {err}")

    async def checkpoint(self, object_id: str, paths: CheckpointPaths) -> None:
        rc, err = await runc_checkpoint.run(
            [*self._runc_argv(object_id), *runc_checkpoint.checkpoint_args(object_id, paths)],
            self.criu_path_env)
        if rc != 0:
            text = runc_message(err)
            why = runc_checkpoint.criu_errors(os.path.join(paths.work, runc_checkpoint.DUMP_LOG))
            raise Unknown(f"{self.name} checkpoint {object_id} failed: {text}"
                          + (f" (CRIU: {why})" if why else ""))

    async def restore(self, opts: CreateOptions, images: str) -> int:
        return await self._spawn(opts, restore=images)

    # ---- exits and logs ----------------------------------------------------------------

    def exit_of(self, object_id: str) -> Exit | None:
        return read_exit(self.exit_dir, object_id)

    def forget_exit(self, object_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.exit_dir, object_id))

    def oom_killed(self, bundle: str) -> bool:
        """conmon's ``oom`` file, else the cgroup's own OOM-kill counter: conmon writes the
        file when its main loop reaches the OOM event, which on cgroup v1 may come after
        it wrote the exit file the daemon is reading now."""
        if os.path.exists(os.path.join(bundle, "oom")):
            return True
        try:
            with open(os.path.join(bundle, "config.json"), "rb") as f:
                path = str(json.load(f).get("linux", {}).get("cgroupsPath") or "")
        except (OSError, ValueError):
            return False
        return (oom_kills(self.cgroups, path) or 0) > 0

    async def reopen_log(self, bundle: str, log_path: str) -> None:
        await interactive.reopen_log(bundle, log_path, REOPEN_TIMEOUT)

    # ---- exec --------------------------------------------------------------------------

    async def exec_sync(self, object_id: str, process: dict[str, Any], *,
                        limit: float | None, output_cap: int) -> ExecResult:
        out, err = CappedSink(output_cap), CappedSink(output_cap)
        io = ProcessIO(tty=False, stdin=None, stdout=out, stderr=err, resize=None)
        # On timeout the exec is cancelled, which kills its process group and runc.
        rc = await asyncio.wait_for(self.exec_stream(object_id, process, io), limit)
        stderr = bytes(err.data)
        if rc == 255 and b"exec failed" in stderr:
            # runc could not start the process at all: its own message is on stderr.
            stderr = runc_message(stderr).encode() + b"\n"
        return ExecResult(rc, bytes(out.data), stderr)

    async def exec_stream(self, object_id: str, process: dict[str, Any], io: ProcessIO) -> int:
        with tempfile.TemporaryDirectory(prefix="exec-", dir=self.socket_dir) as tmp:
            spec_path = os.path.join(tmp, "process.json")
            pid_path = os.path.join(tmp, "pid")
            with open(spec_path, "w") as f:
                json.dump(process, f)
            return await interactive.run_exec(
                [*self._runc_argv(), "exec", "--process", spec_path, "--pid-file", pid_path,
                 object_id], pid_path, io)

    async def attach(self, bundle: str, io: ProcessIO) -> None:
        await interactive.attach(bundle, io)

