"""One daemon per node: an exclusive lock on each path a daemon owns (root, state, CRI socket).

containerd gets this from the lock its metadata database (bbolt) takes on open; pycrid's
SQLite file would let a second daemon in, so the daemon takes these before anything reads
or writes its directories. The lock is ``flock`` on a file holding the holder's pid: the
kernel drops it when the holder dies, and a refused daemon can say who holds it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os

from pycrid.errors import FailedPrecondition


class PathLock:
    """``path`` locked for this process's lifetime; the file is removed at release."""

    def __init__(self, path: str, *, what: str, hint: str) -> None:
        self.path = path
        #: What the lock protects and how to avoid the conflict, for the refusal.
        self.what = what
        self.hint = hint
        self._fd: int | None = None

    def acquire(self) -> None:
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as e:
                raise FailedPrecondition(
                    f"cannot create the lock file {self.path} for {self.what}: {e.strerror}; "
                    f"the directory must be writable by root, or {self.hint}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = _read_pid(fd)
                os.close(fd)
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
                raise FailedPrecondition(
                    f"{self.what} is in use by another pycrid (pid {holder or 'unknown'} holds "
                    f"the lock {self.path}); stop it first or {self.hint}") from None
            # A holder that was stopping may have removed the file between our open and our
            # flock: then we hold a lock on a file nobody else can find. Start again.
            if _same_file(fd, self.path):
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        """Remove the file while still holding the lock (so nobody locks a file about to
        vanish), then unlock."""
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        os.close(self._fd)
        self._fd = None


def _read_pid(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return ""
    return text if text.isdigit() else ""


def _same_file(fd: int, path: str) -> bool:
    mine = os.fstat(fd)
    try:
        there = os.stat(path)
    except FileNotFoundError:
        return False
    return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)
