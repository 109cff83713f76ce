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
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from pycrid import inotify

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Exit:
    id: str
    code: int
    #: When the file was written (its mtime), in Unix nanoseconds.
    at_ns: int
    #: Set when the exit was inferred rather than read ("Unknown": the process vanished
    #: without a recorded status while the daemon was down).
    reason: str = ""
    #: Why, in words, when the daemon recorded the exit on the monitor's behalf.
    message: str = ""


def read_exit(exit_dir: str, object_id: str) -> Exit | None:
    """The exit recorded for ``object_id``, or None while it has not exited.

    conmon writes the code alone; an exit the daemon recorded for a dead monitor
    (``write_exit``) adds a reason and a message on the next lines."""
    path = os.path.join(exit_dir, object_id)
    try:
        with open(path, "rb") as f:
            raw = f.read().strip()
        st = os.stat(path)
    except FileNotFoundError:
        return None
    first, _, rest = raw.partition(b"\n")
    try:
        code = int(first)
    except ValueError:
        return None  # being written; the inotify event follows
    reason, _, message = rest.decode(errors="replace").partition("\n")
    return Exit(object_id, code, st.st_mtime_ns, reason.strip(), message.strip())


def write_exit(exit_dir: str, exit_: Exit) -> Exit:
    """Record ``exit_`` as conmon would (atomically: a hidden name, then renamed), for a
    container whose conmon died before it could; returns it as read back."""
    path = os.path.join(exit_dir, exit_.id)
    tmp = os.path.join(exit_dir, f".{exit_.id}.tmp")
    with open(tmp, "w") as f:
        f.write(f"{exit_.code}\n{exit_.reason}\n{exit_.message}\n")
    os.replace(tmp, path)
    return read_exit(exit_dir, exit_.id) or exit_


class ExitWatcher:
    """Calls ``on_exit`` once per exit file that appears in ``exit_dir``."""

    def __init__(self, exit_dir: str, on_exit: Callable[[Exit], None]) -> None:
        self.exit_dir = exit_dir
        self._on_exit = on_exit
        self._ino: inotify.Inotify | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._seen: set[str] = set()
        os.makedirs(exit_dir, mode=0o700, exist_ok=True)

    def start(self) -> None:
        ino = inotify.Inotify()
        try:
            ino.add_watch(self.exit_dir,
                          inotify.CLOSE_WRITE | inotify.MOVED_TO | inotify.DELETE)
        except BaseException:
            ino.close()
            raise
        self._ino = ino
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(ino.fileno(), self._readable)

    def close(self) -> None:
        if self._ino is not None:
            assert self._loop is not None
            self._loop.remove_reader(self._ino.fileno())
            self._ino.close()
            self._ino = None

    def _readable(self) -> None:
        assert self._ino is not None
        events = self._ino.read_events()
        for e in events:
            if e.mask & inotify.DELETE and e.name:
                self._seen.discard(e.name)  # the object was removed: a new file is a new exit
        names = [e.name for e in events if e.name
                 and not e.mask & (inotify.Q_OVERFLOW | inotify.DELETE)]
        if any(e.mask & inotify.Q_OVERFLOW for e in events):
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
