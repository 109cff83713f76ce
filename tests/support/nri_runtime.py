"""The runtime side of an NRI connection, for tests: serves the Runtime service
(RegisterPlugin, UpdateContainers) and calls the Plugin service, on the
project's own codecs. Each test gets the other end of a socketpair for the
plugin under test.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from google.protobuf import message_factory
from google.protobuf.message import Message

from pycrid.nri import Plugin, Stub, api
from pycrid.nri.wire.connection import RUNTIME_SIDE, Connection, Services, connect
from pycrid.nri.wire.ttrpc import RequestReceived

_PLUGIN = api.DESCRIPTOR.services_by_name["Plugin"]


def plugin_response_type(method: str) -> type[Message]:
    return message_factory.GetMessageClass(_PLUGIN.methods_by_name[method].output_type)


class RuntimePeer:
    """One plugin connection as a runtime sees it."""

    def __init__(self) -> None:
        self.registered: asyncio.Future[api.RegisterPluginRequest] = (
            asyncio.get_running_loop().create_future()
        )
        self.update_requests: list[api.UpdateContainersRequest] = []
        self.fail_updates: Callable[[api.ContainerUpdate], bool] = lambda u: False
        self.conn: Connection | None = None

    async def attach(self, sock: socket.socket) -> None:
        services = Services()
        services.add(api.RUNTIME_SERVICE, "RegisterPlugin", self._register)
        services.add(api.RUNTIME_SERVICE, "UpdateContainers", self._update)
        self.conn = await connect(sock=sock, services=services, roles=RUNTIME_SIDE, name="runtime")

    async def _register(self, ev: RequestReceived) -> bytes:
        req = api.RegisterPluginRequest.FromString(ev.payload)
        if not self.registered.done():
            self.registered.set_result(req)
        return api.Empty().SerializeToString()

    async def _update(self, ev: RequestReceived) -> bytes:
        req = api.UpdateContainersRequest.FromString(ev.payload)
        self.update_requests.append(req)
        failed = [u for u in req.update if self.fail_updates(u) and not u.ignore_failure]
        return api.UpdateContainersResponse(failed=failed).SerializeToString()

    async def call(self, method: str, request: Message, timeout: float | None = 2.0) -> Any:
        assert self.conn is not None
        payload = await self.conn.call(
            api.PLUGIN_SERVICE, method, request.SerializeToString(), timeout=timeout
        )
        return plugin_response_type(method).FromString(payload)

    async def configure(self, config: str = "", **kwargs: Any) -> api.ConfigureResponse:
        req = api.ConfigureRequest(
            config=config,
            runtime_name=kwargs.pop("runtime_name", "pycrid"),
            runtime_version=kwargs.pop("runtime_version", "0.1.0"),
            registration_timeout=kwargs.pop("registration_timeout", 5000),
            request_timeout=kwargs.pop("request_timeout", 2000),
            NRI_version=api.NRI_VERSION,
        )
        resp: api.ConfigureResponse = await self.call("Configure", req)
        return resp

    async def aclose(self) -> None:
        if self.conn is not None:
            await self.conn.aclose("test runtime closed")


@asynccontextmanager
async def launched_plugin(
    argv: Sequence[str], name: str, idx: str, log_path: Path
) -> AsyncIterator[tuple[RuntimePeer, subprocess.Popen[bytes]]]:
    """Start ``argv`` the way a runtime launches a pre-installed plugin: the
    socket on fd 3, an environment of only the three NRI_PLUGIN_* variables.
    Yields the runtime side and the process; on exit closes the runtime side
    and fails if the plugin does not exit by itself within 5 s."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = theirs.fileno()
    with open(log_path, "wb") as log:  # noqa: ASYNC230 - before anything runs
        # bash puts the socket on fd 3 and execs the plugin (dash takes no fd above 9),
        # so no Python code runs between fork and exec: a preexec_fn there can die in
        # gRPC's fork handlers, which this test process has loaded (pycrid's launcher
        # uses posix_spawn for the same reason).
        proc = subprocess.Popen(  # noqa: ASYNC220 - reaped below
            ["/bin/bash", "-c", f'exec "$@" 3<&{fd} {fd}<&-', "bash", *argv],
            env={api.PLUGIN_NAME_ENV: name, api.PLUGIN_IDX_ENV: idx, api.PLUGIN_SOCKET_ENV: "3"},
            pass_fds=(fd,),
            stderr=log,
        )
    theirs.close()
    peer = RuntimePeer()
    try:
        await peer.attach(ours)
        yield peer, proc
    finally:
        await peer.aclose()
        await reap(proc)


async def reap(proc: subprocess.Popen[bytes], seconds: float = 5.0) -> None:
    """Wait for ``proc`` to exit by itself; kill it and fail if it does not."""
    for _ in range(int(seconds * 10)):
        if proc.poll() is not None:
            return
        await asyncio.sleep(0.1)
    proc.kill()
    proc.wait()
    raise AssertionError(f"plugin {proc.args!r} did not exit after the runtime went away")


# ---------------------------------------------------------------- SDK test fixtures

POD = api.PodSandbox(id="pod-1", name="web", uid="uid-1", namespace="default")
CTR = api.Container(id="ctr-1", pod_sandbox_id="pod-1", name="app", args=["sleep", "1"])

class CreateStop(Plugin):
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def create_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        self.calls.append(("create_container", (pod, container)))

    def stop_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        self.calls.append(("stop_container", (pod, container)))


class Connected:
    """A Stub registered and configured against a RuntimePeer."""

    def __init__(
        self,
        stub: Stub,
        rt: RuntimePeer,
        reg: api.RegisterPluginRequest,
        cfg: api.ConfigureResponse,
    ) -> None:
        self.stub, self.rt, self.reg, self.cfg = stub, rt, reg, cfg


@contextlib.asynccontextmanager
async def connected(
    plugin: object, *, name: str = "test", idx: str = "10", **configure: Any
) -> AsyncIterator[Connected]:
    """A plugin registered and configured over a socketpair."""
    a, b = socket.socketpair()
    rt = RuntimePeer()
    stub: Stub | None = None
    try:
        await rt.attach(a)
        stub = Stub(plugin, name=name, idx=idx, sock=b)

        async def runtime() -> tuple[api.RegisterPluginRequest, api.ConfigureResponse]:
            reg = await rt.registered
            return reg, await rt.configure(**configure)

        _, (reg, cfg) = await asyncio.gather(stub.start(), runtime())
        yield Connected(stub, rt, reg, cfg)
    finally:
        if stub is not None:
            await stub.stop()
        await rt.aclose()
        a.close()
        b.close()
