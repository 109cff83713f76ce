"""The plugin side of a ``Stub``: the Plugin service it serves, each call from the runtime
(Configure, Synchronize, the events, Shutdown) answered by the plugin's handlers.

An exception in a handler answers that call with an error and the plugin carries on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from google.protobuf.message import Message

from pycrid.nri import api
from pycrid.nri.replies import Adjustment
from pycrid.nri.sdk_plugin import (
    UpdatesResult,
    call_handler,
    handled_events,
    implemented,
    update_messages,
)
from pycrid.nri.wire.connection import Services
from pycrid.nri.wire.ttrpc import Code, RequestReceived, TtrpcError

log = logging.getLogger("pycrid.nri.stub")

M = TypeVar("M", bound=Message)

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

STATE_CHANGE_ROUTES = {ev: api.EVENT_METHODS[ev] for ev in api.STATE_CHANGE_EVENTS}
"""The events a runtime may resend as the deprecated StateChange (those whose
answer carries nothing), and the method each stands for."""


class StubAnswers:
    """What the runtime told the plugin, and the handlers that answer its calls."""

    def __init__(self, plugin: object, name: str, idx: str, registration_timeout: float) -> None:
        self.plugin = plugin
        self.name, self.idx = name, idx
        self.handled = handled_events(plugin)
        self.events = 0
        self.registration_timeout = registration_timeout
        self.request_timeout = 2.0
        self.runtime_name = ""
        self.runtime_version = ""
        self.runtime_nri_version = ""
        self._configured: asyncio.Future[None] | None = None
        self._sync_pods: list[api.PodSandbox] = []
        self._sync_containers: list[api.Container] = []

    @property
    def full_name(self) -> str:
        return f"{self.idx}-{self.name}"

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
                asked = await call_handler(
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
        result = await call_handler(self.plugin.synchronize, pods, containers)  # type: ignore[attr-defined]
        return api.SynchronizeResponse(update=update_messages(result), more=False)

    async def _shutdown(self, _req: api.Empty) -> api.Empty:
        if implemented(self.plugin, "shutdown"):
            await call_handler(self.plugin.shutdown)  # type: ignore[attr-defined]
        return api.Empty()

    def _event(self, method: str) -> Callable[[Any], Awaitable[Message]]:
        handler, fields, with_updates = SIMPLE_EVENTS[method]
        response: type[Message] = getattr(api, f"{method}Response")

        async def deliver(req: Any) -> Message:
            resp = response()
            if implemented(self.plugin, handler):
                args = [getattr(req, f) for f in fields]
                result = await call_handler(getattr(self.plugin, handler), *args)
                if with_updates:
                    resp.update.extend(update_messages(result))  # type: ignore[attr-defined]
            return resp

        return deliver

    async def _create_container(
        self, req: api.CreateContainerRequest
    ) -> api.CreateContainerResponse:
        if not implemented(self.plugin, "create_container"):
            return api.CreateContainerResponse()
        result = await call_handler(
            self.plugin.create_container,  # type: ignore[attr-defined]
            req.pod,
            req.container,
        )
        updates: UpdatesResult = None
        if isinstance(result, tuple):
            result, updates = result
        resp = api.CreateContainerResponse(update=update_messages(updates))
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
            await call_handler(self.plugin.validate_container_adjustment, req)  # type: ignore[attr-defined]
        except Exception as exc:
            return api.ValidateContainerAdjustmentResponse(reject=True, reason=str(exc))
        return api.ValidateContainerAdjustmentResponse()

    async def _state_change(self, ev: api.StateChangeEvent) -> api.Empty:
        """The older catch-all event: route it to the specific handler."""
        method = STATE_CHANGE_ROUTES.get(ev.event)
        if method is not None:
            await self._event(method)(ev)
        return api.Empty()
