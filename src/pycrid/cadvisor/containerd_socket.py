"""The containerd socket: its own gRPC server (never the CRI one: only the read-only
containerd services are reachable on it, and none of CRI's), published like every socket
pycrid listens on (pycrid/unixsock.py): a real containerd's live socket at the same path
is never taken over, a dead one is replaced, and at close only our own file is removed.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence

import grpc

from pycrid.errors import FailedPrecondition
from pycrid.unixsock import SocketFile, publish

log = logging.getLogger(__name__)

WHAT = "containerd's API socket (for the kubelet's cAdvisor)"
HINT = ('set socket_path in [plugins."pycrid.cadvisor.v1.containerd"] to another path and '
        "give the kubelet --containerd=<that path> (or disable = true)")


class ContainerdEndpoint:
    """One gRPC server on one unix socket; ``start`` publishes it, ``close`` undoes."""

    def __init__(self, path: str, handlers: Sequence[grpc.GenericRpcHandler], *,
                 max_message_size: int = 16 * 1024 * 1024) -> None:
        self.path = path
        self._handlers = list(handlers)
        self._max = max_message_size
        self._server: grpc.aio.Server | None = None
        self._file: SocketFile | None = None

    async def start(self) -> None:
        """FailedPrecondition, and nothing served, when the path is not free."""
        os.makedirs(os.path.dirname(self.path), mode=0o711, exist_ok=True)
        server = grpc.aio.server(options=[("grpc.max_send_message_length", self._max),
                                          ("grpc.max_receive_message_length", self._max)])
        server.add_generic_rpc_handlers(self._handlers)

        def bind(at: str) -> None:
            if not server.add_insecure_port(f"unix://{at}"):
                raise FailedPrecondition(f"cannot listen on {at}")

        # containerd's own socket is root's, mode 0660.
        self._file = publish(self.path, bind, what=WHAT, hint=HINT, mode=0o660)
        await server.start()
        self._server = server
        log.info("serving containerd's API (read-only, for the kubelet's cAdvisor) on %s",
                 self.path)

    async def close(self) -> None:
        if self._server is not None:
            with (self._file.foreign_kept() if self._file is not None
                  else contextlib.nullcontext()):
                await self._server.stop(grace=1)
            self._server = None
        if self._file is not None:
            self._file.remove()
            self._file = None


__all__ = ["HINT", "WHAT", "ContainerdEndpoint"]
