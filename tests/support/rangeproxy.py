"""A proxy in front of a test registry that changes how it answers range requests.

It forwards every request to the registry (plain http on 127.0.0.1) and records it;
``mode`` decides what a ``Range`` request gets: ``pass`` (the registry's answer),
``norange`` (the header is dropped: the whole blob, 200, as a registry without range
support answers), ``single`` (a request for several ranges gets the whole blob, as
object stores behind a redirect answer; one range works). ``tamper`` may change the
body of a 206 answer, and of whole blobs with ``tamper_whole`` (a registry or a path
that corrupts what it sends).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from tests.support.registry import LocalRegistry

#: (path, the Range asked, the body) -> the body to send.
Tamper = Callable[[str, str, bytes], bytes]


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    range: str
    status: int


class RangeProxy:
    def __init__(self, upstream: LocalRegistry, mode: str = "pass",
                 tamper: Tamper | None = None) -> None:
        self.upstream = upstream
        self.mode = mode
        self.tamper = tamper
        #: Have ``tamper`` change whole blobs (200 answers) too.
        self.tamper_whole = False
        self.seen: list[Seen] = []
        self.host = ""
        self._session: aiohttp.ClientSession | None = None

    def blob_requests(self, digest: str) -> list[Seen]:
        return [s for s in self.seen if s.method == "GET" and s.path.endswith(f"/blobs/{digest}")]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() not in ("host", "range", "accept-encoding")}
        rng = request.headers.get("Range", "")
        if rng and not (self.mode == "norange" or (self.mode == "single" and "," in rng)):
            headers["Range"] = rng
        url = f"{self.upstream.url}{request.path_qs}"
        async with self._session.request(request.method, url, headers=headers,
                                         data=await request.read(),
                                         allow_redirects=False) as up:
            body = await up.read()
            status = up.status
            tampered = status == 206 or (status == 200 and self.tamper_whole
                                         and "/blobs/" in request.path)
            if tampered and self.tamper is not None and request.method == "GET":
                body = self.tamper(request.path, rng, body)
            out = {k: v for k, v in up.headers.items()
                   if k.lower() not in ("content-length", "transfer-encoding", "date",
                                        "server", "connection")}
        self.seen.append(Seen(request.method, request.path, rng, status))
        if request.method == "HEAD":
            out["Content-Length"] = up.headers.get("Content-Length", "0")
            return web.Response(status=status, headers=out)
        return web.Response(status=status, body=body, headers=out)

    @contextlib.contextmanager
    def running(self) -> Iterator[RangeProxy]:
        ready = threading.Event()
        loop = asyncio.new_event_loop()
        runner: list[web.AppRunner] = []

        async def start() -> None:
            self._session = aiohttp.ClientSession(auto_decompress=False)
            app = web.Application(client_max_size=1 << 30)
            app.router.add_route("*", "/{tail:.*}", self._handle)
            r = web.AppRunner(app)
            await r.setup()
            site = web.TCPSite(r, "127.0.0.1", 0)
            await site.start()
            sock: Any = site._server.sockets[0]  # type: ignore[union-attr]
            self.host = f"127.0.0.1:{sock.getsockname()[1]}"
            runner.append(r)
            ready.set()

        t = threading.Thread(target=lambda: (loop.run_until_complete(start()),
                                             loop.run_forever()), daemon=True)
        t.start()
        if not ready.wait(10):
            raise RuntimeError("the range proxy did not start")
        try:
            yield self
        finally:
            async def stop() -> None:
                await runner[0].cleanup()
                assert self._session is not None
                await self._session.close()

            asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            t.join(10)
            loop.close()
