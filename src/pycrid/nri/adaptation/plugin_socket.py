"""The socket external NRI plugins connect to: directory 0700, socket 0600, and never
another live runtime's socket taken over (refused at start-up, before recovery)."""

from __future__ import annotations

import os
import socket

from pycrid import unixsock
from pycrid.config.schema import NRIConfig

#: How to avoid another process's NRI socket (for refusals).
SOCKET_HINT = ('set socket_path in [plugins."pycrid.nri.v1.nri"] to another path (or '
               "disable_connections = true)")


def listen(path: str) -> tuple[socket.socket, unixsock.SocketFile]:
    """The external plugins' socket: directory 0700, socket 0600; never another live
    runtime's socket taken over."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    return unixsock.listen(path, what="the NRI socket", hint=SOCKET_HINT, mode=0o600)


def check_socket_free(config: NRIConfig) -> None:
    """At start-up, before recovery: refuse the NRI socket of a runtime that is running."""
    if not config.disable and not config.disable_connections:
        unixsock.check_free(config.socket_path, what="the NRI socket", hint=SOCKET_HINT)
