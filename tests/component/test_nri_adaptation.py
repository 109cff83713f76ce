"""The runtime side of NRI against real SDK plugins over the NRI socket.

The CRI side is a small recording domain here (the e2e tests drive the real
one); everything between it and the plugins is the production code: socket,
registration, Configure, Synchronize (split when large), relay order,
timeouts, merging, validation, Shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from pycrid.config.decode import Duration
from pycrid.config.schema import DefaultValidatorConfig, NRIConfig
from pycrid.errors import FailedPrecondition
from pycrid.nri import Plugin, Stub, api
from pycrid.nri.adaptation.adaptation import Adaptation, PluginError, SyncFn
from pycrid.nri.adaptation.merge import AdjustmentConflict
from pycrid.nri.adaptation.sync_chunks import sync_chunks
from pycrid.nri.replies import Adjustment
from pycrid.nri.wire.connection import PLUGIN_SIDE, Services, connect
from pycrid.nri.wire.ttrpc import RequestReceived, TtrpcError

POD = api.PodSandbox(id="pod-1", name="p", namespace="ns", uid="u")
CTR = api.Container(id="ctr-1", pod_sandbox_id="pod-1", name="c", env=["A=1"])


class Domain:
    """Records what the adaptation asks of the CRI side."""

    def __init__(self, pods: Sequence[api.PodSandbox] = (),
                 containers: Sequence[api.Container] = ()) -> None:
        self.pods = list(pods)
        self.containers = list(containers)
        self.updates: list[api.ContainerUpdate] = []
        self.evictions: list[api.ContainerEviction] = []

    async def synchronize(self, sync: SyncFn) -> None:
        self.updates += await sync(self.pods, self.containers)

    async def update_containers(
            self, updates: Sequence[api.ContainerUpdate]) -> list[api.ContainerUpdate]:
        self.updates += updates
        return []

    def evict(self, evictions: Sequence[api.ContainerEviction]) -> None:
        self.evictions += evictions


class Recorder(Plugin):
    def __init__(self, log: list[str], tag: str) -> None:
        self.log = log
        self.tag = tag
        self.synced: tuple[list[api.PodSandbox], list[api.Container]] | None = None
        self.shut_down = False

    def synchronize(self, pods: list[api.PodSandbox], containers: list[api.Container]) -> None:
        self.synced = (pods, containers)

    def shutdown(self) -> None:
        self.shut_down = True

    def run_pod_sandbox(self, pod: api.PodSandbox) -> None:
        self.log.append(f"{self.tag}:run:{pod.id}")

    def stop_pod_sandbox(self, pod: api.PodSandbox) -> None:
        self.log.append(f"{self.tag}:stop:{pod.id}")
        raise RuntimeError("stop refused")


class EnvSetter(Plugin):
    def __init__(self, name: str, value: str) -> None:
        self.name, self.value = name, value
        self.seen_env: list[str] = []

    def create_container(self, pod: api.PodSandbox, container: api.Container) -> Adjustment:
        self.seen_env = list(container.env)
        return Adjustment().add_env(self.name, self.value)


class Hanger(Plugin):
    async def create_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        await asyncio.sleep(3600)


class Rejecter(Plugin):
    def validate_container_adjustment(self, req: api.ValidateContainerAdjustmentRequest) -> None:
        raise ValueError(f"no thanks, {len(req.plugins)} plugins")


def nri_config(tmp_path: Path, **kw: Any) -> NRIConfig:
    return NRIConfig(socket_path=str(tmp_path / "nri" / "nri.sock"),
                     plugin_path=str(tmp_path / "plugins"),
                     plugin_config_path=str(tmp_path / "conf.d"),
                     plugin_registration_timeout=Duration(kw.pop("registration", 5)),
                     plugin_request_timeout=Duration(kw.pop("request", 2)), **kw)


@contextlib.asynccontextmanager
async def adaptation(tmp_path: Path, domain: Domain | None = None,
                     **kw: Any) -> AsyncIterator[Adaptation]:
    a = Adaptation(nri_config(tmp_path, **kw), runtime_name="pycrid", runtime_version="t",
                   domain=domain or Domain())
    await a.start()
    try:
        yield a
    finally:
        await a.stop()


@contextlib.asynccontextmanager
async def plugged(a: Adaptation, plugin: object, name: str, idx: str) -> AsyncIterator[Stub]:
    """An external plugin, registered and synchronised before the body runs."""
    stub = Stub(plugin, name=name, idx=idx, socket_path=a.config.socket_path)
    await stub.start()
    await until(lambda: any(p.name == f"{idx}-{name}" for p in a.plugins))
    try:
        yield stub
    finally:
        await stub.stop()


async def until(cond: Any) -> None:
    async with asyncio.timeout(5):
        while not cond():  # noqa: ASYNC110 - the plugin list has no event to wait on
            await asyncio.sleep(0.01)


# ---------------------------------------------------------------- synchronisation


def test_sync_chunks_split_under_the_limit_pods_first() -> None:
    pods = [api.PodSandbox(id=f"p{i}", annotations={"x": "y" * 300}) for i in range(20)]
    ctrs = [api.Container(id=f"c{i}", env=["E=" + "z" * 500]) for i in range(30)]
    chunks = sync_chunks(pods, ctrs, limit=4096)
    assert len(chunks) > 3
    flat = [o.id for ps, cs in chunks for o in (*ps, *cs)]
    assert flat == [p.id for p in pods] + [c.id for c in ctrs]
    for ps, cs in chunks:
        size = api.SynchronizeRequest(pods=ps, containers=cs, more=True).ByteSize()
        assert size <= 4096
    assert sync_chunks([], []) == [([], [])]


async def test_new_plugin_is_synchronized_with_every_object(tmp_path: Path) -> None:
    big = [api.Container(id=f"c{i}", pod_sandbox_id="pod-1", env=["E=" + "x" * 100_000])
           for i in range(60)]  # about 6 MiB: more than one ttrpc message
    domain = Domain([POD], big)
    async with adaptation(tmp_path, domain) as a:
        rec = Recorder([], "r")
        async with plugged(a, rec, "rec", "10"):
            assert rec.synced is not None
            assert [p.id for p in rec.synced[0]] == ["pod-1"]
            assert [c.id for c in rec.synced[1]] == [c.id for c in big]


async def test_socket_dir_is_private_and_stale_socket_replaced(tmp_path: Path) -> None:
    path = tmp_path / "nri" / "nri.sock"
    path.parent.mkdir()
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()
    async with adaptation(tmp_path) as a:
        async with plugged(a, Recorder([], "r"), "rec", "10"):
            pass
    assert not path.exists()


async def test_disable_connections_creates_no_socket(tmp_path: Path) -> None:
    async with adaptation(tmp_path, disable_connections=True):
        assert not (tmp_path / "nri" / "nri.sock").exists()


# ---------------------------------------------------------------- relaying


async def test_events_go_in_index_order_and_errors_by_event_kind(tmp_path: Path) -> None:
    log: list[str] = []
    async with adaptation(tmp_path) as a:
        async with plugged(a, Recorder(log, "late"), "late", "20"), \
                plugged(a, Recorder(log, "early"), "early", "05"):
            assert [p.name for p in a.plugins] == ["05-early", "20-late"]
            await a.run_pod_sandbox(POD)
            assert log == ["early:run:pod-1", "late:run:pod-1"]
            # StopPodSandbox may not fail the CRI call: both plugins still get it.
            await a.stop_pod_sandbox(POD)
            assert log[2:] == ["early:stop:pod-1", "late:stop:pod-1"]


async def test_run_pod_refusal_fails_the_call(tmp_path: Path) -> None:
    class Refuser(Plugin):
        def run_pod_sandbox(self, pod: api.PodSandbox) -> None:
            raise RuntimeError("pod not welcome")

    async with adaptation(tmp_path) as a, plugged(a, Refuser(), "refuser", "10"):
        with pytest.raises(PluginError, match="pod not welcome"):
            await a.run_pod_sandbox(POD)


async def test_later_plugin_sees_earlier_adjustment_and_result_merges(tmp_path: Path) -> None:
    first, second = EnvSetter("B", "2"), EnvSetter("C", "3")
    async with adaptation(tmp_path) as a, plugged(a, first, "one", "10"), \
            plugged(a, second, "two", "20"):
        result = await a.create_container(POD, CTR)
    assert result is not None
    assert first.seen_env == ["A=1"]
    assert second.seen_env == ["A=1", "B=2"]
    assert [(kv.key, kv.value) for kv in result.adjust.env] == [("B", "2"), ("C", "3")]


async def test_two_plugins_on_one_env_var_conflict(tmp_path: Path) -> None:
    async with adaptation(tmp_path) as a, plugged(a, EnvSetter("X", "1"), "a", "10"), \
            plugged(a, EnvSetter("X", "2"), "b", "20"):
        with pytest.raises(AdjustmentConflict,
                           match='plugins "20-b" and "10-a" both tried to set'):
            await a.create_container(POD, CTR)


async def test_hanging_plugin_is_dropped_and_the_event_carries_on(tmp_path: Path) -> None:
    async with adaptation(tmp_path, request=0.3) as a, plugged(a, Hanger(), "hang", "10"), \
            plugged(a, EnvSetter("B", "2"), "ok", "20"):
        started = time.monotonic()
        result = await a.create_container(POD, CTR)
        assert time.monotonic() - started < 2
        assert result is not None and [kv.key for kv in result.adjust.env] == ["B"]
        assert [p.name for p in a.plugins] == ["20-ok"]


async def test_per_plugin_request_timeout_overrides_the_global_one(tmp_path: Path) -> None:
    per = {"hang": Duration(0.2)}
    async with adaptation(tmp_path, request=30, plugin_request_timeouts=per) as a, \
            plugged(a, Hanger(), "hang", "10"):
        started = time.monotonic()
        await a.create_container(POD, CTR)
        assert time.monotonic() - started < 5
        assert a.plugins == []


async def test_synchronize_carries_the_registration_timeout(tmp_path: Path) -> None:
    """The deadline a plugin is sent (ttrpc timeout_nano): Configure has the request
    timeout, Synchronize the registration timeout; a per-plugin request timeout longer
    than that covers Synchronize too."""
    sent: dict[str, int] = {}

    def handler(method: str, answer: bytes) -> Any:
        async def serve(ev: RequestReceived) -> bytes:
            sent[method] = ev.timeout_nano
            return answer
        return serve

    services = Services()
    services.add(api.PLUGIN_SERVICE, "Configure",
                 handler("Configure", api.ConfigureResponse().SerializeToString()))
    services.add(api.PLUGIN_SERVICE, "Synchronize",
                 handler("Synchronize", api.SynchronizeResponse().SerializeToString()))
    register = api.RegisterPluginRequest(plugin_name="raw", plugin_idx="10").SerializeToString()
    for per, want in (({}, 7), ({"raw": Duration(9)}, 9)):
        sent.clear()
        async with adaptation(tmp_path, registration=7, request=0.5,
                              plugin_request_timeouts=per) as a:
            conn = await connect(a.config.socket_path, services=services, roles=PLUGIN_SIDE)
            try:
                await conn.call(api.RUNTIME_SERVICE, "RegisterPlugin", register, timeout=5)
                await until(lambda: bool(a.plugins))
            finally:
                await conn.aclose("test done")
        assert sent == {"Configure": 500_000_000, "Synchronize": want * 1_000_000_000}, per


async def test_plugin_slower_to_synchronize_than_a_request_is_kept(tmp_path: Path) -> None:
    """A Synchronize that outlasts the request timeout (well inside the registration
    timeout) does not drop the plugin: it registers and gets the next event."""

    class SlowSync(Recorder):
        async def synchronize(self, pods: list[api.PodSandbox],  # type: ignore[override]
                              containers: list[api.Container]) -> None:
            await asyncio.sleep(1.0)
            self.synced = (pods, containers)

    log: list[str] = []
    async with adaptation(tmp_path, Domain([POD]), request=0.2, registration=30) as a, \
            plugged(a, SlowSync(log, "slow"), "slow", "10"):
        await a.run_pod_sandbox(POD)
        assert log == ["slow:run:pod-1"]
        assert [p.name for p in a.plugins] == ["10-slow"]


async def test_validator_rejection_and_default_validator(tmp_path: Path) -> None:
    async with adaptation(tmp_path) as a, plugged(a, Rejecter(), "judge", "90"):
        with pytest.raises(FailedPrecondition,
                           match='validator "90-judge" rejected container adjustment, '
                                 "reason: no thanks, 1 plugins"):
            await a.create_container(POD, CTR)
    hooks = DefaultValidatorConfig(enable=True, reject_oci_hook_adjustment=True)

    class HookAdder(Plugin):
        def create_container(self, pod: api.PodSandbox, ctr: api.Container) -> Adjustment:
            adj = Adjustment()
            adj.message.hooks.prestart.add(path="/bin/true")
            return adj

    async with adaptation(tmp_path, default_validator=hooks) as a, \
            plugged(a, HookAdder(), "hooker", "10"):
        with pytest.raises(FailedPrecondition, match='validator "00-default-validator" '
                                                     "rejected container adjustment"):
            await a.create_container(POD, CTR)


# ---------------------------------------------------------------- misbehaving peers


async def test_silent_peer_is_closed_at_the_registration_timeout(tmp_path: Path) -> None:
    async with adaptation(tmp_path, registration=0.3) as a:
        reader, writer = await asyncio.open_unix_connection(a.config.socket_path)
        started = time.monotonic()
        assert await asyncio.wait_for(reader.read(), 5) == b""
        assert 0.25 < time.monotonic() - started < 3
        writer.close()


async def test_garbage_closes_at_once_not_at_the_registration_timeout(tmp_path: Path) -> None:
    async with adaptation(tmp_path, registration=30) as a:
        reader, writer = await asyncio.open_unix_connection(a.config.socket_path)
        # conn 2 (the runtime's service), then a ttrpc header of an unknown message type.
        body = b"\x00\x00\x00\x00\x00\x00\x00\x01\x09\x00"
        writer.write(b"\x00\x00\x00\x02" + len(body).to_bytes(4, "big") + body)
        started = time.monotonic()
        assert await asyncio.wait_for(reader.read(), 5) == b""
        assert time.monotonic() - started < 2
        writer.close()
        assert a.plugins == []


async def test_bad_external_identity_is_refused(tmp_path: Path) -> None:
    async with adaptation(tmp_path) as a:
        conn = await connect(a.config.socket_path, services=Services(), roles=PLUGIN_SIDE)
        req = api.RegisterPluginRequest(plugin_name="bad name!", plugin_idx="10")
        with pytest.raises(TtrpcError, match="invalid plugin name"):
            await conn.call(api.RUNTIME_SERVICE, "RegisterPlugin", req.SerializeToString(),
                            timeout=5)
        assert await asyncio.wait_for(conn.wait_closed(), 5)
        assert a.plugins == []


async def test_shutdown_is_sent_when_the_runtime_stops(tmp_path: Path) -> None:
    rec = Recorder([], "r")
    stub: Stub | None = None
    async with adaptation(tmp_path) as a:
        stub = Stub(rec, name="rec", idx="10", socket_path=a.config.socket_path)
        await stub.start()
        await until(lambda: bool(a.plugins))
    await asyncio.wait_for(stub.wait(), 5)
    assert rec.shut_down


async def test_unsolicited_updates_and_evictions_reach_the_domain(tmp_path: Path) -> None:
    domain = Domain([POD], [CTR])
    async with adaptation(tmp_path, domain) as a:
        async with plugged(a, Recorder([], "r"), "rec", "10") as stub:
            upd = api.ContainerUpdate(container_id="ctr-1")
            upd.linux.resources.cpu.shares.value = 512
            failed = await stub.update_containers([upd])
    assert failed == []
    assert [u.container_id for u in domain.updates] == ["ctr-1"]


# ---------------------------------------------------------------- pre-installed plugins

PLUGIN_SCRIPT = """#!{python}
import json, sys
sys.path[:0] = {path!r}
from pycrid.nri import Plugin, run

class P(Plugin):
    def configure(self, config, runtime_name, runtime_version):
        with open({out!r}, "w") as f:
            # /proc/self/environ: what exec gave us, before Python's own locale coercion.
            with open("/proc/self/environ", "rb") as e:
                env = dict(kv.decode().split("=", 1) for kv in e.read().split(b"\\0") if kv)
            json.dump({{"env": env, "config": config,
                       "runtime": [runtime_name, runtime_version]}}, f)
        return 0

    def run_pod_sandbox(self, pod):
        pass

sys.exit(run(P()))
"""


async def test_preinstalled_plugin_gets_fd3_exact_env_and_its_config(tmp_path: Path) -> None:
    plugins, conf = tmp_path / "plugins", tmp_path / "conf.d"
    plugins.mkdir()
    conf.mkdir()
    out = tmp_path / "seen.json"
    script = plugins / "42-probe"
    script.write_text(PLUGIN_SCRIPT.format(python=sys.executable, path=sys.path, out=str(out)))
    script.chmod(0o755)
    (plugins / "not-a-plugin").write_text("#!/bin/sh\nexit 1\n")
    (plugins / "not-a-plugin").chmod(0o755)
    (conf / "probe.conf").write_text("generic")
    (conf / "42-probe.conf").write_text("specific")
    async with adaptation(tmp_path) as a:
        assert [p.name for p in a.plugins] == ["42-probe"]
        assert any("not-a-plugin" in w for w in a.warnings)
        proc = a.plugins[0].launched
        assert proc is not None
    seen = json.loads(out.read_text())
    assert seen["env"] == {"NRI_PLUGIN_NAME": "probe", "NRI_PLUGIN_IDX": "42",
                           "NRI_PLUGIN_SOCKET": "3"}
    assert seen["config"] == "specific"
    assert seen["runtime"] == ["pycrid", "t"]
    assert proc.process.returncode is not None  # shut down (or killed) with the runtime
