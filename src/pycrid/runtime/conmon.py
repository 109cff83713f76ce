"""runc driven through conmon, the way CRI-O does it (CONMON-RUNC.md §1, §3, §5, §6).

Each container's init runs under its own conmon, which outlives the daemon,
writes the CRI log and records the exit status in ``<exit dir>/<id>``. The
daemon talks to conmon only at create time (the sync pipe gives the pid) and
afterwards reads the exit files; everything else is a ``runc`` command.

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
import shutil
import signal
import tempfile
from typing import Any

from pycrid import inotify
from pycrid.errors import FailedPrecondition, Internal, NotFound, Unavailable, Unknown
from pycrid.runtime import interactive
from pycrid.runtime.exits import Exit, read_exit
from pycrid.runtime.interface import ContainerRuntime, CreateOptions, ExecResult, RuncState
from pycrid.runtime.monitor_exit import monitor_gone
from pycrid.runtime.signals import signal_init
from pycrid.stats.cgroup_hierarchy import Hierarchy, oom_kills
from pycrid.stdio import ProcessIO

log = logging.getLogger(__name__)

#: How long conmon may take to report the container's pid (runc create takes ~40 ms).
CREATE_TIMEOUT = 60.0
#: How long conmon may take to reopen a log after being asked.
REOPEN_TIMEOUT = 10.0
#: How long a deleted container's conmon may take to record the exit and end.
MONITOR_EXIT_WAIT = 5.0
_SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


_INSTALL_HINT = "install it (Debian/Ubuntu: apt-get install runc conmon)"


def find_binary(configured: str, name: str, key: str = "") -> str:
    """The binary's path, or an error that says how to get one (``key`` is its config key)."""
    key = key or f"{name}_path"
    if configured:
        if os.path.isfile(configured) and os.access(configured, os.X_OK):
            return configured
        raise Unavailable(f"{name} binary {configured!r} (config {key}) does not exist or is "
                          f"not executable; {_INSTALL_HINT} or fix {key}")
    path = shutil.which(name, path=_SEARCH_PATH)
    if not path:
        raise Unavailable(f"{name} binary not found in {_SEARCH_PATH}; {_INSTALL_HINT} or set "
                          f"{key} to its path")
    return path


class ConmonRuntime(ContainerRuntime):
    def __init__(self, *, state_dir: str, runc: str = "", conmon: str = "",
                 systemd_cgroup: bool = False, runc_root: str = "",
                 cgroups: Hierarchy | None = None) -> None:
        self.runc = find_binary(runc, "runc", "runtime_path")
        #: How messages name the runtime (runc, or runsc).
        self.name = os.path.basename(self.runc)
        self.conmon = find_binary(conmon, "conmon", "conmon_path")
        self.runc_root = runc_root or os.path.join(state_dir, "runc")
        self.exit_dir = os.path.join(state_dir, "exits")
        self.socket_dir = os.path.join(state_dir, "conmon")
        self.systemd_cgroup = systemd_cgroup
        #: conmon's pid by container id (from its pid file at create), so that delete
        #: returns once the container's monitor is gone too.
        self._monitors: dict[str, int] = {}
        #: The host's cgroup mounts, to read a container's OOM-kill counter.
        self.cgroups = cgroups if cgroups is not None else Hierarchy()
        for d in (self.runc_root, self.exit_dir, self.socket_dir):
            os.makedirs(d, mode=0o700, exist_ok=True)

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
        return rc, out, _runc_message(err)

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
        if not os.path.isdir(os.path.join(self.runc_root, object_id)):
            # runc knows nothing of it (deleted at its exit, or never created).
            await self._monitor_ended(object_id)
            return
        rc, _, err = await self._runc("delete", "--force", object_id, of=object_id)
        if rc != 0 and "does not exist" not in err:
            raise Unknown(f"{self.name} delete {object_id}: {err}")
        await self._monitor_ended(object_id)

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
        rfd, wfd = os.pipe2(os.O_CLOEXEC)
        try:
            env = {"PATH": _SEARCH_PATH, "_OCI_SYNCPIPE": str(wfd)}
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
            message = await asyncio.wait_for(_read_sync(rfd), CREATE_TIMEOUT)
        except TimeoutError:
            await self._kill_conmon(bundle)
            raise Unknown(f"conmon did not report container {opts.id} within "
                          f"{CREATE_TIMEOUT:.0f}s") from None
        finally:
            stderr = b""
            with contextlib.suppress(Exception):
                _, stderr = await proc.communicate()
        if message is None:
            text = stderr.decode(errors="replace").strip() or f"exit status {proc.returncode}"
            raise Unknown(f"conmon failed to create container {opts.id}: {text}")
        pid = int(message.get("pid", -1))
        if pid <= 0:
            raise Unknown(f"{self.name} create {opts.id} failed: "
                          f"{_runc_message(str(message.get('message', '')).encode())}")
        with contextlib.suppress(OSError, ValueError):
            with open(os.path.join(bundle, "conmon.pid")) as f:
                self._monitors[opts.id] = int(f.read().strip())
        return pid

    async def _monitor_ended(self, object_id: str) -> None:
        """After the container is deleted: wait (briefly) for its conmon to write the exit
        and go, and kill one that stays, so a deleted container leaves no monitor behind
        (a failed RunPodSandbox once left the pause's conmon waiting for ever)."""
        pid = self._monitors.pop(object_id, 0)
        if pid <= 0 or await monitor_gone(pid, object_id, MONITOR_EXIT_WAIT):
            return
        log.warning("conmon %d of %s still runs %.0fs after its container was deleted; "
                    "killing it", pid, object_id, MONITOR_EXIT_WAIT)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    async def _kill_conmon(self, bundle: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            with open(os.path.join(bundle, "conmon.pid")) as f:
                os.kill(int(f.read().strip()), signal.SIGKILL)

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
        """Ask conmon to reopen the log (after the kubelet rotated it): ``2 0 0`` on ctl.

        conmon reopens when it next reads its ctl fifo, after this returns; the kubelet
        opens the path right after the call, so wait until the new file is there (an
        inotify watch on its directory, armed before asking)."""
        watch: inotify.Inotify | None = None
        try:
            if log_path and not os.path.exists(log_path):
                watch = inotify.Inotify()
                watch.add_watch(os.path.dirname(log_path) or ".",
                                inotify.CREATE | inotify.MOVED_TO)
            if not interactive.write_ctl(bundle, "2 0 0\n"):
                raise FailedPrecondition("container monitor (conmon) is not running")
            if watch is not None:
                await asyncio.wait_for(_appears(watch, log_path), REOPEN_TIMEOUT)
        except TimeoutError:
            raise Unknown(f"conmon did not reopen {log_path} within "
                          f"{REOPEN_TIMEOUT:.0f}s") from None
        finally:
            if watch is not None:
                watch.close()

    # ---- exec --------------------------------------------------------------------------

    async def exec_sync(self, object_id: str, process: dict[str, Any], *,
                        limit: float | None, output_cap: int) -> ExecResult:
        out, err = _CappedSink(output_cap), _CappedSink(output_cap)
        io = ProcessIO(tty=False, stdin=None, stdout=out, stderr=err, resize=None)
        # On timeout the exec is cancelled, which kills its process group and runc.
        rc = await asyncio.wait_for(self.exec_stream(object_id, process, io), limit)
        stderr = bytes(err.data)
        if rc == 255 and b"exec failed" in stderr:
            # runc could not start the process at all: its own message is on stderr.
            stderr = _runc_message(stderr).encode() + b"\n"
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


async def _appears(watch: inotify.Inotify, path: str) -> None:
    while not os.path.exists(path):
        await watch.wait()


class _CappedSink:
    """Collects output up to ``cap`` bytes; containerd discards the excess silently."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.data = bytearray()

    async def write(self, data: bytes) -> None:
        room = self.cap - len(self.data)
        if room > 0:
            self.data += data[:room]

    async def close(self) -> None:
        pass


async def _read_sync(fd: int) -> dict[str, Any] | None:
    """The first JSON message on conmon's sync pipe, or None on EOF without one."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0))
    try:
        line = await reader.readline()
    finally:
        transport.close()
    if not line.strip():
        return None
    try:
        msg = json.loads(line)
    except ValueError:
        raise Internal(f"conmon sent a malformed sync message: {line[:200]!r}") from None
    return msg if isinstance(msg, dict) else None


def _runc_message(raw: bytes) -> str:
    """runc's logrus line (``time=… level=error msg="…"``) reduced to its message."""
    text = raw.decode(errors="replace").strip()
    lines = []
    for line in text.splitlines():
        if 'msg="' in line:
            msg = line.split('msg="', 1)[1]
            msg = msg.rsplit('"', 1)[0]
            lines.append(msg.replace('\\"', '"').replace("\\n", " ").strip())
        elif line.strip():
            lines.append(line.strip())
    return "; ".join(lines) or text
