"""The NRI plugin SDK's lifetime: starting, identity, connecting and ending.

A ``Stub`` against the test runtime peer over a socketpair, a unix socket path, or
as a real subprocess launched the way a runtime launches a pre-installed plugin.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
import textwrap
from pathlib import Path

import pytest

from pycrid.nri import Adjustment, Plugin, PluginIdentityError, Stub, api
from pycrid.nri.stub import resolve_identity
from pycrid.nri.wire.ttrpc import TtrpcError
from tests.support.nri_runtime import (
    CTR,
    POD,
    CreateStop,
    RuntimePeer,
    connected,
    launched_plugin,
    reap,
)

# ---------------------------------------------------------------- start and end


async def test_runtime_closing_ends_wait() -> None:
    async with asyncio.timeout(5):
        async with connected(CreateStop()) as c:
            waiter = asyncio.create_task(c.stub.wait())
            await asyncio.sleep(0.01)
            assert not waiter.done()
            await c.rt.aclose()
            reason = await waiter
            assert reason == "peer closed the connection"


async def test_runtime_closing_ends_run() -> None:
    async with asyncio.timeout(5):
        a, b = socket.socketpair()
        rt = RuntimePeer()
        stub = None
        try:
            await rt.attach(a)
            stub = Stub(CreateStop(), name="runner", idx="11", sock=b)
            runner = asyncio.create_task(stub.run())
            reg = await rt.registered
            assert reg.plugin_name == "runner"
            cfg = await rt.configure()
            assert cfg.events == 0x208
            await asyncio.sleep(0.01)
            assert not runner.done()
            await rt.aclose()
            assert await runner == "peer closed the connection"
        finally:
            if stub is not None:
                await stub.stop()
            await rt.aclose()
            a.close()
            b.close()


async def test_wait_before_start_raises() -> None:
    stub = Stub(CreateStop(), name="x", idx="10")
    with pytest.raises(RuntimeError):
        await stub.wait()


async def test_runtime_never_configures_times_out() -> None:
    async with asyncio.timeout(5):
        a, b = socket.socketpair()
        rt = RuntimePeer()
        stub = None
        try:
            await rt.attach(a)
            stub = Stub(CreateStop(), name="x", idx="10", sock=b, registration_timeout=0.3)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            with pytest.raises(TimeoutError, match="did not configure"):
                await stub.start()
            elapsed = loop.time() - t0
            assert 0.25 <= elapsed < 1.5
            assert rt.registered.done()
            assert rt.conn is not None
            assert await rt.conn.wait_closed()
        finally:
            if stub is not None:
                await stub.stop()
            await rt.aclose()
            a.close()
            b.close()


async def test_runtime_closing_before_configure_fails_start() -> None:
    async with asyncio.timeout(5):
        a, b = socket.socketpair()
        rt = RuntimePeer()
        stub = None
        try:
            await rt.attach(a)
            stub = Stub(CreateStop(), name="x", idx="10", sock=b, registration_timeout=3)

            async def runtime() -> None:
                await rt.registered
                await rt.aclose()

            started, _ = await asyncio.gather(stub.start(), runtime(), return_exceptions=True)
            assert isinstance(started, ConnectionError)
        finally:
            if stub is not None:
                await stub.stop()
            await rt.aclose()
            a.close()
            b.close()


async def test_garbage_from_runtime_fails_start() -> None:
    async with asyncio.timeout(5):
        a, b = socket.socketpair()
        stub = None
        try:
            a.sendall(b"GET / HTTP/1.1\r\nHost: nri\r\n\r\n")
            stub = Stub(CreateStop(), name="x", idx="10", sock=b, registration_timeout=3)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            with pytest.raises((ConnectionError, TtrpcError)):
                await stub.start()
            assert loop.time() - t0 < 2
            assert stub._conn is not None and stub._conn.is_closed
        finally:
            if stub is not None:
                await stub.stop()
            a.close()
            b.close()


async def test_start_twice_raises() -> None:
    async with asyncio.timeout(5):
        async with connected(CreateStop()) as c:
            with pytest.raises(RuntimeError):
                await c.stub.start()


def test_plugin_with_no_handler_is_refused() -> None:
    with pytest.raises(ValueError, match="implements no NRI handler"):
        Stub(Plugin(), name="x", idx="10")


# ---------------------------------------------------------------- identity


def test_identity_env_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(api.PLUGIN_NAME_ENV, "from-env")
    monkeypatch.setenv(api.PLUGIN_IDX_ENV, "33")
    assert resolve_identity("arg", "10") == ("from-env", "33")
    stub = Stub(CreateStop(), name="arg", idx="10")
    assert (stub.name, stub.idx) == ("from-env", "33")


def test_identity_from_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["/x/whatever"])
    assert resolve_identity("mine", "05") == ("mine", "05")


@pytest.mark.parametrize(
    ("name", "idx"),
    [("ok", "1"), ("ok", "100"), ("ok", "ab"), ("has space", "10"), ("sl/ash", "10")],
)
def test_identity_invalid(name: str, idx: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["/x/20-foo"])
    with pytest.raises(PluginIdentityError):
        resolve_identity(name, idx)
    with pytest.raises(PluginIdentityError):
        Stub(CreateStop(), name=name, idx=idx)


def test_identity_invalid_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(api.PLUGIN_IDX_ENV, "1")
    with pytest.raises(PluginIdentityError):
        resolve_identity("ok", "10")


def test_identity_from_argv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["/x/20-foo"])
    assert resolve_identity(None, None) == ("foo", "20")


def test_identity_unknown_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["/x/plainname"])
    with pytest.raises(PluginIdentityError, match="index unknown"):
        resolve_identity("name", None)


# ---------------------------------------------------------------- pre-installed (launched) plugin

PLUGIN_SCRIPT = textwrap.dedent(
    """
    import sys
    from pycrid.nri import Adjustment, Plugin, run

    class P(Plugin):
        def create_container(self, pod, container):
            return Adjustment().add_env("LAUNCHED", pod.name + "/" + container.name)

    sys.exit(run(P()))
    """
)


async def test_launched_plugin_subprocess(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", PLUGIN_SCRIPT]
    async with (
        asyncio.timeout(15),
        launched_plugin(argv, "launched", "07", tmp_path / "plugin.log") as (rt, proc),
    ):
        reg = await asyncio.wait_for(rt.registered, 10)
        assert reg == api.RegisterPluginRequest(
            plugin_name="launched", plugin_idx="07", NRI_version="v0.12.2"
        )
        cfg = await rt.configure()
        assert cfg.events == 0x8
        resp = await rt.call("CreateContainer", api.CreateContainerRequest(pod=POD, container=CTR))
        assert resp == api.CreateContainerResponse(
            adjust=Adjustment().add_env("LAUNCHED", "web/app").message
        )
    # Leaving the block closed the runtime side; the plugin exited by itself.
    assert proc.returncode == 0, (tmp_path / "plugin.log").read_text()


async def test_launched_plugin_exits_zero_on_sigterm(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", PLUGIN_SCRIPT]
    async with (
        asyncio.timeout(15),
        launched_plugin(argv, "term", "08", tmp_path / "plugin.log") as (rt, proc),
    ):
        reg = await asyncio.wait_for(rt.registered, 10)
        assert (reg.plugin_name, reg.plugin_idx) == ("term", "08")
        assert (await rt.configure()).events == 0x8
        proc.send_signal(signal.SIGTERM)
        assert rt.conn is not None
        assert await rt.conn.wait_closed() == "peer closed the connection"
        await reap(proc)
    assert proc.returncode == 0, (tmp_path / "plugin.log").read_text()


# ---------------------------------------------------------------- external plugin (socket path)


async def test_external_plugin_connects_by_path(tmp_path: Path) -> None:
    async with asyncio.timeout(5):
        path = str(tmp_path / "nri.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)
        listener.setblocking(False)
        loop = asyncio.get_running_loop()
        rt = RuntimePeer()
        stub = None
        accepted: socket.socket | None = None
        try:
            stub = Stub(CreateStop(), name="ext", idx="90", socket_path=path)

            async def runtime() -> api.ConfigureResponse:
                nonlocal accepted
                accepted, _ = await loop.sock_accept(listener)
                await rt.attach(accepted)
                reg = await rt.registered
                assert (reg.plugin_name, reg.plugin_idx) == ("ext", "90")
                return await rt.configure()

            _, cfg = await asyncio.gather(stub.start(), runtime())
            assert cfg.events == 0x208
            resp = await rt.call("StopContainer", api.StopContainerRequest(pod=POD, container=CTR))
            assert resp == api.StopContainerResponse()
        finally:
            if stub is not None:
                await stub.stop()
            await rt.aclose()
            if accepted is not None:
                accepted.close()
            listener.close()


async def test_external_plugin_no_socket_raises_connection_error(tmp_path: Path) -> None:
    async with asyncio.timeout(5):
        stub = Stub(CreateStop(), name="ext", idx="90", socket_path=str(tmp_path / "missing"))
        with pytest.raises(ConnectionError, match="cannot connect to NRI"):
            await stub.start()


async def test_socket_from_env_invalid(monkeypatch: pytest.MonkeyPatch) -> None:
    async with asyncio.timeout(5):
        monkeypatch.setenv(api.PLUGIN_SOCKET_ENV, "not-a-number")
        stub = Stub(CreateStop(), name="x", idx="10")
        with pytest.raises(ConnectionError, match="NRI_PLUGIN_SOCKET"):
            await stub.start()
