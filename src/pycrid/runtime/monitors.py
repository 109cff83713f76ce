"""Watching each container's monitor (conmon), which is not the daemon's child.

conmon forks away from the daemon and writes its pid to ``<bundle>/conmon.pid``; while it
lives it holds the container's stdio, its log and its attach socket, and when the
container's init exits it writes the exit file and ends. If it dies first (the OOM
killer, an operator's ``pkill``), nothing would ever record the container's exit. A
pidfd (``pidfd_open`` works for any process, child or not) becomes readable when its
process ends: one per conmon, registered with the event loop, tells at once and costs
nothing while conmon lives. After a restart each is armed again from its pid file.

A pid read from a file may name another process by now (that conmon died while the
daemon was down and its pid was reused): the pidfd is opened first, then the process's
command line must name the container (``--cid <id>``), so the process checked is the one
watched. Where no pidfd can be had (the descriptor limit), that pid is polled every
second instead, by its start time.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import logging
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pycrid.operations import beyond_operation

log = logging.getLogger(__name__)

#: conmon's own pid file in the bundle (``--conmon-pidfile``).
PID_FILE = "conmon.pid"
#: How often a monitor without a pidfd is looked at.
POLL_EVERY = 1.0


@dataclass
class _Watched:
    bundle: str
    pid: int
    #: The pidfd, or -1 when polled.
    fd: int
    #: Field 22 of /proc/<pid>/stat, to tell the process from a later one with its pid.
    start: int | None


def read_pid(bundle: str) -> int:
    """conmon's pid from its pid file; 0 when there is none."""
    return read_pid_file(os.path.join(bundle, PID_FILE))


def read_pid_file(path: str) -> int:
    """The pid a pid file holds; 0 when there is none (yet)."""
    try:
        with open(path) as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def is_monitor_of(pid: int, object_id: str) -> bool:
    """Whether process ``pid`` is a conmon started for ``object_id``."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    wanted = object_id.encode()
    return any(a == b"--cid" and b == wanted for a, b in itertools.pairwise(argv))


def start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


class MonitorWatch:
    """Calls ``ended(object_id, bundle)`` on the event loop once a watched conmon ends
    (whether it wrote an exit file first is the caller's question)."""

    def __init__(self, ended: Callable[[str, str], None]) -> None:
        self._ended = ended
        self._watched: dict[str, _Watched] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._poller: asyncio.TimerHandle | None = None
        self._polling_said = False

    def __contains__(self, object_id: str) -> bool:
        return object_id in self._watched

    def watch(self, object_id: str, bundle: str) -> bool:
        """Watch the conmon of ``object_id`` (idempotent). False when none of it runs."""
        if object_id in self._watched:
            return True
        pid = read_pid(bundle)
        if pid <= 0:
            return False
        loop = self._loop = asyncio.get_running_loop()
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        except OSError as e:
            if e.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
                raise
            (log.debug if self._polling_said else log.warning)(
                "no descriptor left to watch the monitor of %s (%s); polling it every %gs "
                "(raise the daemon's RLIMIT_NOFILE: one descriptor per conmon)",
                object_id, e.strerror, POLL_EVERY)
            self._polling_said = True
            fd = -1
        if not is_monitor_of(pid, object_id):  # checked with the pidfd held: no reuse race
            if fd >= 0:
                os.close(fd)
            return False
        self._watched[object_id] = _Watched(bundle, pid, fd, start_time(pid))
        # The watch outlives the CreateContainer that armed it: not in its cancel scope.
        if fd >= 0:
            beyond_operation(loop.add_reader, fd, self._readable, object_id)
        elif self._poller is None:
            self._poller = beyond_operation(loop.call_later, POLL_EVERY, self._poll)
        return True

    def forget(self, object_id: str) -> int:
        """Stop watching (the container is being deleted, or its loss is handled); the
        pid that was watched, 0 if none."""
        watched = self._watched.pop(object_id, None)
        if watched is None:
            return 0
        if watched.fd >= 0:
            if self._loop is not None:
                self._loop.remove_reader(watched.fd)
            os.close(watched.fd)
        return watched.pid

    def close(self) -> None:
        for object_id in list(self._watched):
            self.forget(object_id)
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None

    def _readable(self, object_id: str) -> None:
        watched = self._watched.get(object_id)
        if watched is None:
            return
        self.forget(object_id)
        self._report(object_id, watched)

    def _poll(self) -> None:
        self._poller = None
        for object_id, w in list(self._watched.items()):
            if w.fd < 0 and (w.start is None or start_time(w.pid) != w.start):
                del self._watched[object_id]
                self._report(object_id, w)
        if any(w.fd < 0 for w in self._watched.values()) and self._loop is not None:
            self._poller = self._loop.call_later(POLL_EVERY, self._poll)

    def _report(self, object_id: str, watched: _Watched) -> None:
        try:
            self._ended(object_id, watched.bundle)
        except Exception:
            log.exception("handling the end of the monitor of %s failed", object_id)


@contextlib.contextmanager
def _monitor_pidfd(pid: int, object_id: str) -> Iterator[int | None]:
    """A pidfd of the conmon of ``object_id`` at ``pid``; None when there is none (pid 0,
    gone, or now another process: checked with the pidfd held, so a pid reused
    meanwhile is never signalled)."""
    try:
        fd = os.pidfd_open(pid) if pid > 0 else -1
    except ProcessLookupError:
        fd = -1
    if fd < 0:
        yield None
        return
    try:
        yield fd if is_monitor_of(pid, object_id) else None
    finally:
        os.close(fd)


def _kill(pidfd: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)


def kill_monitor(pid: int, object_id: str) -> None:
    """SIGKILL the conmon of ``object_id`` at ``pid`` (0: none)."""
    with _monitor_pidfd(pid, object_id) as fd:
        if fd is not None:
            _kill(fd)


async def reap(pid: int, object_id: str, within: float) -> None:
    """After a container's delete: wait (up to ``within`` seconds) for its conmon at
    ``pid`` to write the exit and go, and kill one that stays, so a deleted container
    leaves no monitor behind (a failed RunPodSandbox once left the pause's conmon
    waiting for ever). ``pid`` 0: none was watched."""
    with _monitor_pidfd(pid, object_id) as fd:
        if fd is None or await _ends(fd, within):
            return
        log.warning("conmon %d of %s still runs %.0fs after its container was deleted; "
                    "killing it", pid, object_id, within)
        _kill(fd)


async def _ends(pidfd: int, within: float) -> bool:
    """Whether the process ends within ``within`` seconds (a pidfd turns readable then)."""
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not ended.done():
            ended.set_result(None)

    loop.add_reader(pidfd, readable)
    try:
        async with asyncio.timeout(within):
            await ended
        return True
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(pidfd)
