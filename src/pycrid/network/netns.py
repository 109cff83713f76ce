"""Pinned network namespaces: a new netns bind-mounted on a file, with ``lo`` up.

containerd creates the pod's netns before the pause container so the network
can be wired first (CRI-TO-OCI.md §1.1); the pause container then joins it by
path. Here a short-lived thread unshares its own network namespace (allowed
in a threaded process: namespaces belong to the thread), pins it with a bind
mount of ``/proc/thread-self/ns/net`` and raises ``lo`` through an ioctl on a
socket opened inside it. No ``ip``/``unshare`` subprocess is needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import os
import socket
import struct
import threading
from collections.abc import Callable
from typing import TypeVar

from pycrid.errors import Internal
from pycrid.images.mount import mount, unmount
from pycrid.images.snapshots import Mount

T = TypeVar("T")

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1


def _lo_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s.fileno(), _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def create_netns(path: str) -> None:
    """Create a network namespace pinned at ``path`` (a new file) with loopback up."""
    os.makedirs(os.path.dirname(path), mode=0o711, exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDONLY, 0o444)
    os.close(fd)

    def pin() -> None:
        if _libc.unshare(_CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise Internal(f"unshare(CLONE_NEWNET): {os.strerror(err)}")
        mount(Mount("bind", "/proc/thread-self/ns/net"), path)
        _lo_up()

    try:
        _in_own_thread(pin, "netns-create")
    except Internal:
        remove_netns(path)
        raise
    except Exception as err:
        remove_netns(path)
        raise Internal(f"create netns {path}: {err}") from err


def _in_own_thread(work: Callable[[], T], name: str) -> T:
    """``work()`` in a thread of its own that ends with it: namespaces belong to threads,
    and a thread that joined or made one must never run other work."""
    result: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as e:
            failure.append(e)

    t = threading.Thread(target=run, name=name)
    t.start()
    t.join()
    if failure:
        raise failure[0]
    return result[0]


def remove_netns(path: str) -> None:
    """Unpin and delete ``path``; nothing to do if it is already gone."""
    try:
        unmount(path, detach=True)
    except Internal as e:
        if f"errno {errno.EINVAL}" not in str(e) and f"errno {errno.ENOENT}" not in str(e):
            raise
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def is_pinned(path: str) -> bool:
    """Whether ``path`` still holds a network namespace (a nsfs mount)."""
    try:
        return os.stat(path).st_dev != os.stat(os.path.dirname(path)).st_dev
    except FileNotFoundError:
        return False


def _socket_in(path: str, family: socket.AddressFamily) -> socket.socket:
    """A TCP socket created inside the namespace pinned at ``path``: a socket belongs to
    the namespace it was made in, so only its creation needs a thread that joined it."""

    def create() -> socket.socket:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if _libc.setns(fd, _CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns {path}: {os.strerror(err)}")
        finally:
            os.close(fd)
        return socket.socket(family, socket.SOCK_STREAM)

    return _in_own_thread(create, "netns-socket")


async def connect_in(path: str | None, port: int) -> socket.socket:
    """A connection to ``localhost:port`` in the namespace at ``path`` (None: the
    daemon's own), IPv4 first, then IPv6 (containerd's port-forward dials the same)."""
    loop = asyncio.get_running_loop()
    error: OSError | None = None
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        sock = (await asyncio.to_thread(_socket_in, path, family) if path
                else socket.socket(family, socket.SOCK_STREAM))
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, (host, port))
            return sock
        except OSError as e:
            sock.close()
            error = error or e
    assert error is not None
    raise error
