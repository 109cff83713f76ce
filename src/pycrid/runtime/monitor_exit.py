"""Waiting for a container's conmon to end, without mistaking another process for it."""

from __future__ import annotations

import asyncio
import os


async def monitor_gone(pid: int, object_id: str, within: float) -> bool:
    """Whether the conmon of ``object_id`` at ``pid`` has ended (a pid that now names
    another process counts as ended), waiting up to ``within`` seconds."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            return True
        if not argv[0].endswith(b"conmon") or object_id.encode() not in argv:
            return True
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()

        def readable() -> None:  # a pidfd turns readable when its process ends
            if not ended.done():
                ended.set_result(None)

        loop.add_reader(fd, readable)
        try:
            await asyncio.wait_for(ended, within)
            return True
        except TimeoutError:
            return False
        finally:
            loop.remove_reader(fd)
    finally:
        os.close(fd)
