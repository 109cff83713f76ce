"""A registry that misbehaves on purpose, for the bad-input tests.

It serves one repository ``bad/<mode>:latest`` over plain http on 127.0.0.1.
Modes: ``garbage`` (the manifest is not JSON), ``truncated`` (a layer blob stops
half-way and the connection is closed), ``wrongdigest`` (a layer blob whose bytes
do not match its digest), ``slow`` (a layer blob that sends a little, then stalls).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import json
import threading
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from tests.support.layers import Entry, tar_bytes


def _digest(b: bytes) -> str:
    return "sha256:" + hashlib.sha256(b).hexdigest()


class BadRegistry:
    def __init__(self) -> None:
        layer_tar = tar_bytes([Entry("hello.txt", data=b"hello\n" * 50_000)])
        self.layer = gzip.compress(layer_tar, mtime=0)
        self.layer_digest = _digest(self.layer)
        config = json.dumps({
            "architecture": "amd64", "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": [_digest(layer_tar)]}, "config": {},
        }).encode()
        self.config, self.config_digest = config, _digest(config)
        self.manifest = json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": self.config_digest, "size": len(config)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                        "digest": self.layer_digest, "size": len(self.layer)}],
        }).encode()
        self.host = ""
        self.requests: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None

    async def _manifest(self, request: web.Request) -> web.StreamResponse:
        mode = request.match_info["mode"]
        self.requests.append(f"{request.method} {request.path}")
        if mode == "garbage":
            body = b"<html>this is not a manifest</html>"
            return web.Response(body=body, headers={
                "Content-Type": "application/vnd.oci.image.manifest.v1+json",
                "Docker-Content-Digest": _digest(body)})
        return web.Response(body=self.manifest if request.method == "GET" else b"", headers={
            "Content-Type": "application/vnd.oci.image.manifest.v1+json",
            "Docker-Content-Digest": _digest(self.manifest),
            "Content-Length": str(len(self.manifest))})

    async def _blob(self, request: web.Request) -> web.StreamResponse:
        mode, digest = request.match_info["mode"], request.match_info["digest"]
        self.requests.append(f"{request.method} {request.path}")
        if digest == self.config_digest:
            return web.Response(body=self.config)
        if digest != self.layer_digest:
            return web.Response(status=404)
        resp = web.StreamResponse(headers={"Content-Length": str(len(self.layer))})
        await resp.prepare(request)
        if mode == "wrongdigest":
            data = bytearray(self.layer)
            data[len(data) // 2] ^= 0xFF
            await resp.write(bytes(data))
            return resp
        half = self.layer[: len(self.layer) // 2]
        await resp.write(half)
        if mode == "slow":
            await asyncio.sleep(4)
        # Drop the connection mid-blob.
        assert request.transport is not None
        request.transport.close()
        return resp

    def _app(self) -> web.Application:
        app = web.Application()
        async def root(request: web.Request) -> web.Response:
            return web.json_response({})

        app.router.add_route("GET", "/v2/", root)
        app.router.add_route("*", "/v2/bad/{mode}/manifests/{ref}", self._manifest)
        app.router.add_route("GET", "/v2/bad/{mode}/blobs/{digest}", self._blob)
        return app

    @contextlib.contextmanager
    def running(self) -> Iterator[BadRegistry]:
        ready = threading.Event()
        loop = asyncio.new_event_loop()
        self._loop = loop

        async def start() -> None:
            self._runner = web.AppRunner(self._app())
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            sock: Any = site._server.sockets[0]  # type: ignore[union-attr]
            self.host = f"127.0.0.1:{sock.getsockname()[1]}"
            ready.set()

        def run() -> None:
            loop.run_until_complete(start())
            loop.run_forever()

        t = threading.Thread(target=run, daemon=True)
        t.start()
        ready.wait(10)
        try:
            yield self
        finally:
            async def stop() -> None:
                assert self._runner is not None
                await self._runner.cleanup()

            asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            t.join(10)
            loop.close()
