"""A small inotify binding (libc through ctypes): watch directories, read events.

Used by the exit watcher (conmon's exit files) and the CNI config watcher. One
descriptor, non-blocking; callers either hook ``fileno()`` into the event loop or
``await wait()``.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import os
import struct
from dataclasses import dataclass

from pycrid.errors import ResourceExhausted

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_IN_CLOEXEC = 0o2000000
_IN_NONBLOCK = 0o4000
_EVENT = struct.Struct("iIII")

MODIFY = 0x2
CLOSE_WRITE = 0x8
MOVED_FROM = 0x40
MOVED_TO = 0x80
CREATE = 0x100
DELETE = 0x200
DELETE_SELF = 0x400
MOVE_SELF = 0x800
Q_OVERFLOW = 0x4000
IGNORED = 0x8000


@dataclass(frozen=True)
class Event:
    wd: int
    mask: int
    name: str


class Inotify:
    def __init__(self) -> None:
        fd = _libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        self._fd = int(fd)

    def fileno(self) -> int:
        return self._fd

    def add_watch(self, path: str, mask: int) -> int:
        wd = int(_libc.inotify_add_watch(self._fd, os.fsencode(path), mask))
        if wd < 0:
            err = ctypes.get_errno()
            if err == errno.ENOSPC:  # not the disk: said so, or it would read as a full disk
                raise ResourceExhausted(
                    f"inotify_add_watch {path}: the node's inotify watch limit is reached "
                    "(sysctl fs.inotify.max_user_watches)")
            raise OSError(err, f"inotify_add_watch {path}: {os.strerror(err)}")
        return wd

    def read_events(self) -> list[Event]:
        """The events queued now (none if nothing is pending)."""
        try:
            data = os.read(self._fd, 64 * 1024)
        except BlockingIOError:
            return []
        events: list[Event] = []
        pos = 0
        while pos + _EVENT.size <= len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, pos)
            pos += _EVENT.size
            raw = data[pos:pos + length].split(b"\0", 1)[0]
            pos += length
            events.append(Event(wd, mask, os.fsdecode(raw)))
        return events

    async def wait(self) -> list[Event]:
        """The next batch of events, waiting for it on the running loop."""
        while True:
            events = self.read_events()
            if events:
                return events
            loop = asyncio.get_running_loop()
            ready: asyncio.Future[None] = loop.create_future()
            loop.add_reader(self._fd, _wake, ready)
            try:
                await ready
            finally:
                loop.remove_reader(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)
