"""The command lines of runc and conmon as pycrid meets them: finding the binaries,
reading runc's error messages and conmon's sync pipe, and holding an exec's capped
output."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from pycrid.errors import Internal, Unavailable
from pycrid.host import binaries

_INSTALL_HINT = "install it (Debian/Ubuntu: apt-get install runc conmon)"


def find_binary(configured: str, name: str, key: str = "") -> str:
    """The binary's path, or an error that says how to get one (``key`` is its config key)."""
    key = key or f"{name}_path"
    if configured:
        if os.path.isfile(configured) and os.access(configured, os.X_OK):
            return configured
        raise Unavailable(f"{name} binary {configured!r} (config {key}) does not exist or is "
                          f"not executable; {_INSTALL_HINT} or fix {key}")
    path = binaries.which(name)
    if not path:
        raise Unavailable(f"{name} binary not found in {binaries.search_path()}; {_INSTALL_HINT} "
                          f"or set {key} to its path")
    return path


def runc_message(raw: bytes) -> str:
    """runc's logrus line (``time=… level=error msg="…"``) reduced to its message. When
    there are errors, its warnings go (runc 1.5 quotes all of CRIU's log as warnings
    when a checkpoint fails)."""
    text = raw.decode(errors="replace").strip()
    lines = []
    all_lines = text.splitlines()
    if any("level=error" in line for line in all_lines):
        all_lines = [line for line in all_lines if "level=" not in line or "level=error" in line]
    for line in all_lines:
        if 'msg="' in line:
            msg = line.split('msg="', 1)[1]
            msg = msg.rsplit('"', 1)[0]
            lines.append(msg.replace('\\"', '"').replace("\\n", " ").strip())
        elif line.strip():
            lines.append(line.strip())
    return "; ".join(lines) or text


async def read_sync(fd: int) -> dict[str, Any] | None:
    """The first JSON message on conmon's sync pipe, or None on EOF without one."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0))
    try:
        line = await reader.readline()
    finally:
        transport.close()
    if not line.strip():
        return None
    try:
        msg = json.loads(line)
    except ValueError:
        raise Internal(f"conmon sent a malformed sync message: {line[:200]!r}") from None
    return msg if isinstance(msg, dict) else None


class CappedSink:
    """Collects output up to ``cap`` bytes; containerd discards the excess silently."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.data = bytearray()

    async def write(self, data: bytes) -> None:
        room = self.cap - len(self.data)
        if room > 0:
            self.data += data[:room]

    async def close(self) -> None:
        pass
