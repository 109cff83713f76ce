"""Every unix socket pycrid listens on (CRI, NRI) is published and removed through here.

The rules: a socket another live process listens on is never replaced (the operator is
told which config key to change); one nobody listens on is a dead daemon's and is
replaced; a file that is not a socket is left alone. The socket is bound at its own path
(so ``ss -xlp`` and /proc/net/unix show it by its name) under a umask that keeps it
private until it has its mode and owner. At exit only the file this daemon created is
removed: if another process has since put its own socket at the path, that one stays.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import stat
import struct
from collections.abc import Callable, Iterator
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


def listener_pid(path: str) -> int | None:
    """The pid of the process that listens on the unix socket ``path`` (the kernel keeps
    the listener's credentials for every connection: SO_PEERCRED); None when nothing
    accepts there or the pid is not visible from our pid namespace (0)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
    try:
        probe.connect(path)
        creds = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                 struct.calcsize("3i"))
    except OSError:
        return None
    finally:
        probe.close()
    pid = int(struct.unpack("3i", creds)[0])
    return pid or None


def listener_of(path: str) -> str:
    """Who listens on the unix socket ``path``, e.g. "containerd, pid 812"; "" when that
    cannot be told."""
    pid = listener_pid(path)
    if pid is None:
        return ""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f"{f.read().strip()}, pid {pid}"
    except OSError:
        return f"pid {pid}"


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

    @contextlib.contextmanager
    def foreign_kept(self) -> Iterator[None]:
        """Around the stop of a server that unlinks its path itself (gRPC does): a socket
        another process has put at the path meanwhile survives it (a hard link aside,
        renamed back after)."""
        aside = None
        try:
            st = os.lstat(self.path)
            if (st.st_dev, st.st_ino) != (self.dev, self.ino):
                aside = f"{self.path}.{os.getpid()}.kept"
                os.link(self.path, aside)
        except OSError:
            aside = None
        try:
            yield
        finally:
            if aside is not None:
                os.replace(aside, self.path)

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
    """Bind a listener at ``path`` with ``bind(path)`` once nothing live is there (a dead
    socket is removed first), then give it its mode and owner."""
    if check_free(path, what=what, hint=hint):
        log.info("replacing stale socket %s", path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    old_umask = os.umask(0o177)  # never reachable with a looser mode, even briefly
    try:
        bind(path)
    finally:
        os.umask(old_umask)
    try:
        os.chmod(path, mode)
        os.chown(path, uid, gid)
        st = os.lstat(path)
    except OSError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        raise
    return SocketFile(path, st.st_dev, st.st_ino)


def listen(path: str, *, what: str, hint: str, mode: int,
           backlog: int = 16) -> tuple[socket.socket, SocketFile]:
    """A non-blocking listening socket published at ``path``."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)

    def bind(at: str) -> None:
        sock.bind(at)
        sock.listen(backlog)

    try:
        published = publish(path, bind, what=what, hint=hint, mode=mode)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock, published
