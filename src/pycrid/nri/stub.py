"""The plugin SDK: write an NRI plugin as a Python object.

A plugin subclasses ``Plugin`` (nri/sdk_plugin.py) and overrides the handlers it
cares about. ``Stub`` connects the plugin to a runtime -- the NRI socket for an
external plugin, fd ``NRI_PLUGIN_SOCKET`` for a plugin the runtime launched --
registers it and serves it (nri/stub_answers.py) until the connection ends. An
exception in a handler answers that call with an error and the plugin carries
on; only the connection ending stops it.

    class Logger(Plugin):
        async def create_container(self, pod, container):
            return Adjustment().add_env("SEEN_BY", "logger")

    asyncio.run(Stub(Logger(), name="logger", idx="10").run())
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Iterable
from typing import Any, NoReturn

from pycrid.nri import api
from pycrid.nri.replies import Update
from pycrid.nri.sdk_plugin import Plugin, implemented, update_messages
from pycrid.nri.stub_answers import StubAnswers
from pycrid.nri.wire.connection import PLUGIN_SIDE, Connection, connect
from pycrid.nri.wire.ttrpc import TtrpcError
from pycrid.tasks import race

log = logging.getLogger("pycrid.nri.stub")

__all__ = ["Plugin", "PluginIdentityError", "Stub", "resolve_identity", "run"]


class PluginIdentityError(ValueError):
    """The plugin has no usable name or index."""


def resolve_identity(name: str | None, idx: str | None) -> tuple[str, str]:
    """Name and index from the environment (a launched plugin), else the
    arguments, else the program name ``NN-name``, as the Go stub does."""
    name = os.environ.get(api.PLUGIN_NAME_ENV) or name
    idx = os.environ.get(api.PLUGIN_IDX_ENV) or idx
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if idx and not name:
        name = prog
    if not idx:
        try:
            parsed_idx, parsed_name = api.parse_plugin_name(prog)
        except ValueError as exc:
            raise PluginIdentityError(
                "plugin index unknown: pass idx, set NRI_PLUGIN_IDX or name the program NN-name"
            ) from exc
        idx, name = parsed_idx, name or parsed_name
    try:
        api.check_plugin_index(idx)
        api.check_plugin_name(name or "")
    except ValueError as exc:
        raise PluginIdentityError(str(exc)) from exc
    assert name is not None
    return name, idx


class Stub(StubAnswers):
    """Runs one plugin against one runtime connection; a Stub starts once."""

    def __init__(
        self,
        plugin: object,
        *,
        name: str | None = None,
        idx: str | None = None,
        socket_path: str | None = None,
        sock: socket.socket | None = None,
        registration_timeout: float = 5.0,
    ) -> None:
        super().__init__(plugin, *resolve_identity(name, idx), registration_timeout)
        self._socket_path = socket_path or api.DEFAULT_SOCKET_PATH
        self._sock = sock
        if not self.handled and not any(
            implemented(plugin, m) for m in ("configure", "synchronize", "shutdown")
        ):
            raise ValueError(f"plugin {type(plugin).__name__} implements no NRI handler")
        self._conn: Connection | None = None

    # ------------------------------------------------------------ lifetime

    async def start(self) -> None:
        """Connect, register and wait until the runtime has configured us."""
        if self._conn is not None:
            raise RuntimeError("stub already started")
        loop = asyncio.get_running_loop()
        self._configured = loop.create_future()
        sock = self._sock or self._socket_from_env()
        try:
            self._conn = await connect(
                None if sock else self._socket_path,
                sock=sock,
                services=self._services(),
                roles=PLUGIN_SIDE,
                name=f"nri plugin {self.full_name}",
            )
        except OSError as exc:
            where = "the socket from the runtime" if sock else self._socket_path
            raise ConnectionError(f"cannot connect to NRI at {where}: {exc}") from exc
        try:
            req = api.RegisterPluginRequest(
                plugin_name=self.name, plugin_idx=self.idx, NRI_version=api.NRI_VERSION
            )
            await self._conn.call(
                api.RUNTIME_SERVICE,
                "RegisterPlugin",
                req.SerializeToString(),
                timeout=self.registration_timeout,
            )
            await self._configuration()
        except BaseException:
            await self.stop()
            raise
        log.info("plugin %s started, subscribed to %s", self.full_name,
                 api.event_names(self.events) or "nothing")

    async def _configuration(self) -> None:
        """Until the runtime has configured us; raises if it closes first, if configuring
        failed, or after the registration timeout."""
        assert self._conn is not None and self._configured is not None
        conn, configured = self._conn, self._configured

        async def closed() -> NoReturn:
            await conn.wait_closed()
            raise ConnectionError(f"runtime closed the connection: {conn.close_reason}")

        try:
            async with asyncio.timeout(self.registration_timeout):
                # Configured first: when both are done, configuration wins.
                await race(asyncio.shield(configured), closed())
        except TimeoutError:
            raise TimeoutError(
                f"runtime did not configure the plugin within {self.registration_timeout:g}s"
            ) from None

    async def wait(self) -> str:
        """Until the connection ends; returns why."""
        if self._conn is None:
            raise RuntimeError("stub not started")
        return await self._conn.wait_closed()

    async def run(self) -> str:
        """Start, then serve until the runtime goes away; returns why it ended."""
        await self.start()
        try:
            return await self.wait()
        finally:
            await self.stop()

    async def stop(self) -> None:
        if self._conn is not None:
            await self._conn.aclose("plugin stopped")

    async def __aenter__(self) -> Stub:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _socket_from_env(self) -> socket.socket | None:
        env = os.environ.get(api.PLUGIN_SOCKET_ENV)
        if not env:
            return None
        try:
            fd = int(env)
            return socket.socket(fileno=fd)
        except (ValueError, OSError) as exc:
            raise ConnectionError(f"invalid {api.PLUGIN_SOCKET_ENV}={env!r}: {exc}") from exc

    # ------------------------------------------------------------ plugin -> runtime

    async def update_containers(
        self,
        updates: Iterable[api.ContainerUpdate | Update],
        evictions: Iterable[api.ContainerEviction] = (),
        *,
        timeout: float | None = None,
    ) -> list[api.ContainerUpdate]:
        """Ask the runtime for unsolicited changes; returns the ones that failed."""
        if self._conn is None:
            raise RuntimeError("stub not started")
        req = api.UpdateContainersRequest(update=update_messages(list(updates)),
                                          evict=list(evictions))
        payload = await self._conn.call(
            api.RUNTIME_SERVICE, "UpdateContainers", req.SerializeToString(), timeout=timeout
        )
        return list(api.UpdateContainersResponse.FromString(payload).failed)


def run(plugin: object, **kwargs: Any) -> int:
    """Entry point for a plugin program: run until the runtime goes away or a
    SIGTERM/SIGINT arrives. Returns a process exit status."""

    async def main() -> int:
        try:
            stub = Stub(plugin, **kwargs)
        except ValueError as exc:
            log.error("cannot run plugin %s: %s", type(plugin).__name__, exc)
            return 1
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, task.cancel)
        try:
            reason = await stub.run()
        except asyncio.CancelledError:
            log.info("plugin %s: stopped by signal", stub.full_name)
            return 0
        except (ConnectionError, TimeoutError, TtrpcError) as exc:
            log.error("plugin %s: %s", stub.full_name, exc)
            return 1
        log.info("plugin %s: connection ended: %s", stub.full_name, reason)
        return 0

    return asyncio.run(main())
