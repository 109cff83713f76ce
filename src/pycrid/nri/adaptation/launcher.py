"""Pre-installed plugins: find them in ``plugin_path`` and start them on fd 3.

The rules are containerd/nri's (plugin.go, adaptation.go): regular executable
files named ``NN-name``; the config is ``<conf>/NN-name.conf``, else
``<conf>/name.conf``; the process gets one end of a socketpair as fd 3 and an
environment of exactly NRI_PLUGIN_NAME, NRI_PLUGIN_IDX and NRI_PLUGIN_SOCKET.
One difference: upstream fails start-up on a badly named file; we skip it with a warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import stat
from dataclasses import dataclass

from pycrid.nri import api
from pycrid.nri.adaptation.remote_plugin import Launched

log = logging.getLogger(__name__)

#: The fd a launched plugin finds its socket on.
PLUGIN_FD = 3


@dataclass(frozen=True)
class Found:
    path: str
    idx: str
    base: str


def discover(plugin_path: str) -> tuple[list[Found], list[str]]:
    """The launchable plugins in ``plugin_path`` (sorted by name) and warnings about the rest."""
    found: list[Found] = []
    warnings: list[str] = []
    try:
        names = sorted(os.listdir(plugin_path))
    except FileNotFoundError:
        return [], []
    except OSError as e:
        return [], [f"cannot read NRI plugin directory {plugin_path}: {e.strerror}"]
    for name in names:
        path = os.path.join(plugin_path, name)
        try:
            st = os.stat(path)
        except OSError as e:
            warnings.append(f"NRI plugin {path} skipped: {e.strerror}")
            continue
        if not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o111:
            continue
        try:
            idx, base = api.parse_plugin_name(name)
            api.check_plugin_name(base)
        except ValueError as e:
            warnings.append(f"NRI plugin {path} skipped: {e}")
            continue
        found.append(Found(path, idx, base))
    return found, warnings


def plugin_config(config_dir: str, idx: str, base: str) -> str:
    """``NN-name.conf``, else ``name.conf``, else empty."""
    for name in (f"{idx}-{base}.conf", f"{base}.conf"):
        try:
            with open(os.path.join(config_dir, name)) as f:
                return f.read()
        except FileNotFoundError:
            continue
    return ""


class SpawnedProcess:
    """A child started with posix_spawn, reaped through a pidfd on the event loop.

    Why not asyncio's subprocess: putting the socket on fd 3 there needs a
    ``preexec_fn``, i.e. Python code between fork and exec, and in a process
    that also runs gRPC that fork sometimes dies in gRPC's fork handlers
    (seen in the e2e tests). posix_spawn's dup2 action needs neither.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = loop.create_future()
        self._pidfd = os.pidfd_open(pid)
        loop.add_reader(self._pidfd, self._reap)

    def _reap(self) -> None:
        asyncio.get_running_loop().remove_reader(self._pidfd)
        os.close(self._pidfd)
        _, status = os.waitpid(self.pid, 0)
        self.returncode = os.waitstatus_to_exitcode(status)
        if not self._exited.done():
            self._exited.set_result(self.returncode)

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)


async def launch(plugin: Found) -> tuple[Launched, socket.socket]:
    """Start the plugin with its socket on fd 3; returns it and our end of the socket."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        pid = os.posix_spawn(  # noqa: ASYNC221 - returns once the child has exec'd
            plugin.path, [plugin.path],
            {api.PLUGIN_NAME_ENV: plugin.base, api.PLUGIN_IDX_ENV: plugin.idx,
             api.PLUGIN_SOCKET_ENV: str(PLUGIN_FD)},
            file_actions=[(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                          # dup2 clears close-on-exec on fd 3; every other fd of ours has it.
                          (os.POSIX_SPAWN_DUP2, theirs.fileno(), PLUGIN_FD)])
    except OSError:
        ours.close()
        raise
    finally:
        theirs.close()
    proc = SpawnedProcess(pid)
    return Launched(path=plugin.path, idx=plugin.idx, base=plugin.base, process=proc), ours
