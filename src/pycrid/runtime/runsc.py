"""gVisor's runsc as a runtime handler, watched by conmon as CRI-O runs an OCI runtime.

One sandbox per pod: the pause container creates it (conmon watches the sandbox process
as the pause's init) and the pod's containers are sub-containers inside it, each watched
through the monitor of :mod:`pycrid.runtime.runsc_monitor`. Every runsc command gets the
handler's flags (its runsc.toml ``[runsc_config]``, see :mod:`runsc_config`).

Where runsc differs from runc, this module follows gVisor's containerd shim
(pkg/shim/proc, pkg/shim/service.go): a sub-container gets its stdio at start and its
exit from ``runsc wait``; exec'd processes live in the sandbox, so an exec cut short is
ended with ``runsc kill --pid`` (its internal pid); stats come from ``runsc events
--stats``; and ``UpdateContainerResources`` is refused where runsc has no ``update``
command (the shim answers Unimplemented).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import signal
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pycrid.errors import NotFound, Unimplemented, Unknown
from pycrid.runtime import interactive, runsc_monitor
from pycrid.runtime.conmon import MONITOR_EXIT_WAIT, ConmonRuntime
from pycrid.runtime.exits import Exit
from pycrid.runtime.interface import CreateOptions, RuncState
from pycrid.runtime.monitors import read_pid_file, reap
from pycrid.runtime.runc_cli import runc_message
from pycrid.runtime.runsc_config import RunscProbe, RunscSettings
from pycrid.stats.cgroup_hierarchy import Hierarchy, oom_kills, relative_cgroup
from pycrid.stats.cgroup_stats import CgroupStats
from pycrid.stdio import ProcessIO
from pycrid.tasks import Owner

log = logging.getLogger(__name__)

_TYPE = "io.kubernetes.cri.container-type"
_SANDBOX_ID = "io.kubernetes.cri.sandbox-id"
#: runsc's words for "there is no such container", or none running.
_GONE = ("does not exist", "no such file", "not found", "not running", "no such process",
         "sandbox is not running", "cannot signal container", "state Stopped")
#: What runsc says when its own network stack takes the pod's namespace for the host's.
_ROOT_NETNS = "cannot run with network enabled in root network namespace"
#: How long a stats read may take (one ``runsc events --stats``).
_STATS_TIMEOUT = 5.0
#: runsc's words for a sandbox that is ending, and how often delete tries again meanwhile.
_DYING = ("connecting to control server", "connection refused")
_DELETE_TRIES = 30


@dataclass(frozen=True)
class _Object:
    """What the runtime knows of one of its containers."""

    bundle: str
    #: The pod's sandbox id (the object's own for the pause).
    sandbox_id: str
    #: A container inside the pod's sandbox (not the pause that made it).
    sub: bool
    tty: bool = False


def _object_of(bundle: str, object_id: str, annotations: dict[str, Any]) -> _Object:
    sub = annotations.get(_TYPE) == "container"
    tty = False
    with contextlib.suppress(OSError, ValueError, AttributeError):
        with open(os.path.join(bundle, "config.json")) as f:
            spec = json.load(f)
        annotations = spec.get("annotations") or annotations
        sub = annotations.get(_TYPE) == "container"
        tty = bool((spec.get("process") or {}).get("terminal"))
    sandbox = str(annotations.get(_SANDBOX_ID) or object_id) if sub else object_id
    return _Object(bundle, sandbox, sub, tty)


class RunscRuntime(ConmonRuntime):
    def __init__(self, *, state_dir: str, settings: RunscSettings, probe: RunscProbe,
                 conmon: str = "", systemd_cgroup: bool = False,
                 cgroups: Hierarchy | None = None, owner: Owner | None = None,
                 cgroup_roots: tuple[str, ...] = ()) -> None:
        super().__init__(state_dir=state_dir, runc=settings.binary, conmon=conmon,
                         runc_root=settings.root, cgroups=cgroups, owner=owner)
        self.settings = settings
        # Not the base class's systemd_cgroup: conmon would put --systemd-cgroup before the
        # runtime's own arguments, and its runtime here is the monitor script.
        self.cgroup_flag = ["--systemd-cgroup"] if systemd_cgroup else []
        #: runsc has an ``update`` command (probed at start; newer gVisor) and its version.
        self.can_update, self.version = probe.can_update, probe.version
        #: Every cgroup hierarchy's mount point (named ones too: runsc makes its
        #: containers' cgroups in each).
        self.cgroup_roots = cgroup_roots
        self._objects: dict[str, _Object] = {}

    # ---- commands ----------------------------------------------------------------------

    def _runc_argv(self, of: str = "") -> list[str]:
        pod = self._objects[of].sandbox_id if of in self._objects else of
        return [self.runc, f"--root={self.runc_root}", *self.cgroup_flag,
                *self.settings.args(pod)]

    async def _object(self, object_id: str) -> _Object | None:
        """What is known of ``object_id``; after a restart, learnt from ``runsc state``."""
        known = self._objects.get(object_id)
        if known is None:
            state = await self.state(object_id)
            if state is not None:
                known = self._learn(state)
        return known

    def _learn(self, state: RuncState) -> _Object:
        obj = _object_of(str(state.raw.get("bundle") or ""), state.id,
                         state.raw.get("annotations") or {})
        self._objects[state.id] = obj
        return obj

    def _monitored(self, opts: CreateOptions) -> tuple[str, list[str]]:
        obj = self._objects[opts.id]
        flags = self._runc_argv(opts.id)
        if not obj.sub:  # the pause: conmon watches the sandbox runsc creates
            return flags[0], flags[1:]
        return "/bin/sh", ["-c", runsc_monitor.MONITOR, runsc_monitor.NAME, *flags]

    async def create(self, opts: CreateOptions) -> int:
        obj = _object_of(opts.bundle, opts.id, {})
        self._objects[opts.id] = obj
        self.settings.make_log_dirs(obj.sandbox_id)
        try:
            pid = await super().create(opts)
        except Unknown as e:
            self._objects.pop(opts.id, None)
            raise _hinted(e) from None
        if obj.sub:  # the record shows the sandbox's pid, as gVisor's shim reports it
            pid = read_pid_file(runsc_monitor.sandbox_pid_file(opts.bundle)) or pid
        return pid

    async def start(self, object_id: str) -> None:
        obj = await self._object(object_id)
        if obj is None:
            raise NotFound(f"runtime has no container {object_id}")
        if not obj.sub:
            try:
                await super().start(object_id)
            except Unknown as e:
                raise _hinted(e) from None
            return
        monitor = runsc_monitor.monitor_pid(obj.bundle)
        try:
            stdio = runsc_monitor.open_stdio(monitor) if not obj.tty else []
        except OSError as e:
            raise Unknown(f"runsc start {object_id}: its monitor (pid {monitor}) is gone: "
                          f"{e.strerror}") from None
        error_log = os.path.join(obj.bundle, "runsc-start.log")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(error_log)
        try:
            # A TTY container got its terminal at create; the others get conmon's pipes
            # now, as runsc hands a sub-container the stdio of ``runsc start``.
            proc = await asyncio.create_subprocess_exec(
                *self._runc_argv(object_id), f"--log={error_log}", "start", object_id,
                stdin=stdio[0] if stdio else asyncio.subprocess.DEVNULL,
                stdout=stdio[1] if stdio else asyncio.subprocess.DEVNULL,
                stderr=stdio[2] if stdio else asyncio.subprocess.PIPE)
        finally:
            for fd in stdio:
                os.close(fd)
        _, err = await proc.communicate()
        if proc.returncode != 0:
            # runsc leaves the gofer it started for the container (its state never named
            # it, so runsc delete cannot find it): it goes here.
            await asyncio.to_thread(_kill_gofers, obj.bundle)
            raise Unknown(f"runsc start {object_id}: {_error_of(error_log, err)}")
        if not await runsc_monitor.say(obj.bundle, "start"):
            log.warning("container %s started but its monitor is gone: its exit will be "
                        "found by recovery", object_id)

    async def kill(self, object_id: str, sig: int) -> bool:
        rc, _, err = await self._runc("kill", object_id, str(sig), of=object_id)
        if rc == 0:
            return True
        if any(s in err for s in _GONE):
            return False
        raise Unknown(f"runsc kill {object_id} {sig}: {err}")

    async def delete(self, object_id: str) -> None:
        pid = await self._unwatch(object_id)
        obj = self._objects.get(object_id)
        if (err := await self._force_delete(object_id)) is not None:
            raise Unknown(f"runsc delete {object_id}: {err}")
        if obj is not None and obj.sub:
            # A container deleted before it started: its monitor's child still waits.
            await runsc_monitor.say(obj.bundle, "stop")
            # runsc made it an empty cgroup (for cAdvisor) and leaves it when the sandbox
            # died first.
            await asyncio.to_thread(self._remove_cgroups, obj.bundle, object_id)
        self._objects.pop(object_id, None)
        await reap(pid, object_id, MONITOR_EXIT_WAIT)

    def checkpoint_refusal(self, runtime_handler: str) -> str | None:
        return ("gVisor (runsc) containers cannot be checkpointed with CRIU: their "
                "processes run on gVisor's own kernel (runsc's own checkpoint is not used)")

    async def monitor_lost(self, object_id: str, bundle: str, reason: str = "") -> Exit | None:
        found = await super().monitor_lost(object_id, bundle, reason)
        if (obj := self._objects.get(object_id)) is not None and obj.sub:
            # Lost before it started: its monitor's child still waits to be told.
            await runsc_monitor.say(obj.bundle, "stop")
        return found

    async def _force_delete(self, object_id: str) -> str | None:
        for _ in range(_DELETE_TRIES):
            rc, _, err = await self._runc("delete", "--force", object_id, of=object_id)
            # A sandbox on its way out (its pod is stopping) refuses its control socket
            # for a moment before runsc sees it gone and deletes without it.
            if rc == 0 or not any(s in err for s in _DYING):
                break
            await asyncio.sleep(0.1)
        return None if rc == 0 or any(s in err for s in _GONE) else err

    def _remove_cgroups(self, bundle: str, object_id: str) -> None:
        try:
            with open(os.path.join(bundle, "config.json"), "rb") as f:
                rel = relative_cgroup(str(json.load(f)["linux"]["cgroupsPath"]))
        except (OSError, ValueError, KeyError, TypeError):
            return
        if rel is None or object_id not in os.path.basename(rel):
            return
        for root in self.cgroup_roots:
            with contextlib.suppress(OSError):  # gone, or (not ours to force) busy
                os.rmdir(os.path.join(root, rel))

    async def update(self, object_id: str, resources: dict[str, Any]) -> None:
        if not self.can_update:
            raise Unimplemented(
                f"runsc {self.version} (gVisor) has no update command: a running "
                "container's resources cannot be changed under this runtime handler "
                "(gVisor's containerd shim answers Unimplemented as well)")
        await super().update(object_id, resources)

    async def state(self, object_id: str) -> RuncState | None:
        rc, out, err = await self._runc("state", object_id, of=object_id)
        if rc != 0:
            if any(s in err for s in _GONE):
                return None
            raise Unknown(f"runsc state {object_id}: {err}")
        return RuncState.from_json(json.loads(out))

    async def states(self) -> dict[str, RuncState]:
        found = await super().states()
        for state in found.values():
            self._learn(state)
        return found

    # ---- exec --------------------------------------------------------------------------

    async def exec_stream(self, object_id: str, process: dict[str, Any], io: ProcessIO) -> int:
        with tempfile.TemporaryDirectory(prefix="exec-", dir=self.socket_dir) as tmp:
            spec_path, pid_path = os.path.join(tmp, "process.json"), os.path.join(tmp, "pid")
            internal = os.path.join(tmp, "internal-pid")
            with open(spec_path, "w") as f:
                json.dump(process, f)

            async def stop() -> None:
                # The process runs in the sandbox: killing runsc exec would leave it.
                pid = read_pid_file(internal)
                if pid > 0:
                    await asyncio.wait_for(self._runc(
                        "kill", f"--pid={pid}", object_id, str(int(signal.SIGKILL)),
                        of=object_id), 10)

            return await interactive.run_exec(
                [*self._runc_argv(object_id), "exec", "--process", spec_path,
                 "--pid-file", pid_path, "--internal-pid-file", internal, object_id],
                pid_path, io, stop)

    # ---- what conmon cannot tell of a sub-container ------------------------------------

    def own_stats(self, object_id: str) -> Callable[[], CgroupStats | None] | None:
        obj = self._objects.get(object_id)
        if obj is None or not obj.sub:
            return None
        argv = [*self._runc_argv(object_id), "events", "--stats", object_id]
        return lambda: _events_stats(argv)

    def oom_killed(self, bundle: str) -> bool:
        """A sub-container has no cgroup the kernel could OOM-kill in: gVisor keeps its
        memory in the sandbox, so the kernel's OOM killer ends the sandbox (the pod's
        limit). A sub-container that died with it is OOMKilled when the sandbox's cgroup
        counted a kill; the pause, as for runc, by conmon's word and its cgroup."""
        object_id = os.path.basename(bundle.rstrip("/"))
        try:
            with open(os.path.join(bundle, "config.json"), "rb") as f:
                spec = json.load(f)
        except (OSError, ValueError):
            return super().oom_killed(bundle)
        ann = spec.get("annotations") or {}
        if ann.get(_TYPE) != "container" or not ann.get(_SANDBOX_ID):
            return super().oom_killed(bundle)
        path = str((spec.get("linux") or {}).get("cgroupsPath") or "")
        head, sep, tail = path.rpartition(object_id)
        if not sep:
            return False
        return (oom_kills(self.cgroups, head + ann[_SANDBOX_ID] + tail) or 0) > 0


def _hinted(e: Unknown) -> Unknown:
    """runsc's error, with the way out when its network stack refused the pod's namespace."""
    if _ROOT_NETNS not in str(e):
        return e
    return Unknown(f"{e} (this runsc takes the pod's network namespace for the host's on this "
                   "kernel, which shows net.core.rmem_default in every namespace; set "
                   "network = \"host\" in the handler's [runsc_config])")


def _kill_gofers(bundle: str) -> None:
    """SIGKILL every runsc gofer serving ``bundle``."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if argv[0] == "runsc-gofer" and "gofer" in argv and any(
                a == "--bundle" and b == bundle for a, b in itertools.pairwise(argv)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry), signal.SIGKILL)


def _error_of(log_path: str, stderr: bytes | None) -> str:
    """runsc's own error: the last JSON line of its --log, else what it printed."""
    with contextlib.suppress(OSError):
        with open(log_path, errors="replace") as f:
            lines = [line for line in f.read().splitlines() if line.strip()]
        for line in reversed(lines):
            with contextlib.suppress(ValueError, AttributeError):
                msg = json.loads(line).get("msg")
                if msg:
                    return str(msg)
    return runc_message(stderr or b"") or "failed"


def _events_stats(argv: list[str]) -> CgroupStats | None:
    """One ``runsc events --stats``: the container's CPU as the sandbox accounts it, and
    the sandbox's memory and task count (runsc of 2022 keeps no per-container memory;
    gVisor's shim reports the same figures)."""
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=_STATS_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    try:
        data = json.loads(done.stdout).get("data") or {}
    except (ValueError, AttributeError):
        return None
    usage = (data.get("cpu") or {}).get("usage") or {}
    memory = (data.get("memory") or {}).get("usage") or {}
    pids = data.get("pids") or {}
    return CgroupStats(
        cpu_ns=_int(usage.get("total")), cpu_user_ns=_int(usage.get("user")),
        cpu_system_ns=_int(usage.get("kernel")), memory_usage=_int(memory.get("usage")),
        memory_max_usage=_int(memory.get("max")), processes=_int(pids.get("current")),
        memory_limit=_int(memory.get("limit")) or None)


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) else None
