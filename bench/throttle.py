"""A TCP proxy on 127.0.0.1 that caps what flows from a server to its clients at a given
rate, all connections together: a registry behind a link of that many Mbit/s, for the
partial section (on loopback a download costs next to nothing, which is not a node's
life). Bytes are forwarded as they are; nothing is parsed."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

_CHUNK = 64 << 10


class _Bucket:
    """Bytes allowed out, refilled at ``rate`` bytes per second (one burst of 64 KiB)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._free_at = 0.0

    async def take(self, n: int) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        start = max(now, self._free_at)
        self._free_at = start + n / self.rate
        if start - now > 0:
            await asyncio.sleep(start - now)


class Throttle:
    def __init__(self, upstream_port: int, mbit: float) -> None:
        self.upstream_port = upstream_port
        self.bucket = _Bucket(mbit * 1e6 / 8)
        self.port = 0

    async def _pump(self, r: asyncio.StreamReader, w: asyncio.StreamWriter,
                    limited: bool) -> None:
        try:
            while data := await r.read(_CHUNK):
                if limited:
                    await self.bucket.take(len(data))
                w.write(data)
                await w.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            with contextlib.suppress(Exception):
                w.close()

    async def _serve(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            cw.close()
            return
        await asyncio.gather(self._pump(cr, uw, False), self._pump(ur, cw, True),
                             return_exceptions=True)

    @contextlib.contextmanager
    def running(self) -> Iterator[Throttle]:
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        server: list[Any] = []

        async def start() -> None:
            srv = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            self.port = srv.sockets[0].getsockname()[1]
            server.append(srv)
            ready.set()

        t = threading.Thread(target=lambda: (loop.run_until_complete(start()),
                                             loop.run_forever()), daemon=True)
        t.start()
        if not ready.wait(10):
            raise RuntimeError("the throttling proxy did not start")
        try:
            yield self
        finally:
            async def stop() -> None:
                server[0].close()
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

            asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            t.join(10)
            loop.close()
