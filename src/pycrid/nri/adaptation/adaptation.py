"""The NRI adaptation: the plugins a runtime has, and the relay of its events to them.

Shaped after containerd/nri's ``pkg/adaptation``: events go to subscribed
plugins one at a time, in index order, one event in flight in the whole
runtime; CreateContainer replies are merged with field ownership and then
checked by validators (concurrently); a plugin that crashes, hangs or breaks
the protocol is closed (and killed if we launched it) and the event carries
on. The CRI side is a ``Domain``: it owns the plugin-sync lock, so a plugin is
synchronised and inserted while no CRI operation is in flight.

Where we differ from upstream, on purpose: a badly named pre-installed plugin
is skipped rather than failing start-up; garbage closes a plugin at once; a
per-plugin request timeout; Shutdown is sent when the runtime stops; errors
of the Post*/Stop/Remove events are logged and the other plugins still get
the event.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

from google.protobuf.message import Message

from pycrid import unixsock
from pycrid.config.schema import NRIConfig
from pycrid.errors import Unknown
from pycrid.nri import api
from pycrid.nri.adaptation import launcher
from pycrid.nri.adaptation.adjustment_validation import validate_adjustment
from pycrid.nri.adaptation.call_accounting import PluginInstruments
from pycrid.nri.adaptation.merge import CreateMerger, CreateResult, UpdateMerger
from pycrid.nri.adaptation.plugin_socket import listen
from pycrid.nri.adaptation.remote_plugin import (
    ConnectedPlugin,
    PluginFailed,
    PluginGone,
    RuntimeInfo,
)
from pycrid.nri.adaptation.validator import DefaultValidator
from pycrid.nri.wire.ttrpc import Code
from pycrid.tasks import Owner

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)

SyncFn = Callable[[list[api.PodSandbox], list[api.Container]],
                  Awaitable[list[api.ContainerUpdate]]]

#: Events a plugin that answers Unimplemented gets as the deprecated StateChange instead.
class PluginError(Unknown):
    """A plugin refused an event that may fail its CRI call."""


class Domain(Protocol):
    """What the adaptation needs from the CRI side (containerd's nri Domain)."""

    async def synchronize(self, sync: SyncFn) -> None:
        """Under the write side of the plugin-sync lock: call ``sync`` with every current
        pod and container and apply the updates it returns."""

    async def update_containers(
            self, updates: Sequence[api.ContainerUpdate]) -> list[api.ContainerUpdate]:
        """Apply updates to running containers; returns the failed ones."""

    def evict(self, evictions: Sequence[api.ContainerEviction]) -> None:
        """Stop the named containers (in the background)."""


class Adaptation:
    """The plugins and the relay of events to them. ``owner`` holds the accept loop, the
    registrations and the hang-up watches; ``instruments`` count and trace plugin calls."""

    def __init__(self, config: NRIConfig, *, runtime_name: str, runtime_version: str,
                 domain: Domain, owner: Owner | None = None,
                 instruments: PluginInstruments | None = None) -> None:
        self.config = config
        self.domain = domain
        self.instruments = instruments or PluginInstruments()
        self.info = RuntimeInfo(runtime_name, runtime_version,
                                float(config.plugin_registration_timeout),
                                float(config.plugin_request_timeout))
        self.validator = (DefaultValidator(config.default_validator)
                          if config.default_validator.enable else None)
        self.plugins: list[ConnectedPlugin] = []
        self.warnings: list[str] = []
        self._lock = asyncio.Lock()
        self._owner = owner or Owner("nri adaptation")
        self._listener: socket.socket | None = None
        self._socket_file: unixsock.SocketFile | None = None
        self._stopping = False

    # ---- lifetime -----------------------------------------------------------------------

    async def start(self) -> None:
        """Launch the pre-installed plugins (waiting for their registration and sync), then
        accept external ones."""
        found, self.warnings = launcher.discover(self.config.plugin_path)
        for w in self.warnings:
            log.warning("%s", w)
        await asyncio.gather(*(self._launch(f) for f in found))
        if not self.config.disable_connections:
            self._listener, self._socket_file = listen(self.config.socket_path)
            self._owner.spawn(self._accept_loop(self._listener), "nri accept")
        log.info("NRI started: %d plugin(s) connected%s", len(self.plugins),
                 "" if self._listener is None else f", accepting on {self.config.socket_path}")

    async def stop(self) -> None:
        """Stop accepting, send Shutdown to every plugin, close them all."""
        self._stopping = True
        if self._listener is not None:
            self._listener.close()
        if self._socket_file is not None:
            self._socket_file.remove()  # not another runtime's socket that replaced ours
        await self._owner.aclose()
        async with self._lock:
            plugins, self.plugins = self.plugins, []
        await asyncio.gather(*(p.shutdown() for p in plugins), return_exceptions=True)

    async def _launch(self, found: launcher.Found) -> None:
        try:
            launched, sock = await launcher.launch(found)
        except OSError as e:
            log.error("cannot start NRI plugin %s: %s", found.path, e)
            return
        config = launcher.plugin_config(self.config.plugin_config_path, found.idx, found.base)
        plugin = self._new_plugin(launched=launched, config=config)
        await self._admit(plugin, sock)

    async def _accept_loop(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(listener)
            except OSError as e:
                log.error("NRI socket accept failed: %s", e)
                return
            self._owner.spawn(self._admit(self._new_plugin(), sock), "nri plugin registration")

    def _new_plugin(self, **kw: Any) -> ConnectedPlugin:
        return ConnectedPlugin(info=self.info, request_timeout=self.info.request_timeout,
                               on_update=self._unsolicited_update,
                               instruments=self.instruments, **kw)

    async def _admit(self, plugin: ConnectedPlugin, sock: socket.socket) -> None:
        """Handshake, then synchronise and insert under the plugin-sync write lock."""
        try:
            await plugin.attach(sock)
            await plugin.handshake()
        except PluginGone as e:
            log.warning("%s", e)
            return
        except (OSError, PluginFailed) as e:
            await plugin.close(f"handshake failed: {e}", "error")
            return
        plugin.request_timeout = self._timeout_of(plugin)

        async def sync(pods: list[api.PodSandbox],
                       containers: list[api.Container]) -> list[api.ContainerUpdate]:
            if self._stopping:
                raise PluginGone("runtime is stopping")
            updates = await plugin.synchronize(pods, containers)
            async with self._lock:
                self.plugins = sorted([*self.plugins, plugin], key=lambda p: (p.idx, p.base))
            log.info("NRI plugin %s synchronized (%d pods, %d containers)", plugin.name,
                     len(pods), len(containers))
            if self.instruments.observer is not None:
                self.instruments.observer.nri_registered(plugin.name)
            return updates

        try:
            await self.domain.synchronize(sync)
        except (PluginGone, PluginFailed) as e:
            await plugin.close(f"synchronization failed: {e}", "sync")
            return
        self._owner.spawn(self._watch(plugin), f"nri plugin {plugin.name} hang-up watch")

    async def _watch(self, plugin: ConnectedPlugin) -> None:
        """A plugin that hangs up between events is closed (and counted) at once, not at
        the next event that would have gone to it."""
        why = await plugin.wait_closed()
        if not self._stopping and not plugin.closed_by_us:
            await plugin.close(f"connection closed: {why}", "closed")
            async with self._lock:
                self._prune()

    def _timeout_of(self, plugin: ConnectedPlugin) -> float:
        per = self.config.plugin_request_timeouts
        for key in (plugin.name, plugin.base):
            if key in per:
                return float(per[key])
        return self.info.request_timeout

    async def _unsolicited_update(
            self, req: api.UpdateContainersRequest) -> list[api.ContainerUpdate]:
        failed = await self.domain.update_containers(list(req.update))
        if req.evict:
            self.domain.evict(list(req.evict))
        return failed

    # ---- relaying -----------------------------------------------------------------------

    def subscribed(self, event: int) -> list[ConnectedPlugin]:
        return [p for p in self.plugins if p.subscribed(event)]

    async def _relay(self, event: int, request: Message, response: type[M], *,
                     may_fail: bool) -> list[tuple[ConnectedPlugin, M]]:
        """Send one event to its subscribers in index order; the answers of those that
        answered. A refusal raises PluginError when the event ``may_fail``."""
        if not self.subscribed(event):
            return []
        method = api.EVENT_METHODS[event]
        answers: list[tuple[ConnectedPlugin, M]] = []
        async with self._lock:
            try:
                for plugin in self.subscribed(event):
                    try:
                        answers.append((plugin, await plugin.call(method, request, response)))
                    except PluginGone as e:
                        log.warning("%s (during %s)", e, method)
                    except PluginFailed as e:
                        if e.code == Code.UNIMPLEMENTED and event in api.STATE_CHANGE_EVENTS:
                            await self._state_change(plugin, event, request, may_fail)
                        elif may_fail:
                            raise PluginError(str(e)) from None
                        else:
                            log.warning("%s", e)
            finally:
                self._prune()
        return answers

    async def _state_change(self, plugin: ConnectedPlugin, event: int, request: Message,
                            may_fail: bool) -> None:
        ev = api.StateChangeEvent(event=event)  # type: ignore[arg-type]
        for field in ("pod", "container"):
            if request.DESCRIPTOR.fields_by_name.get(field) and request.HasField(field):
                getattr(ev, field).CopyFrom(getattr(request, field))
        try:
            await plugin.call("StateChange", ev, api.Empty)
        except PluginGone as e:
            log.warning("%s (during StateChange)", e)
        except PluginFailed as e:
            if may_fail:
                raise PluginError(str(e)) from None
            log.warning("%s", e)

    def _prune(self) -> None:
        self.plugins = [p for p in self.plugins if not p.closed]

    # ---- pod events ---------------------------------------------------------------------

    async def run_pod_sandbox(self, pod: api.PodSandbox) -> None:
        await self._relay(api.Event.RUN_POD_SANDBOX, api.RunPodSandboxRequest(pod=pod),
                          api.RunPodSandboxResponse, may_fail=True)

    async def stop_pod_sandbox(self, pod: api.PodSandbox) -> None:
        await self._relay(api.Event.STOP_POD_SANDBOX, api.StopPodSandboxRequest(pod=pod),
                          api.StopPodSandboxResponse, may_fail=False)

    async def remove_pod_sandbox(self, pod: api.PodSandbox) -> None:
        await self._relay(api.Event.REMOVE_POD_SANDBOX, api.RemovePodSandboxRequest(pod=pod),
                          api.RemovePodSandboxResponse, may_fail=False)

    async def update_pod_sandbox(self, pod: api.PodSandbox, overhead: api.LinuxResources,
                                 resources: api.LinuxResources) -> None:
        await self._relay(api.Event.UPDATE_POD_SANDBOX, api.UpdatePodSandboxRequest(
            pod=pod, overhead_linux_resources=overhead, linux_resources=resources),
            api.UpdatePodSandboxResponse, may_fail=True)

    async def post_update_pod_sandbox(self, pod: api.PodSandbox) -> None:
        await self._relay(api.Event.POST_UPDATE_POD_SANDBOX,
                          api.PostUpdatePodSandboxRequest(pod=pod),
                          api.PostUpdatePodSandboxResponse, may_fail=False)

    # ---- container events ---------------------------------------------------------------

    async def create_container(self, pod: api.PodSandbox,
                               container: api.Container) -> CreateResult | None:
        """Every subscriber adjusts in turn (each sees the earlier adjustments), the replies
        are merged with field ownership, then validated. None when nobody is subscribed."""
        if not self.subscribed(api.Event.CREATE_CONTAINER) and not self._has_validators():
            return None
        async with self._lock:
            try:
                merger = CreateMerger(pod, container)
                instances = [p.instance() for p in self.plugins if not p.closed]
                for plugin in self.subscribed(api.Event.CREATE_CONTAINER):
                    request = api.CreateContainerRequest(pod=pod, container=merger.container)
                    try:
                        reply = await plugin.call("CreateContainer", request,
                                                  api.CreateContainerResponse)
                    except PluginGone as e:
                        log.warning("%s (during CreateContainer)", e)
                        continue
                    except PluginFailed as e:
                        raise PluginError(str(e)) from None
                    merger.apply(plugin.name, reply)
                result = merger.result()
                await validate_adjustment(
                    pod, merger.pristine, result, instances,
                    self.subscribed(api.Event.VALIDATE_CONTAINER_ADJUSTMENT), self.validator)
            finally:
                self._prune()
        return result

    def _has_validators(self) -> bool:
        return self.validator is not None or bool(
            self.subscribed(api.Event.VALIDATE_CONTAINER_ADJUSTMENT))

    async def post_create_container(self, pod: api.PodSandbox, ctr: api.Container) -> None:
        await self._relay(api.Event.POST_CREATE_CONTAINER,
                          api.PostCreateContainerRequest(pod=pod, container=ctr),
                          api.PostCreateContainerResponse, may_fail=False)

    async def start_container(self, pod: api.PodSandbox, ctr: api.Container) -> None:
        await self._relay(api.Event.START_CONTAINER,
                          api.StartContainerRequest(pod=pod, container=ctr),
                          api.StartContainerResponse, may_fail=True)

    async def post_start_container(self, pod: api.PodSandbox, ctr: api.Container) -> None:
        await self._relay(api.Event.POST_START_CONTAINER,
                          api.PostStartContainerRequest(pod=pod, container=ctr),
                          api.PostStartContainerResponse, may_fail=False)

    async def update_container(
            self, pod: api.PodSandbox, ctr: api.Container, resources: api.LinuxResources
    ) -> tuple[list[api.ContainerUpdate], list[api.ContainerEviction]]:
        """The merged updates, the target's own (if any) last, and the evictions."""
        answers = await self._relay(
            api.Event.UPDATE_CONTAINER,
            api.UpdateContainerRequest(pod=pod, container=ctr, linux_resources=resources),
            api.UpdateContainerResponse, may_fail=True)
        merger = UpdateMerger(ctr.id)
        for plugin, reply in answers:
            merger.apply(plugin.name, reply.update, reply.evict)
        return merger.result()

    async def post_update_container(self, pod: api.PodSandbox, ctr: api.Container) -> None:
        await self._relay(api.Event.POST_UPDATE_CONTAINER,
                          api.PostUpdateContainerRequest(pod=pod, container=ctr),
                          api.PostUpdateContainerResponse, may_fail=False)

    async def stop_container(self, pod: api.PodSandbox,
                             ctr: api.Container) -> list[api.ContainerUpdate]:
        answers = await self._relay(api.Event.STOP_CONTAINER,
                                    api.StopContainerRequest(pod=pod, container=ctr),
                                    api.StopContainerResponse, may_fail=False)
        merger = UpdateMerger()
        for plugin, reply in answers:
            merger.apply(plugin.name, reply.update, ())
        return merger.result()[0]

    async def remove_container(self, pod: api.PodSandbox, ctr: api.Container) -> None:
        await self._relay(api.Event.REMOVE_CONTAINER,
                          api.RemoveContainerRequest(pod=pod, container=ctr),
                          api.RemoveContainerResponse, may_fail=False)
