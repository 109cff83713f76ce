"""The plugin SDK: write an NRI plugin as a Python object.

A plugin subclasses ``Plugin`` and overrides the handlers it cares about; the
overridden event handlers are its subscription (as with the Go stub, where the
interfaces a plugin implements decide it). ``Stub`` connects the plugin to a
runtime -- the NRI socket for an external plugin, fd ``NRI_PLUGIN_SOCKET`` for a
plugin the runtime launched -- registers it, answers Configure and Synchronize
and delivers every event. Handlers may be coroutines or plain functions. An
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
import inspect
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from google.protobuf.message import Message

from pycrid.nri import api
from pycrid.nri.replies import Adjustment, Update
from pycrid.nri.wire.connection import PLUGIN_SIDE, Connection, Services, connect
from pycrid.nri.wire.ttrpc import Code, RequestReceived, TtrpcError

log = logging.getLogger("pycrid.nri.stub")

M = TypeVar("M", bound=Message)

UpdatesResult = Iterable[api.ContainerUpdate | Update] | None
CreateResult = (
    Adjustment
    | api.ContainerAdjustment
    | tuple[Adjustment | api.ContainerAdjustment | None, UpdatesResult]
    | None
)


class Plugin:
    """Base class for plugins. Every handler here is a no-op; override the
    ones you need. Event handlers you override are the events you get."""

    def configure(self, config: str, runtime_name: str, runtime_version: str) -> int | None:
        """Called once; may return an event mask narrower than the handlers
        overridden (0 or None means all of them)."""
        return 0

    def synchronize(
        self, pods: list[api.PodSandbox], containers: list[api.Container]
    ) -> UpdatesResult:
        """Every pod and container that exists when the plugin joins."""
        return None

    def shutdown(self) -> None:
        """The runtime is shutting down."""

    def run_pod_sandbox(self, pod: api.PodSandbox) -> None: ...
    def update_pod_sandbox(
        self,
        pod: api.PodSandbox,
        overhead: api.LinuxResources,
        resources: api.LinuxResources,
    ) -> None: ...
    def post_update_pod_sandbox(self, pod: api.PodSandbox) -> None: ...
    def stop_pod_sandbox(self, pod: api.PodSandbox) -> None: ...
    def remove_pod_sandbox(self, pod: api.PodSandbox) -> None: ...

    def create_container(self, pod: api.PodSandbox, container: api.Container) -> CreateResult:
        """Return an adjustment, or ``(adjustment, updates)``, or None."""
        return None

    def post_create_container(self, pod: api.PodSandbox, container: api.Container) -> None: ...
    def start_container(self, pod: api.PodSandbox, container: api.Container) -> None: ...
    def post_start_container(self, pod: api.PodSandbox, container: api.Container) -> None: ...

    def update_container(
        self, pod: api.PodSandbox, container: api.Container, resources: api.LinuxResources
    ) -> UpdatesResult:
        return None

    def post_update_container(self, pod: api.PodSandbox, container: api.Container) -> None: ...

    def stop_container(self, pod: api.PodSandbox, container: api.Container) -> UpdatesResult:
        return None

    def remove_container(self, pod: api.PodSandbox, container: api.Container) -> None: ...

    def validate_container_adjustment(
        self, request: api.ValidateContainerAdjustmentRequest
    ) -> None:
        """Raise to reject the merged adjustment; the exception text is the reason."""


EVENT_HANDLERS: dict[int, str] = {
    api.Event.RUN_POD_SANDBOX: "run_pod_sandbox",
    api.Event.STOP_POD_SANDBOX: "stop_pod_sandbox",
    api.Event.REMOVE_POD_SANDBOX: "remove_pod_sandbox",
    api.Event.CREATE_CONTAINER: "create_container",
    api.Event.POST_CREATE_CONTAINER: "post_create_container",
    api.Event.START_CONTAINER: "start_container",
    api.Event.POST_START_CONTAINER: "post_start_container",
    api.Event.UPDATE_CONTAINER: "update_container",
    api.Event.POST_UPDATE_CONTAINER: "post_update_container",
    api.Event.STOP_CONTAINER: "stop_container",
    api.Event.REMOVE_CONTAINER: "remove_container",
    api.Event.UPDATE_POD_SANDBOX: "update_pod_sandbox",
    api.Event.POST_UPDATE_POD_SANDBOX: "post_update_pod_sandbox",
    api.Event.VALIDATE_CONTAINER_ADJUSTMENT: "validate_container_adjustment",
}
"""Each event and the Plugin method that handles it."""

SIMPLE_EVENTS: dict[str, tuple[str, tuple[str, ...], bool]] = {
    "RunPodSandbox": ("run_pod_sandbox", ("pod",), False),
    "StopPodSandbox": ("stop_pod_sandbox", ("pod",), False),
    "RemovePodSandbox": ("remove_pod_sandbox", ("pod",), False),
    "PostUpdatePodSandbox": ("post_update_pod_sandbox", ("pod",), False),
    "UpdatePodSandbox": (
        "update_pod_sandbox", ("pod", "overhead_linux_resources", "linux_resources"), False
    ),
    "PostCreateContainer": ("post_create_container", ("pod", "container"), False),
    "StartContainer": ("start_container", ("pod", "container"), False),
    "PostStartContainer": ("post_start_container", ("pod", "container"), False),
    "PostUpdateContainer": ("post_update_container", ("pod", "container"), False),
    "RemoveContainer": ("remove_container", ("pod", "container"), False),
    "UpdateContainer": ("update_container", ("pod", "container", "linux_resources"), True),
    "StopContainer": ("stop_container", ("pod", "container"), True),
}
"""Plugin methods whose events only pass request fields to a handler:
(handler, request fields in argument order, whether the answer carries updates)."""

STATE_CHANGE_ROUTES = {
    api.Event.RUN_POD_SANDBOX: "RunPodSandbox",
    api.Event.STOP_POD_SANDBOX: "StopPodSandbox",
    api.Event.REMOVE_POD_SANDBOX: "RemovePodSandbox",
    api.Event.POST_UPDATE_POD_SANDBOX: "PostUpdatePodSandbox",
    api.Event.POST_CREATE_CONTAINER: "PostCreateContainer",
    api.Event.START_CONTAINER: "StartContainer",
    api.Event.POST_START_CONTAINER: "PostStartContainer",
    api.Event.POST_UPDATE_CONTAINER: "PostUpdateContainer",
    api.Event.REMOVE_CONTAINER: "RemoveContainer",
}
"""The events a runtime may resend as the deprecated StateChange (those whose
answer carries nothing), and the method each stands for."""


def implemented(plugin: object, method: str) -> bool:
    """Whether ``plugin`` provides ``method`` itself (not Plugin's no-op)."""
    own = getattr(type(plugin), method, None)
    if own is None:
        return callable(getattr(plugin, method, None))
    return own is not getattr(Plugin, method, None)


def handled_events(plugin: object) -> int:
    """The event mask the plugin's overridden handlers cover."""
    return api.event_mask(ev for ev, name in EVENT_HANDLERS.items() if implemented(plugin, name))


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


def _updates(result: UpdatesResult) -> list[api.ContainerUpdate]:
    if not result:
        return []
    return [u.message if isinstance(u, Update) else u for u in result]


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


class Stub:
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
        self.plugin = plugin
        self.name, self.idx = resolve_identity(name, idx)
        self._socket_path = socket_path or api.DEFAULT_SOCKET_PATH
        self._sock = sock
        self.handled = handled_events(plugin)
        if not self.handled and not any(
            implemented(plugin, m) for m in ("configure", "synchronize", "shutdown")
        ):
            raise ValueError(f"plugin {type(plugin).__name__} implements no NRI handler")
        self.events = 0
        self.registration_timeout = registration_timeout
        self.request_timeout = 2.0
        self.runtime_name = ""
        self.runtime_version = ""
        self.runtime_nri_version = ""
        self._conn: Connection | None = None
        self._configured: asyncio.Future[None] | None = None
        self._sync_pods: list[api.PodSandbox] = []
        self._sync_containers: list[api.Container] = []

    @property
    def full_name(self) -> str:
        return f"{self.idx}-{self.name}"

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
            closed: asyncio.Future[Any] = asyncio.ensure_future(self._conn.wait_closed())
            configured: asyncio.Future[Any] = self._configured
            try:
                done, _ = await asyncio.wait(
                    {configured, closed},
                    timeout=self.registration_timeout,
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                closed.cancel()
            if self._configured in done:
                self._configured.result()
            elif closed in done:
                raise ConnectionError(f"runtime closed the connection: {self._conn.close_reason}")
            else:
                raise TimeoutError(
                    f"runtime did not configure the plugin within {self.registration_timeout:g}s"
                )
        except BaseException:
            await self.stop()
            raise
        log.info("plugin %s started, subscribed to %s", self.full_name,
                 api.event_names(self.events) or "nothing")

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
        req = api.UpdateContainersRequest(update=_updates(list(updates)), evict=list(evictions))
        payload = await self._conn.call(
            api.RUNTIME_SERVICE, "UpdateContainers", req.SerializeToString(), timeout=timeout
        )
        return list(api.UpdateContainersResponse.FromString(payload).failed)

    # ------------------------------------------------------------ runtime -> plugin

    def _services(self) -> Services:
        services = Services()

        def add(method: str, request_type: type[M], fn: Callable[[M], Awaitable[Message]]) -> None:
            async def handler(ev: RequestReceived) -> bytes:
                req = request_type.FromString(ev.payload)
                return (await fn(req)).SerializeToString()

            services.add(api.PLUGIN_SERVICE, method, handler)

        add("Configure", api.ConfigureRequest, self._configure)
        add("Synchronize", api.SynchronizeRequest, self._synchronize)
        add("Shutdown", api.Empty, self._shutdown)
        add("StateChange", api.StateChangeEvent, self._state_change)
        add("CreateContainer", api.CreateContainerRequest, self._create_container)
        add("ValidateContainerAdjustment", api.ValidateContainerAdjustmentRequest, self._validate)
        for method in SIMPLE_EVENTS:
            add(method, getattr(api, f"{method}Request"), self._event(method))
        return services

    async def _configure(self, req: api.ConfigureRequest) -> api.ConfigureResponse:
        assert self._configured is not None
        self.runtime_name = req.runtime_name
        self.runtime_version = req.runtime_version
        self.runtime_nri_version = req.NRI_version
        if req.registration_timeout > 0:
            self.registration_timeout = req.registration_timeout / 1000
        if req.request_timeout > 0:
            self.request_timeout = req.request_timeout / 1000
        try:
            events = self.handled
            if implemented(self.plugin, "configure"):
                asked = await _call(
                    self.plugin.configure,  # type: ignore[attr-defined]
                    req.config,
                    req.runtime_name,
                    req.runtime_version,
                )
                events = int(asked or 0) or self.handled
                extra = events & ~self.handled
                if extra:
                    raise TtrpcError(
                        Code.INVALID_ARGUMENT,
                        f"internal error: unhandled events {api.event_names(extra)} (0x{extra:x})",
                    )
        except BaseException as exc:
            log.error("plugin %s: configuration failed: %s", self.full_name, exc)
            if not self._configured.done():
                self._configured.set_exception(ConnectionError(f"configuration failed: {exc}"))
            raise
        self.events = events
        if not self._configured.done():
            self._configured.set_result(None)
        log.info(
            "plugin %s configured by %s %s (NRI %s) for %s",
            self.full_name, req.runtime_name, req.runtime_version, req.NRI_version,
            api.event_names(events),
        )
        return api.ConfigureResponse(events=events)

    async def _synchronize(self, req: api.SynchronizeRequest) -> api.SynchronizeResponse:
        if not implemented(self.plugin, "synchronize"):
            return api.SynchronizeResponse(more=req.more)
        self._sync_pods.extend(req.pods)
        self._sync_containers.extend(req.containers)
        if req.more:
            # A split synchronisation: acknowledge and wait for the final chunk.
            return api.SynchronizeResponse(more=True)
        pods, containers = self._sync_pods, self._sync_containers
        self._sync_pods, self._sync_containers = [], []
        result = await _call(self.plugin.synchronize, pods, containers)  # type: ignore[attr-defined]
        return api.SynchronizeResponse(update=_updates(result), more=False)

    async def _shutdown(self, _req: api.Empty) -> api.Empty:
        if implemented(self.plugin, "shutdown"):
            await _call(self.plugin.shutdown)  # type: ignore[attr-defined]
        return api.Empty()

    def _event(self, method: str) -> Callable[[Any], Awaitable[Message]]:
        handler, fields, with_updates = SIMPLE_EVENTS[method]
        response: type[Message] = getattr(api, f"{method}Response")

        async def deliver(req: Any) -> Message:
            resp = response()
            if implemented(self.plugin, handler):
                args = [getattr(req, f) for f in fields]
                result = await _call(getattr(self.plugin, handler), *args)
                if with_updates:
                    resp.update.extend(_updates(result))  # type: ignore[attr-defined]
            return resp

        return deliver

    async def _create_container(
        self, req: api.CreateContainerRequest
    ) -> api.CreateContainerResponse:
        if not implemented(self.plugin, "create_container"):
            return api.CreateContainerResponse()
        result = await _call(
            self.plugin.create_container,  # type: ignore[attr-defined]
            req.pod,
            req.container,
        )
        updates: UpdatesResult = None
        if isinstance(result, tuple):
            result, updates = result
        resp = api.CreateContainerResponse(update=_updates(updates))
        if isinstance(result, Adjustment):
            resp.adjust.CopyFrom(result.message)
        elif isinstance(result, api.ContainerAdjustment):
            resp.adjust.CopyFrom(result)
        elif result is not None:
            raise TypeError(f"create_container returned {type(result).__name__}")
        return resp

    async def _validate(
        self, req: api.ValidateContainerAdjustmentRequest
    ) -> api.ValidateContainerAdjustmentResponse:
        if not implemented(self.plugin, "validate_container_adjustment"):
            return api.ValidateContainerAdjustmentResponse()
        try:
            await _call(self.plugin.validate_container_adjustment, req)  # type: ignore[attr-defined]
        except Exception as exc:
            return api.ValidateContainerAdjustmentResponse(reject=True, reason=str(exc))
        return api.ValidateContainerAdjustmentResponse()

    async def _state_change(self, ev: api.StateChangeEvent) -> api.Empty:
        """The older catch-all event: route it to the specific handler."""
        method = STATE_CHANGE_ROUTES.get(ev.event)
        if method is not None:
            await self._event(method)(ev)
        return api.Empty()

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
