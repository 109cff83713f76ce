"""Every unix socket pycrid listens on (CRI, NRI) is published and removed through here.

The rules: a socket another live process listens on is never replaced (the operator is
told which config key to change); one nobody listens on is a dead daemon's and is
replaced; a file that is not a socket is left alone. The new socket is bound under a
temporary name, given its mode and owner, then renamed into place, so it appears whole
and at once. At exit only the file this daemon created is removed: if another process
has since put its own socket at the path, that one stays.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import stat
from collections.abc import Callable
from dataclasses import dataclass

from pycrid.errors import FailedPrecondition

log = logging.getLogger(__name__)


def check_free(path: str, *, what: str, hint: str) -> bool:
    """Refuse (FailedPrecondition) when ``path`` is live or not a socket; True when a dead
    socket is there (the caller may replace it), False when nothing is."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(st.st_mode):
        raise FailedPrecondition(
            f"{what} {path} exists and is not a socket; refusing to replace it: remove it "
            f"or {hint}")
    if _listened_on(path):
        who = listener_of(path)
        raise FailedPrecondition(
            f"{what} {path} is served by another process{f' ({who})' if who else ''}; "
            f"refusing to replace it: stop that process or {hint}")
    return True


def _listening_inodes(path: str) -> set[str]:
    """Inodes of listening unix sockets bound at ``path`` (/proc/net/unix)."""
    found = set()
    with contextlib.suppress(OSError), open("/proc/net/unix") as f:
        next(f, None)
        for line in f:
            parts = line.split(None, 7)
            # Num RefCount Protocol Flags Type St Inode Path; Flags 00010000 = listening
            if len(parts) == 8 and parts[7].strip() == path and int(parts[3], 16) & 0x10000:
                found.add(parts[6])
    return found


def listener_of(path: str) -> str:
    """Who listens on the unix socket ``path``, e.g. "containerd, pid 812"; "" when /proc
    does not tell (another network namespace, a process we cannot see)."""
    targets = {f"socket:[{i}]" for i in _listening_inodes(path)}
    if not targets:
        return ""
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") in targets:
                        with open(f"/proc/{pid}/comm") as f:
                            return f"{f.read().strip()}, pid {pid}"
    return ""


def _listened_on(path: str) -> bool:
    """Whether a process accepts on ``path``: only a refused connection means nobody does
    (a full backlog, or any error we cannot read, counts as someone)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
    try:
        probe.connect(path)
    except OSError as e:
        return e.errno not in (errno.ECONNREFUSED, errno.ENOENT)
    finally:
        probe.close()
    return True


@dataclass(frozen=True)
class SocketFile:
    """The socket file this daemon published: its path and identity."""

    path: str
    dev: int
    ino: int

    def remove(self) -> None:
        """Unlink the path only while it is still the file we created."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if (st.st_dev, st.st_ino) != (self.dev, self.ino):
            log.info("leaving %s: it is no longer the socket this daemon created", self.path)
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def publish(path: str, bind: Callable[[str], None], *, what: str, hint: str,
            mode: int, uid: int = -1, gid: int = -1) -> SocketFile:
    """Bind a listener with ``bind(temporary path)`` (which should also listen, so the
    socket accepts from the moment it appears) and move it to ``path``."""
    stale = check_free(path, what=what, hint=hint)
    # Short, so the temporary name fits sun_path wherever the real one does.
    tmp = os.path.join(os.path.dirname(path), f".{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    old_umask = os.umask(0o177)  # never reachable with a looser mode, even briefly
    try:
        bind(tmp)
    finally:
        os.umask(old_umask)
    try:
        os.chmod(tmp, mode)
        os.chown(tmp, uid, gid)
        st = os.lstat(tmp)
        if stale:
            log.info("replacing stale socket %s", path)
        os.rename(tmp, path)
    except OSError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return SocketFile(path, st.st_dev, st.st_ino)


def listen(path: str, *, what: str, hint: str, mode: int,
           backlog: int = 16) -> tuple[socket.socket, SocketFile]:
    """A non-blocking listening socket published at ``path``."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)

    def bind(tmp: str) -> None:
        sock.bind(tmp)
        sock.listen(backlog)

    try:
        published = publish(path, bind, what=what, hint=hint, mode=mode)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock, published
