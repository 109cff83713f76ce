"""The one reader of ``/proc/self/mountinfo`` (proc(5)): unmounting, cgroup discovery,
filesystem devices and mount propagation all need a line of it, parsed the same way;
``MountTableWatch`` tells when the table changes."""

from __future__ import annotations

import asyncio
import os
import re
import select
from collections.abc import Callable, Iterator
from dataclasses import dataclass

MOUNTINFO = "/proc/self/mountinfo"


@dataclass(frozen=True)
class MountEntry:
    """One line: ``36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw``."""

    mount_id: int
    parent_id: int
    device: str
    """``major:minor`` of the filesystem."""
    root: str
    mount_point: str
    options: tuple[str, ...]
    optional: tuple[str, ...]
    """Tagged fields such as ``shared:1`` or ``master:2``."""
    fstype: str
    source: str
    super_options: tuple[str, ...]

    @property
    def propagation(self) -> str:
        """"rshared", "rslave" or "" (private), as runc's mount options name them."""
        if any(o.startswith("shared:") for o in self.optional):
            return "rshared"
        if any(o.startswith("master:") for o in self.optional):
            return "rslave"
        return ""

    def holds(self, path: str) -> bool:
        """``path`` is this mount point or below it."""
        return path == self.mount_point or path.startswith(self.mount_point.rstrip("/") + "/")


def unescape(field: str) -> str:
    """Undo mountinfo's octal escapes (``\\040`` for a space) byte-exactly."""
    raw = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8)]), os.fsencode(field))
    return os.fsdecode(raw)


def parse(text: str) -> Iterator[MountEntry]:
    """The entries of mountinfo text, in order; malformed lines are skipped."""
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, rfields = left.split(" "), right.split(" ")
        if not sep or len(fields) < 6 or len(rfields) < 3:
            continue
        try:
            mount_id, parent_id = int(fields[0]), int(fields[1])
        except ValueError:
            continue
        yield MountEntry(mount_id, parent_id, fields[2], unescape(fields[3]),
                         unescape(fields[4]), tuple(fields[5].split(",")), tuple(fields[6:]),
                         rfields[0], unescape(rfields[1]), tuple(rfields[2].split(",")))


def read(path: str = MOUNTINFO, *, strict: bool = False) -> list[MountEntry]:
    """This process's mount table now; [] when it cannot be read, unless ``strict`` (an
    unmount must not take an unreadable table for one without mounts)."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return list(parse(f.read()))
    except OSError:
        if strict:
            raise
        return []


def holder_of(path: str, entries: list[MountEntry]) -> MountEntry | None:
    """The mount that holds ``path`` (the last of the deepest mount points above it)."""
    target = os.path.normpath(path)
    best: MountEntry | None = None
    for entry in entries:
        if entry.holds(target) and (best is None
                                    or len(entry.mount_point) >= len(best.mount_point)):
            best = entry
    return best


class MountTableWatch:
    """Calls ``changed()`` on the event loop each time this mount namespace's table
    changes. The mountinfo file is always readable and signals a change with POLLPRI
    (proc(5)); an epoll of our own asks for that alone, and the loop watches that epoll,
    so nothing runs while the table is still."""

    def __init__(self, changed: Callable[[], None], path: str = MOUNTINFO) -> None:
        self._changed = changed
        self._path = path
        self._file: int = -1
        self._epoll: select.epoll | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Begin watching (idempotent); on the event loop."""
        if self._epoll is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._file = os.open(self._path, os.O_RDONLY | os.O_CLOEXEC)
        self._epoll = select.epoll()
        self._epoll.register(self._file, select.EPOLLPRI)
        self._loop.add_reader(self._epoll.fileno(), self._ready)

    def close(self) -> None:
        if self._epoll is not None:
            assert self._loop is not None
            self._loop.remove_reader(self._epoll.fileno())
            self._epoll.close()
            os.close(self._file)
            self._epoll, self._file = None, -1

    def _ready(self) -> None:
        assert self._epoll is not None
        self._epoll.poll(0)  # takes the change in: the next one wakes us again
        self._changed()
