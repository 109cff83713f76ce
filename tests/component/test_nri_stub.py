"""The NRI plugin SDK (``pycrid.nri.stub``) against the test runtime peer.

Each test connects a ``Stub`` to a ``RuntimePeer`` over a socketpair (or a unix
socket path, or a real subprocess) and drives the runtime side of the protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.message import Message

from pycrid.nri import Adjustment, Plugin, PluginIdentityError, Stub, Update, api
from pycrid.nri.stub import EVENT_HANDLERS, handled_events, resolve_identity
from pycrid.nri.wire.ttrpc import Code, TtrpcError
from tests.support.nri_runtime import RuntimePeer, launched_plugin, plugin_response_type, reap

E = api.Event

POD = api.PodSandbox(id="pod-1", name="web", uid="uid-1", namespace="default")
CTR = api.Container(id="ctr-1", pod_sandbox_id="pod-1", name="app", args=["sleep", "1"])
RES = api.LinuxResources(memory=api.LinuxMemory(limit=api.OptionalInt64(value=1 << 20)))
OVERHEAD = api.LinuxResources(memory=api.LinuxMemory(limit=api.OptionalInt64(value=4096)))


@pytest.fixture(autouse=True)
def _no_nri_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (api.PLUGIN_NAME_ENV, api.PLUGIN_IDX_ENV, api.PLUGIN_SOCKET_ENV):
        monkeypatch.delenv(var, raising=False)


class Connected:
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


# ---------------------------------------------------------------- plugins


class CreateStop(Plugin):
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def create_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        self.calls.append(("create_container", (pod, container)))

    def stop_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        self.calls.append(("stop_container", (pod, container)))


class Narrow(CreateStop):
    def configure(self, config: str, runtime_name: str, runtime_version: str) -> int:
        return api.event_bit(E.CREATE_CONTAINER)


class ZeroMask(CreateStop):
    def configure(self, config: str, runtime_name: str, runtime_version: str) -> int:
        return 0


class Greedy(CreateStop):
    def configure(self, config: str, runtime_name: str, runtime_version: str) -> int:
        return api.event_bit(E.CREATE_CONTAINER) | api.event_bit(E.RUN_POD_SANDBOX)


def recording_plugin(is_async: bool) -> Any:
    """A plugin overriding every event handler; each records its arguments."""

    def make(name: str) -> Callable[..., Any]:
        if is_async:

            async def ahandler(self: Any, *args: Any) -> None:
                await asyncio.sleep(0)
                self.calls.append((name, args))

            return ahandler

        def handler(self: Any, *args: Any) -> None:
            self.calls.append((name, args))

        return handler

    ns: dict[str, Any] = {name: make(name) for name in EVENT_HANDLERS.values()}
    ns["shutdown"] = make("shutdown")
    cls = type("Recorder", (Plugin,), ns)
    plugin = cls()
    plugin.calls = []
    return plugin


# ---------------------------------------------------------------- registration, configure


async def test_registration_request_and_default_subscription() -> None:
    async with asyncio.timeout(5):
        plugin = CreateStop()
        async with connected(plugin, name="logger", idx="42") as c:
            assert c.reg == api.RegisterPluginRequest(
                plugin_name="logger", plugin_idx="42", NRI_version="v0.12.2"
            )
            assert c.cfg.events == 0x8 | 0x200
            assert c.stub.events == 0x208
            assert c.stub.full_name == "42-logger"
            assert handled_events(plugin) == 0x208


async def test_configure_narrower_mask() -> None:
    async with asyncio.timeout(5):
        async with connected(Narrow()) as c:
            assert c.cfg.events == 0x8
            assert c.stub.events == 0x8


async def test_configure_zero_means_all_handled() -> None:
    async with asyncio.timeout(5):
        async with connected(ZeroMask()) as c:
            assert c.cfg.events == 0x208


async def test_configure_with_unhandled_event_fails() -> None:
    async with asyncio.timeout(5):
        a, b = socket.socketpair()
        rt = RuntimePeer()
        stub = None
        try:
            await rt.attach(a)
            stub = Stub(Greedy(), name="greedy", idx="10", sock=b)

            async def runtime() -> api.ConfigureResponse:
                await rt.registered
                return await rt.configure()

            started, configured = await asyncio.gather(
                stub.start(), runtime(), return_exceptions=True
            )
            assert isinstance(started, ConnectionError)
            assert "configuration failed" in str(started)
            assert "RunPodSandbox" in str(started)
            assert isinstance(configured, TtrpcError)
            assert configured.code == Code.INVALID_ARGUMENT
            assert "unhandled events RunPodSandbox (0x1)" in configured.message
            assert rt.conn is not None
            reason = await rt.conn.wait_closed()
            assert reason
            assert stub._conn is not None and stub._conn.is_closed
            assert stub.events == 0
        finally:
            if stub is not None:
                await stub.stop()
            await rt.aclose()
            a.close()
            b.close()


async def test_configure_sets_timeouts_and_runtime_identity() -> None:
    async with asyncio.timeout(5):
        seen: list[tuple[str, str, str]] = []

        class P(CreateStop):
            def configure(self, config: str, runtime_name: str, runtime_version: str) -> None:
                seen.append((config, runtime_name, runtime_version))

        async with connected(
            P(),
            config="key: value",
            runtime_name="containerd",
            runtime_version="2.1.0",
            registration_timeout=7000,
            request_timeout=1500,
        ) as c:
            assert c.stub.registration_timeout == 7.0
            assert c.stub.request_timeout == 1.5
            assert c.stub.runtime_name == "containerd"
            assert c.stub.runtime_version == "2.1.0"
            assert c.stub.runtime_nri_version == "v0.12.2"
            assert seen == [("key: value", "containerd", "2.1.0")]
            assert c.cfg.events == 0x208


# ---------------------------------------------------------------- events

EVENT_CASES: list[tuple[str, Message, str, tuple[Any, ...]]] = [
    ("RunPodSandbox", api.RunPodSandboxRequest(pod=POD), "run_pod_sandbox", (POD,)),
    ("StopPodSandbox", api.StopPodSandboxRequest(pod=POD), "stop_pod_sandbox", (POD,)),
    ("RemovePodSandbox", api.RemovePodSandboxRequest(pod=POD), "remove_pod_sandbox", (POD,)),
    (
        "UpdatePodSandbox",
        api.UpdatePodSandboxRequest(
            pod=POD, overhead_linux_resources=OVERHEAD, linux_resources=RES
        ),
        "update_pod_sandbox",
        (POD, OVERHEAD, RES),
    ),
    (
        "PostUpdatePodSandbox",
        api.PostUpdatePodSandboxRequest(pod=POD),
        "post_update_pod_sandbox",
        (POD,),
    ),
    (
        "CreateContainer",
        api.CreateContainerRequest(pod=POD, container=CTR),
        "create_container",
        (POD, CTR),
    ),
    (
        "PostCreateContainer",
        api.PostCreateContainerRequest(pod=POD, container=CTR),
        "post_create_container",
        (POD, CTR),
    ),
    (
        "StartContainer",
        api.StartContainerRequest(pod=POD, container=CTR),
        "start_container",
        (POD, CTR),
    ),
    (
        "PostStartContainer",
        api.PostStartContainerRequest(pod=POD, container=CTR),
        "post_start_container",
        (POD, CTR),
    ),
    (
        "UpdateContainer",
        api.UpdateContainerRequest(pod=POD, container=CTR, linux_resources=RES),
        "update_container",
        (POD, CTR, RES),
    ),
    (
        "PostUpdateContainer",
        api.PostUpdateContainerRequest(pod=POD, container=CTR),
        "post_update_container",
        (POD, CTR),
    ),
    (
        "StopContainer",
        api.StopContainerRequest(pod=POD, container=CTR),
        "stop_container",
        (POD, CTR),
    ),
    (
        "RemoveContainer",
        api.RemoveContainerRequest(pod=POD, container=CTR),
        "remove_container",
        (POD, CTR),
    ),
    (
        "ValidateContainerAdjustment",
        api.ValidateContainerAdjustmentRequest(
            pod=POD, container=CTR, adjust=Adjustment().add_env("A", "1").message
        ),
        "validate_container_adjustment",
        (
            api.ValidateContainerAdjustmentRequest(
                pod=POD, container=CTR, adjust=Adjustment().add_env("A", "1").message
            ),
        ),
    ),
]


def test_event_cases_cover_every_event() -> None:
    assert len(EVENT_CASES) == 14
    assert {m for m, *_ in EVENT_CASES} == set(api.EVENT_METHODS.values())
    assert {h for _, _, h, _ in EVENT_CASES} == set(EVENT_HANDLERS.values())


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(
    ("method", "request_msg", "handler", "args"), EVENT_CASES, ids=[c[0] for c in EVENT_CASES]
)
async def test_every_event_reaches_its_handler(
    is_async: bool, method: str, request_msg: Message, handler: str, args: tuple[Any, ...]
) -> None:
    async with asyncio.timeout(5):
        plugin = recording_plugin(is_async)
        async with connected(plugin) as c:
            assert c.cfg.events == api.VALID_EVENTS == 0x3FFF
            resp = await c.rt.call(method, request_msg)
            assert resp == plugin_response_type(method)()
            assert plugin.calls == [(handler, args)]


async def test_events_for_handlers_not_overridden_answer_empty() -> None:
    async with asyncio.timeout(5):
        plugin = CreateStop()
        async with connected(plugin) as c:
            resp = await c.rt.call(
                "StartContainer", api.StartContainerRequest(pod=POD, container=CTR)
            )
            assert resp == api.StartContainerResponse()
            resp = await c.rt.call(
                "UpdateContainer", api.UpdateContainerRequest(pod=POD, container=CTR)
            )
            assert resp == api.UpdateContainerResponse()
            assert plugin.calls == []


# ---------------------------------------------------------------- create_container results


def _adjustment() -> Adjustment:
    return Adjustment().add_env("SEEN_BY", "test").add_annotation("a", "b")


CREATE_RESULTS: list[tuple[str, Callable[[], Any], api.CreateContainerResponse]] = [
    ("none", lambda: None, api.CreateContainerResponse()),
    (
        "adjustment",
        _adjustment,
        api.CreateContainerResponse(adjust=_adjustment().message),
    ),
    (
        "raw",
        lambda: api.ContainerAdjustment(annotations={"x": "y"}),
        api.CreateContainerResponse(adjust=api.ContainerAdjustment(annotations={"x": "y"})),
    ),
    (
        "tuple",
        lambda: (
            _adjustment(),
            [
                Update("other").set_memory_limit(1000),
                api.ContainerUpdate(container_id="raw", ignore_failure=True),
            ],
        ),
        api.CreateContainerResponse(
            adjust=_adjustment().message,
            update=[
                Update("other").set_memory_limit(1000).message,
                api.ContainerUpdate(container_id="raw", ignore_failure=True),
            ],
        ),
    ),
    (
        "tuple-none-adjust",
        lambda: (None, [Update("u1").set_cpu_shares(512)]),
        api.CreateContainerResponse(update=[Update("u1").set_cpu_shares(512).message]),
    ),
]


@pytest.mark.parametrize(
    ("result", "expected"), [c[1:] for c in CREATE_RESULTS], ids=[c[0] for c in CREATE_RESULTS]
)
async def test_create_container_results(
    result: Callable[[], Any], expected: api.CreateContainerResponse
) -> None:
    async with asyncio.timeout(5):

        class P(Plugin):
            async def create_container(self, pod: api.PodSandbox, container: api.Container) -> Any:
                return result()

        async with connected(P()) as c:
            resp = await c.rt.call(
                "CreateContainer", api.CreateContainerRequest(pod=POD, container=CTR)
            )
            assert resp == expected
            assert resp.HasField("adjust") == expected.HasField("adjust")


async def test_create_container_bad_return_type_is_an_error() -> None:
    async with asyncio.timeout(5):

        class P(Plugin):
            def create_container(self, pod: api.PodSandbox, container: api.Container) -> Any:
                return "nope"

        async with connected(P()) as c:
            with pytest.raises(TtrpcError) as err:
                await c.rt.call(
                    "CreateContainer", api.CreateContainerRequest(pod=POD, container=CTR)
                )
            assert err.value.code == Code.UNKNOWN
            assert err.value.message == "create_container returned str"


# ---------------------------------------------------------------- adjustment helpers


def test_adjustment_removal_markers() -> None:
    adj = (
        Adjustment()
        .remove_annotation("a")
        .remove_env("E")
        .remove_mount("/m")
        .remove_device("/dev/x")
        .remove_namespace("network")
        .update_args(["x"])
        .add_rlimit("RLIMIT_NOFILE", 1024, 512)
        .set_memory_limit(1 << 30)
    )
    msg = adj.message
    assert dict(msg.annotations) == {"-a": ""}
    assert [(e.key, e.value) for e in msg.env] == [("-E", "")]
    assert [m.destination for m in msg.mounts] == ["-/m"]
    assert [d.path for d in msg.linux.devices] == ["-/dev/x"]
    assert list(msg.linux.namespaces) == [api.LinuxNamespace(type="-network")]
    assert list(msg.args) == ["", "x"]
    assert list(msg.rlimits) == [api.POSIXRlimit(type="RLIMIT_NOFILE", hard=1024, soft=512)]
    assert msg.linux.resources.memory.HasField("limit")
    assert msg.linux.resources.memory.limit == api.OptionalInt64(value=1 << 30)
    assert msg.linux.resources.memory.limit.value == 1 << 30


def test_adjustment_zero_memory_limit_is_present() -> None:
    # The wrapper distinguishes "set to 0" from "not set".
    msg = Adjustment().set_memory_limit(0).message
    assert msg.linux.resources.memory.HasField("limit")
    assert msg.linux.resources.memory.limit.value == 0


def test_update_builder() -> None:
    u = Update("c1", ignore_failure=True).set_memory_limit(5).set_cpuset_cpus("0-1")
    assert u.message == api.ContainerUpdate(
        container_id="c1",
        ignore_failure=True,
        linux=api.LinuxContainerUpdate(
            resources=api.LinuxResources(
                memory=api.LinuxMemory(limit=api.OptionalInt64(value=5)),
                cpu=api.LinuxCPU(cpus="0-1"),
            )
        ),
    )


# ---------------------------------------------------------------- synchronize


async def test_split_synchronize_calls_handler_once_with_everything() -> None:
    async with asyncio.timeout(5):
        calls: list[tuple[list[str], list[str]]] = []

        class P(CreateStop):
            async def synchronize(
                self, pods: list[api.PodSandbox], containers: list[api.Container]
            ) -> Any:
                calls.append(([p.id for p in pods], [c.id for c in containers]))
                return [Update("c3").set_memory_limit(77)]

        chunks = [
            api.SynchronizeRequest(
                pods=[api.PodSandbox(id="p1")], containers=[api.Container(id="c1")], more=True
            ),
            api.SynchronizeRequest(pods=[api.PodSandbox(id="p2")], more=True),
            api.SynchronizeRequest(
                containers=[api.Container(id="c2"), api.Container(id="c3")], more=False
            ),
        ]
        async with connected(P()) as c:
            answers = [await c.rt.call("Synchronize", req) for req in chunks]
            assert answers[0] == api.SynchronizeResponse(more=True)
            assert answers[1] == api.SynchronizeResponse(more=True)
            assert answers[2] == api.SynchronizeResponse(
                update=[Update("c3").set_memory_limit(77).message], more=False
            )
            assert calls == [(["p1", "p2"], ["c1", "c2", "c3"])]

            # A second synchronisation starts afresh.
            again = await c.rt.call(
                "Synchronize", api.SynchronizeRequest(pods=[api.PodSandbox(id="p9")])
            )
            assert len(again.update) == 1
            assert calls[-1] == (["p9"], [])


@pytest.mark.parametrize("more", [True, False])
async def test_synchronize_without_handler_echoes_more(more: bool) -> None:
    async with asyncio.timeout(5):
        async with connected(CreateStop()) as c:
            resp = await c.rt.call(
                "Synchronize", api.SynchronizeRequest(pods=[api.PodSandbox(id="p1")], more=more)
            )
            assert resp == api.SynchronizeResponse(more=more)


# ---------------------------------------------------------------- update_containers


async def test_update_containers_reaches_runtime_and_returns_failures() -> None:
    async with asyncio.timeout(5):
        async with connected(CreateStop()) as c:
            c.rt.fail_updates = lambda u: u.container_id == "bad"
            failed = await c.stub.update_containers(
                [
                    Update("good").set_memory_limit(100),
                    Update("bad").set_cpu_shares(2),
                    api.ContainerUpdate(container_id="bad", ignore_failure=True),
                ],
                [api.ContainerEviction(container_id="evict-me", reason="too big")],
            )
            assert failed == [Update("bad").set_cpu_shares(2).message]
            assert len(c.rt.update_requests) == 1
            req = c.rt.update_requests[0]
            assert list(req.update) == [
                Update("good").set_memory_limit(100).message,
                Update("bad").set_cpu_shares(2).message,
                api.ContainerUpdate(container_id="bad", ignore_failure=True),
            ]
            assert list(req.evict) == [
                api.ContainerEviction(container_id="evict-me", reason="too big")
            ]

            assert await c.stub.update_containers([Update("good")]) == []
            assert len(c.rt.update_requests) == 2


async def test_update_containers_before_start_raises() -> None:
    stub = Stub(CreateStop(), name="x", idx="10")
    with pytest.raises(RuntimeError):
        await stub.update_containers([])


# ---------------------------------------------------------------- errors, validation


async def test_handler_exception_answers_unknown_and_plugin_keeps_serving() -> None:
    async with asyncio.timeout(5):

        class P(Plugin):
            def __init__(self) -> None:
                self.n = 0

            async def create_container(self, pod: api.PodSandbox, container: api.Container) -> Any:
                self.n += 1
                if self.n == 1:
                    raise RuntimeError("boom: first call fails")
                return Adjustment().add_env("N", str(self.n))

        plugin = P()
        async with connected(plugin) as c:
            req = api.CreateContainerRequest(pod=POD, container=CTR)
            with pytest.raises(TtrpcError) as err:
                await c.rt.call("CreateContainer", req)
            assert err.value.code == Code.UNKNOWN
            assert err.value.message == "boom: first call fails"
            resp = await c.rt.call("CreateContainer", req)
            assert resp == api.CreateContainerResponse(
                adjust=Adjustment().add_env("N", "2").message
            )
            assert c.stub._conn is not None and not c.stub._conn.is_closed


async def test_validate_reject_and_accept() -> None:
    async with asyncio.timeout(5):

        class P(Plugin):
            def validate_container_adjustment(
                self, request: api.ValidateContainerAdjustmentRequest
            ) -> None:
                if request.container.name == "evil":
                    raise ValueError("containers named evil are not allowed")

        async with connected(P()) as c:
            assert c.cfg.events == api.event_bit(E.VALIDATE_CONTAINER_ADJUSTMENT) == 0x2000
            rejected = await c.rt.call(
                "ValidateContainerAdjustment",
                api.ValidateContainerAdjustmentRequest(
                    pod=POD, container=api.Container(name="evil")
                ),
            )
            assert rejected == api.ValidateContainerAdjustmentResponse(
                reject=True, reason="containers named evil are not allowed"
            )
            accepted = await c.rt.call(
                "ValidateContainerAdjustment",
                api.ValidateContainerAdjustmentRequest(pod=POD, container=CTR),
            )
            assert accepted == api.ValidateContainerAdjustmentResponse()
            assert not accepted.reject


# ---------------------------------------------------------------- StateChange


@pytest.mark.parametrize(
    ("event", "handler", "args"),
    [
        (E.POST_START_CONTAINER, "post_start_container", (POD, CTR)),
        (E.REMOVE_POD_SANDBOX, "remove_pod_sandbox", (POD,)),
        (E.RUN_POD_SANDBOX, "run_pod_sandbox", (POD,)),
        (E.STOP_POD_SANDBOX, "stop_pod_sandbox", (POD,)),
        (E.POST_UPDATE_POD_SANDBOX, "post_update_pod_sandbox", (POD,)),
        (E.POST_CREATE_CONTAINER, "post_create_container", (POD, CTR)),
        (E.START_CONTAINER, "start_container", (POD, CTR)),
        (E.POST_UPDATE_CONTAINER, "post_update_container", (POD, CTR)),
        (E.REMOVE_CONTAINER, "remove_container", (POD, CTR)),
    ],
)
async def test_state_change_routes_to_handler(
    event: int, handler: str, args: tuple[Any, ...]
) -> None:
    async with asyncio.timeout(5):
        plugin = recording_plugin(is_async=True)
        async with connected(plugin) as c:
            resp = await c.rt.call(
                "StateChange", api.StateChangeEvent(event=event, pod=POD, container=CTR)
            )
            assert resp == api.Empty()
            assert plugin.calls == [(handler, args)]


@pytest.mark.parametrize(
    "event",
    [
        E.CREATE_CONTAINER,
        E.UPDATE_CONTAINER,
        E.STOP_CONTAINER,
        E.UPDATE_POD_SANDBOX,
        E.VALIDATE_CONTAINER_ADJUSTMENT,
        E.UNKNOWN,
        99,
    ],
)
async def test_state_change_unrouted_event_is_ignored(event: int) -> None:
    async with asyncio.timeout(5):
        plugin = recording_plugin(is_async=False)
        async with connected(plugin) as c:
            resp = await c.rt.call(
                "StateChange", api.StateChangeEvent(event=event, pod=POD, container=CTR)
            )
            assert resp == api.Empty()
            assert plugin.calls == []


# ---------------------------------------------------------------- shutdown, lifetime


async def test_shutdown_calls_plugin_shutdown() -> None:
    async with asyncio.timeout(5):
        plugin = recording_plugin(is_async=False)
        async with connected(plugin) as c:
            resp = await c.rt.call("Shutdown", api.Empty())
            assert resp == api.Empty()
            assert plugin.calls == [("shutdown", ())]


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


# ---------------------------------------------------------------- more handler shapes


async def test_update_and_stop_container_return_updates() -> None:
    async with asyncio.timeout(5):

        class P(Plugin):
            def update_container(
                self, pod: api.PodSandbox, container: api.Container, resources: api.LinuxResources
            ) -> Any:
                return [Update(container.id).set_memory_limit(resources.memory.limit.value * 2)]

            async def stop_container(self, pod: api.PodSandbox, container: api.Container) -> Any:
                return [api.ContainerUpdate(container_id="sibling", ignore_failure=True)]

        async with connected(P()) as c:
            assert c.cfg.events == api.event_bit(E.UPDATE_CONTAINER) | api.event_bit(
                E.STOP_CONTAINER
            )
            resp = await c.rt.call(
                "UpdateContainer",
                api.UpdateContainerRequest(pod=POD, container=CTR, linux_resources=RES),
            )
            assert resp == api.UpdateContainerResponse(
                update=[Update("ctr-1").set_memory_limit(2 << 20).message]
            )
            resp = await c.rt.call(
                "StopContainer", api.StopContainerRequest(pod=POD, container=CTR)
            )
            assert resp == api.StopContainerResponse(
                update=[api.ContainerUpdate(container_id="sibling", ignore_failure=True)]
            )


async def test_duck_typed_plugin_without_base_class() -> None:
    async with asyncio.timeout(5):

        class Duck:
            def __init__(self) -> None:
                self.seen: list[str] = []

            async def post_start_container(
                self, pod: api.PodSandbox, container: api.Container
            ) -> None:
                self.seen.append(container.id)

        duck = Duck()
        async with connected(duck) as c:
            assert c.cfg.events == api.event_bit(E.POST_START_CONTAINER) == 0x40
            resp = await c.rt.call(
                "PostStartContainer", api.PostStartContainerRequest(pod=POD, container=CTR)
            )
            assert resp == api.PostStartContainerResponse()
            resp = await c.rt.call(
                "CreateContainer", api.CreateContainerRequest(pod=POD, container=CTR)
            )
            assert resp == api.CreateContainerResponse()
            assert duck.seen == ["ctr-1"]


async def test_exception_without_text_answers_its_type_name() -> None:
    async with asyncio.timeout(5):

        class P(Plugin):
            async def run_pod_sandbox(self, pod: api.PodSandbox) -> None:
                raise KeyError

        async with connected(P()) as c:
            with pytest.raises(TtrpcError) as err:
                await c.rt.call("RunPodSandbox", api.RunPodSandboxRequest(pod=POD))
            assert err.value.code == Code.UNKNOWN
            assert err.value.message == "KeyError"


async def test_async_validator_rejects() -> None:
    async with asyncio.timeout(5):

        class P(Plugin):
            async def validate_container_adjustment(
                self, request: api.ValidateContainerAdjustmentRequest
            ) -> None:
                await asyncio.sleep(0)
                if any(e.key == "FORBIDDEN" for e in request.adjust.env):
                    raise PermissionError("FORBIDDEN may not be set")

        async with connected(P()) as c:
            resp = await c.rt.call(
                "ValidateContainerAdjustment",
                api.ValidateContainerAdjustmentRequest(
                    pod=POD, container=CTR, adjust=Adjustment().add_env("FORBIDDEN", "1").message
                ),
            )
            assert resp == api.ValidateContainerAdjustmentResponse(
                reject=True, reason="FORBIDDEN may not be set"
            )
