"""systemd's readiness protocol (sd_notify(3)) without a library: datagrams to NOTIFY_SOCKET.

The variable is taken out of the environment as soon as it is read: runc treats a
NOTIFY_SOCKET it inherits as a request to proxy the socket into the container and
``runc start`` would then wait for the container to say READY=1.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)

ENV = "NOTIFY_SOCKET"


def _address(value: str) -> str | bytes | None:
    """The socket address: a path, or ``@name`` for Linux's abstract namespace."""
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    return None  # vsock and other forms are not for a node daemon


class Notifier:
    """Sends state lines to the service manager; does nothing when none is listening."""

    def __init__(self, value: str | None) -> None:
        self.address = _address(value) if value else None
        if value and self.address is None:
            log.warning("%s=%r is not a unix socket path; not notifying", ENV, value)

    @classmethod
    def from_env(cls) -> Notifier:
        return cls(os.environ.pop(ENV, None))

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, **fields: str | int) -> bool:
        """Send ``KEY=value`` lines (``notify(READY=1, STATUS="...")``); True if sent."""
        if self.address is None:
            return False
        data = "".join(f"{k}={v}\n" for k, v in fields.items()).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.sendto(data, self.address)
        except OSError as e:
            # The manager going away must not take the daemon with it.
            log.warning("sd_notify to %s failed: %s", self.address, e)
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.notify(READY=1, MAINPID=os.getpid(), STATUS=status)

    def stopping(self) -> bool:
        return self.notify(STOPPING=1, STATUS="stopping")
