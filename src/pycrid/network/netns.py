"""Pinned network namespaces: a new netns bind-mounted on a file, with ``lo`` up.

containerd creates the pod's netns before the pause container so the network
can be wired first (CRI-TO-OCI.md §1.1); the pause container then joins it by
path. A short-lived thread makes it (:mod:`pycrid.host.pins`) and raises ``lo``
through an ioctl on a socket opened inside it, with no ``ip``/``unshare``
subprocess. A pod in a user namespace gets its netns made inside a new
user namespace with the pod's mappings (containerd's ``setupNetnsWithinUserns``):
only a process can do that (:mod:`pycrid.host.userns`), and the netns then holds
that user namespace, which the sandbox controller pins as the pod's.
"""

from __future__ import annotations

import asyncio
import fcntl
import socket
import struct

from pycrid.host import pins
from pycrid.host.idmap import IDMap
from pycrid.host.userns import NamespaceRequest, pin_namespaces

_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1


def _lo_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s.fileno(), _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def create_netns(path: str, idmap: IDMap | None = None) -> None:
    """Create a network namespace pinned at ``path`` (a new file) with loopback up;
    with ``idmap``, owned by a new user namespace with those mappings."""
    if idmap is None:
        pins.pin_new({"net": path}, _lo_up)
    else:
        pin_namespaces(NamespaceRequest(pins={"net": path}, idmap=idmap, new=("net",),
                                        lo_up=True))


#: Unpin and delete a netns file (nothing to do if it is gone).
remove_netns = pins.unpin
#: Whether a netns file still holds its namespace.
is_pinned = pins.is_pinned


def _socket_in(path: str, family: socket.AddressFamily) -> socket.socket:
    """A TCP socket created inside the namespace pinned at ``path``: a socket belongs to
    the namespace it was made in, so only its creation needs a thread that joined it."""

    def create() -> socket.socket:
        pins.setns(path, "net")
        return socket.socket(family, socket.SOCK_STREAM)

    return pins.in_own_thread(create, "netns-socket")


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
