"""The NRI plugin SDK (``pycrid.nri.stub``): what a plugin is asked and what it answers.

Each test connects a ``Stub`` to a ``RuntimePeer`` over a socketpair and drives the
runtime side of the protocol: registration and Configure, every event, reply shapes,
the adjustment builders, Synchronize, UpdateContainers, errors and StateChange. How a
Stub starts, identifies itself, connects and ends is in test_nri_stub_lifetime.py.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf.message import Message

from pycrid.nri import Adjustment, Plugin, Stub, Update, api
from pycrid.nri.sdk_plugin import EVENT_HANDLERS, handled_events
from pycrid.nri.wire.ttrpc import Code, TtrpcError
from tests.support.nri_runtime import (
    CTR,
    POD,
    CreateStop,
    RuntimePeer,
    connected,
    plugin_response_type,
)

E = api.Event

RES = api.LinuxResources(memory=api.LinuxMemory(limit=api.OptionalInt64(value=1 << 20)))
OVERHEAD = api.LinuxResources(memory=api.LinuxMemory(limit=api.OptionalInt64(value=4096)))


# ---------------------------------------------------------------- plugins


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


async def test_shutdown_calls_plugin_shutdown() -> None:
    async with asyncio.timeout(5):
        plugin = recording_plugin(is_async=False)
        async with connected(plugin) as c:
            resp = await c.rt.call("Shutdown", api.Empty())
            assert resp == api.Empty()
            assert plugin.calls == [("shutdown", ())]
