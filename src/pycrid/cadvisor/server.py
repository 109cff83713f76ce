"""The containerd socket: claimed only when nobody else serves it, then served by its own
gRPC server (never the CRI one: only the read-only containerd services are reachable on
it, and none of CRI's).

A real containerd may run on the same node, at the same path. Its socket is never taken
over: a path some live process listens on, or that is not a socket at all, is refused
(``SocketBusy``, naming the listener when /proc tells); a socket file nobody listens on
is stale and replaced. At close, the socket is removed only if it is still the one bound
here (gRPC would remove whatever is at its bind path: it binds a private name instead).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
from collections.abc import Sequence

import grpc

from pycrid.errors import FailedPrecondition

log = logging.getLogger(__name__)


class SocketBusy(FailedPrecondition):
    """The path is another process's socket (or not a socket): not taken over."""


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
    """Who listens on the unix socket ``path``, e.g. "containerd (pid 812)"; "" unknown."""
    inodes = _listening_inodes(path)
    if not inodes:
        return ""
    targets = {f"socket:[{i}]" for i in inodes}
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") in targets:
                        with open(f"/proc/{pid}/comm") as f:
                            return f"{f.read().strip()} (pid {pid})"
    return ""


def claim(path: str) -> None:
    """Make ``path`` free to bind, or raise SocketBusy saying why it is not ours."""
    os.makedirs(os.path.dirname(path), mode=0o711, exist_ok=True)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketBusy(f"{path} exists and is not a socket; not replacing it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        log.info("replacing stale socket %s (nobody listens on it)", path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    except OSError as e:  # a full backlog, a timeout: somebody is there
        who = listener_of(path) or f"a live process ({e.strerror or e})"
        raise SocketBusy(f"{path} is served by {who}; not taking it over") from None
    finally:
        probe.close()
    raise SocketBusy(f"{path} is served by {listener_of(path) or 'another process'}; "
                     "not taking it over")


class ContainerdEndpoint:
    """One gRPC server on one unix socket; ``start`` claims and binds, ``close`` undoes."""

    def __init__(self, path: str, handlers: Sequence[grpc.GenericRpcHandler], *,
                 max_message_size: int = 16 * 1024 * 1024) -> None:
        self.path = path
        self._handlers = list(handlers)
        self._max = max_message_size
        self._server: grpc.aio.Server | None = None
        self._inode = 0

    async def start(self) -> None:
        """Claim the path, serve on a private name beside it, then hard-link the path to
        that socket: the link fails if anybody took the path meanwhile (no race), and
        gRPC's own unlink at shutdown only ever sees the private name."""
        claim(self.path)
        directory, name = os.path.split(self.path)
        private = os.path.join(directory, f".{name}.pycrid-{os.getpid()}")
        server = grpc.aio.server(options=[("grpc.max_send_message_length", self._max),
                                          ("grpc.max_receive_message_length", self._max)])
        server.add_generic_rpc_handlers(self._handlers)
        old_umask = os.umask(0o117)  # born 0660, as containerd's
        try:
            server.add_insecure_port(f"unix://{private}")
        finally:
            os.umask(old_umask)
        await server.start()
        try:
            os.link(private, self.path)
        except OSError as e:
            await server.stop(grace=None)
            raise SocketBusy(f"{self.path} was taken while pycrid started serving it "
                             f"({e.strerror}); not taking it over") from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(private)
        self._server = server
        self._inode = os.stat(self.path).st_ino
        log.info("serving containerd's API (read-only, for the kubelet's cAdvisor) on %s",
                 self.path)

    async def close(self) -> None:
        if self._server is None:
            return
        await self._server.stop(grace=1)
        self._server = None
        with contextlib.suppress(FileNotFoundError):
            if os.stat(self.path).st_ino == self._inode:  # not a successor's socket
                os.unlink(self.path)


__all__ = ["ContainerdEndpoint", "SocketBusy", "claim", "listener_of"]
