"""The ``[metrics] address`` endpoint: Prometheus text on /v1/metrics (containerd's path) and
/metrics, served by aiohttp on the daemon's loop."""

from __future__ import annotations

import logging

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from pycrid.config.decode import ConfigError
from pycrid.metrics import Metrics

log = logging.getLogger(__name__)

PATHS = ("/v1/metrics", "/metrics")


class MetricsServer:
    def __init__(self, metrics: Metrics, address: str) -> None:
        self.metrics = metrics
        self.address = address
        self._runner: web.AppRunner | None = None

    async def _scrape(self, request: web.Request) -> web.Response:
        # Scrapes are small and read memory only, so they run on the loop.
        return web.Response(body=self.metrics.exposition(),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self) -> None:
        """Bind and serve; a bad or busy address is a ConfigError naming metrics.address."""
        host, _, port = self.address.rpartition(":")
        app = web.Application()
        for path in PATHS:
            app.router.add_get(path, self._scrape)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        try:
            site = web.TCPSite(runner, host.strip("[]") or None, int(port))
            await site.start()
        except (OSError, ValueError) as e:
            await runner.cleanup()
            raise ConfigError("metrics.address",
                              f"cannot serve metrics on {self.address}: {e}") from None
        self._runner = runner
        log.info("serving metrics on http://%s%s", self.address, PATHS[0])

    async def aclose(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
