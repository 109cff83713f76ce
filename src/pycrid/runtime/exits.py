"""One watcher for every conmon exit file.

conmon writes ``<exit dir>/<container id>`` (the exit status in decimal) when
the container's init process dies. Instead of a poller per container
(containerd's shim waits per task), one inotify watch on the directory turns
each new file into a callback on the event loop. Exit files that appeared
while nobody watched (daemon down) are the recovery's business: ``read``
answers for one id at any time.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_IN_CLOEXEC = 0o2000000
_IN_NONBLOCK = 0o4000
_IN_CLOSE_WRITE = 0x8
_IN_MOVED_TO = 0x80
_IN_Q_OVERFLOW = 0x4000
_EVENT = struct.Struct("iIII")


@dataclass(frozen=True)
class Exit:
    id: str
    code: int
    #: When the file was written (its mtime), in Unix nanoseconds.
    at_ns: int


def read_exit(exit_dir: str, object_id: str) -> Exit | None:
    """The exit recorded for ``object_id``, or None while it has not exited."""
    path = os.path.join(exit_dir, object_id)
    try:
        with open(path, "rb") as f:
            raw = f.read().strip()
        st = os.stat(path)
    except FileNotFoundError:
        return None
    try:
        code = int(raw)
    except ValueError:
        return None  # being written; the inotify event follows
    return Exit(object_id, code, st.st_mtime_ns)


class ExitWatcher:
    """Calls ``on_exit`` once per exit file that appears in ``exit_dir``."""

    def __init__(self, exit_dir: str, on_exit: Callable[[Exit], None]) -> None:
        self.exit_dir = exit_dir
        self._on_exit = on_exit
        self._fd = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._seen: set[str] = set()
        os.makedirs(exit_dir, mode=0o700, exist_ok=True)

    def start(self) -> None:
        fd = _libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        if _libc.inotify_add_watch(fd, self.exit_dir.encode(),
                                   _IN_CLOSE_WRITE | _IN_MOVED_TO) < 0:
            err = ctypes.get_errno()
            os.close(fd)
            raise OSError(err, f"inotify_add_watch {self.exit_dir}: {os.strerror(err)}")
        self._fd = fd
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(fd, self._readable)

    def close(self) -> None:
        if self._fd >= 0:
            assert self._loop is not None
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1

    def forget(self, object_id: str) -> None:
        """The object is gone: a later exit file with its id is a new exit."""
        self._seen.discard(object_id)

    def _readable(self) -> None:
        try:
            data = os.read(self._fd, 64 * 1024)
        except BlockingIOError:
            return
        names: list[str] = []
        overflow = False
        pos = 0
        while pos + _EVENT.size <= len(data):
            _wd, mask, _cookie, length = _EVENT.unpack_from(data, pos)
            pos += _EVENT.size
            raw = data[pos:pos + length].split(b"\0", 1)[0]
            pos += length
            if mask & _IN_Q_OVERFLOW:
                overflow = True
            elif raw:
                names.append(os.fsdecode(raw))
        if overflow:
            log.warning("exit watcher queue overflowed; rescanning %s", self.exit_dir)
            names = os.listdir(self.exit_dir)
        for name in names:
            self._deliver(name)

    def _deliver(self, name: str) -> None:
        if name in self._seen or name.startswith("."):
            return
        exit_ = read_exit(self.exit_dir, name)
        if exit_ is None:
            return
        self._seen.add(name)
        try:
            self._on_exit(exit_)
        except Exception:
            log.exception("exit handler failed for %s", name)


class ExitWaiters:
    """Lets coroutines wait for an object's exit, which ``notify`` reports."""

    def __init__(self, lookup: Callable[[str], Exit | None]) -> None:
        self._lookup = lookup
        #: id -> (event, number of coroutines waiting on it)
        self._events: dict[str, tuple[asyncio.Event, int]] = {}

    def notify(self, exit_: Exit) -> None:
        entry = self._events.get(exit_.id)
        if entry is not None:
            entry[0].set()

    async def wait(self, object_id: str, within: float | None = None) -> Exit | None:
        """The exit, or None if ``within`` seconds pass first."""
        found = self._lookup(object_id)
        if found is not None:
            return found
        event, count = self._events.get(object_id, (asyncio.Event(), 0))
        self._events[object_id] = (event, count + 1)
        try:
            # The file may have landed between the lookup and the registration.
            if self._lookup(object_id) is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), within)
            return self._lookup(object_id)
        finally:
            event, count = self._events[object_id]
            if count <= 1:
                del self._events[object_id]
            else:
                self._events[object_id] = (event, count - 1)
